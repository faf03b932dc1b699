"""Self-batching ``fn(input_context)`` sources, handed to the replicas as they batch.

A ``fn(input_context)`` that batches returns *per-replica* batches (as
``Strategy.distribute_datasets_from_function`` takes them, batched with
``input_context.get_per_replica_batch_size(global_batch_size)``): the builder calls it once to
look at what it returns (:class:`ProbedFunction`), reads the per-replica size from that call
(or the batches' static size), hands the batches to the replicas as they are, and says what it
then cannot guarantee. Whether an element is an example or a batch is decided in
:mod:`tfdp_utils.data._elements`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from tfdp_utils._tf import tf
from tfdp_utils.data._diagnostics import Finding
from tfdp_utils.data._elements import (
    EXAMPLES,
    SourceElements,
    classify,
)
from tfdp_utils.data._info import DatasetInfo
from tfdp_utils.data._sharding import ShardingPlan, SourceFacts, plan_from_facts
from tfdp_utils.data._sources import is_dataset


class _RecordingContext(tf.distribute.InputContext):  # type: ignore[misc]
    """An ``InputContext`` that notes the global batch size the function asks to split."""

    def __init__(self, context: Any) -> None:
        super().__init__(
            num_input_pipelines=int(context.num_input_pipelines),
            input_pipeline_id=int(context.input_pipeline_id),
            num_replicas_in_sync=int(context.num_replicas_in_sync),
        )
        self.requested: int | None = None

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        per_replica = int(super().get_per_replica_batch_size(global_batch_size))
        self.requested = int(global_batch_size)
        return per_replica


class ProbedFunction:
    """A source function whose first call, the builder's look at it, is kept for the pipeline.

    :meth:`call` returns the kept dataset (and the batch size it asked for) once, to the
    first call with the same input context; every other call runs the function.
    """

    def __init__(self, function: Callable[[Any], Any], context: Any) -> None:
        self.function = function
        self._key = _context_key(context)
        self.first: tuple[Any, int | None] = _call(function, context)
        self._kept: tuple[Any, int | None] | None = self.first

    def call(self, context: Any) -> tuple[Any, int | None]:
        """``(dataset, requested global batch size)`` for ``context``."""
        kept, self._kept = self._kept, None
        if kept is not None and _context_key(context) == self._key:
            return kept
        return _call(self.function, context)

    def __call__(self, context: Any) -> Any:
        return self.call(context)[0]


def _context_key(context: Any) -> tuple[int, int, int]:
    return (
        int(context.num_input_pipelines),
        int(context.input_pipeline_id),
        int(context.num_replicas_in_sync),
    )


def call_function(source: Callable[[Any], Any], context: Any) -> tuple[Any, int | None]:
    """``source(context)`` checked to be a dataset, and the global batch size it asked for."""
    if isinstance(source, ProbedFunction):
        return source.call(context)
    return _call(source, context)


def _call(source: Callable[[Any], Any], context: Any) -> tuple[Any, int | None]:
    recording = _RecordingContext(context)
    dataset = source(recording)
    if not is_dataset(dataset):
        raise TypeError(
            f"the source function returned {type(dataset).__name__}; expected a "
            "tf.data.Dataset for input pipeline "
            f"{context.input_pipeline_id} of {context.num_input_pipelines}."
        )
    return dataset, recording.requested


def inspect_source(
    source: Any, element: str, *, kind: str, context: Any
) -> tuple[SourceElements, Any]:
    """What the elements of a source of ``kind`` are, and the source to build from.

    A function is called once with ``context`` (this worker's) to look at what it returns;
    the source to build from is then a :class:`ProbedFunction` that hands that dataset to the
    pipeline's first call, so the function still runs once per worker.

    Raises:
        ValueError: ``element='batch'`` on arrays or files, or what :func:`classify` raises.
    """
    if kind == "dataset":
        return classify(source, element, what="source", source_kind="dataset"), source
    if kind == "function":
        if element == "example":
            return SourceElements("example", "element='example' given"), source
        probed = ProbedFunction(source, context)
        return classify_function(probed, element), probed
    if element == "batch":
        raise ValueError(
            f"element='batch' applies to a tf.data.Dataset or a fn(input_context) source, but "
            f"the source is {'in-memory arrays' if kind == 'arrays' else 'files'}, whose "
            "elements are examples (arrays are cut along their first dimension). Pass "
            "element='auto' (or reshape the arrays so that their first dimension counts "
            "examples)."
        )
    return EXAMPLES, source


def classify_function(source: ProbedFunction, element: str) -> SourceElements:
    """What a ``fn(input_context)`` source returns, from its first call (this worker's context).

    The call builds the function's dataset (reading nothing) to look at its elements and at
    the batch size it asks ``input_context`` for.
    """
    dataset, requested = source.first
    what = "the dataset returned by the source function"
    elements = classify(dataset, element, what=what, source_kind="function")
    if requested is not None and elements.kind == "example" and element == "auto":
        raise ValueError(
            f"the source function called input_context.get_per_replica_batch_size({requested}) "
            f"but {what} does not end in a batch the builder can see "
            f"({elements.reason.split(':')[0]}). Say what its elements are: element='batch' if "
            "it returns per-replica batches, element='example' if each element is one example."
        )
    return dataclasses.replace(elements, requested_global_batch_size=requested)


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


def check_function_options(options: dict[str, Any]) -> None:
    """Refuse builder options that would act on the function's batches instead of examples."""
    for name, fix in _UNSUPPORTED:
        value = options.get(name)
        if value is not None and value is not False:
            raise ValueError(
                f"{name}={value!r} cannot apply to a source function that batches itself: "
                f"the builder would act on whole per-replica batches. Instead, {fix}; or "
                "return unbatched examples from the function and let the builder batch them."
            )


def function_plan(plan: ShardingPlan, elements: SourceElements, per_replica: int) -> ShardingPlan:
    """``plan`` whose reason also says that the function batches itself, and how much."""
    how = (
        f"input_context.get_per_replica_batch_size({elements.requested_global_batch_size})"
        if elements.requested_global_batch_size is not None
        else "its own .batch()"
    )
    return dataclasses.replace(
        plan,
        reason=f"{plan.reason}; it batches itself ({per_replica} per replica, from {how}): "
        "steps and per-step counts unknown",
    )


def function_finding(elements: SourceElements, per_replica: int, *, exact: bool) -> Finding:
    """What the builder cannot guarantee for a function that batches itself."""
    counts = (
        "every batch is full and every step is counted as full"
        if exact
        else "the examples in each step are unknown (tfdp_info.exact is False: throughput "
        "counts every step as full), the last step is not split evenly (a replica may get an "
        "empty batch)"
    )
    return Finding(
        logging.INFO,
        f"the source function returns per-replica batches of {per_replica} ({elements.reason}); "
        "they go to the replicas as they are, as Strategy.distribute_datasets_from_function "
        f"defines. Not guaranteed: each example once per epoch (the function must split its "
        f"data by input_context.input_pipeline_id); {counts}. For exact counts and an evenly "
        "split last step, return unbatched examples and pass global_batch_size=.",
    )


def function_info(
    elements: SourceElements,
    *,
    per_replica: int,
    replicas: int,
    workers: int,
    repeat: bool,
) -> DatasetInfo:
    """The ``DatasetInfo`` of a function's own per-replica batches: sizes, no counts.

    Exact only when every batch is full (a static batch size) and the data repeats, so that
    no epoch ends in a partial or empty batch.
    """
    return DatasetInfo(
        global_batch_size=per_replica * replicas,
        per_replica_batch_size=per_replica,
        num_replicas_in_sync=replicas,
        num_workers=workers,
        repeat=repeat,
        exact=repeat and elements.batch_size == per_replica,
    )


@dataclasses.dataclass(frozen=True)
class FunctionBatches:
    """What each worker's pipeline does with a function's own batches."""

    plan: ShardingPlan
    requested_global_batch_size: int | None
    repeat: bool
    prefetch: bool
    data_options: Any


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
    strategy: Any,
    source: Callable[[Any], Any],
    elements: SourceElements,
    *,
    per_replica: int,
    num_workers: int,
    shard_policy: str,
    repeat: bool | str,
    prefetch: bool,
    data_options: Any,
    input_options: Any,
) -> tuple[Any, DatasetInfo, ShardingPlan, list[Finding]]:
    """The distributed dataset of a function's own per-replica batches, its info, plan, findings."""
    replicas = int(strategy.num_replicas_in_sync)
    plan = plan_from_facts(
        SourceFacts("function"), shard_policy=shard_policy, num_workers=num_workers
    )
    plan = function_plan(plan, elements, per_replica)
    info = function_info(
        elements,
        per_replica=per_replica,
        replicas=replicas,
        workers=num_workers,
        repeat=bool(repeat),
    )
    findings = [function_finding(elements, per_replica, exact=info.exact)]
    if repeat == "epochs":
        findings.append(
            Finding(
                logging.INFO,
                "repeat='epochs' needs the examples per epoch, which a function that batches "
                "itself does not tell; repeating its batches instead.",
            )
        )
    findings.append(Finding(logging.INFO, plan.describe()))
    recipe = FunctionBatches(
        plan,
        elements.requested_global_batch_size,
        repeat=bool(repeat),
        prefetch=prefetch,
        data_options=data_options,
    )
    dist = strategy.distribute_datasets_from_function(
        lambda context: per_worker_batches(recipe, source, context), options=input_options
    )
    return dist, info, plan, findings
