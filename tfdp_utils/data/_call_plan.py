"""One call's plan: the step's shape, the sharding, the epochs, and the diagnosis logged.

The builder's middle phase (:mod:`~tfdp_utils.data._builder`). From the checked call
(:class:`~tfdp_utils.data._arguments.BuilderCall`) and the examined source
(:class:`~tfdp_utils.data._examine.ExaminedSource`) it decides what a step holds
(:func:`step_shape`), plans the sharding (:mod:`~tfdp_utils.data._sharding`) and the epochs
(:mod:`~tfdp_utils.data._epochs`), checks ``map_fn`` against the elements, and logs what
:mod:`~tfdp_utils.data._diagnostics` finds (:func:`plan_call`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from tfdp_utils.cluster._topology import WorkerPosition
from tfdp_utils.data import _elements as element_kinds
from tfdp_utils.data._arguments import BuilderCall, check_map_fn, per_replica_size
from tfdp_utils.data._diagnostics import BuildFacts, Finding, diagnose
from tfdp_utils.data._epochs import (
    EpochPlan,
    Repeat,
    StepShape,
    check_epochs_aligned,
    needs_element_check,
    plan_epochs,
)
from tfdp_utils.data._examine import ExaminedSource
from tfdp_utils.data._sharding import ShardingPlan, plan_from_facts
from tfdp_utils.data._sources import dense_only, reader_dataset
from tfdp_utils.data.service._modes import service_plan

logger = logging.getLogger("tfdp_utils")


def log_findings(findings: Sequence[Finding]) -> None:
    """Log what the builder found, each at its level, on the ``tfdp_utils`` logger."""
    for finding in findings:
        logger.log(finding.level, "tfdp_utils: %s", finding.message)


def step_shape(call: BuilderCall, source: ExaminedSource, position: WorkerPosition) -> StepShape:
    """The examples each replica receives in a full step; logs what the elements are.

    Raises:
        ValueError: both or neither batch size (for a source of examples, or of batches of
            unknown size), a global size not divisible by, or smaller than, the replicas.
    """
    global_batch_size = element_kinds.batch_size_of_batches(
        source.elements, call.global_batch_size, call.per_replica_batch_size
    )
    replicas = int(call.strategy.num_replicas_in_sync)
    per_replica = per_replica_size(
        global_batch_size, call.per_replica_batch_size, replicas, call.strategy
    )
    log_findings(element_kinds.element_findings(source.elements, per_replica * replicas))
    return StepShape(per_replica, replicas, position.num_workers)


@dataclasses.dataclass(frozen=True)
class CallPlan:
    """What the planning phase decided for one call.

    Attributes:
        source: the examined source.
        plan: which worker reads what.
        epochs: each worker's steps and what the last one holds.
        shape: what a full step holds.
        worker_index: this worker's input pipeline.
    """

    source: ExaminedSource
    plan: ShardingPlan
    epochs: EpochPlan
    shape: StepShape
    worker_index: int = 0


def plan_call(
    call: BuilderCall, source: ExaminedSource, shape: StepShape, worker_index: int
) -> CallPlan:
    """Plan sharding and epochs for the call, check ``map_fn``, and log the diagnosis.

    Raises:
        ValueError: a policy that cannot apply to the source, a ``map_fn`` that cannot take
            the elements, ``drop_remainder`` dropping every example, ``repeat="epochs"`` on a
            source whose epochs cannot be counted.
    """
    facts = source.facts
    plan = plan_from_facts(
        facts,
        shard_policy=call.shard_policy,
        num_workers=shape.num_workers,
        per_replica_batch_size=shape.per_replica_batch_size,
        replicas_per_worker=shape.replicas_per_worker,
        drop_remainder=call.drop_remainder,
    )
    if call.service is not None:
        plan = service_plan(plan, call.service, cache=call.cache)
    dense = check_elements(call, source, plan, worker_index, shape, repeat=call.repeat)
    epochs = plan_epochs(
        plan.examples_per_worker,
        shape,
        drop_remainder=call.drop_remainder,
        repeat=call.repeat,
        dense=dense,
    )
    if not call.repeat:
        _check_not_empty_by_dropping(epochs, shape, drop_remainder=call.drop_remainder)
    check_epochs_aligned(
        epochs,
        repeat=call.repeat,
        source_kind=facts.kind,
        infinite=facts.infinite,
        distributed_epoch=call.distributed_epoch,
    )
    diagnosis = BuildFacts(
        plan,
        facts,
        epochs,
        shape,
        shuffling=call.shuffle_buffer_size is not None,
        seed=call.seed,
        repeat=call.repeat,
        drop_remainder=call.drop_remainder,
    )
    log_findings(diagnose(diagnosis))
    return CallPlan(source, plan, epochs, shape, worker_index)


# ------------------------------------------------------------------------ the elements


def element_spec(call: BuilderCall, source: ExaminedSource, plan: ShardingPlan, index: int) -> Any:
    """One unbatched element's spec as worker ``index`` reads it; None for a function."""
    if source.kind == "function":
        return None
    if source.kind != "files":
        return source.element_spec
    own = plan.files_per_worker[index]
    path = own[0] if own else source.facts.files[0]
    return reader_dataset(call.reader, path).element_spec


def _mapped_dense(call: BuilderCall, source: ExaminedSource, spec: Any) -> bool:
    """Whether the elements as batched (after ``map_fn``) are all dense tensors."""
    if call.map_fn is None:
        return dense_only(spec)
    facts = source.facts
    read = reader_dataset(call.reader, facts.files[0]) if facts.kind == "files" else source.readable
    return dense_only(read.map(call.map_fn).element_spec)


def check_elements(
    call: BuilderCall,
    source: ExaminedSource,
    plan: ShardingPlan,
    index: int,
    shape: StepShape,
    *,
    repeat: Repeat,
) -> bool | None:
    """Check ``map_fn`` against the elements; say whether they batch dense, if it matters.

    Returns:
        Whether the mapped elements are all dense, or None when the epoch plan for ``repeat``
        does not depend on it (see :func:`~tfdp_utils.data._epochs.needs_element_check`).
    """
    spec = element_spec(call, source, plan, index)
    if spec is not None:
        check_map_fn(call.map_fn, spec)
    needed = needs_element_check(
        plan.examples_per_worker,
        repeat=repeat,
        replicas_per_worker=shape.replicas_per_worker,
        drop_remainder=call.drop_remainder,
    )
    return _mapped_dense(call, source, spec) if needed else None


def _check_not_empty_by_dropping(
    epochs: EpochPlan, shape: StepShape, *, drop_remainder: bool
) -> None:
    """A clear error when drop_remainder leaves no step at all (fit would see no data)."""
    layout = epochs.layout
    if not drop_remainder or layout is None or layout.steps > 0 or layout.dropped == 0:
        return
    raise ValueError(
        f"drop_remainder=True drops every example: {layout.dropped} examples per epoch do not "
        f"fill one step of {shape.global_batch_size} examples "
        f"({shape.per_replica_batch_size} on each of {shape.num_replicas_in_sync} replicas), "
        "so the dataset would yield no step and fit would stop at once. Pass "
        "drop_remainder=False (the last step is partial), or a smaller global_batch_size."
    )
