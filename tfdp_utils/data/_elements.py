"""What an element of a source is: one example (even one with a leading dimension), or a batch.

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
from typing import Any, Literal

from tfdp_utils import _tf
from tfdp_utils._tf import tf
from tfdp_utils.data._diagnostics import Finding
from tfdp_utils.data._sources import cardinality

# Private tf.data classes (read with _tf.dataset_class_name) that keep the element
# structure; walked through to find a batch.
PASSTHROUGH_CLASSES = frozenset(
    {
        "_PrefetchDataset",
        "_OptionsDataset",
        "CacheDataset",
        "_CacheDataset",
        "_MemoryCacheDataset",
        "_RepeatDataset",
        "_ShuffleDataset",
        "ShuffleDataset",
        "_ShardDataset",
        "_TakeDataset",
        "_SkipDataset",
        "_AssertCardinalityDataset",
        "_FilterDataset",
        "_ParallelFilterDataset",
    }
)
MAP_CLASSES = frozenset({"_MapDataset", "_ParallelMapDataset"})
BATCH_CLASSES = frozenset(
    {
        "BatchDataset",
        "_BatchDataset",
        "_ParallelBatchDataset",
        "_PaddedBatchDataset",
        "PaddedBatchDataset",
        "_RaggedBatchDataset",
        "_DenseToRaggedDataset",
        "_SparseBatchDataset",
        "_RebatchDataset",
        "_BucketBySequenceLengthDataset",
    }
)

ElementKind = Literal["example", "batch"]
ELEMENTS: tuple[str, ...] = ("auto", "example", "batch")


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
    mapped = False
    for name, node in _tf.dataset_chain(dataset):
        if name in BATCH_CLASSES:
            return node, mapped
        if name in MAP_CLASSES:
            mapped = True
        elif name not in PASSTHROUGH_CLASSES:
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
    for name, node in _tf.dataset_chain(dataset):
        if name in ("BatchDataset", "_BatchDataset"):
            source = _tf.dataset_input(node)
            total = None if source is None else cardinality(source)
            size, drop = _tf.batch_arguments(node)
            if total is None or total < 0 or size is None:
                return None
            return total - total % size if drop else total
        if name not in _COUNT_KEEPING:
            return None
    return None


# Transformations after a batch whose effect on the batches is read from their arguments.
_SLICING = frozenset({"_ShardDataset", "_TakeDataset", "_SkipDataset"})
# After a batch, keeping every batch whole (a map may change its leading size: not here).
_SIZE_KEEPING = _COUNT_KEEPING - MAP_CLASSES


def _static_int(node: Any, attribute: str) -> int | None:
    value = tf.get_static_value(getattr(node, attribute, None))
    return None if value is None else int(value)


def _slice_sizes(sizes: list[int], name: str, node: Any) -> list[int] | None:
    """``sizes`` after one shard, take or skip of ``node``; None when its arguments are unknown."""
    if name == "_ShardDataset":
        shards, index = _static_int(node, "_num_shards"), _static_int(node, "_index")
        if shards is None or index is None or shards < 1:
            return None
        return sizes[index::shards]
    count = _static_int(node, "_count")
    if count is None:
        return None
    if name == "_TakeDataset":
        return sizes if count < 0 else sizes[:count]
    return [] if count < 0 else sizes[count:]


def batch_sizes(dataset: Any) -> list[int] | None:
    """The leading size of every element of a dataset that ends in a plain ``batch``.

    Read from the batch's input cardinality, its size and ``drop_remainder``, then through what
    follows it: prefetch, options and cache, and ``shard``, ``take`` and ``skip`` with constant
    arguments. None when any of that is unknown (a map or a filter after the batch, an input
    of unknown size, a batch size that is a tensor).
    """
    after: list[tuple[str, Any]] = []
    for name, node in _tf.dataset_chain(dataset):
        if name in ("BatchDataset", "_BatchDataset"):
            source = _tf.dataset_input(node)
            total = None if source is None else cardinality(source)
            size, drop = _tf.batch_arguments(node)
            if total is None or total < 0 or size is None or size < 1:
                return None
            sizes = [size] * (total // size)
            if total % size and not drop:
                sizes.append(total % size)
            for later_name, later in reversed(after):
                if later_name in _SLICING:
                    sliced = _slice_sizes(sizes, later_name, later)
                    if sliced is None:
                        return None
                    sizes = sliced
            return sizes
        if name not in _SIZE_KEEPING and name not in _SLICING:
            return None
        after.append((name, node))
    return None


# ------------------------------------------------------------------ a source function


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
