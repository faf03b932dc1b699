"""Distributed datasets that see every example exactly once, with equal steps on every worker.

Two layers, as elsewhere in the package:

* :func:`plan_sharding` decides how the data is split between workers and says why. The
  decision and the epoch arithmetic (:func:`decide_policy`, :func:`assign_files`,
  :func:`split_examples`, :func:`epoch_layout`) are pure Python, tested in microseconds.
* :func:`build_distributed_dataset` applies the plan with ``tf.data``: it shards, shuffles,
  maps, batches per replica and prefetches inside
  ``strategy.distribute_datasets_from_function``, and attaches a
  :class:`~tfdp_utils.dataset_info.DatasetInfo` with the exact per-replica counts.

Why the builder shards by itself instead of relying on tf.data's autoshard rewrite: AUTO
silently falls back to DATA (every worker reads everything), FILE on a non-file source
raises NotFoundError with a graph dump, one file with two workers errors on one worker while
the other blocks in a collective (tensorflow#35878, #36153, #37112, #26222). Sharding the
unbatched stream explicitly makes the split a partition by construction, and TensorFlow's
distributed iterator (which all-reduces "has data" across workers every step when batches
may be partial) keeps the step count equal: a worker that runs out first feeds empty
batches until every worker is done.
"""

from __future__ import annotations

import dataclasses
import glob as _glob
import inspect
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast

from tfdp_utils import dataset_info
from tfdp_utils.batching import check_size, split_batch_size
from tfdp_utils.dataset_info import DatasetInfo

logger = logging.getLogger("tfdp_utils")

ShardPolicy = Literal["file", "data", "hint", "off"]
SourceKind = Literal["dataset", "arrays", "files", "function"]

SHARD_POLICIES: tuple[str, ...] = ("auto", "file", "data", "hint", "off")
MAX_PARALLEL_FILES = 16
"""Files a worker reads at once (the interleave's cycle length and parallelism)."""
DEFAULT_SHUFFLE_SEED = 1234
"""Seed used when shuffling with DATA sharding and no ``seed`` was given.

Every worker must shuffle identically for DATA sharding to stay disjoint, and workers cannot
agree on a random seed without communicating, so a fixed seed stands in."""

