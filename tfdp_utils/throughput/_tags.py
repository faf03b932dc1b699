"""The TensorBoard schema of the throughput logs: run names, tag names, descriptions, layout.

Pure Python (standard library only, never TensorFlow). :class:`ThroughputLogger
<tfdp_utils.callbacks.ThroughputLogger>` writes these names, ``tfdp-utils report`` reads them
and the tests check against them, so the schema lives here and nowhere else. Every scalar the
logger writes is one :class:`TagSpec` of :data:`SCHEMA`: which run carries it, under which
tag, and the description TensorBoard shows for it. :data:`LAYOUT` is the custom-scalars
dashboard as plain data; the writer turns it into the plugin's protobuf.

Example:
>>> replica_run(3), parse_run("worker_1"), parse_run("train")
('replica_3', ('worker', 1), None)
"""

from __future__ import annotations

import dataclasses
from typing import Literal

RunKind = Literal["global", "replica", "worker"]
"""The three kinds of run: the job as a whole, one replica, one worker."""

# ------------------------------------------------------------------------------ run names

GLOBAL_RUN = "global"
"""Run written by the chief: the job's rates, and the worker spread in multi-worker jobs."""

REPLICA_RUN_PREFIX = "replica_"
"""Prefix of the per-replica runs: ``replica_<k>``, k the global replica id."""

WORKER_RUN_PREFIX = "worker_"
"""Prefix of the per-worker runs (multi-worker jobs only): ``worker_<w>``, w the worker rank."""


def replica_run(replica_id: int) -> str:
    """Run name of the replica with global replica id ``replica_id``."""
    return f"{REPLICA_RUN_PREFIX}{replica_id}"


def worker_run(worker_index: int) -> str:
    """Run name of worker ``worker_index`` (multi-worker jobs only)."""
    return f"{WORKER_RUN_PREFIX}{worker_index}"


def parse_run(name: str) -> tuple[RunKind, int | None] | None:
    """``(kind, index)`` of a run the logger writes; None for any other run.

    The index is the replica id or worker rank, None for the global run. Only the last path
    component counts, so runs found in subdirectories (``exp1/replica_0``, as ``tfdp-utils
    report`` names them) parse too. Names the logger never writes (Keras' ``train``,
    ``replica_x``, ``replica_01``) give None.
    """
    leaf = name.rsplit("/", 1)[-1]
    if leaf == GLOBAL_RUN:
        return "global", None
    kinds: tuple[tuple[RunKind, str], ...] = (
        ("replica", REPLICA_RUN_PREFIX),
        ("worker", WORKER_RUN_PREFIX),
    )
    for kind, prefix in kinds:
        digits = leaf[len(prefix) :]
        # One spelling per index: ASCII digits without leading zeros, as the logger writes.
        if leaf.startswith(prefix) and digits.isascii() and digits.isdigit():
            index = int(digits)
            if str(index) == digits:
                return kind, index
    return None


# ------------------------------------------------------------------------------ tag names

EXAMPLES_PER_SEC = "throughput/examples_per_sec"
STEPS_PER_SEC = "throughput/steps_per_sec"
EXAMPLES = "throughput/examples"
FLOPS_PER_SEC = "throughput/flops_per_sec"
MFU = "throughput/mfu"
WORKER_STEPS_PER_SEC_MIN = "throughput/worker_steps_per_sec_min"
WORKER_STEPS_PER_SEC_MAX = "throughput/worker_steps_per_sec_max"
WORKER_SKEW = "throughput/worker_skew"
EPOCH_START_SECONDS = "throughput/epoch_start_seconds"
INPUT_WAIT_SHARE = "input/wait_share"
GOODPUT = "goodput/goodput"
GOODPUT_LOSS_PREFIX = "goodput/loss_seconds/"
MEMORY_CURRENT_BYTES = "memory/current_bytes"
MEMORY_PEAK_BYTES = "memory/peak_bytes"

