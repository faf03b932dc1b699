"""tfdp-utils: data-parallel training for TensorFlow/Keras that works as hoped.

>>> import tfdp_utils as tdu
>>> strategy = tdu.auto_strategy()                                    # doctest: +SKIP
>>> dataset = tdu.build_distributed_dataset(ds, global_batch_size=64)  # doctest: +SKIP
>>> model.fit(dataset, callbacks=[tdu.callbacks.ThroughputLogger("logs")])  # doctest: +SKIP
"""

from tfdp_utils._tf import IS_KERAS3, KERAS_FLAVOUR
from tfdp_utils.cluster import ClusterConfig, ClusterTimeoutError
from tfdp_utils.data import ShardingPlan, build_distributed_dataset, plan_sharding
from tfdp_utils.dataset_info import DatasetInfo
from tfdp_utils.environment import Environment, detect_environment
from tfdp_utils.strategy import (
    StrategyChoice,
    TPUProbeError,
    auto_strategy,
    choose_strategy,
)

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
    "__version__",
    "auto_strategy",
    "build_distributed_dataset",
    "choose_strategy",
    "detect_environment",
    "plan_sharding",
]
