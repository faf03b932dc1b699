"""Self-batching ``fn(input_context)`` sources, handed to the replicas as they batch.

A ``fn(input_context)`` that batches returns *per-replica* batches (as
``Strategy.distribute_datasets_from_function`` takes them, batched with
``input_context.get_per_replica_batch_size(global_batch_size)``): the builder calls it once to
look at what it returns (:class:`~tfdp_utils.data._examine.ProbedFunction`), reads the
per-replica size from that call (or the batches' static size), hands the batches to the
replicas as they are, and says what it then cannot guarantee. Whether an element is an example
or a batch is decided in :mod:`tfdp_utils.data._elements`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from tfdp_utils._dataset_info import DatasetInfo
from tfdp_utils._tf import tf
from tfdp_utils.data._arguments import BuilderCall
from tfdp_utils.data._diagnostics import Finding
from tfdp_utils.data._elements import SourceElements, batch_sizes
from tfdp_utils.data._epochs import OTHER_REPEATS, EpochLayout, Repeat, batches_layout
from tfdp_utils.data._examine import ExaminedSource, ProbedFunction, call_function
from tfdp_utils.data._pipeline import empty_batch
from tfdp_utils.data._sharding import ShardingPlan, plan_from_facts
from tfdp_utils.data._sources import cardinality, dense_only


def function_batch_size(
    elements: SourceElements,
    *,
    global_batch_size: int | None,
    per_replica_batch_size: int | None,
    replicas: int,
) -> int:
    """The per-replica batch of a function that batches itself, from what is known.

    Raises:
        ValueError: the sizes given disagree with the function's, or none is known.
    """
    given = None
    if per_replica_batch_size is not None:
        given = ("per_replica_batch_size", per_replica_batch_size, per_replica_batch_size)
    elif global_batch_size is not None:
        given = ("global_batch_size", global_batch_size, global_batch_size // replicas)
    requested = elements.requested_global_batch_size
    if requested is not None:
        known = requested // replicas
        source = f"input_context.get_per_replica_batch_size({requested})"
    elif elements.batch_size is not None:
        known = elements.batch_size
        source = f"its batches of {known} (static size)"
    else:
        known, source = None, ""
    if given is not None and known is not None and given[2] != known:
        raise ValueError(
            f"{given[0]}={given[1]} gives {given[2]} examples per replica, but the source "
            f"function batches {known} per replica ({source}). Pass the same size (or neither: "
            "the builder takes the function's), or change the function."
        )
    if known is not None:
        return known
    if given is not None:
        return given[2]
    raise ValueError(
        "the source function returns batches of unknown size and no batch size was given. "
        "Pass global_batch_size= (examples per step over all replicas), or batch in the "
        "function with input_context.get_per_replica_batch_size(global_batch_size)."
    )


_UNSUPPORTED = (
    ("map_fn", "map each example inside the function, before its .batch()"),
    ("shuffle_buffer_size", "shuffle inside the function, before its .batch()"),
    ("cache", "cache inside the function"),
    ("drop_remainder", "pass drop_remainder=True to the function's own .batch()"),
)


def check_function_options(example_options: tuple[tuple[str, Any], ...]) -> None:
    """Refuse builder options that would act on the function's batches instead of examples.

    Args:
        example_options: the options given that act on examples, as
            :attr:`~tfdp_utils.data._arguments.BuilderCall.example_options` holds them.
    """
    if not example_options:
        return
    name, value = example_options[0]
    fix = dict(_UNSUPPORTED)[name]
    raise ValueError(
        f"{name}={value!r} cannot apply to a source function that batches itself: "
        f"the builder would act on whole per-replica batches. Instead, {fix}; or "
        "return unbatched examples from the function and let the builder batch them."
    )


@dataclasses.dataclass(frozen=True)
class FunctionEpoch:
    """What the builder counted of a function's own batches, over every worker.

    Attributes:
        batches_per_worker: batches the function's dataset holds on each worker (after the
            builder's shard, if any); None when unknown on some worker.
        steps: steps every worker runs per epoch (the busiest worker's), when counted.
        layout: each replica's examples in every step, when every batch's size is known.
        examples_per_worker: examples each worker's batches hold, when every size is known.
        infinite: whether the function's dataset never ends on some worker.
        unknown: why the batches are not counted, in words ("" when they are).
    """

    batches_per_worker: tuple[int, ...] | None = None
    steps: int | None = None
    layout: EpochLayout | None = None
    examples_per_worker: tuple[int, ...] | None = None
    infinite: bool = False
    unknown: str = ""

    @property
    def uneven(self) -> bool:
        """Whether the workers hold different numbers of batches."""
        return self.batches_per_worker is not None and len(set(self.batches_per_worker)) > 1


def _worker_dataset(source: Callable[[Any], Any], context: Any, own_index: int) -> Any:
    """The dataset the function returns for ``context``; the builder's first look for its own."""
    if isinstance(source, ProbedFunction):
        if int(context.input_pipeline_id) == own_index:
            return source.first[0]
        source = source.function
    return call_function(source, context)[0]


def _sizes(
    dataset: Any, count: int, elements: SourceElements, per_replica: int
) -> list[int] | None:
    # Every batch's size: read from the chain, or all full when the batch size is static.
    sizes = batch_sizes(dataset)
    if sizes is None and elements.batch_size == per_replica:
        sizes = [per_replica] * count
    if sizes is None or len(sizes) != count or any(size > per_replica for size in sizes):
        return None
    return sizes


def count_function_batches(
    source: Callable[[Any], Any],
    elements: SourceElements,
    *,
    per_replica: int,
    replicas: int,
    num_workers: int,
    worker_index: int,
    shard: bool,
) -> FunctionEpoch:
    """Count the batches the function returns on every worker, and their sizes where known.

    The function is called with every worker's input context (which builds datasets and
    reads nothing; this worker's is the call the builder already made), so every worker
    counts the same steps without talking to the others.

    Args:
        source: the function (a :class:`ProbedFunction` after the builder's look).
        elements: what its elements are.
        per_replica: examples in a full batch.
        replicas: replicas in sync over all workers.
        num_workers: input pipelines.
        worker_index: this worker's pipeline.
        shard: whether the builder shards the function's batches (``shard_policy="data"``).
    """
    per_worker: list[int] = []
    sizes: list[list[int]] | None = []
    infinite = False
    for index in range(num_workers):
        context = tf.distribute.InputContext(num_workers, index, replicas)
        try:
            dataset = _worker_dataset(source, context, worker_index)
        except Exception as error:  # the pipeline calls it again and raises it there
            return FunctionEpoch(
                unknown=f"calling it for input pipeline {index} of {num_workers} raised "
                f"{type(error).__name__}: {error}"
            )
        if shard:
            dataset = dataset.shard(num_workers, index)
        count = cardinality(dataset)
        if count == -1:
            infinite = True
            continue
        if count is None:
            return FunctionEpoch(
                unknown="tf.data does not know the size of the dataset it returns for input "
                f"pipeline {index} of {num_workers}"
            )
        per_worker.append(count)
        found = _sizes(dataset, count, elements, per_replica)
        sizes = None if sizes is None or found is None else [*sizes, found]
    if infinite:
        return FunctionEpoch(infinite=True, unknown="the dataset it returns never ends")
    local = max(1, replicas // num_workers)
    steps = max((-(-count // local) for count in per_worker), default=0)
    if sizes is None:
        return FunctionEpoch(tuple(per_worker), steps)
    return FunctionEpoch(
        tuple(per_worker),
        steps,
        batches_layout(sizes, per_replica, local),
        tuple(sum(worker) for worker in sizes),
    )


def function_plan(
    plan: ShardingPlan, elements: SourceElements, per_replica: int, counted: FunctionEpoch
) -> ShardingPlan:
    """``plan`` with what the function batches and what the builder counted of it."""
    how = (
        f"input_context.get_per_replica_batch_size({elements.requested_global_batch_size})"
        if elements.requested_global_batch_size is not None
        else "its own .batch()"
    )
    if counted.layout is not None:
        known = "steps and per-step counts from its dataset's size and batches"
    elif counted.steps is not None:
        known = "steps from its dataset's size; per-step counts unknown"
    else:
        known = "steps and per-step counts unknown"
    return dataclasses.replace(
        plan,
        reason=f"{plan.reason}; it batches itself ({per_replica} per replica, from {how}): {known}",
        examples_per_worker=counted.examples_per_worker,
        steps_per_worker=counted.steps,
    )


def function_findings(
    elements: SourceElements, per_replica: int, counted: FunctionEpoch, *, exact: bool
) -> list[Finding]:
    """What the builder counted, and cannot guarantee, for a function that batches itself."""
    if exact and counted.layout is not None:
        counts = (
            f"the {counted.steps} steps per epoch and each replica's examples in every step "
            "are counted from the dataset it returns (its size and batches)"
        )
    elif exact:
        counts = "every batch is full and every step is counted as full"
    else:
        steps = (
            f"the {counted.steps} steps per epoch are counted from the size of the dataset it "
            "returns, but "
            if counted.steps is not None
            else ""
        )
        counts = (
            f"{steps}the examples in each step are unknown (tfdp_info.exact is False: "
            "throughput counts every step as full)"
        )
    findings = [
        Finding(
            logging.INFO,
            f"the source function returns per-replica batches of {per_replica} "
            f"({elements.reason}); they go to the replicas as they are, as "
            "Strategy.distribute_datasets_from_function defines. Not guaranteed: each example "
            "once per epoch (the function must split its data by "
            f"input_context.input_pipeline_id); the last step is not split evenly (a replica "
            f"may get an empty batch). Counted: {counts}. For an evenly split last step, "
            "return unbatched examples and pass global_batch_size=.",
        )
    ]
    if counted.steps == 0:
        findings.append(
            Finding(
                logging.WARNING,
                "the source function returns no batches on any worker: fit would train "
                "nothing. Check the data it reads (an empty glob, a shard or filter that keeps "
                "nothing).",
            )
        )
    if counted.uneven:
        findings.append(
            Finding(
                logging.WARNING,
                "the source function returns different numbers of batches on the workers "
                f"({', '.join(map(str, counted.batches_per_worker or ()))} by input pipeline): "
                f"every worker runs {counted.steps} steps per epoch, and those that run out "
                "first feed empty batches. Split the data evenly by "
                "input_context.input_pipeline_id if that is not intended.",
            )
        )
    return findings


def function_info(
    elements: SourceElements,
    *,
    per_replica: int,
    replicas: int,
    workers: int,
    repeat: Repeat,
    counted: FunctionEpoch | None = None,
) -> DatasetInfo:
    """The ``DatasetInfo`` of a function's own per-replica batches.

    Steps per epoch when every worker's dataset has a known size; exact per-replica counts
    when every batch's size is known too. With ``repeat=True`` (or a function whose dataset
    never ends) exact only when every batch is full (a static batch size).
    """
    counted = counted or FunctionEpoch()
    if (repeat is True) or counted.infinite:
        return DatasetInfo(
            global_batch_size=per_replica * replicas,
            per_replica_batch_size=per_replica,
            num_replicas_in_sync=replicas,
            num_workers=workers,
            repeat=True,
            exact=elements.batch_size == per_replica,
        )
    layout = counted.layout
    return DatasetInfo(
        global_batch_size=per_replica * replicas,
        per_replica_batch_size=per_replica,
        num_replicas_in_sync=replicas,
        num_workers=workers,
        examples_per_epoch=None if layout is None else layout.examples,
        steps_per_epoch=counted.steps,
        full_steps=None if layout is None else layout.full_steps,
        tail=() if layout is None else layout.tail,
        repeat=repeat == "epochs",
        exact=layout is not None,
    )


def check_function_epochs(
    counted: FunctionEpoch, *, repeat: Repeat, replicas_per_worker: int, dense: bool
) -> None:
    """Refuse ``repeat="epochs"`` on a function's batches when the epochs cannot be aligned.

    Raises:
        ValueError: the batches are not counted on every worker, or a worker's epoch would be
            padded with empty batches of sparse or ragged elements.
    """
    if repeat != "epochs":
        return
    if counted.steps is None:
        why = counted.unknown or "its batches are not counted"
        fix = (
            "If you know the batches per worker (N), declare them at the end of the function: "
            "dataset.apply(tf.data.experimental.assert_cardinality(N)); and repeat in the "
            "builder, not in the function."
        )
        raise ValueError(
            "repeat='epochs' repeats whole epochs padded to equal steps on every worker, which "
            "needs the number of batches the source function returns on each worker, but "
            f"{why}. {fix} {OTHER_REPEATS}"
        )
    batches = counted.batches_per_worker or ()
    padded = any(count < counted.steps * replicas_per_worker for count in batches)
    if padded and not dense:
        raise ValueError(
            "repeat='epochs' pads each worker's epoch to "
            f"{counted.steps * replicas_per_worker} batches ({counted.steps} steps) with empty "
            "batches, but the source function's batches are sparse or ragged, which an empty "
            "dense batch cannot pad. Return dense batches, or the same number of batches "
            f"(a multiple of {replicas_per_worker}) on every worker. {OTHER_REPEATS}"
        )


@dataclasses.dataclass(frozen=True)
class FunctionBatches:
    """What each worker's pipeline does with a function's own batches.

    Attributes:
        padding: with ``repeat="epochs"``, the empty batches each worker (by index) adds to
            its epoch so that every epoch has the same steps on every worker; None otherwise.
    """

    plan: ShardingPlan
    requested_global_batch_size: int | None
    repeat: bool
    prefetch: bool
    data_options: Any
    padding: tuple[int, ...] | None = None


def per_worker_batches(recipe: FunctionBatches, source: Callable[[Any], Any], context: Any) -> Any:
    """This worker's per-replica batches, for ``distribute_datasets_from_function``.

    Raises:
        RuntimeError: the strategy has a different number of input pipelines than the plan.
        ValueError: the function asks for another global batch size than when probed.
    """
    workers, index = int(context.num_input_pipelines), int(context.input_pipeline_id)
    if workers != recipe.plan.num_workers:
        raise RuntimeError(
            f"the plan was made for {recipe.plan.num_workers} workers but the strategy has "
            f"{workers} input pipelines; build the dataset with the strategy that trains."
        )
    dataset, requested = call_function(source, context)
    if requested != recipe.requested_global_batch_size:
        raise ValueError(
            f"the source function asked input_context.get_per_replica_batch_size({requested}) "
            f"on input pipeline {index}, but {recipe.requested_global_batch_size} when the "
            "builder looked at it: it must batch the same way on every call."
        )
    if recipe.plan.policy == "data":
        dataset = dataset.shard(workers, index)
    if recipe.padding is not None:
        pad = recipe.padding[index]
        if pad > 0:
            empty = tf.data.Dataset.from_tensors(empty_batch(dataset.element_spec))
            dataset = dataset.concatenate(empty.repeat(pad))
    if recipe.repeat:
        dataset = dataset.repeat()
    if recipe.prefetch:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    if recipe.data_options is not None:
        options = options.merge(recipe.data_options)
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def distribute_function_batches(
    call: BuilderCall, source: ExaminedSource, *, num_workers: int, worker_index: int = 0
) -> tuple[Any, DatasetInfo, ShardingPlan, list[Finding]]:
    """The distributed dataset of a function's own per-replica batches, its info, plan, findings.

    Args:
        call: the checked call.
        source: the examined source, a function that batches itself.
        num_workers: input pipelines.
        worker_index: this worker's pipeline. Defaults to `0`.

    Raises:
        ValueError: options that act on examples (see :func:`check_function_options`),
            batch sizes that disagree with the function's (see :func:`function_batch_size`),
            ``repeat="epochs"`` on batches whose epochs cannot be aligned (see
            :func:`check_function_epochs`).
    """
    check_function_options(call.example_options)
    replicas = int(call.strategy.num_replicas_in_sync)
    elements = source.elements
    per_replica = function_batch_size(
        elements,
        global_batch_size=call.global_batch_size,
        per_replica_batch_size=call.per_replica_batch_size,
        replicas=replicas,
    )
    plan = plan_from_facts(source.facts, shard_policy=call.shard_policy, num_workers=num_workers)
    local = max(1, replicas // num_workers)
    counted = count_function_batches(
        source.readable,
        elements,
        per_replica=per_replica,
        replicas=replicas,
        num_workers=num_workers,
        worker_index=worker_index,
        shard=plan.policy == "data",
    )
    batch_spec = source.element_spec
    check_function_epochs(
        counted,
        repeat=call.repeat,
        replicas_per_worker=local,
        dense=batch_spec is not None and dense_only(batch_spec),
    )
    plan = function_plan(plan, elements, per_replica, counted)
    info = function_info(
        elements,
        per_replica=per_replica,
        replicas=replicas,
        workers=num_workers,
        repeat=call.repeat,
        counted=counted,
    )
    findings = function_findings(elements, per_replica, counted, exact=info.exact)
    findings.append(Finding(logging.INFO, plan.describe()))
    recipe = FunctionBatches(
        plan,
        elements.requested_global_batch_size,
        repeat=bool(call.repeat),
        prefetch=call.prefetch,
        data_options=call.data_options,
        padding=_padding(counted, call.repeat, local),
    )
    readable = source.readable
    dist = call.strategy.distribute_datasets_from_function(
        lambda context: per_worker_batches(recipe, readable, context), options=call.input_options
    )
    return dist, info, plan, findings


def _padding(counted: FunctionEpoch, repeat: Repeat, local: int) -> tuple[int, ...] | None:
    """With ``repeat="epochs"``, the empty batches each worker adds to its epoch; else None."""
    if repeat != "epochs" or counted.steps is None:
        return None
    return tuple(counted.steps * local - count for count in counted.batches_per_worker or ())