COUNTS = "throughput/counts"
"""A text summary (not a scalar) at each fit's first step: ``exact: ...`` or ``derived: why``."""

INPUT_WAIT_NOTE = "input/wait_note"
"""A text summary (not a scalar) of a fit whose input-wait share is unknown, saying why
(``unknown: op determinism is on ...``); at the fit's first step, or its last when timing
stopped during the fit. Absent when the share is measured."""

GOODPUT_LEDGER = "goodput/ledger"
"""A text summary (not a scalar) at each fit's last step, on the chief: where the fit's time
went (:class:`~tfdp_utils.throughput._goodput.FitLedger`, as JSON)."""

GOODPUT_LOSSES = (
    "startup",
    "restarts",
    "epoch_starts",
    "validation",
    "input_wait",
    "checkpoint_saves",
    "steps_trained_twice",
    "after_last_step",
    "other",
)
"""The losses of :func:`~tfdp_utils.throughput._goodput.job_goodput`, each a scalar
``goodput/loss_seconds/<name>``."""

LAYOUT_TAG = "custom_scalars__config__"
"""The tag TensorBoard's custom-scalars plugin stores :data:`LAYOUT` under (the plugin's name)."""

# --------------------------------------------------------------------------- descriptions


@dataclasses.dataclass(frozen=True)
class TagSpec:
    """One scalar the logger writes.

    Attributes:
        run: the kind of run that carries it.
        tag: the TensorBoard tag.
        description: what TensorBoard shows for it, as a ``str.format`` template. Fields:
            ``timing`` (:func:`window_timing`), ``steps`` (:func:`step_unit`),
            ``counted`` (:func:`count_origin`),
            ``exactness`` (:func:`replica_split`), ``device`` (a device name).
    """

    run: RunKind
    tag: str
    description: str


_WORKERS = "Derived from the workers' measured steps/s, gathered at this step"

SCHEMA: tuple[TagSpec, ...] = (
    TagSpec("global", EXAMPLES, "{counted} All replicas."),
    TagSpec(
        "global",
        EXAMPLES_PER_SEC,
        "Measured: examples trained per second, all replicas, {timing}.",
    ),
    TagSpec("global", STEPS_PER_SEC, "Measured: {steps} per second {timing}."),
    TagSpec(
        "global",
        FLOPS_PER_SEC,
        "Derived: measured examples/s times the flops_per_example given to ThroughputLogger.",
    ),
    TagSpec(
        "global",
        MFU,
        "Derived: model FLOPs utilisation, flops_per_sec / (peak_flops_per_replica x "
        "replicas), from the FLOPs figures given to ThroughputLogger.",
    ),
    TagSpec("global", WORKER_STEPS_PER_SEC_MIN, f"{_WORKERS}."),
    TagSpec("global", WORKER_STEPS_PER_SEC_MAX, f"{_WORKERS}."),
    TagSpec(
        "global",
        WORKER_SKEW,
        f"{_WORKERS}: (max - min) / max; 0 when all workers step alike.",
    ),
    TagSpec(
        "global",
        EPOCH_START_SECONDS,
        "Measured: seconds from the end of the previous epoch (or from train begin) to this "
        "epoch's first step on this host: the input iterator's rebuild and prefetch, and "
        "other callbacks' epoch-end work. Left out of every window's rate.",
    ),
    TagSpec(
        "global",
        INPUT_WAIT_SHARE,
        "Measured: share of the window's time the training loop waited for its next batch "
        "(timed inside the step, this worker's own pipeline only), {timing}. With several "
        "workers, the largest worker's share: the worker the others wait for.",
    ),
    TagSpec(
        "worker",
        INPUT_WAIT_SHARE,
        "Measured: share of the window's time this worker's training loop waited for its "
        "next batch from its own pipeline (waits for other workers left out), {timing}.",
    ),
    TagSpec("worker", STEPS_PER_SEC, "Measured: this worker's {steps} per second {timing}."),
    TagSpec(
        "worker",
        EXAMPLES_PER_SEC,
        "Measured: examples this worker's replicas trained per second {timing}.",
    ),
    TagSpec(
        "global",
        GOODPUT,
        "Derived: the job's goodput at the end of this fit: the training steps' time (less "
        "input waits and steps trained twice) over the wall time since the first run's start, "
        "over every fit logged here (a resumed job is one job).",
    ),
    *(
        TagSpec(
            "global",
            GOODPUT_LOSS_PREFIX + name,
            f"Derived: the job's seconds lost to {name.replace('_', ' ')} over every fit "
            "logged here, at the end of this fit, added up from the fits' ledgers (tfdp-utils "
            "report LOGDIR says whether each item was measured or derived).",
        )
        for name in GOODPUT_LOSSES
    ),
    TagSpec("replica", EXAMPLES, "{counted}"),
    TagSpec(
        "replica",
        EXAMPLES_PER_SEC,
        "Derived: examples this replica trained ({exactness}) divided by the worker's "
        "measured window time; replicas of one worker step together. {timing}.",
    ),
    TagSpec("replica", MEMORY_CURRENT_BYTES, "Measured: bytes allocated on {device} at this step."),
    TagSpec("replica", MEMORY_PEAK_BYTES, "Measured: peak bytes allocated on {device} so far."),
)
"""Every scalar the logger writes, by run kind; a tag may mean different things per kind."""

