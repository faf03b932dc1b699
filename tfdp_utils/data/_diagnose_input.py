"""``diagnose_input``: is training input-bound, where is the pipeline slow, what to change.

TensorFlow glue around the pure :mod:`tfdp_utils.data._input_report`: it checks the
arguments, walks the dataset's chain (:func:`tfdp_utils._tf.dataset_chain`, the one walker)
into stages, times four things on the model's own strategy and hands the figures over:

1. the input alone: the distributed iterator drained, no model;
2. each stage of the tf.data pipeline alone (up to that stage), to find the slow one;
3. the model alone: the compiled train function on one batch cached on the devices;
4. the two together: the same train function fed from the dataset, as ``fit`` runs it.

Every variable the steps change (weights, optimizer state, metrics) is read before and
written back after, so the user's model is as it was.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from tfdp_utils import _tf, _validate
from tfdp_utils._dataset_info import info_of
from tfdp_utils._tf import tf
from tfdp_utils.data._elements import BATCH_CLASSES, MAP_CLASSES
from tfdp_utils.data._input_report import (
    Figures,
    InputDiagnosis,
    Rate,
    Stage,
    StageKind,
    diagnose,
)
from tfdp_utils.data._sources import READER_OPS
from tfdp_utils.errors import StrategyMismatchError

DEFAULT_STEPS = 20
"""Steps timed in each phase by default (after the warm-up)."""

DEFAULT_MAX_SECONDS = 10.0
"""Default budget in seconds for the timed phases (tracing the train step comes on top)."""

WARMUP_STEPS = 2
"""Steps run before each phase's clock starts: the first one traces or fills the pipeline."""

MIN_TIMED_STEPS = 2
"""Steps each phase times even past its share of the budget."""

MIN_WINDOW_SECONDS = 0.5
"""Each phase is timed for at least this long (within its budget), past ``steps`` if need be:
a pipeline's buffers (prefetch, parallel calls in flight) hand out what they made during the
warm-up at once, and a window of a few fast steps is at the mercy of one hiccup of a shared
machine."""

MAX_TIMED_STAGES = 8
"""Stages of the pipeline timed alone, at most."""

# Share of max_seconds each phase may use: input, stages, model, together.
_BUDGET = {"input": 0.3, "stages": 0.2, "model": 0.15, "together": 0.35}

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


class _Exhausted(Exception):
    """The dataset ended twice in a row: it holds no batch."""


# ------------------------------------------------------------------------------ checks


def _check_model(model: Any) -> Any:
    """The model's strategy, after checking ``model`` is a compiled Keras model."""
    if not hasattr(model, "fit") or not hasattr(model, "distribute_strategy"):
        raise TypeError(
            f"model must be a compiled Keras model, but received {model!r:.80} of type "
            f"{type(model).__name__}. Pass the model you train, e.g. "
            "tdu.diagnose_input(model, dataset) after model.compile(...)."
        )
    compiled = getattr(model, "compiled", None)  # Keras 3; tf_keras has no such flag
    if not isinstance(compiled, bool):
        compiled = getattr(model, "optimizer", None) is not None
    if not compiled:
        raise ValueError(
            f"model must be compiled, but {type(model).__name__} {getattr(model, 'name', '')!r} "
            "has no optimizer and loss yet: diagnose_input times its train step. Call "
            "model.compile(optimizer=..., loss=...) first (inside the strategy's scope)."
        )
    return model.distribute_strategy


def _variable_strategy(model: Any) -> Any | None:
    """The strategy that made the model's weights (None: plain variables, no strategy)."""
    try:
        weights = model.weights
    except ValueError:  # tf_keras: a model not built yet has no weights to ask for
        return None
    return _tf.variable_strategy(weights[0]) if weights else None


def _strategy_name(strategy: Any) -> str:
    name = type(strategy).__name__
    return "no strategy (TensorFlow's default)" if name == "_DefaultDistributionStrategy" else name


