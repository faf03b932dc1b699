"""What to change, from what :func:`~tfdp_utils.diagnose_input` measured: the advice for the
slow stage (a table of rows), the CPU share, the overlap of input and model, or the model
step when the input is not the limit. Pure Python (no TensorFlow).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tfdp_utils.data._input_figures import (
    INPUT_BOUND_FACTOR,
    Figures,
    Stage,
    bottleneck,
    cpu_share,
    factor_of,
    format_rate,
    input_bound,
    per_sec,
)

CPU_SATURATED_SHARE = 0.8
"""Above this share of the cores busy while the pipeline runs alone, it is CPU-bound."""

LATENCY_BOUND_SHARE = 0.5
"""Below this share of the cores busy while it runs alone, the pipeline mostly waits."""

OVERLAP_SHARE = 0.8
"""Training below this share of the slower of input and model: the two do not overlap."""


@dataclasses.dataclass(frozen=True)
class Advice:
    """One thing to change, derived from the pipeline and the figures.

    Attributes:
        kind: a stable key: ``"parallel_reads"``, ``"more_files"``, ``"parallel_map"``,
            ``"python"``, ``"cache"``, ``"service"``, ``"threading"``, ``"overlap"``,
            ``"distribution"`` (several replicas only), ``"compute"`` (the input is not the
            limit) or ``"budget"`` (no batch came within ``max_seconds``).
        message: the advice in words, with the call to make.
    """

    kind: str
    message: str

    def __str__(self) -> str:
        return self.message


def _parallel_reads(stage: Stage, figures: Figures, where: str) -> str:
    unless_builder = (
        "" if figures.builder else " (a file source given to build_distributed_dataset is read so)"
    )
    return (
        f"Reads are serial ({where}): read several files at once with "
        "tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE), or "
        "tf.data.Dataset.from_tensor_slices(files).interleave(reader, "
        f"num_parallel_calls=tf.data.AUTOTUNE, deterministic=False){unless_builder}."
    )


def _more_files(stage: Stage, figures: Figures, where: str) -> str:
    return (
        f"Only {stage.files} file(s) to read from ({where}): parallel reads cannot go beyond the "
        f"number of files; split the data into more files (at least {2 * figures.cores}, "
        "several per reader)."
    )


def _generator(stage: Stage, figures: Figures, where: str) -> str:
    return (
        f"The source is a Python generator ({where}): from_generator runs it in one Python "
        "thread under the GIL. Write the data to TFRecord files and read them in parallel, or "
        "interleave several generators (one per shard) with num_parallel_calls."
    )


def _parallel_map(stage: Stage, figures: Figures, where: str) -> str:
    python = (
        " (a py_function/numpy_function holds the GIL: parallel calls help only while it "
        "waits; rewrite it in TensorFlow ops if it computes)"
    )
    return (
        f"A map runs one element at a time ({where}): pass num_parallel_calls=tf.data.AUTOTUNE "
        f"to that map{python if stage.python else ''}."
    )


def _cache(stage: Stage, figures: Figures, where: str) -> str:
    fix = (
        "pass cache=True (or a file prefix) to build_distributed_dataset, which maps before caching"
        if figures.builder
        else "add .cache() (memory) or .cache(path) (disk) right after it"
    )
    return (
        f"A map is the expensive part ({where}): when its result is the same every epoch and "
        f"fits in memory or on disk, {fix}: epochs after the first skip it."
    )


def service_applies(figures: Figures) -> bool:
    """Whether the tf.data service can help: not already in use, no Python stage (a
    ``py_function``, ``numpy_function`` or ``from_generator`` cannot run on its workers), and
    not first-epoch figures (later epochs read the ``cache()`` being filled)."""
    python = any(stage.python or stage.kind == "generator" for stage in figures.stages)
    return not (figures.service or figures.first_epoch or python)


def _map_service(stage: Stage, figures: Figures, where: str) -> str:
    return _service_advice(figures.builder, "to run the map on other machines").message


@dataclasses.dataclass(frozen=True)
class _StageRule:
    """One row of advice for the slow stage: its kind, when it applies, its words.

    Attributes:
        kind: the advice's :attr:`Advice.kind`.
        applies: whether it applies to the slow stage (at its index in ``figures.stages``).
        message: the advice in words, given where the time goes (``the slow stage is ...``).
    """

    kind: str
    applies: Callable[[Stage, Figures, int], bool]
    message: Callable[[Stage, Figures, str], str]


_STAGE_RULES = (
    _StageRule("parallel_reads", lambda s, f, i: s.kind == "read" and s.serial, _parallel_reads),
    _StageRule(
        "more_files",
        lambda s, f, i: s.kind == "read" and s.files is not None and s.files < 2 * f.cores,
        _more_files,
    ),
    _StageRule("python", lambda s, f, i: s.kind == "generator", _generator),
    _StageRule("parallel_map", lambda s, f, i: s.kind == "map" and s.serial, _parallel_map),
    _StageRule("cache", lambda s, f, i: s.kind == "map" and i not in f.cached_after, _cache),
    _StageRule("service", lambda s, f, i: s.kind == "map" and service_applies(f), _map_service),
)
"""The advice for the slow stage, in the order it is given."""


def _stage_advice(stage: Stage, figures: Figures, index: int, where: str = "") -> list[Advice]:
    where = where or f"the slow stage is {stage.describe()}"
    return [
        Advice(rule.kind, rule.message(stage, figures, where))
        for rule in _STAGE_RULES
        if rule.applies(stage, figures, index)
    ]


def _service_advice(builder: bool, why: str) -> Advice:
    how = (
        "pass service='grpc://dispatcher:port' to build_distributed_dataset (start one with "
        "tfdp-utils data-service dispatcher / worker)"
        if builder
        else "tf.data.experimental.service.distribute(...) on the dataset, or "
        "build_distributed_dataset(..., service=...)"
    )
    return Advice("service", f"Use the tf.data service {why}: {how}.")


def _cpu_advice(figures: Figures, advice: list[Advice]) -> list[Advice]:
    share = cpu_share(figures.input, figures.cores)
    if share is None:
        return []
    kinds = {a.kind for a in advice}
    busy = f"{share:.0%} of {figures.cores} core(s)"
    if share >= CPU_SATURATED_SHARE:
        more: list[Advice] = []
        if "service" not in kinds and service_applies(figures):
            more.append(
                _service_advice(
                    figures.builder,
                    f"to move preprocessing off this machine: the pipeline alone keeps {busy} "
                    "busy, so more parallelism here cannot help",
                )
            )
        more.append(
            Advice(
                "threading",
                f"The pipeline keeps {busy} busy: set options = tf.data.Options(); "
                "options.threading.max_intra_op_parallelism = 1 (ops inside the pipeline stop "
                "competing for the same threads) and dataset = dataset.with_options(options).",
            )
        )
        return more
    if share < LATENCY_BOUND_SHARE:
        threads = 4 * figures.cores
        return [
            Advice(
                "threading",
                f"The pipeline waits more than it computes (the process used {busy} while "
                "the input ran alone): reads or calls are latency-bound. Keep more in flight "
                "than there are cores, which AUTOTUNE does not (it stops at the core count): a "
                f"fixed num_parallel_calls / num_parallel_reads (e.g. {threads}) with options = "
                f"tf.data.Options(); options.threading.private_threadpool_size = {threads}; "
                "dataset = dataset.with_options(options).",
            )
        ]
    return []


def _overlap_advice(figures: Figures) -> list[Advice]:
    rates = [r for r in (per_sec(figures.input), per_sec(figures.cached)) if r is not None]
    together = per_sec(figures.together)
    if together is None or not rates or together >= OVERLAP_SHARE * min(rates):
        return []
    slower = min(rates)
    share = cpu_share(figures.together, figures.cores)
    off = (
        "move preprocessing off this machine (the tf.data service) or cache its result"
        if service_applies(figures)
        else "cache the result of the expensive stages"
    )
    reason = (
        "add .prefetch(tf.data.AUTOTUNE) at the end of the pipeline so batches are made "
        "while the step runs"
        if not figures.prefetches
        else "the pipeline and the step compete for the same cores"
        + (f" (the process kept {share:.0%} of {figures.cores} busy)" if share is not None else "")
        + f": {off}"
    )
    return [
        Advice(
            "overlap",
            f"Together they train {format_rate(together)} examples/s, below the slower of the "
            f"pipeline alone and training on cached batches ({format_rate(slower)}): {reason}.",
        )
    ]


def _input_bound_advice(figures: Figures) -> list[Advice]:
    """The slow stage's advice, or the distributed iterator's (several replicas only)."""
    input_rate = per_sec(figures.input) or 0.0
    slow = bottleneck(figures.stages, input_rate, figures.replicas)
    if slow is not None and slow == len(figures.stages):
        return [
            Advice(
                "distribution",
                "Every tf.data stage alone is faster than the distributed iterator delivers "
                f"({format_rate(input_rate)} examples/s): the time goes into splitting batches "
                f"over the {figures.replicas} replicas and copying them to the devices; larger "
                "per-replica batches amortise it.",
            )
        ]
    if slow is not None:
        return _stage_advice(figures.stages[slow], figures, slow)
    likely = next(
        (
            i
            for i, stage in enumerate(figures.stages)
            if stage.kind == "generator"
            or (stage.kind in ("read", "map") and (stage.serial or stage.python))
        ),
        None,
    )
    if likely is None:  # no stage timed, none that is slow by its kind
        return []
    stage = figures.stages[likely]
    where = f"the stages were not timed; {stage.describe()} is slow by its kind"
    return _stage_advice(stage, figures, likely, where)


def advise(figures: Figures) -> tuple[Advice, ...]:
    """The advice for ``figures``, most useful first, one per kind. Pure."""
    factor = factor_of(figures)
    advice: list[Advice] = []
    if factor is None:
        advice.append(
            Advice(
                "budget",
                "No batch came from the pipeline within the time budget, so nothing could be "
                "compared: pass a larger max_seconds (more than a few batches' time), or time "
                "the pipeline alone (tdu.diagnose_input finds its slow stage once it delivers).",
            )
        )
        advice.extend(_input_bound_advice(figures))
    elif not input_bound(figures):
        advice.append(
            Advice(
                "compute",
                f"The input is not what limits training: fed from the pipeline it trains at "
                f"{min(1.0, 1 / factor):.0%} of the speed on the same batches held in memory"
                f"{'' if factor <= INPUT_BOUND_FACTOR else ', within the spread of its windows'}. "
                "A faster pipeline will not speed training up; the model step is the place to "
                "look (per-replica batch size, mixed precision, XLA with jit_compile=True, more "
                "replicas).",
            )
        )
    else:
        advice.extend(_input_bound_advice(figures))
        advice.extend(_cpu_advice(figures, advice))
    advice.extend(_overlap_advice(figures))
    unique: dict[str, Advice] = {}
    for item in advice:
        unique.setdefault(item.kind, item)
    return tuple(unique.values())
