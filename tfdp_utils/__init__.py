"""tfdp-utils: data-parallel training for TensorFlow/Keras that works as hoped.

The public API is this module's ``__all__``: the names below, and the documented surfaces of
the subpackages it lists (``callbacks``, ``cluster``, ``compat``, ``data``, ``errors``,
``strategy``). Every other module is internal (its name starts with ``_``).

>>> import tfdp_utils as tdu
>>> strategy = tdu.auto_strategy()                                    # doctest: +SKIP
>>> dataset = tdu.build_distributed_dataset(ds, global_batch_size=64)  # doctest: +SKIP
>>> model.fit(dataset, callbacks=[tdu.callbacks.ThroughputLogger("logs")])  # doctest: +SKIP
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from tfdp_utils._lazy import surface

if TYPE_CHECKING:
    from tfdp_utils import callbacks, cluster, compat, data, errors, strategy
    from tfdp_utils._dataset_info import DatasetInfo
    from tfdp_utils._tf import IS_KERAS3, KERAS_FLAVOUR
    from tfdp_utils.batching import (
        GlobalBatchPlan,
        global_batch_size,
        num_replicas_in_sync,
        per_replica_batch_size,
        plan_global_batch,
        scale_learning_rate,
        steps_per_epoch,
    )
    from tfdp_utils.cluster._config import ClusterConfig
    from tfdp_utils.cluster._environments import cluster_task_type
    from tfdp_utils.data._builder import build_distributed_dataset, plan_sharding
    from tfdp_utils.data._diagnose_input import diagnose_input
    from tfdp_utils.data._input_report import InputDiagnosis
    from tfdp_utils.data._sharding import ShardingPlan
    from tfdp_utils.data._single_device import single_device_dataset
    from tfdp_utils.data._splits import split_for_validation
    from tfdp_utils.doctor._comparison import EquivalenceReport
    from tfdp_utils.doctor._equivalence import check_replica_equivalence
    from tfdp_utils.errors import (
        ClusterTimeoutError,
        EndlessEpochError,
        KerasCompatError,
        ReplicaDivergenceError,
        ResumeMismatchError,
        ServiceTimeoutError,
        StrategyMismatchError,
        TfdpError,
        TPUProbeError,
    )
    from tfdp_utils.schedules import WarmupSchedule
    from tfdp_utils.strategy._backup_dir import worker_backup_dir
    from tfdp_utils.strategy._build import run_server
    from tfdp_utils.strategy._choice import auto_strategy, choose_strategy
    from tfdp_utils.strategy._detect import Environment, detect_environment
    from tfdp_utils.strategy._strategy_choice import StrategyChoice
    from tfdp_utils.throughput._meter import ThroughputMeter
    from tfdp_utils.training._accumulation import enable_gradient_accumulation
    from tfdp_utils.training._step import DistributedTrainStep, make_distributed_train_step

# Public name -> the module that defines it. Importing tfdp_utils imports no TensorFlow; a
# name loads its module on first use, so the pure parts (cluster, throughput, errors) and the
# command line work without TensorFlow installed.
_HOMES: dict[str, str] = {
    "IS_KERAS3": "tfdp_utils._tf",
    "KERAS_FLAVOUR": "tfdp_utils._tf",
    "ClusterConfig": "tfdp_utils.cluster._config",
    "ClusterTimeoutError": "tfdp_utils.errors",
    "DatasetInfo": "tfdp_utils._dataset_info",
    "DistributedTrainStep": "tfdp_utils.training._step",
    "EndlessEpochError": "tfdp_utils.errors",
    "Environment": "tfdp_utils.strategy._detect",
    "EquivalenceReport": "tfdp_utils.doctor._comparison",
    "GlobalBatchPlan": "tfdp_utils.batching",
    "InputDiagnosis": "tfdp_utils.data._input_report",
    "KerasCompatError": "tfdp_utils.errors",
    "ReplicaDivergenceError": "tfdp_utils.errors",
    "ResumeMismatchError": "tfdp_utils.errors",
    "ServiceTimeoutError": "tfdp_utils.errors",
    "ShardingPlan": "tfdp_utils.data._sharding",
    "StrategyChoice": "tfdp_utils.strategy._strategy_choice",
    "StrategyMismatchError": "tfdp_utils.errors",
    "TPUProbeError": "tfdp_utils.errors",
    "TfdpError": "tfdp_utils.errors",
    "ThroughputMeter": "tfdp_utils.throughput._meter",
    "WarmupSchedule": "tfdp_utils.schedules",
    "auto_strategy": "tfdp_utils.strategy._choice",
    "build_distributed_dataset": "tfdp_utils.data._builder",
    "callbacks": "tfdp_utils.callbacks",
    "check_replica_equivalence": "tfdp_utils.doctor._equivalence",
    "choose_strategy": "tfdp_utils.strategy._choice",
    "cluster": "tfdp_utils.cluster",
    "cluster_task_type": "tfdp_utils.cluster._environments",
    "compat": "tfdp_utils.compat",
    "data": "tfdp_utils.data",
    "detect_environment": "tfdp_utils.strategy._detect",
    "diagnose_input": "tfdp_utils.data._diagnose_input",
    "enable_gradient_accumulation": "tfdp_utils.training._accumulation",
    "errors": "tfdp_utils.errors",
    "global_batch_size": "tfdp_utils.batching",
    "make_distributed_train_step": "tfdp_utils.training._step",
    "num_replicas_in_sync": "tfdp_utils.batching",
    "per_replica_batch_size": "tfdp_utils.batching",
    "plan_global_batch": "tfdp_utils.batching",
    "plan_sharding": "tfdp_utils.data._builder",
    "run_server": "tfdp_utils.strategy._build",
    "scale_learning_rate": "tfdp_utils.batching",
    "single_device_dataset": "tfdp_utils.data._single_device",
    "split_for_validation": "tfdp_utils.data._splits",
    "steps_per_epoch": "tfdp_utils.batching",
    "strategy": "tfdp_utils.strategy",
    "worker_backup_dir": "tfdp_utils.strategy._backup_dir",
}

__version__ = "0.1.0"

__all__ = [
    "IS_KERAS3",
    "KERAS_FLAVOUR",
    "ClusterConfig",
    "ClusterTimeoutError",
    "DatasetInfo",
    "DistributedTrainStep",
    "EndlessEpochError",
    "Environment",
    "EquivalenceReport",
    "GlobalBatchPlan",
    "InputDiagnosis",
    "KerasCompatError",
    "ReplicaDivergenceError",
    "ResumeMismatchError",
    "ServiceTimeoutError",
    "ShardingPlan",
    "StrategyChoice",
    "StrategyMismatchError",
    "TPUProbeError",
    "TfdpError",
    "ThroughputMeter",
    "WarmupSchedule",
    "__version__",
    "auto_strategy",
    "build_distributed_dataset",
    "callbacks",
    "check_replica_equivalence",
    "choose_strategy",
    "cluster",
    "cluster_task_type",
    "compat",
    "data",
    "detect_environment",
    "diagnose_input",
    "enable_gradient_accumulation",
    "errors",
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
    "strategy",
    "worker_backup_dir",
]

__getattr__, __dir__ = surface(__name__, _HOMES, globals(), __all__)

if "tensorflow" in sys.modules:
    # TensorFlow is in use: register WarmupSchedule with Keras now, so that load_model finds
    # it after `import tensorflow; import tfdp_utils` (any TensorFlow part of tfdp-utils also
    # registers it on first use, through tfdp_utils.compat).
    from tfdp_utils import schedules as _schedules  # noqa: F401