TAGS: frozenset[str] = frozenset(spec.tag for spec in SCHEMA)
"""Every tag the logger writes as a scalar (:data:`LAYOUT_TAG` is not a scalar)."""

_BY_KEY = {(spec.run, spec.tag): spec for spec in SCHEMA}


def tags_of(kind: RunKind) -> tuple[str, ...]:
    """The tags a run of ``kind`` may carry, in schema order."""
    return tuple(spec.tag for spec in SCHEMA if spec.run == kind)


def describe(run: str, tag: str, **fields: str) -> str:
    """The description the logger gives ``tag`` in run ``run``, its template filled in.

    Raises:
        KeyError: ``run`` is not a logger run, or its kind of run carries no ``tag``.
    """
    parsed = parse_run(run)
    if parsed is None:
        raise KeyError(f"{run!r} is not a ThroughputLogger run")
    return _BY_KEY[(parsed[0], tag)].description.format(**fields)


def window_timing(log_every_n_steps: int) -> str:
    """The ``timing`` field: what a window's rate is measured over."""
    return (
        f"over the last window (about {log_every_n_steps} steps; the last window of "
        "a fit may be shorter), wall time on this worker's host clock at log points, "
        "validation and epoch starts excluded"
    )


def step_unit(accumulation_steps: int = 1) -> str:
    """The ``steps`` field: what one step is (an update, or a micro-batch under accumulation).

    The step axis of every series counts the batches ``fit`` trained on: optimizer updates,
    or under gradient accumulation micro-batches, ``accumulation_steps`` per update.
    """
    if accumulation_steps <= 1:
        return "optimizer steps"
    return (
        f"micro-batches (gradient accumulation: {accumulation_steps} per optimizer update, so "
        f"updates per second are this divided by {accumulation_steps})"
    )


def count_origin(*, exact: bool, source: str, reason: str | None = None) -> str:
    """The ``counted`` field: whether counts are exact, where they come from, and why not."""
    kind = "Exact count" if exact else "Derived count"
    why = f" Not exact: {reason}." if reason and not exact else ""
    return f"{kind}: cumulative examples trained, from {source or 'the dataset'}.{why}"


EXACT_PREFIX = "exact: "
DERIVED_PREFIX = "derived: "
COUNTS_DESCRIPTION = (
    "How this fit's example counts (and every examples/s) were obtained: 'exact: <source>' or "
    "'derived: <why they are not exact>'. Written once per fit, at its first step."
)