def _check_strategies(model: Any, strategy: Any, dataset: Any, distributed: bool) -> None:
    made_by = _variable_strategy(model)
    replicas = int(strategy.num_replicas_in_sync)
    if made_by is None and replicas > 1 and getattr(model, "built", False):
        raise StrategyMismatchError(
            f"the model's weights were made without a strategy, but the model reports "
            f"{_strategy_name(strategy)} with {replicas} replicas (called inside its scope?). "
            "Build and compile the model inside `with strategy.scope():` of the strategy "
            "that trains, then call diagnose_input."
        )
    if made_by is not None and made_by is not strategy:
        raise StrategyMismatchError(
            f"the model's weights belong to {_strategy_name(made_by)}, but the model reports "
            f"{_strategy_name(strategy)}. Call diagnose_input outside other strategies' scopes."
        )
    info = info_of(dataset)
    if distributed:
        owner = _tf.distributed_strategy(dataset)
        if owner is not None and owner is not strategy:
            raise StrategyMismatchError(
                "dataset was distributed by another strategy than the model's: "
                f"{_strategy_name(owner)} with {owner.num_replicas_in_sync} replica(s), the "
                f"model's {_strategy_name(strategy)} with {replicas}. Build the dataset with "
                "the strategy the model was compiled under "
                "(tdu.build_distributed_dataset(..., strategy=model.distribute_strategy)), or "
                "pass the tf.data.Dataset before distribution."
            )
    if info is not None and distributed and info.num_replicas_in_sync != replicas:
        raise StrategyMismatchError(
            f"dataset was built for {info.num_replicas_in_sync} replicas but the model "
            f"trains on {replicas}. Build it with strategy=model.distribute_strategy."
        )


_BATCH_IT = (
    "Batch it as you do for fit, e.g. dataset.batch(64) (or build it with "
    "tdu.build_distributed_dataset(..., global_batch_size=64))."
)


def _check_batched(model: Any, dataset: Any) -> None:
    """Refuse a plain dataset whose elements are single examples."""
    if any(name in BATCH_CLASSES for name, _ in _tf.dataset_chain(dataset)):
        return
    specs = tf.nest.flatten(dataset.element_spec)
    scalar = [spec for spec in specs if getattr(getattr(spec, "shape", None), "rank", 1) == 0]
    if scalar:
        raise ValueError(
            "dataset must give batches, but it has no batch transformation and its elements "
            f"hold scalars ({dataset.element_spec}): it looks unbatched. {_BATCH_IT}"
        )
    try:
        inputs = list(getattr(model, "inputs", None) or [])
    except (AttributeError, ValueError):
        inputs = []
    x_spec = tf.nest.flatten(dataset.element_spec)[0]
    rank = getattr(getattr(x_spec, "shape", None), "rank", None)
    if len(inputs) == 1 and rank is not None and rank == len(inputs[0].shape) - 1:
        raise ValueError(
            f"dataset must give batches, but its x has shape {x_spec.shape}, one dimension "
            f"fewer than the model's input {tuple(inputs[0].shape)} with its batch dimension: "
            f"it looks unbatched. {_BATCH_IT}"
        )


def _input_shapes(model: Any) -> list[tuple[int | None, ...]] | None:
    """The shapes the model's inputs declare (batch dimension first), or None when it declares
    none (a subclassed model, a Sequential without ``keras.Input`` not built yet)."""
    try:
        inputs = list(model.inputs or [])
    except (AttributeError, TypeError, ValueError):
        return None
    shapes = [tf.TensorShape(tensor.shape).as_list() for tensor in inputs]
    # The batch dimension is any size (a model built by fit can record its first batch's).
    return [(None, *shape[1:]) if shape else () for shape in shapes] or None


def _x_specs(element_spec: Any) -> list[Any]:
    """The specs of an element's x: the first part of an ``(x, y, ...)`` tuple, else all."""
    x = element_spec[0] if isinstance(element_spec, tuple) and element_spec else element_spec
    return list(tf.nest.flatten(x))


def _shape_text(shape: Any) -> str:
    return str(tuple(tf.TensorShape(shape).as_list()))


