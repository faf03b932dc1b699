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
    from tfdp_utils import callbacks as callbacks
    from tfdp_utils import cluster as cluster
    from tfdp_utils import compat as compat
    from tfdp_utils import data as data
    from tfdp_utils import errors as errors
    from tfdp_utils import strategy as strategy
    from tfdp_utils._dataset_info import DatasetInfo as DatasetInfo
    from tfdp_utils._tf import IS_KERAS3 as IS_KERAS3
    from tfdp_utils._tf import KERAS_FLAVOUR as KERAS_FLAVOUR
    from tfdp_utils.batching import GlobalBatchPlan as GlobalBatchPlan
    from tfdp_utils.batching import global_batch_size as global_batch_size
    from tfdp_utils.batching import num_replicas_in_sync as num_replicas_in_sync
    from tfdp_utils.batching import per_replica_batch_size as per_replica_batch_size
    from tfdp_utils.batching import plan_global_batch as plan_global_batch
    from tfdp_utils.batching import scale_learning_rate as scale_learning_rate
    from tfdp_utils.batching import steps_per_epoch as steps_per_epoch
    from tfdp_utils.cluster._config import ClusterConfig as ClusterConfig
    from tfdp_utils.cluster._environments import cluster_task_type as cluster_task_type
    from tfdp_utils.data._builder import build_distributed_dataset as build_distributed_dataset
    from tfdp_utils.data._builder import plan_sharding as plan_sharding
    from tfdp_utils.data._diagnose_input import diagnose_input as diagnose_input
    from tfdp_utils.data._input_report import InputDiagnosis as InputDiagnosis
    from tfdp_utils.data._sharding import ShardingPlan as ShardingPlan
    from tfdp_utils.data._single_device import single_device_dataset as single_device_dataset
    from tfdp_utils.data._splits import split_for_validation as split_for_validation
    from tfdp_utils.doctor._comparison import EquivalenceReport as EquivalenceReport
    from tfdp_utils.doctor._equivalence import (
        check_replica_equivalence as check_replica_equivalence,
    )
    from tfdp_utils.errors import ClusterTimeoutError as ClusterTimeoutError
    from tfdp_utils.errors import EndlessEpochError as EndlessEpochError
    from tfdp_utils.errors import KerasCompatError as KerasCompatError
    from tfdp_utils.errors import ReplicaDivergenceError as ReplicaDivergenceError
    from tfdp_utils.errors import ResumeMismatchError as ResumeMismatchError
    from tfdp_utils.errors import ServiceTimeoutError as ServiceTimeoutError
    from tfdp_utils.errors import StrategyMismatchError as StrategyMismatchError
    from tfdp_utils.errors import TfdpError as TfdpError
    from tfdp_utils.errors import TPUProbeError as TPUProbeError
    from tfdp_utils.schedules import WarmupSchedule as WarmupSchedule
    from tfdp_utils.strategy._backup_dir import worker_backup_dir as worker_backup_dir
    from tfdp_utils.strategy._build import run_server as run_server
    from tfdp_utils.strategy._choice import auto_strategy as auto_strategy
    from tfdp_utils.strategy._choice import choose_strategy as choose_strategy
    from tfdp_utils.strategy._detect import Environment as Environment
    from tfdp_utils.strategy._detect import detect_environment as detect_environment
    from tfdp_utils.strategy._strategy_choice import StrategyChoice as StrategyChoice
    from tfdp_utils.throughput._meter import ThroughputMeter as ThroughputMeter
    from tfdp_utils.training._accumulation import (
        enable_gradient_accumulation as enable_gradient_accumulation,
    )
    from tfdp_utils.training._step import DistributedTrainStep as DistributedTrainStep
    from tfdp_utils.training._step import make_distributed_train_step as make_distributed_train_step
    from tfdp_utils.training._step_files import ReplayedStep as ReplayedStep
    from tfdp_utils.training._step_files import replay_step as replay_step

__version__ = "0.1.0"

# The imports above are the public names, each written once: surface() reads them from this
# file's source for the table that loads a name's module on first use (importing tfdp_utils
# imports no TensorFlow, so the pure parts and the command line work without it), and for
# __all__ and dir().
__all__, __getattr__, __dir__ = surface(globals(), defined=["__version__"])

if "tensorflow" in sys.modules:
    # TensorFlow is in use: register WarmupSchedule with Keras now, so that load_model finds
    # it after `import tensorflow; import tfdp_utils` (any TensorFlow part of tfdp-utils also
    # registers it on first use, through tfdp_utils.compat).
    from tfdp_utils import schedules as _schedules  # noqa: F401
