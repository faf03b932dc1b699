"""Attaching a built dataset's info: the class patch that records iteration and reports steps.

:func:`attach` sets ``tfdp_info`` and ``tfdp_plan`` on the distributed dataset and swaps its
class for a same-named subclass whose ``__iter__`` records the iteration for the throughput
callbacks (:func:`tfdp_utils.dataset_info.record_iteration`) and whose ``cardinality`` is
the builder's step count, which Keras 3 takes as the epoch's steps.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from tfdp_utils import dataset_info
from tfdp_utils.data.sharding import ShardingPlan
from tfdp_utils.dataset_info import DatasetInfo

logger = logging.getLogger("tfdp_utils")

_RECORDING_CLASSES: dict[type, type] = {}
_UNKNOWN_CARDINALITY = -2  # tf.data.UNKNOWN_CARDINALITY
_INFINITE_CARDINALITY = -1  # tf.data.INFINITE_CARDINALITY


def _steps_cardinality(fget: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``cardinality`` as steps per epoch, for Keras 3, which takes it as its step count.

    TensorFlow reports the number of per-replica batches of one worker's dataset, which is
    not the number of steps with several replicas per worker, and differs between workers
    whose shares differ: Keras would then end epochs early, or at different steps on
    different workers. The exact step count, or "unknown" (iterate until the synchronised
    end of data), is right in every case.
    """

    def cardinality(self: Any) -> Any:
        value = fget(self)
        info = getattr(self, "tfdp_info", None)
        if not isinstance(info, DatasetInfo) or int(value) == _INFINITE_CARDINALITY:
            return value
        # Known counts give the steps even where TensorFlow cannot tell (a step cut into
        # replica batches by unbatch has unknown cardinality).
        if info.steps_per_epoch is not None and not info.repeat:
            return type(value)(info.steps_per_epoch)
        return type(value)(_UNKNOWN_CARDINALITY)

    return cardinality


def _recording_class(base: type) -> type:
    """A subclass of ``base`` whose ``__iter__`` records the iteration for the callbacks."""
    cls = _RECORDING_CLASSES.get(base)
    if cls is None:

        def __iter__(self: Any) -> Any:
            info = getattr(self, "tfdp_info", None)
            if isinstance(info, DatasetInfo):
                dataset_info.record_iteration(info)
            return base.__iter__(self)  # type: ignore[attr-defined]

        namespace: dict[str, Any] = {"__iter__": __iter__, "__module__": __name__}
        base_cardinality = inspect.getattr_static(base, "cardinality", None)
        if isinstance(base_cardinality, property) and base_cardinality.fget is not None:
            namespace["cardinality"] = property(_steps_cardinality(base_cardinality.fget))
        # Same name, so that code matching on the class name (Keras' data adapters walk
        # the MRO for "DistributedDatasetsFromFunction") still recognises it.
        cls = type(base.__name__, (base,), namespace)
        _RECORDING_CLASSES[base] = cls
    return cls


def attach(dist: Any, info: DatasetInfo, plan: ShardingPlan) -> Any:
    """``dist`` with ``tfdp_info`` and ``tfdp_plan`` set and its iterations recorded."""
    from tfdp_utils import compat

    dist.tfdp_info = info
    dist.tfdp_plan = plan
    # tf_keras: fit/evaluate then take the epoch's steps from tfdp_info, as Keras 3 does.
    compat.apply_for_datasets()
    try:
        dist.__class__ = _recording_class(type(dist))
    except TypeError:  # pragma: no cover - a class that forbids __class__ assignment
        logger.warning(
            "tfdp_utils: cannot record iterations of %s; callbacks find the dataset info only "
            "through tfdp_utils.dataset_info.info_of(dataset).",
            type(dist).__name__,
        )
    return dist


__all__ = ["attach"]
