"""tfdp-utils: data-parallel training for TensorFlow/Keras that works as hoped.

>>> import tfdp_utils as tdu
>>> strategy = tdu.auto_strategy()                                    # doctest: +SKIP
>>> dataset = tdu.build_distributed_dataset(ds, global_batch_size=64)  # doctest: +SKIP
>>> model.fit(dataset, callbacks=[tdu.callbacks.ThroughputLogger("logs")])  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tfdp_utils import callbacks, compat
    from tfdp_utils._tf import IS_KERAS3, KERAS_FLAVOUR
    from tfdp_utils.accumulation import enable_gradient_accumulation
    from tfdp_utils.batching import (
        GlobalBatchPlan,
        global_batch_size,
        num_replicas_in_sync,
        per_replica_batch_size,
        plan_global_batch,
        scale_learning_rate,
        steps_per_epoch,
    )
    from tfdp_utils.cluster import ClusterConfig, ClusterTimeoutError, cluster_task_type
    from tfdp_utils.construction import run_server
    from tfdp_utils.data import ShardingPlan, build_distributed_dataset, plan_sharding
    from tfdp_utils.data.single_device import single_device_dataset
    from tfdp_utils.data.splits import split_for_validation
    from tfdp_utils.dataset_info import DatasetInfo
    from tfdp_utils.environment import Environment, detect_environment
    from tfdp_utils.equivalence import (
        EquivalenceReport,
        ReplicaDivergenceError,
        check_replica_equivalence,
    )
    from tfdp_utils.faults import worker_backup_dir
    from tfdp_utils.schedules import WarmupSchedule
    from tfdp_utils.strategy import StrategyChoice, TPUProbeError, auto_strategy, choose_strategy
    from tfdp_utils.throughput import ThroughputMeter
    from tfdp_utils.training import DistributedTrainStep, make_distributed_train_step

# Public name -> the module that defines it. Importing tfdp_utils imports no TensorFlow; a
# name loads its module on first use, so the pure modules (cluster, throughput, ...) and the
# command line work without TensorFlow installed.
_HOMES: dict[str, str] = {
    "IS_KERAS3": "tfdp_utils._tf",
    "KERAS_FLAVOUR": "tfdp_utils._tf",
    "ClusterConfig": "tfdp_utils.cluster",
    "ClusterTimeoutError": "tfdp_utils.cluster",
    "DatasetInfo": "tfdp_utils.dataset_info",
    "DistributedTrainStep": "tfdp_utils.training",
    "Environment": "tfdp_utils.environment",
    "EquivalenceReport": "tfdp_utils.equivalence",
    "GlobalBatchPlan": "tfdp_utils.batching",
    "ReplicaDivergenceError": "tfdp_utils.equivalence",
    "ShardingPlan": "tfdp_utils.data",
    "StrategyChoice": "tfdp_utils.strategy",
    "TPUProbeError": "tfdp_utils.strategy",
    "ThroughputMeter": "tfdp_utils.throughput",
    "WarmupSchedule": "tfdp_utils.schedules",
    "auto_strategy": "tfdp_utils.strategy",
    "build_distributed_dataset": "tfdp_utils.data",
    "check_replica_equivalence": "tfdp_utils.equivalence",
    "choose_strategy": "tfdp_utils.strategy",
    "cluster_task_type": "tfdp_utils.cluster",
    "detect_environment": "tfdp_utils.environment",
    "enable_gradient_accumulation": "tfdp_utils.accumulation",
    "global_batch_size": "tfdp_utils.batching",
    "make_distributed_train_step": "tfdp_utils.training",
    "num_replicas_in_sync": "tfdp_utils.batching",
    "per_replica_batch_size": "tfdp_utils.batching",
    "plan_global_batch": "tfdp_utils.batching",
    "plan_sharding": "tfdp_utils.data",
    "run_server": "tfdp_utils.construction",
    "scale_learning_rate": "tfdp_utils.batching",
    "single_device_dataset": "tfdp_utils.data.single_device",
    "split_for_validation": "tfdp_utils.data.splits",
    "steps_per_epoch": "tfdp_utils.batching",
    "worker_backup_dir": "tfdp_utils.faults",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        value: Any = getattr(importlib.import_module(_HOMES[name]), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"tfdp_utils.{name}"):
        value = importlib.import_module(f"tfdp_utils.{name}")  # tdu.callbacks, tdu.strategy
    else:
        raise AttributeError(f"module 'tfdp_utils' has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if "tensorflow" in sys.modules:
    # TensorFlow is in use: register WarmupSchedule with Keras now, so that load_model finds
    # it after `import tensorflow; import tfdp_utils` (any TensorFlow part of tfdp-utils also
    # registers it on first use).
    importlib.import_module("tfdp_utils._tf")


__version__ = "0.1.0"

__all__ = [
    "IS_KERAS3",
    "KERAS_FLAVOUR",
    "ClusterConfig",
    "ClusterTimeoutError",
    "DatasetInfo",
    "DistributedTrainStep",
    "Environment",
    "EquivalenceReport",
    "GlobalBatchPlan",
    "ReplicaDivergenceError",
    "ShardingPlan",
    "StrategyChoice",
    "TPUProbeError",
    "ThroughputMeter",
    "WarmupSchedule",
    "__version__",
    "auto_strategy",
    "build_distributed_dataset",
    "callbacks",
    "check_replica_equivalence",
    "choose_strategy",
    "cluster_task_type",
    "compat",
    "detect_environment",
    "enable_gradient_accumulation",
    "global_batch_size",
    "make_distributed_train_step",
    "num_replicas_in_sync",
    "per_replica_batch_size",
    "plan_global_batch",
    "plan_sharding",
    "run_server",
    "scale_learning_rate",
    "single_device_dataset",
    "split_for_validation",
    "steps_per_epoch",
    "worker_backup_dir",
]