INPUT_WAIT_NOTE_DESCRIPTION = (
    "Why this fit's input-wait share (input/wait_share) is unknown, e.g. op determinism, "
    "which refuses the timer of each fetch. Written only when the share is not measured."
)


def counts_note(*, exact: bool, source: str, reason: str | None = None) -> str:
    """The text of the :data:`COUNTS` summary; :func:`parse_counts_note` reads it back."""
    if exact:
        return f"{EXACT_PREFIX}{source}"
    return f"{DERIVED_PREFIX}{reason or source}"


def parse_counts_note(note: str) -> tuple[bool, str] | None:
    """``(exact, source or reason)`` of a :data:`COUNTS` text; None for any other text."""
    for prefix, exact in ((EXACT_PREFIX, True), (DERIVED_PREFIX, False)):
        if note.startswith(prefix):
            return exact, note[len(prefix) :]
    return None


def replica_split(*, exact: bool) -> str:
    """The ``exactness`` field: how a replica's share of the examples is known."""
    return "exact per-replica counts" if exact else "global_batch_size split evenly (assumed)"


# -------------------------------------------------------------------------- custom scalars


@dataclasses.dataclass(frozen=True)
class Chart:
    """A multiline chart of the custom-scalars dashboard: every tag matching a pattern."""

    title: str
    tag_patterns: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Category:
    """A section of the custom-scalars dashboard."""

    title: str
    charts: tuple[Chart, ...]
    closed: bool = False


_EXAMPLES_RATE = Chart("examples/s: global, workers and replicas", (f"^{EXAMPLES_PER_SEC}$",))
_STEPS_RATE = Chart("steps/s: global and workers", (f"^{STEPS_PER_SEC}$",))
_SPREAD = Chart("worker steps/s spread", (r"^throughput/worker_steps_per_sec_(min|max)$",))
_SKEW = Chart("worker skew", (f"^{WORKER_SKEW}$",))
_TRAINED = Chart("examples trained", (f"^{EXAMPLES}$",))
_EPOCH_STARTS = Chart("epoch start (s)", (f"^{EPOCH_START_SECONDS}$",))
_MFU = Chart("MFU", (f"^{MFU}$",))
_INPUT_WAIT = Chart("input wait share: global and workers", (f"^{INPUT_WAIT_SHARE}$",))
_GOODPUT = Category(
    "goodput",
    (
        Chart("the job's goodput", (f"^{GOODPUT}$",)),
        Chart("the job's losses (s)", (f"^{GOODPUT_LOSS_PREFIX}.*$",)),
    ),
)
_MEMORY = Category("memory", (Chart("device memory per replica", (r"^memory/.*_bytes$",)),), True)


def layout(
    *, multi_worker: bool, flops: bool, memory: bool, input_wait: bool = False
) -> tuple[Category, ...]:
    """The dashboard for one job: only the charts that job's runs will have data for.

    Args:
        multi_worker: whether several workers train (worker spread and skew charts).
        flops: whether FLOPs figures were given (the MFU chart).
        memory: whether some replica's device reports memory (the memory section).
        input_wait: whether the input-wait share is measured (its chart).
    """
    charts = [_EXAMPLES_RATE, _STEPS_RATE]
    if input_wait:
        charts.append(_INPUT_WAIT)
    if multi_worker:
        charts += [_SPREAD, _SKEW]
    charts += [_TRAINED, _EPOCH_STARTS]
    if flops:
        charts.append(_MFU)
    categories = [Category("throughput", tuple(charts)), _GOODPUT]
    if memory:
        categories.append(_MEMORY)
    return tuple(categories)


LAYOUT: tuple[Category, ...] = layout(multi_worker=True, flops=True, memory=True, input_wait=True)
"""Every chart of the dashboard; the chief writes :func:`layout` for its job into the global
run (the plugin reads it there)."""
