"""The pipeline's stages for :func:`~tfdp_utils.diagnose_input`: the dataset's chain walked
(:func:`tfdp_utils._tf.dataset_chain`, the one walker) into
:class:`~tfdp_utils.data._input_figures.Stage` records, and each stage timed alone (the
pipeline up to it), to find the slow one.

TensorFlow glue: the rule that names the slow stage from these rates is pure
(:func:`tfdp_utils.data._input_figures.bottleneck`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from tfdp_utils import _tf
from tfdp_utils._tf import tf
from tfdp_utils.data._elements import BATCH_CLASSES, MAP_CLASSES
from tfdp_utils.data._input_figures import Stage, StageKind
from tfdp_utils.data._sources import READER_OPS
from tfdp_utils.data._step_timing import MIN_TIMED_STEPS, leading_size

MAX_TIMED_STAGES = 8
"""Stages of the pipeline timed alone, at most."""

STAGE_PASSES = 2
"""Timed windows per stage, interleaved over the stages; the faster is kept."""

_READER_CLASSES = frozenset(
    {
        "TFRecordDatasetV2",
        "TFRecordDatasetV1",
        "_TFRecordDataset",
        "TextLineDatasetV2",
        "TextLineDatasetV1",
        "_TextLineDataset",
        "FixedLengthRecordDatasetV2",
        "FixedLengthRecordDatasetV1",
        "_FixedLengthRecordDataset",
    }
)
_INTERLEAVE_CLASSES = frozenset(
    {
        "_InterleaveDataset",
        "_ParallelInterleaveDataset",
        "ParallelInterleaveDataset",
        "_FlatMapDataset",
    }
)
_PYTHON_OPS = frozenset({"EagerPyFunc", "PyFunc", "PyFuncStateless"})
_HIDDEN_CLASSES = frozenset({"_OptionsDataset", "_RestructuredDataset"})
_CACHE_CLASSES = frozenset({"CacheDataset", "_CacheDataset", "_MemoryCacheDataset"})


# ---------------------------------------------------------------------- the chain


def _stage_name(node: Any) -> str:
    name = _tf.dataset_class_name(node).lstrip("_")
    return name.replace("DatasetV", "V").removesuffix("Dataset") or name


def _classify(node: Any) -> tuple[StageKind, int | None, bool, int | None]:
    """(kind, parallelism, runs Python, files) of one transformation."""
    name = _tf.dataset_class_name(node)
    parallel = _tf.dataset_parallelism(node)
    if name in _READER_CLASSES:
        return "read", parallel, False, _tf.dataset_file_count(node)
    ops = _tf.dataset_function_ops(node)
    python = bool(ops & _PYTHON_OPS)
    if name in _INTERLEAVE_CLASSES:
        if "GeneratorDataset" in ops:
            return "generator", parallel, True, None
        if ops & READER_OPS:
            source = _tf.dataset_input(node)
            count = None if source is None else int(source.cardinality())
            return "read", parallel, python, count if count is not None and count >= 0 else None
        return "interleave", parallel, python, None
    if name in MAP_CLASSES:
        return "map", parallel, python, None
    if name in BATCH_CLASSES:
        return "batch", parallel, python, None
    if _tf.dataset_input(node) is None:
        return "source", None, python, None
    return "other", parallel, python, None


def chain(pipeline: Any) -> list[tuple[Stage, Any]]:
    """The pipeline's stages, source first, each with its dataset node."""
    nodes = [node for name, node in _tf.dataset_chain(pipeline) if name not in _HIDDEN_CLASSES]
    nodes.reverse()
    stages = []
    for node in nodes:
        kind, parallel, python, files = _classify(node)
        stages.append((Stage(_stage_name(node), kind, parallel, python, files), node))
    return stages


def first_rank(spec: Any) -> int | None:
    """The rank of the first tensor of an element of ``spec`` (None: unknown)."""
    shape = getattr(tf.nest.flatten(spec)[0], "shape", None)
    return None if shape is None else shape.rank


def cached_after(stages: list[tuple[Stage, Any]]) -> tuple[int, ...]:
    """Indices of the stages a ``cache()`` follows (somewhere downstream)."""
    caches = [
        i for i, (_, node) in enumerate(stages) if _tf.dataset_class_name(node) in _CACHE_CLASSES
    ]
    if not caches:
        return ()
    return tuple(range(max(caches)))