_RAISED = re.compile(r"^(?:\w+Error|\(\d+\) [A-Z_]+):\s+")
"""The head of a line that holds an error's own words: ``ValueError: ...`` in a trace that
tf_keras puts in its message ("in user code: ..."), ``(0) UNIMPLEMENTED: ...`` in TensorFlow's."""


def _what_failed(error: BaseException) -> str:
    """The line of ``error``'s message that says what did not fit (no colour codes): one that
    says "incompatible", else the innermost error raised in a trace, else TensorFlow's first
    root error, else the first line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    named = [line for line in lines if "incompatible" in line.lower()]
    raised = [line for line in lines if re.match(r"\w+Error:\s", line)]
    roots = [line for line in lines if re.match(r"\(\d+\) [A-Z_]+:\s", line)]
    line = (named or raised[-1:] or roots or lines or [type(error).__name__])[0]
    return _RAISED.sub("", line).rstrip(".")


def _input_dtypes(model: Any) -> list[Any] | None:
    """The dtypes the model's inputs declare, or None when it declares none."""
    try:
        inputs = list(model.inputs or [])
        return [tf.as_dtype(tensor.dtype) for tensor in inputs] or None
    except (AttributeError, TypeError, ValueError):
        return None


def _loss_name(loss: Any) -> str:
    if isinstance(loss, str):
        return repr(loss)
    return str(getattr(loss, "name", None) or getattr(loss, "__name__", type(loss).__name__))


def _strings_error(
    expected: list[tuple[int | None, ...]] | None,
    dtypes: list[Any],
    element_spec: Any,
    error: BaseException,
) -> ValueError:
    shapes: list[Any] = list(expected) if expected is not None else [None] * len(dtypes)
    takes = " and ".join(
        f"dtype {dtype.name}" + ("" if shape is None else f" and shape {_shape_text(shape)}")
        for dtype, shape in zip(dtypes, shapes, strict=False)
    )
    return ValueError(
        f"dataset's elements do not fit the model: the dataset gives {element_spec}, whose x "
        f"holds strings, but the model takes x of {takes}; its train step failed on the first "
        f"batch with {type(error).__name__}: {_what_failed(error)}. Turn the strings into "
        "numbers before the model: in the pipeline (dataset.map with a "
        "keras.layers.StringLookup or TextVectorization adapted to the data), or in the model "
        "(keras.Input(dtype='string') followed by such a layer)."
    )


def _no_targets_error(loss: Any, element_spec: Any, error: BaseException) -> ValueError:
    return ValueError(
        f"dataset's elements do not fit the model: the dataset gives {element_spec}, x alone "
        f"without targets, but the model was compiled with loss={_loss_name(loss)}, which "
        f"compares targets y with its output; its train step failed on the first batch with "
        f"{type(error).__name__}: {_what_failed(error)}. Make the dataset give (x, y) pairs, "
        "e.g. tf.data.Dataset.from_tensor_slices((x, y)).batch(64), or compile without loss= "
        "for a model that adds its own (add_loss)."
    )


