"""tfdp-utils: data-parallel training for TensorFlow/Keras that works as hoped.

>>> import tfdp_utils as tdu
>>> strategy = tdu.auto_strategy()                                    # doctest: +SKIP
>>> dataset = tdu.build_distributed_dataset(ds, global_batch_size=64)  # doctest: +SKIP
>>> model.fit(dataset, callbacks=[tdu.callbacks.ThroughputLogger("logs")])  # doctest: +SKIP
"""

from tfdp_utils import callbacks, compat
from tfdp_utils._tf import IS_KERAS3, KERAS_FLAVOUR
from tfdp_utils.batching import (
    global_batch_size,
    num_replicas_in_sync,
    per_replica_batch_size,
    scale_learning_rate,
    steps_per_epoch,
)
from tfdp_utils.cluster import ClusterConfig, ClusterTimeoutError, cluster_task_type
from tfdp_utils.data import ShardingPlan, build_distributed_dataset, plan_sharding
from tfdp_utils.dataset_info import DatasetInfo
from tfdp_utils.environment import Environment, detect_environment
from tfdp_utils.faults import worker_backup_dir
from tfdp_utils.schedules import WarmupSchedule
from tfdp_utils.strategy import (
    StrategyChoice,
    TPUProbeError,
    auto_strategy,
    choose_strategy,
    run_server,
)
from tfdp_utils.throughput import ThroughputMeter
from tfdp_utils.training import make_distributed_train_step

__version__ = "0.1.0"

__all__ = [
    "IS_KERAS3",
    "KERAS_FLAVOUR",
    "ClusterConfig",
    "ClusterTimeoutError",
    "DatasetInfo",
    "Environment",
    "ShardingPlan",
    "StrategyChoice",
    "TPUProbeError",
    "ThroughputMeter",
    "WarmupSchedule",
    "__version__",
    "auto_strategy",
    "build_distributed_dataset",
    "callbacks",
    "choose_strategy",
    "cluster_task_type",
    "compat",
    "detect_environment",
    "global_batch_size",
    "make_distributed_train_step",
    "num_replicas_in_sync",
    "per_replica_batch_size",
    "plan_sharding",
    "run_server",
    "scale_learning_rate",
    "steps_per_epoch",
    "worker_backup_dir",
]
