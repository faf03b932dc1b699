"""The epoch layout: how many steps an epoch has and what each replica receives in each.

Pure Python (no TensorFlow). From the examples each worker holds (the sharding plan's
``examples_per_worker``) and the shape of a step (:class:`StepShape`), :func:`epoch_layout`
counts the examples of every replica in every step, and :func:`plan_epochs` says how the
per-worker pipeline batches, trims and repeats so that those counts come true; the
:class:`~tfdp_utils._dataset_info.DatasetInfo` the builder attaches is made from them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Literal

from tfdp_utils._dataset_info import DatasetInfo

Repeat = bool | Literal["epochs"]
REPEAT_MODES: tuple[Repeat, ...] = (False, True, "epochs")


def _is_bool(value: Any) -> bool:
    # A Python bool, or NumPy's (``numpy.bool_``; ``numpy.bool`` in NumPy 2), as _validate takes.
    return isinstance(value, bool) or (
        type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")
    )


def check_repeat(repeat: Any) -> Repeat:
    """``repeat`` when it is one of :data:`REPEAT_MODES`, else ``ValueError``.

    Only the documented values: a bool (Python's or NumPy's) or the string ``"epochs"``. A
    number is refused although ``1 == True``: ``repeat=1`` reads as "once" and would repeat
    without end, and ``repeat=2`` is not a count of repetitions either.
    """
    if _is_bool(repeat):
        return bool(repeat)
    if isinstance(repeat, str) and repeat == "epochs":
        return "epochs"
    if isinstance(repeat, (int, float)) or type(repeat).__module__ == "numpy":
        fix = (
            " repeat takes no count: for N passes over the data pass repeat=False and "
            "fit(epochs=N) (each epoch is one pass); repeat=True repeats without end."
        )
    elif isinstance(repeat, str):
        fix = " Strings other than 'epochs' are not read as booleans: pass True or False."
    else:
        fix = " Pass repeat=False (one pass per epoch, the default), True or 'epochs'."
    raise ValueError(
        f"repeat={repeat!r} is not supported; expected False, True (repeat examples) or "
        f"'epochs' (repeat whole epochs, padded to equal steps).{fix}"
    )


@dataclasses.dataclass(frozen=True)
class StepShape:
    """How many examples one step holds and how the replicas are spread over the workers.

    Attributes:
        per_replica_batch_size: examples per replica in a full step.
        num_replicas_in_sync: replicas over all workers.
        num_workers: input pipelines (worker processes).
    """

    per_replica_batch_size: int
    num_replicas_in_sync: int
    num_workers: int = 1

    @property
    def global_batch_size(self) -> int:
        """Examples in a full step over all replicas."""
        return self.per_replica_batch_size * self.num_replicas_in_sync

    @property
    def replicas_per_worker(self) -> int:
        """Replicas each worker runs (at least one)."""
        return max(1, self.num_replicas_in_sync // self.num_workers)


@dataclasses.dataclass(frozen=True)
class EpochLayout:
    """What each replica receives in one epoch (see :func:`epoch_layout`).

    Attributes:
        steps: steps every worker runs.
        full_steps: leading steps in which every replica receives a full batch.
        tail: per-replica examples (by global replica id) of each later step.
        examples: examples trained per epoch over all replicas.
        dropped: examples of the epoch that no replica receives (``drop_remainder=True``).
    """

    steps: int
    full_steps: int
    tail: tuple[tuple[int, ...], ...]
    examples: int
    dropped: int


def split_evenly(examples: int, parts: int) -> tuple[int, ...]:
    """``examples`` split into ``parts`` counts that differ by at most one, larger first. Pure.

    >>> split_evenly(29, 2)
    (15, 14)
    """
    return tuple(
        examples // parts + (1 if index < examples % parts else 0) for index in range(parts)
    )


def epoch_layout(
    examples_per_worker: Sequence[int],
    per_replica_batch_size: int,
    replicas_per_worker: int,
    *,
    drop_remainder: bool = False,
    split_last_step: bool = True,
) -> EpochLayout:
    """Per-step, per-replica example counts of one epoch. Pure.

    Each worker fills steps of ``per_replica_batch_size * replicas_per_worker`` examples from
    its own share. With ``split_last_step`` (what the builder does for dense elements), the
    worker's last, partial step is split as evenly as possible over its local replicas
    (28 over 2 -> 14 + 14), so a replica is left empty only when the worker has fewer
    examples left than replicas. Without it, local replicas take consecutive batches of
    ``per_replica_batch_size`` (28 over 2 replicas of 32 -> 28 + 0). Every worker runs as
    many steps as the busiest one; a worker with no examples left gets empty batches. With
    ``drop_remainder=True`` every worker keeps only the full steps that all workers can fill.

    Args:
        examples_per_worker: examples each worker holds, by worker index.
        per_replica_batch_size: examples per replica in a full step.
        replicas_per_worker: replicas on each worker.
        drop_remainder: drop what does not fill a step on every replica. Defaults to `False`.
        split_last_step: split each worker's partial last step evenly over its replicas.
            Defaults to `True`.

    Returns:
        An :class:`EpochLayout`.
    """
    batch, local = per_replica_batch_size, replicas_per_worker
    per_step_examples = batch * local
    total = sum(examples_per_worker)
    if drop_remainder:
        steps = min((n // per_step_examples for n in examples_per_worker), default=0)
        examples = steps * per_step_examples * len(examples_per_worker)
        return EpochLayout(steps, steps, (), examples, total - examples)
    steps = max((math.ceil(n / per_step_examples) for n in examples_per_worker), default=0)
    per_step: list[tuple[int, ...]] = []
    for step in range(steps):
        row: list[int] = []
        for n in examples_per_worker:
            left = max(0, n - step * per_step_examples)
            if split_last_step and left < per_step_examples:
                row.extend(split_evenly(left, local))
                continue
            for replica in range(local):
                row.append(max(0, min(batch, left - replica * batch)))
        per_step.append(tuple(row))
    full = (batch,) * (local * len(examples_per_worker))
    full_steps = 0
    while full_steps < steps and per_step[full_steps] == full:
        full_steps += 1
    return EpochLayout(steps, full_steps, tuple(per_step[full_steps:]), total, 0)


def splits_last_step(
    replicas_per_worker: int, *, drop_remainder: bool, repeat_by_example: bool, dense: bool
) -> bool:
    """Whether the pipeline cuts whole steps into replica batches (see :func:`epoch_layout`).

    Only for several replicas per worker, dense elements (a step is cut by row lengths, which
    sparse elements do not take) and epochs that can end in a partial step.
    """
    if replicas_per_worker < 2 or drop_remainder or repeat_by_example:
        return False
    return dense


def needs_element_check(
    examples_per_worker: Sequence[int] | None,
    *,
    repeat: Repeat,
    replicas_per_worker: int,
    drop_remainder: bool,
) -> bool:
    """Whether :func:`plan_epochs` depends on the batched elements being dense.

    The builder then maps one element spec (tracing ``map_fn`` once) to find out. A
    ``fn(input_context)`` source never has known examples per worker, so it never needs one.
    """
    if examples_per_worker is None:
        return False
    return repeat == "epochs" or (replicas_per_worker > 1 and not drop_remainder)


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """How each worker batches, trims and repeats its share (see :func:`plan_epochs`).

    Attributes:
        layout: the epoch's per-step, per-replica counts; None when the size is unknown.
        split_last_step: whether whole steps are cut into replica batches, the last one
            evenly.
        take_per_worker: examples each worker keeps (``drop_remainder``), when known.
        epoch_batches: with ``repeat="epochs"`` on dense elements, the batches each worker
            holds per epoch (in the unit the pipeline batches); epochs are then padded with
            empty batches to ``layout.steps`` steps. None otherwise.
        exact: whether the layout describes every epoch the dataset yields.
    """

    layout: EpochLayout | None
    split_last_step: bool = False
    take_per_worker: int | None = None
    epoch_batches: tuple[int, ...] | None = None
    exact: bool = False

    @property
    def epoch_steps(self) -> int | None:
        """Steps each padded epoch holds (with ``epoch_batches``), else None."""
        if self.epoch_batches is None or self.layout is None:
            return None
        return self.layout.steps


def _epoch_batches(
    examples_per_worker: Sequence[int],
    layout: EpochLayout,
    shape: StepShape,
    *,
    drop_remainder: bool,
    split: bool,
) -> tuple[int, ...]:
    # Per-replica batches each worker holds per epoch, as the pipeline makes them.
    per_replica, local = shape.per_replica_batch_size, shape.replicas_per_worker
    step_size = per_replica * local
    return tuple(
        layout.steps * local
        if drop_remainder
        else local * math.ceil(n / step_size)
        if split
        else math.ceil(n / per_replica)
        for n in examples_per_worker
    )


def plan_epochs(
    examples_per_worker: Sequence[int] | None,
    shape: StepShape,
    *,
    drop_remainder: bool,
    repeat: Repeat,
    dense: bool | None,
) -> EpochPlan:
    """How the per-worker pipeline batches, trims and repeats, from the plan. Pure.

    Args:
        examples_per_worker: examples each worker holds per epoch (the sharding plan's),
            None when unknown.
        shape: batch size and replicas.
        drop_remainder: as for the builder.
        repeat: ``False``, ``True`` or ``"epochs"``.
        dense: whether the batched elements (after ``map_fn``) are all dense tensors; None
            when :func:`needs_element_check` says it does not matter.

    Returns:
        An :class:`EpochPlan`.
    """
    local = shape.replicas_per_worker
    aligned = repeat == "epochs" and dense is True
    split = dense is not None and splits_last_step(
        local,
        drop_remainder=drop_remainder,
        repeat_by_example=bool(repeat) and not aligned,
        dense=dense,
    )
    examples = examples_per_worker
    if examples is None:
        return EpochPlan(layout=None, split_last_step=split)
    per_replica = shape.per_replica_batch_size
    layout = epoch_layout(
        examples, per_replica, local, drop_remainder=drop_remainder, split_last_step=split
    )
    take = layout.steps * per_replica * local if drop_remainder else None
    batches = None
    if aligned:
        batches = _epoch_batches(
            examples, layout, shape, drop_remainder=drop_remainder, split=split
        )
    return EpochPlan(
        layout=layout,
        split_last_step=split,
        take_per_worker=take,
        epoch_batches=batches,
        exact=not repeat or batches is not None,
    )


def batches_layout(
    sizes_per_worker: Sequence[Sequence[int]], per_replica_batch_size: int, replicas_per_worker: int
) -> EpochLayout:
    """The epoch of per-replica batches handed to the replicas as they are. Pure.

    For a ``fn(input_context)`` that batches itself: each worker's local replicas take its
    batches in turn (batch ``s * R + r`` to local replica ``r`` in step ``s``), every worker
    runs as many steps as the one with most batches, and a replica without a batch left
    receives an empty one (as TensorFlow's distributed iterator gives it).

    Args:
        sizes_per_worker: the examples in each batch of each worker, by worker index.
        per_replica_batch_size: examples in a full batch.
        replicas_per_worker: replicas on each worker.

    Returns:
        An :class:`EpochLayout` (nothing dropped).
    """
    local = replicas_per_worker
    steps = max((math.ceil(len(sizes) / local) for sizes in sizes_per_worker), default=0)
    rows = []
    for step in range(steps):
        row: list[int] = []
        for sizes in sizes_per_worker:
            for replica in range(local):
                position = step * local + replica
                row.append(sizes[position] if position < len(sizes) else 0)
        rows.append(tuple(row))
    full = (per_replica_batch_size,) * (local * len(sizes_per_worker))
    full_steps = 0
    while full_steps < steps and rows[full_steps] == full:
        full_steps += 1
    examples = sum(sum(sizes) for sizes in sizes_per_worker)
    return EpochLayout(steps, full_steps, tuple(rows[full_steps:]), examples, 0)


OTHER_REPEATS = (
    "Or pass repeat=False (one pass per epoch; Keras iterates the dataset again every epoch), "
    "or repeat=True with fit(steps_per_epoch=...) (examples repeat without end: epochs are "
    "then not passes over the data)."
)


def check_epochs_aligned(
    epochs: EpochPlan,
    *,
    repeat: Repeat,
    source_kind: str,
    infinite: bool = False,
    distributed_epoch: bool = False,
) -> None:
    """Refuse ``repeat="epochs"`` where :func:`plan_epochs` could not align the epochs. Pure.

    ``"epochs"`` promises that every ``steps_per_epoch`` steps are one pass over the data,
    padded to the same steps on every worker; without the examples per worker (or with
    elements an empty batch cannot pad) that promise cannot be kept, so the builder refuses
    before training rather than repeat example by example.

    Raises:
        ValueError: ``repeat="epochs"`` and no aligned epochs, with the fix for the source.
    """
    if repeat != "epochs" or epochs.epoch_batches is not None:
        return
    alternatives = OTHER_REPEATS
    if epochs.layout is not None:
        why = (
            "the elements (after map_fn) are sparse or ragged, and an epoch is padded with "
            "empty dense batches"
        )
        fix = "Make them dense in map_fn (tf.sparse.to_dense, or .to_tensor() on a ragged tensor)."
    elif distributed_epoch:
        why = (
            "service_mode='distributed_epoch' hands the data out dynamically, so the steps of "
            "an epoch are known only once it has ended"
        )
        fix = "Pass service_mode='synchronous' (exact epochs through the service)."
    elif infinite:
        why = "the source is infinite: it has no epoch to repeat"
        fix = "Pass repeat=True (or False) and fit(steps_per_epoch=<steps per epoch>)."
        alternatives = ""
    elif source_kind == "files":
        why = "the number of examples in the files is unknown"
        fix = "Pass count_examples=True (each worker reads every file once more before training)."
    elif source_kind == "dataset":
        why = "tf.data does not know the dataset's size (a generator, a filter, ...)"
        fix = (
            "If you know it (N examples), declare it: "
            "source = source.apply(tf.data.experimental.assert_cardinality(N))."
        )
    else:
        why = "the builder does not count the examples a fn(input_context) source returns"
        fix = "Pass the data as a tf.data.Dataset of known size, arrays or counted files."
    raise ValueError(
        "repeat='epochs' repeats whole epochs padded to equal steps on every worker, which "
        f"needs the examples each worker holds per epoch, but {why}. {fix}"
        + (f" {alternatives}" if alternatives else "")
    )


def dataset_info_for(
    epochs: EpochPlan, shape: StepShape, *, repeat: Repeat, infinite: bool
) -> DatasetInfo:
    """The :class:`~tfdp_utils._dataset_info.DatasetInfo` the builder attaches. Pure."""
    layout = epochs.layout if epochs.exact else None
    return DatasetInfo(
        global_batch_size=shape.global_batch_size,
        per_replica_batch_size=shape.per_replica_batch_size,
        num_replicas_in_sync=shape.num_replicas_in_sync,
        num_workers=shape.num_workers,
        examples_per_epoch=None if epochs.layout is None else epochs.layout.examples,
        steps_per_epoch=None if layout is None else layout.steps,
        full_steps=None if layout is None else layout.full_steps,
        tail=() if layout is None else layout.tail,
        repeat=bool(repeat or infinite),
        # Without a layout only a dataset that never ends an epoch has every step full.
        exact=layout is not None or bool(repeat or infinite),
    )