def _misfit_error(
    expected: list[tuple[int | None, ...]] | None,
    element_spec: Any,
    error: BaseException,
    *,
    dtypes: list[Any] | None = None,
    loss: Any = None,
) -> ValueError | None:
    """A clear error when ``error`` (from the model's first call on a batch) says the dataset's
    elements do not fit the model, whose inputs declared the shapes ``expected`` and the
    ``dtypes`` and which was compiled with ``loss``; None when it says something else
    (re-raised as it is)."""
    x_specs = _x_specs(element_spec)
    if (
        dtypes is not None
        and len(dtypes) == len(x_specs)
        and any(
            getattr(spec, "dtype", None) == tf.string and dtype != tf.string
            for dtype, spec in zip(dtypes, x_specs, strict=True)
        )
    ):
        return _strings_error(expected, dtypes, element_spec, error)
    x_misfits = (
        expected is not None
        and len(expected) == len(x_specs)
        and not all(
            tf.TensorShape(shape).is_compatible_with(getattr(spec, "shape", None))
            for shape, spec in zip(expected, x_specs, strict=True)
        )
    )
    if not x_misfits and "incompatible" not in str(error).lower():
        if loss is None or (isinstance(element_spec, tuple) and len(element_spec) >= 2):
            return None
        return _no_targets_error(loss, element_spec, error)  # x alone, for a compiled loss
    if expected is None:
        takes = "the model declares no input shape (it has no keras.Input)"
    else:
        shapes = " and ".join(_shape_text(shape) for shape in expected)
        takes = f"the model takes x of shape {shapes} (batch dimension first)"
    if x_misfits and expected is not None:
        fix = f"Make the dataset give x of shape {shapes} (e.g. fix the map that makes it)"
        if len(x_specs) == 1:
            features = tuple(tf.TensorShape(x_specs[0].shape).as_list()[1:])
            fix += f", or build the model for this data: keras.Input(shape={features})"
    else:
        fix = (
            "Make the dataset give what fit takes for this model: (x, y) with x of the shape "
            "the model takes and y of the shape its loss compares with the model's output"
        )
    return ValueError(
        f"dataset's elements do not fit the model: the dataset gives {element_spec}, "
        f"{'but' if x_misfits else 'and'} {takes}; its train step failed on the first batch "
        f"with {type(error).__name__}: {_what_failed(error)}. {fix}."
    )


def _is_distributed(dataset: Any) -> bool:
    return isinstance(dataset, tf.distribute.DistributedDataset)


def _check_dataset(dataset: Any) -> None:
    if isinstance(dataset, tf.data.Dataset) or _is_distributed(dataset):
        return
    raise TypeError(
        "dataset must be a batched tf.data.Dataset or a distributed dataset from "
        f"tdu.build_distributed_dataset, but received {type(dataset).__name__}. For arrays, "
        "pass tf.data.Dataset.from_tensor_slices((x, y)).batch(64)."
    )


# ---------------------------------------------------------------------- the pipeline


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


def _chain(pipeline: Any) -> list[tuple[Stage, Any]]:
    """The pipeline's stages, source first, each with its dataset node."""
    nodes = [node for name, node in _tf.dataset_chain(pipeline) if name not in _HIDDEN_CLASSES]
    nodes.reverse()
    stages = []
    for node in nodes:
        kind, parallel, python, files = _classify(node)
        stages.append((Stage(_stage_name(node), kind, parallel, python, files), node))
    return stages


def _first_rank(spec: Any) -> int | None:
    shape = getattr(tf.nest.flatten(spec)[0], "shape", None)
    return None if shape is None else shape.rank


def _count_one(*element: Any) -> Any:
    return tf.constant(1, tf.int64)


def _batchable(element_spec: Any) -> bool:
    """Whether elements of ``element_spec`` can be stacked by ``batch`` (dense, fixed shapes)."""
    return all(
        type(spec) is tf.TensorSpec and spec.shape.is_fully_defined()
        for spec in tf.nest.flatten(element_spec)
    )


def _timed_cuts(stages: list[tuple[Stage, Any]], final_rank: int | None) -> list[tuple[int, bool]]:
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
        if batched and (final_rank is None or _first_rank(node.element_spec) != final_rank):
            continue
        cuts.append((index, not batched))
    return cuts[:MAX_TIMED_STAGES]


STAGE_PASSES = 2
"""Timed windows per stage, interleaved over the stages; the faster is kept."""


