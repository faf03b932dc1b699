"""Sources whose elements come out of ``.batch()``: an example that is a batch, or a batch.

A ``tf.data`` element with a leading dimension is either one example that happens to have one
(a window of a sequence: ``ds.batch(11, drop_remainder=True).map(split)``, the text-generation
pattern) or a batch of examples (``ds.batch(64)``). The builder's ``element=`` says which;
``"auto"`` infers it where that is safe and refuses where it is not:

* nothing batches at the end of the pipeline (through structure-keeping transformations):
  examples;
* a batch at the very end (only prefetch, cache, shuffle, repeat, ... after it): batches;
* a map after the batch that changes every component's leading dimension from the batch's
  static size (11 -> 10) or reduces it to a scalar: examples (windows, or per-batch sums);
* any other map after a batch: ambiguous, refused with both ways out.

What a batch means follows TensorFlow's two definitions. A ``tf.data.Dataset`` of batches is a
dataset of *global* batches (as ``Strategy.experimental_distribute_dataset`` takes it): the
builder unbatches it and batches ``global_batch_size`` examples per step again, so sharding,
counts and the evenly split last step stay exact. A ``fn(input_context)`` that batches returns
*per-replica* batches (as ``Strategy.distribute_datasets_from_function`` takes them, batched
with ``input_context.get_per_replica_batch_size(global_batch_size)``): the builder hands them to
the replicas as they are, reads the per-replica size from that call (or the batches' static
size), and says what it then cannot guarantee.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, Literal

from tfdp_utils import _tf
from tfdp_utils._tf import tf
from tfdp_utils.data._diagnostics import Finding
from tfdp_utils.data._info import DatasetInfo
from tfdp_utils.data._sharding import ShardingPlan, SourceFacts, plan_from_facts
from tfdp_utils.data._sources import (
    BATCH_CLASSES,
    MAP_CLASSES,
    PASSTHROUGH_CLASSES,
    cardinality,
    is_dataset,
)

ElementKind = Literal["example", "batch"]
ELEMENTS: tuple[str, ...] = ("auto", "example", "batch")
_MAX_DEPTH = 64  # transformations walked back from the end before giving up


def check_element(element: Any) -> str:
    """``element`` when it is one of :data:`ELEMENTS`, else a clear ``ValueError``."""
    if element in ELEMENTS:
        return str(element)
    raise ValueError(
        f"element={element!r} is not supported; expected 'auto' (infer it), 'example' (each "
        "element of the source is one example, even one with a leading dimension such as a "
        "window of a sequence) or 'batch' (each element is a batch of examples)."
    )


@dataclasses.dataclass(frozen=True)
class SourceElements:
    """What a source's elements are, as the builder decided.

    Attributes:
        kind: ``"example"`` or ``"batch"``.
        reason: one line saying why.
        batch_size: the static leading size shared by every component of a batch, else None.
        requested_global_batch_size: the global batch size a ``fn(input_context)`` source
            passed to ``input_context.get_per_replica_batch_size``, else None.
    """

    kind: ElementKind
    reason: str
    batch_size: int | None = None
    requested_global_batch_size: int | None = None


EXAMPLES = SourceElements("example", "the source's elements are examples")


# ----------------------------------------------------------------------- reading a dataset


def _leading_sizes(element_spec: Any) -> list[int | None] | None:
    """Each component's leading size (None: unknown); None when a component is a scalar."""
    sizes: list[int | None] = []
    for spec in tf.nest.flatten(element_spec):
        shape = getattr(spec, "shape", None)
        if shape is None or shape.rank == 0:
            return None
        sizes.append(None if shape.rank is None else shape[0])
    return sizes


def _common(sizes: list[int | None] | None) -> int | None:
    """The size every component shares, when it is known and the same for all."""
    if not sizes or any(size is None for size in sizes) or len(set(sizes)) != 1:
        return None
    return sizes[0]


def _find_batch(dataset: Any) -> tuple[Any, bool] | None:
    """The batching transformation at the end of ``dataset``, and whether a map follows it."""
    node, mapped = dataset, False
    for _ in range(_MAX_DEPTH):
        name = _tf.dataset_class_name(node)
        if name in BATCH_CLASSES:
            return node, mapped
        if name in MAP_CLASSES:
            mapped = True
        elif name not in PASSTHROUGH_CLASSES:
            return None
        node = _tf.dataset_input(node)
        if node is None:
            return None
    return None


def _batch_meaning(source_kind: str) -> str:
    if source_kind == "function":
        return (
            "per-replica batches, handed to the replicas as they are, as "
            "Strategy.distribute_datasets_from_function takes them"
        )
    return "global batches, which the builder unbatches and batches again per step"


