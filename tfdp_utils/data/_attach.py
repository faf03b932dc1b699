"""Attaching a built dataset's info, its epoch's steps and its input clock.

:func:`attach` gives the distributed dataset its one record, ``tfdp`` (a
:class:`~tfdp_utils._dataset_info.DatasetRecord`: its info, its plan, an
:class:`~tfdp_utils.data._input_wait.InputClock`, how to build it again) and swaps its class
for a same-named subclass whose ``cardinality`` (where the class has one) is the builder's step
count, which Keras 3 takes as the epoch's steps, and whose iterators time each worker's fetch of
the next batch with that clock. It also
makes sure Keras' ``fit``/``evaluate``/``predict`` check the dataset's step count and hand it to
the call's callbacks (:mod:`tfdp_utils.compat._fit_binding`): nothing about the dataset is kept in
process-wide state. Both changes go through the compat registry (``"builder-dataset-class"``,
``"fit-binding"``), which :func:`tfdp_utils.compat.status` lists.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from tfdp_utils._dataset_info import DatasetInfo, DatasetRecord, StreamPosition, carry, info_of
from tfdp_utils.compat import _changes as compat_changes
from tfdp_utils.data import _input_wait as input_wait
from tfdp_utils.data._sharding import ShardingPlan

logger = logging.getLogger("tfdp_utils")

_BUILDER = "build_distributed_dataset()"
_STEP_CLASSES: dict[type, type] = {}
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
        info = info_of(self)
        if info is None or int(value) == _INFINITE_CARDINALITY:
            return value
        # Known counts give the steps even where TensorFlow cannot tell (a step cut into
        # replica batches by unbatch has unknown cardinality).
        if info.steps_per_epoch is not None and not info.repeat:
            return type(value)(info.steps_per_epoch)
        return type(value)(_UNKNOWN_CARDINALITY)

    return cardinality


def _timed_iter(base_iter: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``__iter__`` returning an iterator that times its waits for input (``InputClock``)."""

    def __iter__(self: Any) -> Any:
        iterator = base_iter(self)
        clock = input_wait.clock_of(self)
        return iterator if clock is None else input_wait.timed_iterator(iterator, clock)

    return __iter__


def _steps_class(base: type) -> type:
    """A same-named subclass of ``base`` whose ``cardinality`` counts steps and whose
    iterators time their waits for input, or ``base``."""
    cls = _STEP_CLASSES.get(base)
    if cls is None:
        namespace: dict[str, Any] = {"__module__": __name__}
        base_cardinality = inspect.getattr_static(base, "cardinality", None)
        if isinstance(base_cardinality, property) and base_cardinality.fget is not None:
            namespace["cardinality"] = property(_steps_cardinality(base_cardinality.fget))
        base_iter = getattr(base, "__iter__", None)
        if input_wait.can_time(base) and callable(base_iter):
            namespace["__iter__"] = _timed_iter(base_iter)
        if len(namespace) == 1:
            return base
        # Same name, so that code matching on the class name (Keras' data adapters walk
        # the MRO for "DistributedDatasetsFromFunction") still recognises it.
        cls = type(base.__name__, (base,), namespace)
        _STEP_CLASSES[base] = cls
    return cls


def _host_device(dist: Any) -> str | None:
    """This worker's input device (where tf.distribute runs the input pipeline)."""
    workers = getattr(dist, "_input_workers", None)
    devices = getattr(workers, "worker_devices", None) or ()
    return str(devices[0]) if devices else None


def attach(
    dist: Any,
    info: DatasetInfo,
    plan: ShardingPlan,
    *,
    resumable: Callable[[], Any] | None = None,
    rebuild_on_one_device: Callable[[], Any] | None = None,
    position: StreamPosition | None = None,
    example_index: Callable[[], Any] | None = None,
    learnable: Callable[[], Any] | None = None,
) -> Any:
    """``dist`` carrying its record (``dist.tfdp``) and its epoch's step count.

    Args:
        dist: the distributed dataset (a ``tf.data.Dataset`` under the default strategy).
        info: its :class:`~tfdp_utils._dataset_info.DatasetInfo`.
        plan: the :class:`~tfdp_utils.data._sharding.ShardingPlan` it was built with.
        resumable: builds its :class:`~tfdp_utils.data._positioned.Resumable`, where it has
            one. Defaults to `None`.
        rebuild_on_one_device: builds it again for one device. Defaults to `None`.
        position: where it starts, for a resumed stream. Defaults to `None`.
        example_index: builds what names the source indices of a step's examples (see
            :class:`~tfdp_utils._dataset_info.DatasetRecord`). Defaults to `None`.
        learnable: builds its :class:`~tfdp_utils.data._learned_epochs.Learnable` (a dataset
            of unknown size). Defaults to `None`.
    """
    clock = None
    if input_wait.can_time(type(dist)):  # a tf.distribute dataset (not a plain tf.data one)
        clock = input_wait.InputClock(_host_device(dist))
    record = DatasetRecord(
        info,
        plan,
        input_clock=clock,
        resumable=resumable,
        rebuild_on_one_device=rebuild_on_one_device,
        position=position,
        example_index=example_index,
        learnable=learnable,
    )
    carry(dist, record)
    # fit/evaluate/predict check the dataset and hand it to callbacks; on tf_keras they also
    # take the epoch's steps from the dataset's info, as Keras 3 does.
    compat_changes.prepare_for_datasets(applied_by=_BUILDER)
    steps_class = _steps_class(type(dist))
    if steps_class is not type(dist):
        try:
            compat_changes.swap_dataset_class(dist, steps_class, applied_by=_BUILDER)
        except TypeError:  # pragma: no cover - a class that forbids __class__ assignment
            logger.warning(
                "tfdp_utils: cannot set the step count of %s; Keras takes the epoch's steps "
                "from TensorFlow's cardinality instead.",
                type(dist).__name__,
            )
    return dist