# --------------------------------------------------------------------- the timing


def _count_one(*element: Any) -> Any:
    return tf.constant(1, tf.int64)


def _batchable(element_spec: Any) -> bool:
    """Whether elements of ``element_spec`` can be stacked by ``batch`` (dense, fixed shapes)."""
    return all(
        type(spec) is tf.TensorSpec and spec.shape.is_fully_defined()
        for spec in tf.nest.flatten(element_spec)
    )


def timed_cuts(stages: list[tuple[Stage, Any]], final_rank: int | None) -> list[tuple[int, bool]]:
    """Stages to time alone: (index, elements are examples), from the last read on.

    Up to the first batch an element is one example; after it, a stage is timed only when its
    elements have the rank of the pipeline's batches (they are batches of examples).
    """
    start = max(
        (i for i, (s, _) in enumerate(stages) if s.kind in ("read", "generator", "interleave")),
        default=0,
    )
    cuts: list[tuple[int, bool]] = []
    batched = False
    for index in range(start, len(stages)):
        stage, node = stages[index]
        if stage.kind == "batch":
            batched = True
        if stage.kind not in ("source", "read", "generator", "interleave", "map", "batch"):
            continue
        if batched and (final_rank is None or first_rank(node.element_spec) != final_rank):
            continue
        cuts.append((index, not batched))
    return cuts[:MAX_TIMED_STAGES]


def time_stages(
    stages: list[tuple[Stage, Any]],
    cuts: list[tuple[int, bool]],
    options: Any,
    *,
    chunk: int,
    limit: int,
    seconds: float,
    into: dict[int, float | None] | None = None,
    stop: threading.Event | None = None,
) -> dict[int, float | None]:
    """Examples per second of each cut stage, in ``seconds`` in all: two interleaved passes,
    the faster kept per stage (load only slows a window; one spike in a stage's only window
    named the next stage as the slow one). Written into ``into`` when given (a caller that
    stops waiting keeps those timed so far): the first pass's rates as they come, a later
    pass's only once it timed every stage (a pass cut short would leave the stages it reached
    with two windows and the rest with one, and a spike in one of those would stand out as
    the slow stage); no stage is started once ``stop`` is set."""
    timed: dict[int, float | None] = into if into is not None else {}
    timed.update(dict.fromkeys(range(len(stages))))
    for passed in range(STAGE_PASSES):
        window: dict[int, float | None] = timed if passed == 0 else {}
        for index, examples in cuts:
            if stop is not None and stop.is_set():
                return timed
            rate = _time_stage(
                stages[index][1],
                options,
                examples=examples,
                chunk=chunk,
                limit=limit,
                seconds=seconds / max(1, STAGE_PASSES * len(cuts)),
            )
            best = window.get(index)
            if rate is not None and (best is None or rate > best):
                window[index] = rate
        for index, rate in window.items():
            best = timed[index]
            if rate is not None and (best is None or rate > best):
                timed[index] = rate
    return timed


def _time_stage(
    node: Any, options: Any, *, examples: bool, chunk: int, limit: int, seconds: float
) -> float | None:
    """Examples per second of ``node`` iterated alone, or None when too few elements.

    Elements that are examples are counted in batches of ``chunk`` (stacked by ``batch``,
    which costs far less per element than a counting map); elements that are batches are
    counted by their leading size.
    """
    dataset = node
    if options is not None:
        try:
            dataset = dataset.with_options(options)
        except ValueError:  # options that conflict with the node's own
            dataset = node
    if examples:
        if not _batchable(dataset.element_spec):
            dataset = dataset.map(_count_one)
        dataset = dataset.batch(chunk)
    iterator = iter(dataset)
    try:
        next(iterator)  # the first element starts the pipeline
    except StopIteration:
        return None
    start = time.perf_counter()
    deadline = start + seconds
    total = elements = 0
    for element in iterator:
        total += leading_size(tf.nest.flatten(element)[0])
        elements += 1
        if total >= limit or (elements >= MIN_TIMED_STEPS and time.perf_counter() > deadline):
            break
    elapsed = time.perf_counter() - start
    if elements == 0 or elapsed <= 0:
        return None
    return total / elapsed
