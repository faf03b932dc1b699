"""What a distributed dataset from the builder holds, in exact counts, for whoever consumes it.

Pure Python. :func:`tfdp_utils.build_distributed_dataset` attaches one
:class:`DatasetRecord` to the dataset it returns (attribute ``tfdp``): its :class:`DatasetInfo`,
its plan, its input clock and how to build it again. ``fit`` hands the dataset it trains on to
its callbacks (:mod:`tfdp_utils.compat._fit_binding`), so the throughput callbacks know the
global batch size and the exact number of examples each replica receives in each step,
partial last batch included, without extra arguments.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable
from typing import Any

from tfdp_utils._public import public


@public("tfdp_utils")
@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """Exact shape of one epoch of a distributed dataset.

    Attributes:
        global_batch_size: examples in a full step, summed over all replicas of all workers.
        per_replica_batch_size: examples one replica receives in a full step.
        num_replicas_in_sync: replicas over all workers.
        num_workers: worker processes.
        examples_per_epoch: examples trained per epoch over all workers, or None if unknown
            (e.g. an infinite or unsized source).
        steps_per_epoch: steps every worker runs per epoch, or None if unknown.
        full_steps: steps at the start of each epoch in which every replica receives
            ``per_replica_batch_size`` examples. None when unknown (then every step is full).
        tail: for each step after ``full_steps``, the examples each replica receives, by
            global replica id. Empty when the epoch has no partial step. The builder splits
            each worker's partial last step evenly over that worker's replicas (28 over 2 ->
            ``(14, 14)``), except for sparse elements (replicas filled in order: ``(28, 0)``).
        repeat: whether the dataset repeats without end (epochs then come from
            ``steps_per_epoch`` passed to ``fit``). When ``steps_per_epoch`` and
            ``full_steps`` are also known, the dataset repeats whole epochs: every
            ``steps_per_epoch`` steps, counted from the start of iteration, repeat the same
            layout (the builder pads each worker's epoch with empty batches to keep them
            aligned). Otherwise every step of a repeating dataset is full.
        exact: whether :meth:`examples_in_step` is what each replica receives in every step.
            False when the builder cannot know: an epoch of unknown size ends in a partial
            step it cannot see, or a source function batches by itself; the counts then take
            every step as full.
        inexact_reason: why ``exact`` is False, in words, where the builder says (e.g. the
            tf.data service's ``distributed_epoch`` mode); empty otherwise, and
            :meth:`derived_reason` then words it from the other fields.
    """

    global_batch_size: int
    per_replica_batch_size: int
    num_replicas_in_sync: int
    num_workers: int = 1
    examples_per_epoch: int | None = None
    steps_per_epoch: int | None = None
    full_steps: int | None = None
    tail: tuple[tuple[int, ...], ...] = ()
    repeat: bool = False
    exact: bool = True
    inexact_reason: str = ""

    def derived_reason(self) -> str | None:
        """Why counts taken from this info are derived rather than exact; None when exact."""
        if self.exact:
            return None
        if self.inexact_reason:
            return self.inexact_reason
        return (
            "the builder cannot see where each epoch of this dataset ends or what its last "
            "step holds (a source of unknown size, a source function that batches by itself, "
            "or the tf.data service's distributed_epoch mode), so every step is counted as "
            f"{self.global_batch_size} examples and a partial last step is over-counted"
        )

    def examples_in_step(self, step_in_epoch: int) -> tuple[int, ...]:
        """Examples each replica (by global replica id) receives in step ``step_in_epoch``.

        Steps count from 0 at the start of each epoch. Past the end of a known epoch the
        replicas receive nothing.
        """
        full = (self.per_replica_batch_size,) * self.num_replicas_in_sync
        if self.full_steps is None or step_in_epoch < self.full_steps:
            return full
        offset = step_in_epoch - self.full_steps
        if offset < len(self.tail):
            return self.tail[offset]
        return (0,) * self.num_replicas_in_sync

    def examples_in_epoch_range(self, first: int, last: int) -> tuple[int, ...]:
        """Per-replica examples in the steps at positions ``first .. last - 1`` of one epoch.

        Positions past the epoch's steps count nothing: Keras 3 can run one more (empty) step
        than the epoch has batches before the iterator reports its end.
        """
        replicas = self.num_replicas_in_sync
        if last <= first:
            return (0,) * replicas
        if self.full_steps is None:
            return (self.per_replica_batch_size * (last - first),) * replicas
        full = max(0, min(last, self.full_steps) - max(first, 0))
        totals = [self.per_replica_batch_size * full] * replicas
        end = min(last, self.full_steps + len(self.tail))
        for position in range(max(first, self.full_steps), end):
            for i, value in enumerate(self.tail[position - self.full_steps]):
                totals[i] += value
        return tuple(totals)

    def examples_in_steps(self, first_step: int, last_step: int) -> tuple[int, ...]:
        """Per-replica examples summed over steps ``first_step`` .. ``last_step - 1`` (global).

        Steps are counted from the start of training (as ``optimizer.iterations`` counts);
        epoch boundaries come from ``steps_per_epoch`` when known, and each epoch's part is
        :meth:`examples_in_epoch_range`.
        """
        if last_step <= first_step:
            return (0,) * self.num_replicas_in_sync
        if self.full_steps is None or not self.steps_per_epoch:
            return (self.per_replica_batch_size * (last_step - first_step),) * (
                self.num_replicas_in_sync
            )
        per_epoch = self.steps_per_epoch
        totals = [0] * self.num_replicas_in_sync
        step = first_step
        while step < last_step:
            epoch_start = step - step % per_epoch
            end = min(last_step, epoch_start + per_epoch)
            part = self.examples_in_epoch_range(step - epoch_start, end - epoch_start)
            for i, value in enumerate(part):
                totals[i] += value
            step = end
        return tuple(totals)


_lock = threading.Lock()


_strategy_ref: Callable[[], Any] | None = None


def record_strategy(strategy: Any) -> None:
    """Note the strategy that :func:`tfdp_utils.auto_strategy` built in this process.

    The builder reads it back (:func:`last_strategy`) to warn when ``strategy=None`` resolves
    to TensorFlow's default strategy while a multi-replica one exists. Held by weak
    reference where the strategy allows it, so the record keeps nothing alive.
    """
    global _strategy_ref
    try:
        ref: Callable[[], Any] = weakref.ref(strategy)
    except TypeError:  # an object without weak reference support: hold it
        ref = lambda: strategy  # noqa: E731
    with _lock:
        _strategy_ref = ref


def last_strategy() -> Any:
    """The strategy :func:`record_strategy` noted last, or None (none, or since collected)."""
    with _lock:
        ref = _strategy_ref
    return None if ref is None else ref()


@dataclasses.dataclass(frozen=True)
class StreamPosition:
    """Where a resumed builder dataset starts (``PreemptionCheckpoint``): its first element
    is step ``step`` of epoch ``epoch`` of a job that began at epoch 0, step 0.

    Attributes:
        epoch: the epoch the stream starts in (0-based).
        step: the steps of that epoch trained before (the stream starts after them).
        built_from: the info of the dataset the stream was rebuilt from (as the builder made
            it, before its epochs were aligned).
        shape_change: how the job's shape changed at this position (an elastic resume on
            another number of replicas or workers, e.g. ``"2 workers x 1 replica (4 examples
            per replica) -> 1 worker x 2 replicas (4 examples per replica)"``), or None.
        step_offset: steps the job trained before ``epoch * steps_per_epoch + step`` counts
            (the rest of an epoch of files sharded by file, laid out on a shape whose epochs
            have another number of steps): the job's global step at the stream's start is
            ``step_offset + epoch * steps_per_epoch + step``.
    """

    epoch: int
    step: int
    built_from: DatasetInfo | None = None
    shape_change: str | None = None
    step_offset: int = 0


@dataclasses.dataclass(frozen=True)
class DatasetRecord:
    """What a dataset from the builder carries, as its one attribute ``tfdp``.

    The plan, the clock and the factories are the data pillar's objects, which this floor
    module does not import: they are typed loosely here and named below.

    Attributes:
        info: the exact shape of one epoch, for whoever consumes the dataset.
        plan: the :class:`~tfdp_utils.ShardingPlan` it was built with.
        input_clock: the :class:`~tfdp_utils.data._input_wait.InputClock` timing this
            worker's fetches of the next batch; None on a plain ``tf.data.Dataset`` (the
            default strategy, one device), whose iterators are not timed.
        resumable: builds the :class:`~tfdp_utils.data._positioned.Resumable` that starts the
            same data at a step of an epoch (``PreemptionCheckpoint``, one iterator per job;
            it returns None where the epochs cannot be aligned); None where the dataset
            cannot be positioned at all (the tf.data service, a source function that batches
            itself, a stream already positioned).
        rebuild_on_one_device: builds the same data again as one ``tf.data.Dataset``
            (:func:`~tfdp_utils.single_device_dataset`); None for a positioned stream.
        position: where a resumed stream starts; None for a dataset as the builder made it.
        replaces: for the stream ``fit`` trains on instead of a builder dataset (one iterator
            per job, :mod:`tfdp_utils.compat._one_iterator`), that dataset; None otherwise.
        example_index: builds the :class:`~tfdp_utils.data._replay.ExampleIndex` that names
            the source indices of a step's examples (``DivergenceGuard``), or a sentence
            saying why they have none; None where the builder cannot say (the tf.data
            service, a source function that batches itself).
        learnable: for a dataset of unknown size, builds the
            :class:`~tfdp_utils.data._learned_epochs.Learnable` that streams its epochs padded
            to the steps ``fit`` learns in the first one (returns None where it cannot); None
            for every other dataset.
    """

    info: DatasetInfo
    plan: Any
    input_clock: Any = None
    resumable: Callable[[], Any] | None = None
    rebuild_on_one_device: Callable[[], Any] | None = None
    position: StreamPosition | None = None
    replaces: Any = None
    example_index: Callable[[], Any] | None = None
    learnable: Callable[[], Any] | None = None


def carry(dataset: Any, record: DatasetRecord) -> Any:
    """``dataset`` carrying ``record`` as ``dataset.tfdp``; the one place that sets it."""
    dataset.tfdp = record
    # Documented before the record existed (docs/data.md, docs/migrating.md,
    # docs/scale-out.md), so kept for users: aliases of the record's fields, set only here
    # and read by nothing in the package.
    dataset.tfdp_info = record.info
    dataset.tfdp_plan = record.plan
    if record.input_clock is not None:
        dataset.tfdp_input_clock = record.input_clock
    return dataset


def record_of(dataset: Any) -> DatasetRecord | None:
    """The :class:`DatasetRecord` a dataset from the builder carries, or None."""
    record = getattr(dataset, "tfdp", None)
    return record if isinstance(record, DatasetRecord) else None


def info_of(dataset: Any) -> DatasetInfo | None:
    """The :class:`DatasetInfo` of a dataset from the builder, or None."""
    record = record_of(dataset)
    info = None if record is None else record.info
    return info if isinstance(info, DatasetInfo) else None


def resumable_of(dataset: Any) -> Callable[[], Any] | None:
    """How to build a builder dataset from a step of an epoch (its record's ``resumable``),
    or None."""
    record = record_of(dataset)
    return None if record is None else record.resumable


def position_of_stream(dataset: Any) -> StreamPosition | None:
    """The :class:`StreamPosition` of a resumed builder dataset, or None."""
    record = record_of(dataset)
    position = None if record is None else record.position
    return position if isinstance(position, StreamPosition) else None