# Dataset ops that read files; tf.data's FILE autoshard rewrite looks for the same ones.
_READER_OPS = frozenset(
    {
        "TFRecordDataset",
        "TFRecordDatasetV2",
        "TextLineDataset",
        "FixedLengthRecordDataset",
        "FixedLengthRecordDatasetV2",
        "ArrayRecordDataset",
        "RecordIODataset",
        "SSTableDataset",
    }
)
# Transformations that keep the element structure; walked through to find a batch.
_PASSTHROUGH_CLASSES = frozenset(
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
_MAP_CLASSES = frozenset({"_MapDataset", "_ParallelMapDataset"})
_BATCH_CLASSES = frozenset(
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


# ------------------------------------------------------------------------- the pure part


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
    """How a source is split between workers, and what each worker will see.

    Attributes:
        policy: the policy applied: ``"file"`` (each worker reads its own files),
            ``"data"`` (every worker reads everything and keeps every ``num_workers``-th
            example), ``"hint"`` (tf.data shards where the dataset calls
            ``shard(tf.data.experimental.SHARD_HINT, ...)``) or ``"off"`` (no sharding: a
            single worker, or a ``fn(input_context)`` source that shards itself).
        reason: one line saying why, e.g. ``"4 files >= 2 workers -> file"``.
        num_workers: input pipelines (worker processes).
        source_kind: ``"dataset"``, ``"arrays"``, ``"files"`` or ``"function"``.
        requested: the ``shard_policy`` asked for.
        files_per_worker: for file sources, the files each worker reads, by worker index.
            Every worker reads every file under ``"data"``. Empty for other sources.
        examples_per_worker: examples each worker receives per epoch, when known.
        steps_per_worker: steps each worker runs per epoch (the same for all), when known.
    """

    policy: ShardPolicy
    reason: str
    num_workers: int
    source_kind: SourceKind
    requested: str = "auto"
    files_per_worker: tuple[tuple[str, ...], ...] = ()
    examples_per_worker: tuple[int, ...] | None = None
    steps_per_worker: int | None = None

    @property
    def num_examples(self) -> int | None:
        """Examples per epoch over all workers, when known."""
        if self.examples_per_worker is None:
            return None
        return sum(self.examples_per_worker)

    def describe(self) -> str:
        """A one-line summary for logs."""
        parts = [f"shard_policy={self.policy} over {self.num_workers} worker(s): {self.reason}"]
        if self.files_per_worker and self.policy == "file":
            counts = ", ".join(str(len(f)) for f in self.files_per_worker)
            parts.append(f"files per worker [{counts}]")
        if self.examples_per_worker is not None:
            parts.append(f"examples per worker {list(self.examples_per_worker)}")
        if self.steps_per_worker is not None:
            parts.append(f"{self.steps_per_worker} steps per epoch on every worker")
        return "; ".join(parts)


def check_policy(shard_policy: Any) -> str:
    """Normalise ``shard_policy`` to one of :data:`SHARD_POLICIES` or raise ``ValueError``."""
    value = shard_policy.strip().lower() if isinstance(shard_policy, str) else shard_policy
    if value not in SHARD_POLICIES:
        raise ValueError(
            f"shard_policy={shard_policy!r} is not a sharding policy; expected one of "
            f"{', '.join(repr(p) for p in SHARD_POLICIES)}. Use 'auto' to let the builder "
            "choose."
        )
    return str(value)


def decide_policy(
    shard_policy: str,
    *,
    source_kind: SourceKind,
    num_workers: int,
    num_files: int | None = None,
    has_reader: bool = False,
) -> tuple[ShardPolicy, str]:
    """Which policy to apply, and why. Pure.

    ``"auto"``: nothing on a single worker; FILE when there are at least as many files as
    workers; DATA otherwise. A ``fn(input_context)`` source shards itself (OFF).

    Args:
        shard_policy: one of :data:`SHARD_POLICIES`.
        source_kind: ``"dataset"``, ``"arrays"``, ``"files"`` or ``"function"``.
        num_workers: input pipelines (worker processes).
        num_files: number of files for a ``"files"`` source. Defaults to `None`.
        has_reader: whether a ``"dataset"`` source reads files (for ``"file"``).
            Defaults to `False`.

    Returns:
        ``(policy, reason)``.

    Raises:
        ValueError: unknown policy, or ``"file"`` / ``"hint"`` on a source that cannot be
            sharded that way.
    """
    requested = check_policy(shard_policy)
    workers = f"{num_workers} worker{'s' if num_workers != 1 else ''}"
    if requested == "file":
        if source_kind == "files":
            return "file", f"shard_policy='file' given; {num_files} files over {workers}"
        if source_kind == "dataset" and has_reader:
            return "file", f"shard_policy='file' given; the dataset reads files ({workers})"
        what = {
            "arrays": "in-memory arrays",
            "function": "a fn(input_context) source",
            "dataset": "a tf.data.Dataset that reads no files",
        }.get(source_kind, source_kind)
        raise ValueError(
            f"shard_policy='file' needs a source that reads files, but received {what}. "
            "Pass file paths (a path, a list of paths or a glob) as source, or use "
            "shard_policy='data' (every worker reads everything and keeps its share) or 'auto'."
        )
    if requested == "hint":
        if source_kind != "dataset":
            raise ValueError(
                f"shard_policy='hint' applies to a tf.data.Dataset that calls "
                f"shard(tf.data.experimental.SHARD_HINT, ...), but the source is {source_kind}. "
                "Use shard_policy='auto'."
            )
        return "hint", f"shard_policy='hint' given ({workers})"
    if requested == "data":
        return "data", f"shard_policy='data' given ({workers})"
    if requested == "off":
        if num_workers > 1 and source_kind != "function":
            why = f"shard_policy='off' given: each of the {workers} reads and trains on everything"
        else:
            why = f"shard_policy='off' given ({workers})"
        return "off", why
    # auto
    if source_kind == "function":
        return "off", "fn(input_context) source shards its own data by input_pipeline_id"
    if num_workers <= 1:
        return "off", "a single worker: nothing to shard"
    if source_kind == "files":
        if num_files is not None and num_files >= num_workers:
            return "file", f"{num_files} files >= {workers} -> file"
        return "data", f"{num_files} file(s) < {workers} -> data (every worker reads all files)"
    if source_kind == "arrays":
        return "data", f"in-memory arrays on {workers} -> data"
    return "data", (
        f"a tf.data.Dataset on {workers}: its files are not visible to the planner -> data "
        "(pass file paths as source to shard by file)"
    )


def assign_files(
    files: Sequence[str], num_workers: int, sizes: Sequence[int] | None = None
) -> tuple[tuple[str, ...], ...]:
    """Split ``files`` between workers so that bytes per worker are as even as possible. Pure.

    Largest file first, each to the worker with the fewest bytes so far (ties: fewest files,
    then lowest index); each worker's files keep the given order. Deterministic, so every
    worker computes the same assignment.

    Args:
        files: file paths, in a fixed order (sorted by the builder).
        num_workers: workers to split between.
        sizes: byte size of each file. Defaults to `None` (round robin).

    Returns:
        The files of each worker, by worker index.
    """
    if sizes is None:
        return tuple(tuple(files[i::num_workers]) for i in range(num_workers))
    if len(sizes) != len(files):
        raise ValueError(f"got {len(sizes)} sizes for {len(files)} files.")
    order = sorted(range(len(files)), key=lambda i: (-sizes[i], i))
    loads = [0] * num_workers
    chosen: list[list[int]] = [[] for _ in range(num_workers)]
    for index in order:
        worker = min(range(num_workers), key=lambda w: (loads[w], len(chosen[w]), w))
        loads[worker] += sizes[index]
        chosen[worker].append(index)
    return tuple(tuple(files[i] for i in sorted(c)) for c in chosen)


def file_imbalance(
    files_per_worker: Sequence[Sequence[str]],
    files: Sequence[str],
    sizes: Sequence[int] | None,
) -> float | None:
    """Bytes of the busiest worker over the mean bytes per worker (1.0 = even). Pure."""
    if sizes is None or not files_per_worker:
        return None
    size_of = dict(zip(files, sizes, strict=True))
    loads = [sum(size_of[f] for f in worker_files) for worker_files in files_per_worker]
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else None


def split_examples(num_examples: int, num_workers: int) -> tuple[int, ...]:
    """Examples each worker keeps when ``shard(num_workers, index)`` splits ``num_examples``."""
    return tuple(
        max(0, (num_examples - index + num_workers - 1) // num_workers)
        for index in range(num_workers)
    )


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


# ------------------------------------------------------------------------ gathering facts


def _tf() -> Any:
    from tfdp_utils._tf import tf

    return tf


def _is_dataset(source: Any) -> bool:
    return isinstance(source, _tf().data.Dataset)


def _is_path_like(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike))


def _source_kind(source: Any) -> SourceKind:
    if _is_dataset(source):
        return "dataset"
    if _is_path_like(source):
        return "files"
    if isinstance(source, (list, tuple)) and source and all(_is_path_like(s) for s in source):
        return "files"
    if isinstance(source, (list, tuple)) and not source:
        raise ValueError(
            "source=[] is an empty list: expected file paths, a glob, arrays or a "
            "tf.data.Dataset. Check the list you built (e.g. a glob that matched nothing)."
        )
    if callable(source):
        return "function"
    if _looks_like_arrays(source):
        return "arrays"
    raise TypeError(
        f"source of type {type(source).__name__} is not supported; expected an unbatched "
        "tf.data.Dataset, numpy arrays (or a tuple/dict of them), a file path, a list of paths "
        "or a glob, or a function fn(input_context) -> tf.data.Dataset."
    )


def _looks_like_arrays(source: Any) -> bool:
    tf = _tf()
    leaves = tf.nest.flatten(source)
    return bool(leaves) and all(
        hasattr(leaf, "shape") and hasattr(leaf, "dtype") for leaf in leaves
    )


def _has_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def resolve_files(source: Any) -> tuple[str, ...]:
    """Expand a path, list of paths or glob to a sorted tuple of existing files.

    Raises:
        ValueError: a glob matches nothing, a list is empty, or a file does not exist.
    """
    tf = _tf()
    paths = [source] if _is_path_like(source) else list(source)
    files: list[str] = []
    for raw in paths:
        path = os.fspath(raw)
        if _has_glob(path):
            matched = sorted(tf.io.gfile.glob(path)) if "://" in path else sorted(_glob.glob(path))
            if not matched:
                raise ValueError(
                    f"the glob {path!r} matches no file. Check the pattern and the working "
                    f"directory ({os.getcwd()})."
                )
            files.extend(matched)
        else:
            if not tf.io.gfile.exists(path):
                raise ValueError(
                    f"file {path!r} does not exist. Pass existing paths or a glob such as "
                    f"'{os.path.join(os.path.dirname(path) or '.', '*.tfrecord')}'."
                )
            if tf.io.gfile.isdir(path):
                raise ValueError(
                    f"{path!r} is a directory, not a file. Pass a glob such as "
                    f"'{os.path.join(path, '*')}'."
                )
            files.append(path)
    if len(set(files)) != len(files):
        seen: set[str] = set()
        dupes = sorted({f for f in files if f in seen or seen.add(f)})  # type: ignore[func-returns-value]
        raise ValueError(
            f"files {dupes} are listed more than once; each would be read twice per epoch. "
            "Remove the duplicates."
        )
    return tuple(sorted(files))


def _file_sizes(files: Sequence[str]) -> tuple[int, ...]:
    tf = _tf()
    return tuple(int(tf.io.gfile.stat(f).length) for f in files)


def _cardinality(dataset: Any) -> int | None:
    """Known finite cardinality, -1 for infinite, None for unknown."""
    tf = _tf()
    value = int(dataset.cardinality())
    if value == int(tf.data.INFINITE_CARDINALITY):
        return -1
    if value < 0:
        return None
    return value


def _graph_ops(dataset: Any) -> set[str]:
    tf = _tf()
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(dataset._as_serialized_graph().numpy())
    ops = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        ops.update(node.op for node in function.node_def)
    return ops


def _reads_files(dataset: Any) -> bool:
    try:
        return bool(_graph_ops(dataset) & _READER_OPS)
    except Exception:  # a dataset that cannot be serialised: treat as not readable
        return False


def _batched_by(dataset: Any) -> str | None:
    """The class of the batching transformation at the end of ``dataset``, if any."""
    node = dataset
    for _ in range(64):
        name = type(node).__name__
        if name in _BATCH_CLASSES:
            return name
        if name in _MAP_CLASSES:
            # A map of a batch usually stays a batch, unless it reduces to scalars.
            specs = _tf().nest.flatten(node.element_spec)
            if not all(getattr(spec.shape, "rank", 0) for spec in specs):
                return None
        elif name not in _PASSTHROUGH_CLASSES:
            return None
        node = getattr(node, "_input_dataset", None)
        if node is None:
            return None
    return None


def _strategy_or_default(strategy: Any, caller: str | None = "build_distributed_dataset") -> Any:
    """``strategy``, or the strategy in scope; warns when that is the default one by mistake.

    ``caller`` names the function in the warning; None does not warn.
    """
    if strategy is not None:
        return strategy
    tf = _tf()
    resolved = tf.distribute.get_strategy()
    if caller is None or tf.distribute.has_strategy():
        return resolved
    built = dataset_info.last_strategy()
    replicas = int(getattr(built, "num_replicas_in_sync", 1)) if built is not None else 1
    if replicas > 1:
        logger.warning(
            "tfdp_utils: %s(strategy=None) outside any strategy scope uses TensorFlow's "
            "default strategy (1 replica), but auto_strategy() built %s with %d replicas in "
            "this process: the data will not be split over those replicas. Pass "
            "strategy=strategy, or call %s inside `with strategy.scope():`.",
            caller,
            type(built).__name__,
            replicas,
            caller,
        )
    return resolved


def worker_position(strategy: Any) -> tuple[int, int]:
    """``(num_workers, worker_index)`` of this process in ``strategy``'s input pipelines."""
    make = getattr(strategy.extended, "_make_input_context", None)
    if make is not None:
        context = make()
        return int(context.num_input_pipelines), int(context.input_pipeline_id)
    return 1, 0


@dataclasses.dataclass(frozen=True)
class _Facts:
    kind: SourceKind
    files: tuple[str, ...] = ()
    sizes: tuple[int, ...] | None = None
    num_examples: int | None = None  # -1: infinite
    has_reader: bool = False
    file_counts: tuple[int, ...] | None = None  # examples in each file, when counted


def count_records(
    files: Sequence[str], reader: Callable[[Any], Any] | None = None
) -> tuple[int, ...]:
    """Examples in each file as ``reader`` reads it (reads every file once, in parallel).

    Args:
        files: file paths.
        reader: ``path -> tf.data.Dataset``. Defaults to `None` (``tf.data.TFRecordDataset``).

    Returns:
        The number of elements in each file, in the order of ``files``.
    """
    tf = _tf()
    reader = reader or tf.data.TFRecordDataset
    if not files:
        return ()

    def count(path: Any) -> Any:
        return reader(path).reduce(tf.constant(0, tf.int64), lambda total, _: total + 1)

    names = tf.data.Dataset.from_tensor_slices(list(files))
    counts = names.map(count, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return tuple(int(n) for n in counts.as_numpy_iterator())


def _gather(
    source: Any,
    *,
    shard_policy: str,
    reader: Callable[[Any], Any] | None = None,
    count_examples: bool = False,
) -> _Facts:
    kind = _source_kind(source)
    if kind == "files":
        files = resolve_files(source)
        counts = count_records(files, reader) if count_examples else None
        return _Facts(
            kind,
            files=files,
            sizes=_file_sizes(files),
            num_examples=None if counts is None else sum(counts),
            file_counts=counts,
        )
    if kind == "dataset":
        return _Facts(
            kind,
            num_examples=_cardinality(source),
            # Serialising the graph copies any constants in it, so only look when it matters.
            has_reader=check_policy(shard_policy) == "file" and _reads_files(source),
        )
    if kind == "arrays":
        return _Facts(kind, num_examples=_array_length(source))
    return _Facts(kind)


def _array_length(source: Any) -> int:
    tf = _tf()
    lengths = {int(leaf.shape[0]) if len(leaf.shape) else -1 for leaf in tf.nest.flatten(source)}
    if -1 in lengths:
        raise ValueError(
            "source holds a scalar array; every array needs a leading example dimension."
        )
    if len(lengths) != 1:
        raise ValueError(
            f"source arrays have different lengths {sorted(lengths)}; every array needs the "
            "same number of examples along its first dimension."
        )
    return lengths.pop()


def _plan(
    facts: _Facts,
    *,
    shard_policy: str,
    num_workers: int,
    per_replica_batch_size: int | None = None,
    replicas_per_worker: int | None = None,
    drop_remainder: bool = False,
) -> ShardingPlan:
    policy, reason = decide_policy(
        shard_policy,
        source_kind=facts.kind,
        num_workers=num_workers,
        num_files=len(facts.files) if facts.kind == "files" else None,
        has_reader=facts.has_reader,
    )
    files_per_worker: tuple[tuple[str, ...], ...] = ()
    if facts.kind == "files":
        if policy == "file":
            # Balance examples when counted (they make the steps), else bytes.
            weights = facts.file_counts if facts.file_counts is not None else facts.sizes
            files_per_worker = assign_files(facts.files, num_workers, weights)
        else:
            files_per_worker = (facts.files,) * num_workers
    examples: tuple[int, ...] | None = None
    n = facts.num_examples
    if policy == "file" and facts.file_counts is not None:
        count_of = dict(zip(facts.files, facts.file_counts, strict=True))
        examples = tuple(sum(count_of[f] for f in files) for files in files_per_worker)
    elif n is not None and n >= 0:
        if policy == "data":
            examples = split_examples(n, num_workers)
        elif policy == "off" and facts.kind != "function":
            examples = (n,) * num_workers
    steps = None
    if examples is not None and per_replica_batch_size and replicas_per_worker:
        steps = epoch_layout(
            examples, per_replica_batch_size, replicas_per_worker, drop_remainder=drop_remainder
        ).steps
    return ShardingPlan(
        policy=policy,
        reason=reason,
        num_workers=num_workers,
        source_kind=facts.kind,
        requested=check_policy(shard_policy),
        files_per_worker=files_per_worker,
        examples_per_worker=examples,
        steps_per_worker=steps,
    )


def plan_sharding(
    source: Any,
    *,
    strategy: Any = None,
    num_workers: int | None = None,
    shard_policy: str = "auto",
    global_batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    drop_remainder: bool = False,
    reader: Callable[[Any], Any] | None = None,
    count_examples: bool = False,
) -> ShardingPlan:
    """Decide how ``source`` is split between workers, without building anything.

    Args:
        source: what :func:`build_distributed_dataset` accepts.
        strategy: the ``tf.distribute.Strategy`` that will train. Defaults to `None`
            (``tf.distribute.get_strategy()``: the strategy in scope; outside any scope
            TensorFlow's default strategy, which logs a warning when
            :func:`~tfdp_utils.auto_strategy` built one with several replicas).
        num_workers: plan for this many workers instead of the strategy's (with one replica
            per worker if the strategy has fewer replicas than that). Defaults to `None`.
        shard_policy: ``"auto"``, ``"file"``, ``"data"``, ``"hint"`` or ``"off"``.
            Defaults to `"auto"`.
        global_batch_size: with it, the plan includes steps per worker when the example count
            is known. Defaults to `None`.
        per_replica_batch_size: alternative to ``global_batch_size``. Defaults to `None`.
        drop_remainder: as for the builder. Defaults to `False`.
        reader: as for the builder. Defaults to `None` (``tf.data.TFRecordDataset``).
        count_examples: count the examples of file sources (reads every file once), so the
            plan knows examples and steps per worker. Defaults to `False`.

    Returns:
        A :class:`ShardingPlan`.

    Raises:
        ValueError: unknown policy, a policy that cannot apply to the source, files that do
            not exist, a glob that matches nothing.

    Examples:
        >>> import numpy as np
        >>> import tfdp_utils as tdu
        >>> tdu.plan_sharding(np.arange(10), num_workers=2).policy
        'data'
    """
    # With num_workers given, the strategy only sets the replicas: nothing to warn about.
    strategy = _strategy_or_default(strategy, "plan_sharding" if num_workers is None else None)
    replicas = int(strategy.num_replicas_in_sync)
    workers, _ = worker_position(strategy)
    if num_workers is not None:
        workers = check_size(num_workers, "num_workers")
        replicas = max(replicas, workers)
    per_replica = None
    if global_batch_size is not None or per_replica_batch_size is not None:
        per_replica, _ = _batch_sizes(global_batch_size, per_replica_batch_size, replicas, strategy)
    check_policy(shard_policy)
    facts = _gather(source, shard_policy=shard_policy, reader=reader, count_examples=count_examples)
    return _plan(
        facts,
        shard_policy=shard_policy,
        num_workers=workers,
        per_replica_batch_size=per_replica,
        replicas_per_worker=max(1, replicas // workers),
        drop_remainder=drop_remainder,
    )


def _batch_sizes(
    global_batch_size: int | None, per_replica_batch_size: int | None, replicas: int, strategy: Any
) -> tuple[int, int]:
    if (global_batch_size is None) == (per_replica_batch_size is None):
        got = "both" if global_batch_size is not None else "neither"
        raise ValueError(
            f"pass exactly one of global_batch_size and per_replica_batch_size, but received "
            f"{got} (global_batch_size={global_batch_size!r}, "
            f"per_replica_batch_size={per_replica_batch_size!r}). The global size is split "
            f"over the {replicas} replica(s) in sync; e.g. global_batch_size={32 * replicas} or "
            "per_replica_batch_size=32."
        )
    if per_replica_batch_size is not None:
        per_replica = check_size(per_replica_batch_size, "per_replica_batch_size")
        return per_replica, per_replica * replicas
    where = f" of {type(strategy).__name__}"
    per_replica = split_batch_size(cast(int, global_batch_size), replicas, where=where)
    return per_replica, per_replica * replicas


# ------------------------------------------------------------------------------ the glue


def _check_map_fn(map_fn: Any, element_spec: Any) -> None:
    if map_fn is None:
        return
    if not callable(map_fn):
        raise TypeError(f"map_fn={map_fn!r} is not callable; pass a function of one element.")
    arity = len(element_spec) if isinstance(element_spec, tuple) else 1
    try:
        signature = inspect.signature(map_fn)
    except (TypeError, ValueError):  # builtins and some C callables have none
        return
    try:
        signature.bind(*([None] * arity))
    except TypeError:
        structure = (
            f"a tuple of {arity} components, which tf.data passes as {arity} arguments"
            if isinstance(element_spec, tuple)
            else f"a single {'dict' if isinstance(element_spec, Mapping) else 'value'}, "
            "passed as one argument"
        )
        raise ValueError(
            f"map_fn{signature} cannot take the dataset's elements: each element is "
            f"{structure}. Change map_fn to accept {arity} positional argument(s)."
        ) from None


def _check_unbatched(dataset: Any, what: str) -> None:
    batch = _batched_by(dataset)
    if batch is not None:
        raise ValueError(
            f"{what} is already batched ({batch}); the builder batches by itself so that it "
            "can split every global batch exactly over the replicas. Pass the unbatched "
            "dataset (remove .batch(...), or call .unbatch()) and give global_batch_size= or "
            "per_replica_batch_size=."
        )


def _reader_dataset(reader: Callable[[Any], Any], path: str) -> Any:
    dataset = reader(path)
    if not _is_dataset(dataset):
        raise TypeError(
            f"reader({path!r}) returned {type(dataset).__name__}; expected a tf.data.Dataset "
            "such as tf.data.TFRecordDataset(path) or tf.data.TextLineDataset(path)."
        )
    return dataset


@dataclasses.dataclass(frozen=True)
class _Recipe:
    """Everything the per-worker pipeline needs; built once, used inside dataset_fn."""

    plan: ShardingPlan
    per_replica_batch_size: int
    global_batch_size: int
    replicas_per_worker: int
    map_fn: Any
    reader: Any
    shuffle_buffer_size: int | None
    seed: int | None
    repeat: bool
    cache: bool | str
    drop_remainder: bool
    prefetch: bool
    data_options: Any
    take_per_worker: int | None
    # Batches each worker holds per epoch, when known; with repeat, each epoch is padded with
    # empty batches to the same number of steps on every worker, so epochs stay exact.
    epoch_batches: tuple[int, ...] | None = None
    epoch_steps: int | None = None


def _per_worker_dataset(recipe: _Recipe, source: Any, context: Any) -> Any:
    tf = _tf()
    plan = recipe.plan
    workers, index = int(context.num_input_pipelines), int(context.input_pipeline_id)
    if workers != plan.num_workers:
        raise RuntimeError(
            f"the plan was made for {plan.num_workers} workers but the strategy has {workers} "
            "input pipelines; build the dataset with the strategy that trains."
        )
    autotune = tf.data.AUTOTUNE
    shuffle = recipe.shuffle_buffer_size is not None
    # DATA needs the same element order on every worker; FILE and OFF do not.
    needs_order = plan.policy == "data"
    if plan.source_kind == "files":
        files = plan.files_per_worker[index]
        file_ds = tf.data.Dataset.from_tensor_slices(tf.constant(list(files) or [""])).take(
            len(files)
        )
        if shuffle and not needs_order and len(files) > 1:
            file_ds = file_ds.shuffle(len(files), seed=_worker_seed(recipe.seed, index))
        dataset = file_ds.interleave(
            recipe.reader,
            cycle_length=max(1, min(len(files), MAX_PARALLEL_FILES)),
            num_parallel_calls=autotune,
            deterministic=needs_order,
        )
    elif plan.source_kind == "function":
        dataset = source(context)
        if not _is_dataset(dataset):
            raise TypeError(
                f"the source function returned {type(dataset).__name__}; expected an unbatched "
                "tf.data.Dataset for input pipeline "
                f"{context.input_pipeline_id} of {context.num_input_pipelines}."
            )
        _check_unbatched(dataset, "the dataset returned by the source function")
    else:
        dataset = source
    map_first = recipe.map_fn is not None and bool(recipe.cache)
    if map_first:
        # Cache what map_fn produced; shuffle and shard after, so later epochs reshuffle.
        dataset = dataset.map(recipe.map_fn, num_parallel_calls=autotune, deterministic=True)
    if recipe.cache:
        name = recipe.cache if isinstance(recipe.cache, str) else ""
        if name and workers > 1:
            name = f"{name}.worker-{index}-of-{workers}"
        dataset = dataset.cache(name)
    if shuffle:
        seed = recipe.seed if needs_order else _worker_seed(recipe.seed, index)
        dataset = dataset.shuffle(
            recipe.shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True
        )
    aligned = recipe.repeat and recipe.epoch_batches is not None
    if recipe.repeat and not aligned:
        dataset = dataset.repeat()
    if plan.policy == "data":
        dataset = dataset.shard(workers, index)
    if recipe.map_fn is not None and not map_first:
        dataset = dataset.map(
            recipe.map_fn, num_parallel_calls=autotune, deterministic=needs_order or None
        )
    if recipe.take_per_worker is not None and (aligned or not recipe.repeat):
        dataset = dataset.take(recipe.take_per_worker)
    local = recipe.replicas_per_worker
    split = _splits_last_step(
        local,
        drop_remainder=recipe.drop_remainder,
        repeat_by_example=recipe.repeat and not aligned,
        element_spec=dataset.element_spec,
    )
    # With the split, batch whole steps of the worker (all its replicas) first; each step is
    # cut into one batch per replica below, the last one as evenly as possible.
    batch_size = recipe.per_replica_batch_size * (local if split else 1)
    dataset = dataset.batch(batch_size, drop_remainder=recipe.drop_remainder)
    if aligned:
        assert recipe.epoch_batches is not None and recipe.epoch_steps is not None
        # Pad in the unit batched above: whole steps with the split, replica batches without.
        held = recipe.epoch_batches[index]
        pad = recipe.epoch_steps - held // local if split else recipe.epoch_steps * local - held
        if pad > 0:
            empty = tf.data.Dataset.from_tensors(_empty_batch(dataset.element_spec))
            dataset = dataset.concatenate(empty.repeat(pad))
        dataset = dataset.repeat()
    if split:
        # In order (a reordered step would mix the partial step into full ones). The identity
        # map after unbatch turns its rows (RaggedTensorSpec of ragged_rank 0) back into dense
        # TensorSpecs, which the distributed iterator and tf.function loops expect.
        dataset = (
            dataset.map(_step_splitter(local), num_parallel_calls=autotune, deterministic=True)
            .unbatch()
            .map(_identity)
        )
    if recipe.prefetch:
        dataset = dataset.prefetch(autotune)
    options = tf.data.Options()
    if recipe.data_options is not None:
        options = options.merge(recipe.data_options)
    # The builder shards above; say so, so that tf.data neither rewrites nor warns.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if needs_order:
        # DATA keeps every W-th example of a stream that must be in the same order on every
        # worker, including in the source's own parallel transformations.
        options.deterministic = True
    return dataset.with_options(options)


def _splits_last_step(
    replicas_per_worker: int, *, drop_remainder: bool, repeat_by_example: bool, element_spec: Any
) -> bool:
    """Whether the pipeline cuts whole steps into replica batches (see :func:`epoch_layout`).

    Only for several replicas per worker, dense elements (a step is cut by row lengths, which
    sparse elements do not take) and epochs that can end in a partial step. The builder asks
    with the mapped elements when it computes the counts, the pipeline with the same ones.
    """
    if replicas_per_worker < 2 or drop_remainder or repeat_by_example:
        return False
    return _dense_only(element_spec)


def _step_splitter(replicas: int) -> Callable[[Any], Any]:
    """``step -> ragged [replicas, None, ...]`` cut as evenly as possible, larger parts first.

    A full step becomes ``replicas`` batches of ``per_replica_batch_size``; a partial one of
    ``n`` examples becomes ``n // replicas`` or one more each (28 -> 14 + 14), where tf.data's
    own rebatching would give 28 + 0. Empty per-replica batches crash some kernels, e.g.
    Conv2D on CPU with oneDNN ("input depth must be evenly divisible by filter depth").
    """
    tf = _tf()

    def split(*parts: Any) -> Any:
        # tf.data passes the components of a tuple element as separate arguments.
        step = parts[0] if len(parts) == 1 else parts
        size = tf.shape(tf.nest.flatten(step)[0], out_type=tf.int64)[0]
        replica = tf.range(replicas, dtype=tf.int64)
        lengths = size // replicas + tf.cast(replica < size % replicas, tf.int64)
        return tf.nest.map_structure(
            lambda t: tf.RaggedTensor.from_row_lengths(t, lengths, validate=False), step
        )

    return split


def _identity(*element: Any) -> Any:
    return element[0] if len(element) == 1 else element


def _dense_only(element_spec: Any) -> bool:
    tf = _tf()
    return all(type(spec) is tf.TensorSpec for spec in tf.nest.flatten(element_spec))


def _empty_batch(batch_spec: Any) -> Any:
    """A batch of 0 examples with the structure, dtypes and inner shapes of ``batch_spec``."""
    tf = _tf()

    def empty(spec: Any) -> Any:
        inner = [d if d is not None else 0 for d in spec.shape.as_list()[1:]]
        return tf.zeros([0, *inner], spec.dtype)

    return tf.nest.map_structure(empty, batch_spec)


def _worker_seed(seed: int | None, index: int) -> int | None:
    return None if seed is None else seed + 7919 * index


def _global_dataset(recipe: _Recipe, source: Any) -> Any:
    """A globally batched dataset for tf.data's own autoshard (FILE/HINT on a Dataset)."""
    tf = _tf()
    dataset = source
    if recipe.map_fn is not None and recipe.cache:
        dataset = dataset.map(recipe.map_fn, num_parallel_calls=tf.data.AUTOTUNE)
    if recipe.cache:
        dataset = dataset.cache(recipe.cache if isinstance(recipe.cache, str) else "")
    if recipe.shuffle_buffer_size is not None:
        dataset = dataset.shuffle(recipe.shuffle_buffer_size, seed=recipe.seed)
    if recipe.repeat:
        dataset = dataset.repeat()
    if recipe.map_fn is not None and not recipe.cache:
        dataset = dataset.map(recipe.map_fn, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(recipe.global_batch_size, drop_remainder=recipe.drop_remainder)
    if recipe.prefetch:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    if recipe.data_options is not None:
        options = options.merge(recipe.data_options)
    policy = tf.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = (
        policy.FILE if recipe.plan.policy == "file" else policy.HINT
    )
    return dataset.with_options(options)


_RECORDING_CLASSES: dict[type, type] = {}
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
        info = getattr(self, "tfdp_info", None)
        if not isinstance(info, DatasetInfo) or int(value) == _INFINITE_CARDINALITY:
            return value
        # Known counts give the steps even where TensorFlow cannot tell (a step cut into
        # replica batches by unbatch has unknown cardinality).
        if info.steps_per_epoch is not None and not info.repeat:
            return type(value)(info.steps_per_epoch)
        return type(value)(_UNKNOWN_CARDINALITY)

    return cardinality


def _recording_class(base: type) -> type:
    """A subclass of ``base`` whose ``__iter__`` records the iteration for the callbacks."""
    cls = _RECORDING_CLASSES.get(base)
    if cls is None:

        def __iter__(self: Any) -> Any:
            info = getattr(self, "tfdp_info", None)
            if isinstance(info, DatasetInfo):
                dataset_info.record_iteration(info)
            return base.__iter__(self)  # type: ignore[attr-defined]

        namespace: dict[str, Any] = {"__iter__": __iter__, "__module__": __name__}
        base_cardinality = inspect.getattr_static(base, "cardinality", None)
        if isinstance(base_cardinality, property) and base_cardinality.fget is not None:
            namespace["cardinality"] = property(_steps_cardinality(base_cardinality.fget))
        # Same name, so that code matching on the class name (Keras' data adapters walk
        # the MRO for "DistributedDatasetsFromFunction") still recognises it.
        cls = type(base.__name__, (base,), namespace)
        _RECORDING_CLASSES[base] = cls
    return cls


def _attach(dist: Any, info: DatasetInfo, plan: ShardingPlan) -> Any:
    from tfdp_utils import compat

    dist.tfdp_info = info
    dist.tfdp_plan = plan
    # tf_keras: fit/evaluate then take the epoch's steps from tfdp_info, as Keras 3 does.
    compat.apply_for_datasets()
    try:
        dist.__class__ = _recording_class(type(dist))
    except TypeError:  # pragma: no cover - a class that forbids __class__ assignment
        logger.warning(
            "tfdp_utils: cannot record iterations of %s; callbacks find the dataset info only "
            "through tfdp_utils.dataset_info.info_of(dataset).",
            type(dist).__name__,
        )
    return dist


def build_distributed_dataset(
    source: Any,
    *,
    strategy: Any = None,
    global_batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    shard_policy: str = "auto",
    map_fn: Callable[..., Any] | None = None,
    reader: Callable[[Any], Any] | None = None,
    shuffle_buffer_size: int | None = None,
    seed: int | None = None,
    repeat: bool | str = False,
    cache: bool | str = False,
    drop_remainder: bool = False,
    prefetch: bool = True,
    options: Any = None,
    count_examples: bool = False,
) -> Any:
    """Build a distributed dataset in which every example is seen exactly once per epoch.

    The source is sharded between workers by an explicit policy (see
    :func:`plan_sharding`, logged once), shuffled with a seed shared by every worker when
    sharding needs it, mapped with AUTOTUNE parallelism, batched per replica and prefetched.
    With ``drop_remainder=False`` each epoch covers every example exactly once across all
    replicas and every worker runs the same number of steps; replicas that run out first
    receive empty batches in the last steps.

    Args:
        source: an unbatched ``tf.data.Dataset``; numpy arrays or a tuple/dict of them; a
            file path, list of paths or glob (read with ``reader``); or a function
            ``fn(input_context) -> tf.data.Dataset`` returning this worker's unbatched data.
        strategy: the ``tf.distribute.Strategy`` that trains. Defaults to `None`
            (``tf.distribute.get_strategy()``: the strategy in scope; outside any scope
            TensorFlow's default strategy, with one replica. A warning is logged when
            :func:`~tfdp_utils.auto_strategy` built a strategy with several replicas in this
            process: pass it, or build inside ``with strategy.scope():``).
        global_batch_size: examples per step over all replicas. Defaults to `None`.
        per_replica_batch_size: examples per replica per step; pass exactly one of the two.
            Defaults to `None`.
        shard_policy: ``"auto"``, ``"file"``, ``"data"``, ``"hint"`` or ``"off"``.
            Defaults to `"auto"`.
        map_fn: applied to each example (after sharding, so each worker maps only its share,
            unless ``cache`` is set, when mapped examples are cached). Defaults to `None`.
        reader: ``path -> tf.data.Dataset`` for file sources. Defaults to `None`
            (``tf.data.TFRecordDataset``).
        shuffle_buffer_size: shuffle with this buffer; None does not shuffle. Defaults to
            `None`.
        seed: shuffle seed. With DATA sharding every worker must use the same one; None then
            uses :data:`DEFAULT_SHUFFLE_SEED`. Defaults to `None`.
        repeat: ``True`` repeats the examples without end, every step full (pass
            ``steps_per_epoch`` to ``fit``). ``"epochs"`` repeats whole epochs: each worker's
            epoch is padded with empty batches to the same number of steps, so with
            ``fit(steps_per_epoch=dist.tfdp_info.steps_per_epoch)`` every epoch sees every
            example exactly once (needs a known size and dense elements; otherwise it acts
            as ``True``, logged). Defaults to `False`.
        cache: cache in memory (True) or in files with this prefix. Defaults to `False`.
        drop_remainder: drop the examples that do not fill a step on every replica; the
            number dropped per epoch is logged. Defaults to `False`.
        prefetch: prefetch with AUTOTUNE. Defaults to `True`.
        options: a ``tf.data.Options`` merged into the pipeline's, or a
            ``tf.distribute.InputOptions`` for the strategy. Defaults to `None`.
        count_examples: for file sources, count the examples of every file before training
            (each worker reads every file once more), so that files are balanced by examples
            and ``tfdp_info`` has exact per-replica counts. Defaults to `False`.

    Returns:
        A ``tf.distribute.DistributedDataset`` (a ``tf.data.Dataset`` under the default
        strategy) with attributes ``tfdp_info`` (a :class:`~tfdp_utils.DatasetInfo`) and
        ``tfdp_plan`` (a :class:`ShardingPlan`). Iterating it records the info for the
        throughput callbacks.

    Raises:
        ValueError: both or neither batch size; a global size not divisible by, or smaller
            than, the replicas; an empty file list, a glob that matches nothing or a missing
            file; an unknown policy; ``"file"`` on a source without files; an already-batched
            dataset; a ``map_fn`` that cannot take the elements.
        TypeError: an unsupported source or reader.

    Examples:
        >>> import numpy as np
        >>> import tfdp_utils as tdu
        >>> dist = tdu.build_distributed_dataset(np.arange(10), global_batch_size=4)
        >>> dist.tfdp_info.steps_per_epoch
        3
    """
    tf = _tf()
    strategy = _strategy_or_default(strategy)
    replicas = int(strategy.num_replicas_in_sync)
    per_replica, global_size = _batch_sizes(
        global_batch_size, per_replica_batch_size, replicas, strategy
    )
    check_policy(shard_policy)
    num_workers, worker_index = worker_position(strategy)
    replicas_per_worker = max(1, replicas // num_workers)
    if shuffle_buffer_size is not None:
        shuffle_buffer_size = check_size(shuffle_buffer_size, "shuffle_buffer_size")
    data_options, input_options = _split_options(options)
    reader = reader or tf.data.TFRecordDataset

    kind = _source_kind(source)
    if kind == "arrays":
        _array_length(source)
        source = tf.data.Dataset.from_tensor_slices(source)
    elif kind == "dataset":
        _check_unbatched(source, "source")
    facts = (
        _gather(source, shard_policy=shard_policy, reader=reader, count_examples=count_examples)
        if kind != "arrays"
        else _Facts("arrays", num_examples=_cardinality(source))
    )
    plan = _plan(
        facts,
        shard_policy=shard_policy,
        num_workers=num_workers,
        per_replica_batch_size=per_replica,
        replicas_per_worker=replicas_per_worker,
        drop_remainder=drop_remainder,
    )
    element_spec = None
    if kind == "files":
        element_spec = _reader_dataset(
            reader,
            plan.files_per_worker[worker_index][0]
            if plan.files_per_worker[worker_index]
            else facts.files[0],
        ).element_spec
    elif kind != "function":
        element_spec = source.element_spec
    if element_spec is not None:
        _check_map_fn(map_fn, element_spec)

    if (
        plan.policy == "data"
        and shuffle_buffer_size is not None
        and seed is None
        and (num_workers > 1)
    ):
        seed = DEFAULT_SHUFFLE_SEED
        logger.info(
            "tfdp_utils: shuffling with DATA sharding over %d workers needs the same seed on "
            "every worker; using seed=%d. Pass seed= to shuffle differently between runs.",
            num_workers,
            seed,
        )
    infinite = facts.num_examples == -1
    if facts.num_examples == 0:
        logger.warning(
            "tfdp_utils: the source holds no examples, so every epoch is empty and training "
            "does nothing. Check the source (a filter that drops everything, an empty file)."
        )
    if infinite and not repeat:
        logger.warning(
            "tfdp_utils: the source is infinite, so an epoch never ends; pass steps_per_epoch "
            "to fit (or stop your loop yourself). Per-epoch exact coverage does not apply."
        )
    if plan.policy == "file" and kind == "dataset" and num_workers > 1:
        logger.warning(
            "tfdp_utils: shard_policy='file' on a tf.data.Dataset uses tf.data's FILE "
            "autoshard, which needs at least %d files in the dataset: with fewer, a worker "
            "fails at its first batch while the others wait for it. Pass the file paths as "
            "source instead so the builder can check and balance them.",
            num_workers,
        )
    if plan.policy == "off" and num_workers > 1 and kind != "function":
        logger.warning(
            "tfdp_utils: shard_policy='off' on %d workers: every worker trains on every "
            "example, so each epoch sees each example %d times.",
            num_workers,
            num_workers,
        )
    if plan.policy == "file" and kind == "files":
        idle = [i for i, files in enumerate(plan.files_per_worker) if not files]
        weights = facts.file_counts if facts.file_counts is not None else facts.sizes
        imbalance = file_imbalance(plan.files_per_worker, facts.files, weights)
        if imbalance is not None and imbalance > 1.5 and not idle:
            logger.warning(
                "tfdp_utils: the busiest worker reads %.1fx the mean %s per worker (files of "
                "very different sizes): the others feed empty batches for the last part of each "
                "epoch. Split the large files, or use shard_policy='data' (every worker reads "
                "everything) to balance the steps.",
                imbalance,
                "examples" if facts.file_counts is not None else "bytes",
            )
        if idle:
            logger.warning(
                "tfdp_utils: %d file(s) for %d workers: workers %s read no file and feed only "
                "empty batches. Use shard_policy='auto' or 'data' to use every worker.",
                len(facts.files),
                num_workers,
                idle,
            )

    if repeat not in (False, True, "epochs"):
        raise ValueError(
            f"repeat={repeat!r} is not supported; expected False, True (repeat examples) or "
            "'epochs' (repeat whole epochs, padded to equal steps)."
        )
    known = plan.examples_per_worker is not None
    # The elements as batched (after map_fn), to know how the pipeline will cut steps.
    mapped = None
    if (
        known
        and kind != "function"
        and (repeat == "epochs" or (replicas_per_worker > 1 and not drop_remainder))
    ):
        mapped = element_spec
        if map_fn is not None:
            read = _reader_dataset(reader, facts.files[0]) if kind == "files" else source
            mapped = read.map(map_fn).element_spec
    aligned = repeat == "epochs" and mapped is not None and _dense_only(mapped)
    split = mapped is not None and _splits_last_step(
        replicas_per_worker,
        drop_remainder=drop_remainder,
        repeat_by_example=bool(repeat) and not aligned,
        element_spec=mapped,
    )
    layout = None
    if plan.examples_per_worker is not None:
        layout = epoch_layout(
            plan.examples_per_worker,
            per_replica,
            replicas_per_worker,
            drop_remainder=drop_remainder,
            split_last_step=split,
        )
    take = None
    if drop_remainder:
        if layout is not None:
            take = layout.steps * per_replica * replicas_per_worker
            logger.info(
                "tfdp_utils: drop_remainder=True drops %d of %d examples each epoch (%d full "
                "steps of %d).",
                layout.dropped,
                layout.dropped + layout.examples,
                layout.steps,
                global_size,
            )
        else:
            logger.warning(
                "tfdp_utils: drop_remainder=True with an unknown number of examples per "
                "worker: each epoch drops up to %d examples per replica, and a worker that "
                "runs out of full batches first feeds empty batches until the others finish.",
                per_replica - 1,
            )

    epoch_batches = None
    if repeat == "epochs" and (layout is None or plan.examples_per_worker is None):
        logger.info(
            "tfdp_utils: repeat='epochs' needs the number of examples, which is unknown for "
            "this source; repeating example by example instead (every step full)."
        )
    if repeat == "epochs" and layout is not None and plan.examples_per_worker is not None:
        if aligned:
            # Per-replica batches each worker holds per epoch, as the pipeline makes them.
            step_size = per_replica * replicas_per_worker
            epoch_batches = tuple(
                layout.steps * replicas_per_worker
                if drop_remainder
                else replicas_per_worker * math.ceil(n / step_size)
                if split
                else math.ceil(n / per_replica)
                for n in plan.examples_per_worker
            )
        else:
            logger.info(
                "tfdp_utils: repeat='epochs' over sparse or ragged elements repeats example "
                "by example instead: epochs are not aligned to steps."
            )
    exact = layout is not None and (not repeat or epoch_batches is not None)
    info = DatasetInfo(
        global_batch_size=global_size,
        per_replica_batch_size=per_replica,
        num_replicas_in_sync=replicas,
        num_workers=num_workers,
        examples_per_epoch=None if layout is None else layout.examples,
        steps_per_epoch=layout.steps if exact and layout is not None else None,
        full_steps=layout.full_steps if exact and layout is not None else None,
        tail=layout.tail if exact and layout is not None else (),
        repeat=bool(repeat or infinite),
    )
    recipe = _Recipe(
        plan=plan,
        per_replica_batch_size=per_replica,
        global_batch_size=global_size,
        replicas_per_worker=replicas_per_worker,
        map_fn=map_fn,
        reader=reader,
        shuffle_buffer_size=shuffle_buffer_size,
        seed=seed,
        repeat=bool(repeat),
        cache=cache,
        drop_remainder=drop_remainder,
        prefetch=prefetch,
        data_options=data_options,
        take_per_worker=take,
        epoch_batches=epoch_batches,
        epoch_steps=layout.steps if epoch_batches is not None and layout is not None else None,
    )
    logger.info("tfdp_utils: %s", plan.describe())
    if kind == "dataset" and plan.policy in ("file", "hint"):
        dist = strategy.experimental_distribute_dataset(
            _global_dataset(recipe, source), options=input_options
        )
    else:
        dist = strategy.distribute_datasets_from_function(
            lambda context: _per_worker_dataset(recipe, source, context), options=input_options
        )
    dataset_info.record_built()
    return _attach(dist, info, plan)


def _split_options(options: Any) -> tuple[Any, Any]:
    tf = _tf()
    if options is None:
        return None, None
    if isinstance(options, tf.data.Options):
        return options, None
    if isinstance(options, tf.distribute.InputOptions):
        return None, options
    raise TypeError(
        f"options of type {type(options).__name__} is not supported; pass a tf.data.Options "
        "or a tf.distribute.InputOptions."
    )


__all__ = [
    "DEFAULT_SHUFFLE_SEED",
    "SHARD_POLICIES",
    "EpochLayout",
    "ShardingPlan",
    "assign_files",
    "build_distributed_dataset",
    "check_policy",
    "count_records",
    "decide_policy",
    "epoch_layout",
    "file_imbalance",
    "plan_sharding",
    "resolve_files",
    "split_evenly",
    "split_examples",
    "worker_position",
]