def _time_stages(
    stages: list[tuple[Stage, Any]],
    cuts: list[tuple[int, bool]],
    options: Any,
    *,
    chunk: int,
    limit: int,
    seconds: float,
) -> dict[int, float | None]:
    """Examples per second of each cut stage, in ``seconds`` in all: two interleaved passes,
    the faster kept per stage (load only slows a window; one spike in a stage's only window
    named the next stage as the slow one)."""
    timed: dict[int, float | None] = dict.fromkeys(range(len(stages)))
    for _ in range(STAGE_PASSES):
        for index, examples in cuts:
            rate = _time_stage(
                stages[index][1],
                options,
                examples=examples,
                chunk=chunk,
                limit=limit,
                seconds=seconds / max(1, STAGE_PASSES * len(cuts)),
            )
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
        total += _leading_size(tf.nest.flatten(element)[0])
        elements += 1
        if total >= limit or (elements >= MIN_TIMED_STEPS and time.perf_counter() > deadline):
            break
    elapsed = time.perf_counter() - start
    if elements == 0 or elapsed <= 0:
        return None
    return total / elapsed


# -------------------------------------------------------------------------- timing


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _leading_size(value: Any) -> int:
    if isinstance(value, tf.RaggedTensor):
        return int(value.nrows())
    if isinstance(value, tf.SparseTensor):
        return int(value.dense_shape[0])
    shape = getattr(value, "shape", None)
    return int(shape[0]) if shape is not None and shape.rank else 0


def _examples_in(strategy: Any, element: Any) -> int:
    """Examples in one distributed element, summed over this worker's replicas."""
    first = tf.nest.flatten(element)[0]
    return sum(_leading_size(v) for v in strategy.experimental_local_results(first))


class _Feed:
    """An iterator over a distributed dataset that starts again when the dataset ends."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.iterator: Iterator[Any] | None = iter(dataset)
        self.restarts = 0

    def close(self) -> None:
        """Let the iterator go (its prefetch threads stop competing for the cores)."""
        self.iterator = None

    def run(self, step: Callable[[Iterator[Any]], Any]) -> Any:
        """``step(iterator)``; once more on a fresh iterator if the dataset ended."""
        for attempt in range(2):
            try:
                return step(self.iterator)  # type: ignore[arg-type]
            except (StopIteration, tf.errors.OutOfRangeError):
                if attempt:
                    break
                self.iterator = iter(self.dataset)
                self.restarts += 1
        raise _Exhausted


def _timed(
    step: Callable[[], int],
    *,
    steps: int,
    deadline: float | None,
    warmup: int = WARMUP_STEPS,
    min_seconds: float = 0.0,
) -> Rate:
    """Run ``step`` (it returns the examples it handled) ``warmup`` times, then time ``steps``
    calls (more while under ``min_seconds``), stopping at ``deadline`` (None: never, and then
    exactly ``steps``) after :data:`MIN_TIMED_STEPS`."""
    for _ in range(warmup):
        step()
    cpu, start = _cpu_seconds(), time.perf_counter()
    # Without a deadline (several workers) every worker times exactly ``steps``.
    window = 0.0 if deadline is None else min(min_seconds, max(0.0, deadline - start))
    examples = done = 0
    while done < steps or time.perf_counter() - start < window:
        examples += step()
        done += 1
        if deadline is not None and done >= MIN_TIMED_STEPS and time.perf_counter() > deadline:
            break
    return Rate(examples, done, time.perf_counter() - start, _cpu_seconds() - cpu)


# ----------------------------------------------------------------------- model state


def _state_variables(model: Any) -> list[Any]:
    """Every variable a train step may change: weights, optimizer state, metrics."""
    optimizer_variables = getattr(model.optimizer, "variables", [])
    if callable(optimizer_variables):  # legacy optimizers: a method
        optimizer_variables = optimizer_variables()
    metric_variables = [v for metric in getattr(model, "metrics", []) for v in metric.variables]
    # tf_keras' LossScaleOptimizer keeps its loss scale and good-step count out of its
    # variables: the diagnosis's steps move them, and the fit after it would start elsewhere.
    loss_scale = getattr(model.optimizer, "_loss_scale", None)
    scale_variables = list((getattr(loss_scale, "_weights", None) or {}).values())
    seen: dict[int, Any] = {}
    for variable in [*model.variables, *optimizer_variables, *metric_variables, *scale_variables]:
        seen.setdefault(id(variable), variable)
    return list(seen.values())


def _snapshot(model: Any) -> list[tuple[Any, Any]]:
    return [(variable, variable.numpy()) for variable in _state_variables(model)]


def _restore(model: Any, saved: list[tuple[Any, Any]]) -> None:
    for variable, value in saved:
        variable.assign(value)
    known = {id(variable) for variable, _ in saved}
    for metric in getattr(model, "metrics", []):
        if any(id(v) not in known for v in metric.variables):
            metric.reset_state()  # made by the steps (tf_keras builds metrics in the first)


# ---------------------------------------------------------------------- the function


def _describe_dataset(dataset: Any, distributed: bool, builder: bool) -> str:
    if builder and distributed:
        return "build_distributed_dataset (distributed)"
    if builder:
        return "build_distributed_dataset (tf.data.Dataset)"
    if distributed:
        return f"distributed dataset ({type(dataset).__name__})"
    return "tf.data.Dataset, distributed here as fit would"


def _cached(strategy: Any, dataset: Any, pipeline: Any, distributed: bool) -> Any:
    """A distributed dataset that repeats this worker's first step, cached."""
    options = _tf.distributed_input_options(dataset) if distributed else None
    if distributed and _tf.distributed_from_function(dataset):
        local = max(1, len(strategy.extended.worker_devices))  # this worker's replicas
        repeated = pipeline.take(local).cache().repeat()
        return strategy.distribute_datasets_from_function(lambda _: repeated, options=options)
    return strategy.experimental_distribute_dataset(
        pipeline.take(1).cache().repeat(), options=options
    )