def classify(dataset: Any, element: str, *, what: str, source_kind: str) -> SourceElements:
    """Whether ``dataset``'s elements are examples or batches (see the module docstring).

    Args:
        dataset: the source, or the dataset a source function returned.
        element: ``"auto"``, ``"example"`` or ``"batch"``.
        what: how to name ``dataset`` in messages.
        source_kind: ``"dataset"`` or ``"function"`` (what a batch means differs).

    Raises:
        ValueError: ``"auto"`` on an ambiguous dataset; ``"batch"`` on scalar components.
    """
    sizes = _leading_sizes(dataset.element_spec)
    if element == "example":
        return SourceElements("example", "element='example' given")
    if element == "batch":
        if sizes is None:
            raise ValueError(
                f"element='batch' but {what} has scalar components: {dataset.element_spec}. "
                "A batch needs a leading example dimension in every component; pass "
                "element='example' (or 'auto') if each element is one example."
            )
        return SourceElements("batch", "element='batch' given", batch_size=_common(sizes))
    found = _find_batch(dataset)
    if found is None:
        return EXAMPLES
    node, mapped = found
    name = _tf.dataset_class_name(node)
    if sizes is None:
        return SourceElements("example", f"a map after {name} reduces each batch to scalars")
    if not mapped:
        return SourceElements("batch", f"it ends in {name}", batch_size=_common(sizes))
    batch = _common(_leading_sizes(node.element_spec))
    if batch is not None and all(size is not None and size != batch for size in sizes):
        leading = sorted({size for size in sizes if size is not None})
        return SourceElements(
            "example",
            f"a map turns each {name} of {batch} into components of leading size "
            f"{', '.join(map(str, leading))}: each element is one example (e.g. a window)",
        )
    raise ValueError(
        f"{what} ends in {name} followed by a map, so each element may be a batch of examples "
        "or one example that has a leading dimension (a window of a sequence, as in "
        "ds.batch(11, drop_remainder=True).map(split_input_target)). Say which: "
        "element='example' if each element is one example (the builder batches them), or "
        f"element='batch' if each element is a batch of examples ({_batch_meaning(source_kind)})."
    )


def _unknown_inner(shape: Any) -> bool:
    """Whether a dense shape has an unknown size after its leading one (or an unknown rank)."""
    return shape.rank is None or any(size is None for size in shape[1:])


def element_findings(elements: SourceElements, global_batch_size: int | None) -> list[Finding]:
    """What the builder says about a dataset's elements when they came out of a batch."""
    if elements is EXAMPLES or (
        elements.kind == "example" and elements.reason.startswith("element=")
    ):
        return []
    if elements.kind == "example":
        return [Finding(logging.INFO, f"the source's elements are examples: {elements.reason}.")]
    return [
        Finding(
            logging.INFO,
            f"the source's elements are batches ({elements.reason}): the builder unbatches "
            f"them and batches {global_batch_size} examples per step again, so every example is "
            "seen once per epoch and the last step is split evenly. If each element is one "
            "example, pass element='example'.",
        )
    ]


def examples_of(dataset: Any, elements: SourceElements, *, what: str = "source") -> Any:
    """``dataset`` as examples: unbatched when its elements are batches.

    Raises:
        ValueError: batches with a dense component of unknown inner shape (``padded_batch``,
            variable-length data), which cannot be batched again at another size.
    """
    if elements.kind == "example":
        return dataset
    for spec in tf.nest.flatten(dataset.element_spec):
        if type(spec) is tf.TensorSpec and _unknown_inner(spec.shape):
            raise ValueError(
                f"{what} holds batches with a component of unknown inner shape "
                f"{spec.shape} (padded_batch or variable-length data): cut into batches of "
                "another size they would fail on the first two examples of different "
                "shapes. Pass the unbatched examples (remove .batch/.padded_batch) and pad "
                "in map_fn, or use a fn(input_context) source that returns per-replica "
                "batches (the builder hands those to the replicas as they are)."
            )
    examples = dataset.unbatch()
    known = _examples_in_batches(dataset)
    if known is not None and cardinality(examples) is None:
        examples = examples.apply(tf.data.experimental.assert_cardinality(known))
    return examples


# Transformations after a batch that keep every batch and its size.
_COUNT_KEEPING = MAP_CLASSES | frozenset(
    {"_PrefetchDataset", "_OptionsDataset", "CacheDataset", "_CacheDataset", "_MemoryCacheDataset"}
)


def _examples_in_batches(dataset: Any) -> int | None:
    """The examples a dataset ending in a plain ``batch`` holds, read from the batch's input.

    tf.data knows the examples after ``unbatch`` only for static batches; when only
    count-keeping transformations follow the batch, its input's cardinality is the count
    (less what ``drop_remainder`` drops).
    """
    node = dataset
    for _ in range(_MAX_DEPTH):
        name = _tf.dataset_class_name(node)
        if name in ("BatchDataset", "_BatchDataset"):
            source = _tf.dataset_input(node)
            total = None if source is None else cardinality(source)
            size, drop = _tf.batch_arguments(node)
            if total is None or total < 0 or size is None:
                return None
            return total - total % size if drop else total
        if name not in _COUNT_KEEPING:
            return None
        node = _tf.dataset_input(node)
        if node is None:
            return None
    return None


# ------------------------------------------------------------------ a source function


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


def batch_size_of_batches(
    elements: SourceElements, global_batch_size: int | None, per_replica_batch_size: int | None
) -> int | None:
    """For a dataset of batches without a batch size given: its static batch as the global one."""
    if elements.kind != "batch" or global_batch_size is not None:
        return global_batch_size
    if per_replica_batch_size is not None:
        return None
    if elements.batch_size is None:
        raise ValueError(
            "the source's elements are batches of unknown size (batched without "
            "drop_remainder=True) and no batch size was given. Pass global_batch_size= "
            "(examples per step over all replicas); the builder unbatches the source and "
            "batches that many per step."
        )
    return elements.batch_size
