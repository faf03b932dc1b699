"""The sharding plan: which worker reads which data, and why.

Pure Python (no TensorFlow), tested in microseconds. The TensorFlow side
(:mod:`tfdp_utils.data._sources`) gathers :class:`SourceFacts`; from them this module decides
the policy (:func:`decide_policy`), assigns files to workers (:func:`assign_files`) and
counts each worker's examples (:func:`split_examples`), giving a :class:`ShardingPlan`
(:func:`plan_from_facts`). What each step then holds is :mod:`tfdp_utils.data._epochs`'s
business; what the builder warns about, :mod:`tfdp_utils.data._diagnostics`'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from tfdp_utils._public import public
from tfdp_utils.data._epochs import epoch_layout

ShardPolicy = Literal["file", "data", "hint", "off"]
SourceKind = Literal["dataset", "arrays", "files", "function"]

SHARD_POLICIES: tuple[str, ...] = ("auto", "file", "data", "hint", "off")
MAX_PARALLEL_FILES = 16
"""Files a worker reads at once (the interleave's cycle length and parallelism).

Reads are sized by latency, not cores: a read in flight mostly waits on storage (an object
store or a network file system answers in tens of milliseconds), so a worker keeps one read
per file in flight, up to this cap. With 16 reads in flight and 10 ms per record a worker
reads ~1,600 records/s, more than one host's replicas consume in typical steps; each read
holds a thread and an interleave buffer, so beyond the cap more files add memory and
threads, not throughput."""


def parallel_reads(num_files: int) -> int:
    """Reads a worker keeps in flight for ``num_files`` files (1 .. :data:`MAX_PARALLEL_FILES`)."""
    return max(1, min(num_files, MAX_PARALLEL_FILES))


DEFAULT_SHUFFLE_SEED = 1234
"""Seed used when shuffling with DATA sharding and no ``seed`` was given.

Every worker must shuffle identically for DATA sharding to stay disjoint, and workers cannot
agree on a random seed without communicating, so a fixed seed stands in."""


@public("tfdp_utils")
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


@dataclasses.dataclass(frozen=True)
class SourceFacts:
    """What the planner knows about a source (gathered by :mod:`tfdp_utils.data._sources`).

    Attributes:
        kind: ``"dataset"``, ``"arrays"``, ``"files"`` or ``"function"``.
        files: for file sources, the files, sorted.
        sizes: byte size of each file, when known.
        num_examples: examples in the source; -1 for an infinite source, None if unknown.
        has_reader: whether a dataset source reads files (only looked at for ``"file"``).
        file_counts: examples in each file, when counted.
    """

    kind: SourceKind
    files: tuple[str, ...] = ()
    sizes: tuple[int, ...] | None = None
    num_examples: int | None = None
    has_reader: bool = False
    file_counts: tuple[int, ...] | None = None

    @property
    def infinite(self) -> bool:
        """Whether the source never ends."""
        return self.num_examples == -1


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


def _file_policy(
    source_kind: SourceKind, num_files: int | None, has_reader: bool, workers: str
) -> tuple[ShardPolicy, str]:
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


def _auto_policy(
    source_kind: SourceKind, num_workers: int, num_files: int | None, workers: str
) -> tuple[ShardPolicy, str]:
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
        return _file_policy(source_kind, num_files, has_reader, workers)
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
    return _auto_policy(source_kind, num_workers, num_files, workers)


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


def _files_per_worker(
    facts: SourceFacts, policy: ShardPolicy, num_workers: int
) -> tuple[tuple[str, ...], ...]:
    if facts.kind != "files":
        return ()
    if policy != "file":
        return (facts.files,) * num_workers
    # Balance examples when counted (they make the steps), else bytes.
    weights = facts.file_counts if facts.file_counts is not None else facts.sizes
    return assign_files(facts.files, num_workers, weights)


def _examples_per_worker(
    facts: SourceFacts,
    policy: ShardPolicy,
    files_per_worker: tuple[tuple[str, ...], ...],
    num_workers: int,
) -> tuple[int, ...] | None:
    n = facts.num_examples
    if policy == "file" and facts.file_counts is not None:
        count_of = dict(zip(facts.files, facts.file_counts, strict=True))
        return tuple(sum(count_of[f] for f in files) for files in files_per_worker)
    if n is None or n < 0:
        return None
    if policy == "data":
        return split_examples(n, num_workers)
    if policy == "off" and facts.kind != "function":
        return (n,) * num_workers
    return None


def plan_from_facts(
    facts: SourceFacts,
    *,
    shard_policy: str,
    num_workers: int,
    per_replica_batch_size: int | None = None,
    replicas_per_worker: int | None = None,
    drop_remainder: bool = False,
) -> ShardingPlan:
    """The :class:`ShardingPlan` for a source described by ``facts``. Pure.

    Steps per worker are included when the examples per worker are known and both
    ``per_replica_batch_size`` and ``replicas_per_worker`` are given.
    """
    policy, reason = decide_policy(
        shard_policy,
        source_kind=facts.kind,
        num_workers=num_workers,
        num_files=len(facts.files) if facts.kind == "files" else None,
        has_reader=facts.has_reader,
    )
    files_per_worker = _files_per_worker(facts, policy, num_workers)
    examples = _examples_per_worker(facts, policy, files_per_worker, num_workers)
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


def shuffle_seed(plan: ShardingPlan, seed: int | None, *, shuffling: bool) -> int | None:
    """The seed to shuffle with: :data:`DEFAULT_SHUFFLE_SEED` where DATA sharding needs one.

    DATA sharding over several workers keeps every worker's share disjoint only when every
    worker shuffles identically, so an unset seed becomes the shared default there.
    """
    if plan.policy == "data" and shuffling and seed is None and plan.num_workers > 1:
        return DEFAULT_SHUFFLE_SEED
    return seed