def diagnose_input(
    model: Any,
    dataset: Any,
    *,
    steps: int = DEFAULT_STEPS,
    max_seconds: float = DEFAULT_MAX_SECONDS,
) -> InputDiagnosis:
    """Tell whether training is input-bound, which stage of the pipeline is slow, what to change.

    Times, on the model's own strategy (``model.distribute_strategy``): the input pipeline
    alone (the dataset iterated as training reads it, no model); each stage of the
    ``tf.data`` pipeline alone, to find the slow one; the model alone (its compiled train step
    on one batch cached on the devices); and the two together (the same train step fed from
    the dataset, as ``fit`` runs it, without callbacks). The input is the limit when the model
    alone is more than 1.1x faster than the input alone (``factor``). The advice comes from
    the pipeline's transformations (serial reads or maps, Python stages, caches, the
    service) and the figures (the slow stage, the CPU time the pipeline used against the wall
    time: CPU-saturated or waiting on latency).

    The model is left as it was: every weight, optimizer variable (``iterations`` included)
    and metric variable is read before the first step and written back after the last, also
    when a step fails. A model that is not built yet is built first, as ``fit`` would (its
    weights then keep their fresh initial values).

    Bounded: each phase times ``steps`` steps after 2 warm-up steps and stops early at its
    share of ``max_seconds`` (after at least 2 timed steps); a phase goes on past ``steps``
    until it has run for 0.5 s (within its share), so that the pipeline's buffers cannot make
    a short window look fast. Tracing the train step (once, as ``fit``'s first
    step does) comes on top. On several workers, call it on every worker at
    the same time with the same arguments: the phases that step the strategy then run exactly
    ``steps`` steps (every worker must take part in each), and ``max_seconds`` bounds only the
    local timing of the pipeline's stages.

    A ``cache()`` in the pipeline is being filled while it is timed (the first epoch's speed is
    measured), and a pipeline that ends before the phases do is started again, as the next
    epoch would be.

    Args:
        model: a compiled Keras model (Keras 3 or tf_keras), built and compiled under the
            strategy that trains (or none).
        dataset: a batched ``tf.data.Dataset`` (as given to ``fit``; distributed here as
            ``fit`` would), or a distributed dataset from
            :func:`~tfdp_utils.build_distributed_dataset` (or
            ``strategy.experimental_distribute_dataset``) made with the model's strategy.
        steps: steps to time in each phase. Defaults to `20`.
        max_seconds: the time budget of the timed phases, in seconds. Defaults to `10.0`.

    Returns:
        An :class:`~tfdp_utils.InputDiagnosis`; ``print(report.summary())`` for a bug report.

    Raises:
        TypeError: ``model`` is not a Keras model, ``dataset`` is not a dataset, or
            ``steps``/``max_seconds`` are not numbers.
        ValueError: the model is not compiled, the dataset is unbatched or gives no batch,
            its elements do not fit the model (naming the element spec and the model's input
            shape), ``steps`` < 1 or ``max_seconds`` <= 0.
        StrategyMismatchError: the dataset (or the model's weights) belong to another
            strategy than the model's.

    Example:

    ```python
    report = tdu.diagnose_input(model, dataset, steps=10)
    print(report.summary())
    if report.input_bound:
        for advice in report.advice:
            print(advice.kind, advice.message)
    ```
    """
    started = time.perf_counter()
    steps = _validate.positive_int(steps, "steps", hint="Pass e.g. steps=20.")
    max_seconds = _validate.positive_float(
        max_seconds, "max_seconds", unit="number of seconds", hint="Pass e.g. max_seconds=10."
    )
    strategy = _check_model(model)
    _check_dataset(dataset)
    distributed = _is_distributed(dataset)
    _check_strategies(model, strategy, dataset, distributed)
    if distributed:
        pipelines = _tf.distributed_pipelines(dataset)
        if not pipelines:
            raise TypeError(
                f"dataset is a {type(dataset).__name__} whose tf.data pipeline cannot be read "
                "here; pass the tf.data.Dataset before distribution, or a dataset from "
                "tdu.build_distributed_dataset."
            )
        pipeline, dist = pipelines[0], dataset
    else:
        _check_batched(model, dataset)
        pipeline, dist = dataset, strategy.experimental_distribute_dataset(dataset)
    info = info_of(dataset)
    fixed = _tf.in_multi_worker_mode(strategy)
    budget = {phase: share * max_seconds for phase, share in _BUDGET.items()}
    notes: list[str] = []

    def deadline(phase: str) -> float | None:
        return None if fixed else time.perf_counter() + budget[phase]

    # 1. The input alone, through the distributed iterator.
    feed = _Feed(dist)
    first: list[Any] = []

    def next_batch() -> int:
        element = feed.run(next)
        if not first:
            first.append(element)
        return _examples_in(strategy, element)

    try:
        input_rate = _timed(
            next_batch, steps=steps, deadline=deadline("input"), min_seconds=MIN_WINDOW_SECONDS
        )
    except _Exhausted:
        raise ValueError(
            "dataset gave no batch: it is empty (a filter that drops everything, an empty "
            "file, a take(0)). Pass the dataset you train on."
        ) from None
    global_batch = _examples_in(strategy, first[0])
    if global_batch == 0:
        raise ValueError("dataset's first batch holds no example; pass the dataset you train on.")

    # The model is built (as fit does before its first step) before its state is read.
    replica_batch = strategy.experimental_local_results(first[0])[0]
    with _fitting(model, pipeline.element_spec):
        _tf.build_for_training(model, replica_batch)
    model.make_train_function()
    train = model.train_function
    per_call = _tf.steps_per_execution(model)
    saved = _snapshot(model)
    try:
        # The train step is traced for the dataset's iterator now, so that the clock of the
        # together phase never runs while the pipeline fills its buffers during a trace.
        # The model's first call on a batch: elements that do not fit it fail here.
        with _fitting(model, pipeline.element_spec):
            feed.run(train)
        feed.close()
        first.clear()

        # 2. Each stage of the pipeline alone.
        stages = _chain(pipeline)
        cuts = _timed_cuts(stages, _first_rank(pipeline.element_spec))
        options = pipeline.options()
        timed = _time_stages(
            stages,
            cuts,
            options,
            chunk=max(1, global_batch),
            limit=4 * steps * global_batch,
            seconds=budget["stages"],
        )
        stage_list = tuple(
            Stage(s.name, s.kind, s.parallel, s.python, s.files, timed[i])
            for i, (s, _) in enumerate(stages)
        )

        # 3. The model alone on one cached batch.
        calls = math.ceil(steps / per_call)
        cached = _Feed(_cached(strategy, dataset, pipeline, distributed))
        cached_examples = global_batch * per_call

        def cached_step() -> int:
            cached.run(train)
            return cached_examples

        model_rate = _timed(
            cached_step, steps=calls, deadline=deadline("model"), min_seconds=MIN_WINDOW_SECONDS
        )
        cached.close()

        # 4. The two together: train steps fed from a fresh iterator of the dataset.
        fresh = _Feed(dist)
        position = [0]

        def together_step() -> int:
            fresh.run(train)
            first_step = position[0]
            position[0] += per_call
            if info is not None and fresh.restarts == 0:
                return sum(info.examples_in_steps(first_step, position[0]))
            return global_batch * per_call

        together_rate = _timed(
            together_step,
            steps=calls,
            deadline=deadline("together"),
            min_seconds=MIN_WINDOW_SECONDS,
        )
        if fresh.restarts:
            notes.append(
                f"the dataset ended {fresh.restarts} time(s) while training was timed and was "
                "started again (as the next epoch); its startup is in the figures"
            )
        fresh.close()
    except _Exhausted:
        raise ValueError(
            "dataset ended at once when iterated again: it gives its batches only once (e.g. "
            "a one-shot generator). Pass a dataset that can be iterated again."
        ) from None
    finally:
        _restore(model, saved)

    model_rate = _per_call_steps(model_rate, per_call)
    together_rate = _per_call_steps(together_rate, per_call)
    if any(rate.steps < steps for rate in (input_rate, model_rate, together_rate)):
        notes.append(
            f"max_seconds={max_seconds:g} cut a phase short of steps={steps} (the steps timed "
            "are listed); the figures are over fewer steps"
        )
    chain_names = [name for name, _ in _tf.dataset_chain(pipeline)]
    figures = Figures(
        input=input_rate,
        model=model_rate,
        together=together_rate,
        stages=stage_list,
        cores=_cores(),
        builder=info is not None,
        prefetches="_PrefetchDataset" in chain_names[:3],
        cached_after=_cached_after(stages),
        service=any("DataService" in name for name in chain_names),
    )
    return diagnose(
        figures,
        seconds=time.perf_counter() - started,
        global_batch_size=global_batch,
        num_replicas_in_sync=int(strategy.num_replicas_in_sync),
        strategy=_strategy_name(strategy),
        keras=f"{_tf.KERAS_FLAVOUR} {_tf.KERAS_VERSION}; TensorFlow {tf.__version__}",
        dataset=_describe_dataset(dataset, distributed, info is not None),
        notes=notes,
    )


@contextlib.contextmanager
def _fitting(model: Any, element_spec: Any) -> Iterator[None]:
    """Turn an error that says the elements do not fit the model into a clear ValueError (the
    original chained); other errors pass as they are."""
    expected = _input_shapes(model)  # before the call: tf_keras relaxes a Sequential's inputs
    dtypes = _input_dtypes(model)
    try:
        yield
    except (ValueError, tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as exc:
        loss = getattr(model, "loss", None)
        error = _misfit_error(expected, element_spec, exc, dtypes=dtypes, loss=loss)
        if error is None:
            raise
        raise error from exc


def _per_call_steps(rate: Rate, per_call: int) -> Rate:
    """``rate`` with its calls of the train function counted as steps."""
    return Rate(rate.examples, rate.steps * per_call, rate.seconds, rate.cpu_seconds)


def _cached_after(stages: list[tuple[Stage, Any]]) -> tuple[int, ...]:
    """Indices of the stages a ``cache()`` follows (somewhere downstream)."""
    caches = [
        i for i, (_, node) in enumerate(stages) if _tf.dataset_class_name(node) in _CACHE_CLASSES
    ]
    if not caches:
        return ()
    return tuple(range(max(caches)))


diagnose_input.__module__ = "tfdp_utils"  # public home (tfdp_utils._public)
