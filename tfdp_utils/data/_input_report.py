"""What :func:`~tfdp_utils.diagnose_input` concludes from its figures: the verdict, the slow
stage and the advice, as data. Pure Python (no TensorFlow).

The TensorFlow part (:mod:`tfdp_utils.data._diagnose_input`) walks the dataset's chain into
:class:`Stage` records, times the pipeline, the model and the two together, and hands the
figures to :func:`diagnose`; everything it decides is decided here, so each rule is tested
as a table without TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

INPUT_BOUND_FACTOR = 1.1
"""Above this factor (model alone / input alone) the input is what limits training."""

BOTTLENECK_MARGIN = 1.3
"""A stage whose rate is within this factor of the slowest is taken as the slow one."""

CPU_SATURATED_SHARE = 0.8
"""Above this share of the cores busy while the pipeline runs alone, it is CPU-bound."""

LATENCY_BOUND_SHARE = 0.5
"""Below this share of the cores busy while it runs alone, the pipeline mostly waits."""

OVERLAP_SHARE = 0.8
"""Training below this share of the slower of input and model: the two do not overlap."""

StageKind = Literal["source", "read", "generator", "map", "batch", "interleave", "other"]


@dataclasses.dataclass(frozen=True)
class Stage:
    """One transformation of the input pipeline, as :func:`diagnose_input` saw it.

    Attributes:
        name: tf.data's class without underscores and ``Dataset`` (``ParallelMap``,
            ``TFRecordV2``, ``Interleave``).
        kind: ``"source"``, ``"read"`` (reads files), ``"generator"`` (``from_generator``),
            ``"map"``, ``"batch"``, ``"interleave"`` or ``"other"``.
        parallel: parallel calls or reads: a number, ``-1`` for AUTOTUNE, None when the stage
            runs one element at a time.
        python: whether the stage runs Python (``py_function``, ``numpy_function``,
            ``from_generator``), which holds the GIL.
        files: files the stage reads, when known.
        examples_per_sec: examples per second of the pipeline up to and including this
            stage, timed alone; None when not timed.
    """

    name: str
    kind: StageKind
    parallel: int | None = None
    python: bool = False
    files: int | None = None
    examples_per_sec: float | None = None

    def describe(self) -> str:
        """``ParallelMap(AUTOTUNE, Python)``: the name and what matters about the stage."""
        parts: list[str] = []
        if self.files is not None:
            parts.append(f"{self.files} file{'s' if self.files != 1 else ''}")
        if self.kind in ("read", "map", "interleave", "generator"):
            if self.parallel is None or self.parallel == 1:
                parts.append("serial")
            else:
                parts.append("AUTOTUNE" if self.parallel < 0 else f"parallel={self.parallel}")
        if self.python:
            parts.append("Python")
        return f"{self.name}({', '.join(parts)})" if parts else self.name

    @property
    def serial(self) -> bool:
        return self.parallel is None or self.parallel == 1


@dataclasses.dataclass(frozen=True)
class Advice:
    """One thing to change, derived from the pipeline and the figures.

    Attributes:
        kind: a stable key: ``"parallel_reads"``, ``"more_files"``, ``"parallel_map"``,
            ``"python"``, ``"cache"``, ``"service"``, ``"threading"``, ``"overlap"``,
            ``"distribution"`` or ``"compute"`` (the input is not the limit).
        message: the advice in words, with the call to make.
    """

    kind: str
    message: str

    def __str__(self) -> str:
        return self.message


@dataclasses.dataclass(frozen=True)
class Rate:
    """Examples per second over a timed stretch.

    Attributes:
        examples: examples in the timed steps.
        steps: steps (or batches) timed, after the warm-up.
        seconds: wall time of those steps.
        cpu_seconds: CPU time of this process (all threads) over the same stretch, or None.
    """

    examples: int
    steps: int
    seconds: float
    cpu_seconds: float | None = None

    @property
    def examples_per_sec(self) -> float:
        return self.examples / self.seconds if self.seconds > 0 else float("inf")


@dataclasses.dataclass(frozen=True)
class Figures:
    """Everything :func:`diagnose` looks at.

    Attributes:
        input: the pipeline alone through the distributed iterator.
        model: train steps on one cached batch.
        together: train steps fed from the dataset.
        stages: the pipeline's stages from its source to its end.
        cores: cores this process may run on.
        builder: whether the dataset came from ``build_distributed_dataset`` (advice names its
            arguments).
        prefetches: whether the pipeline ends in a prefetch.
        cached_after: indices in ``stages`` of the stages a ``cache()`` follows.
        service: whether the pipeline reads from the tf.data service.
    """

    input: Rate
    model: Rate
    together: Rate
    stages: tuple[Stage, ...] = ()
    cores: int = 1
    builder: bool = False
    prefetches: bool = True
    cached_after: tuple[int, ...] = ()
    service: bool = False


def factor_of(figures: Figures) -> float:
    """Model alone over input alone: how many times faster the model could train than the
    input delivers (above 1: input-bound)."""
    return figures.model.examples_per_sec / figures.input.examples_per_sec


def cpu_share(rate: Rate, cores: int) -> float | None:
    """Share of ``cores`` this process kept busy over ``rate``'s stretch, or None."""
    if rate.cpu_seconds is None or rate.seconds <= 0:
        return None
    return rate.cpu_seconds / (rate.seconds * max(cores, 1))


def bottleneck(stages: Sequence[Stage], input_rate: float) -> int | None:
    """Index in ``stages`` of the slow stage, ``len(stages)`` for the distributed iterator
    after the pipeline, or None when no stage was timed.

    Each timed rate is the pipeline up to that stage, so rates fall along the chain and stay
    down after the slow stage: it is the first whose rate is within :data:`BOTTLENECK_MARGIN`
    of the slowest.
    """
    timed = [(i, s.examples_per_sec) for i, s in enumerate(stages) if s.examples_per_sec]
    if not timed:
        return None
    slowest = min(rate for _, rate in timed)
    if input_rate * BOTTLENECK_MARGIN < slowest:
        return len(stages)  # every tf.data stage is faster than what the iterator delivers
    return next(i for i, rate in timed if rate <= slowest * BOTTLENECK_MARGIN)


def _fmt(rate: float) -> str:
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:,.1f}"


def _stage_advice(stage: Stage, figures: Figures, index: int) -> list[Advice]:
    builder = figures.builder
    advice: list[Advice] = []
    where = f"the slow stage is {stage.describe()}"
    if stage.kind == "read" and stage.serial:
        advice.append(
            Advice(
                "parallel_reads",
                f"Reads are serial ({where}): read several files at once with "
                "tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE), or "
                "tf.data.Dataset.from_tensor_slices(files).interleave(reader, "
                "num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)"
                + (
                    " (a file source given to build_distributed_dataset is read so)"
                    if not builder
                    else ""
                )
                + ".",
            )
        )
    if stage.kind == "read" and stage.files is not None and stage.files < 2 * figures.cores:
        advice.append(
            Advice(
                "more_files",
                f"Only {stage.files} file(s) to read from ({where}): parallel reads cannot go "
                f"beyond the number of files; split the data into more files (at least "
                f"{2 * figures.cores}, several per reader).",
            )
        )
    if stage.kind == "generator":
        advice.append(
            Advice(
                "python",
                f"The source is a Python generator ({where}): from_generator runs it in one "
                "Python thread under the GIL. Write the data to TFRecord files and read them in "
                "parallel, or interleave several generators (one per shard) with "
                "num_parallel_calls.",
            )
        )
    if stage.kind == "map":
        if stage.serial:
            advice.append(
                Advice(
                    "parallel_map",
                    f"A map runs one element at a time ({where}): pass "
                    "num_parallel_calls=tf.data.AUTOTUNE to that map"
                    + (
                        " (a py_function/numpy_function holds the GIL: parallel calls help "
                        "only while it waits; rewrite it in TensorFlow ops if it computes)"
                        if stage.python
                        else ""
                    )
                    + ".",
                )
            )
        if index not in figures.cached_after:
            fix = (
                "pass cache=True (or a file prefix) to build_distributed_dataset, which maps "
                "before caching"
                if builder
                else "add .cache() (memory) or .cache(path) (disk) right after it"
            )
            advice.append(
                Advice(
                    "cache",
                    f"A map is the expensive part ({where}): when its result is the same every "
                    f"epoch and fits in memory or on disk, {fix}: epochs after the first skip it.",
                )
            )
        if not figures.service:
            advice.append(_service_advice(builder, "to run the map on other machines"))
    return advice


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
        if "service" not in kinds and not figures.service:
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
    slower = min(figures.input.examples_per_sec, figures.model.examples_per_sec)
    together = figures.together.examples_per_sec
    if together >= OVERLAP_SHARE * slower:
        return []
    share = cpu_share(figures.together, figures.cores)
    reason = (
        "add .prefetch(tf.data.AUTOTUNE) at the end of the pipeline so batches are made "
        "while the step runs"
        if not figures.prefetches
        else "the pipeline and the step compete for the same cores"
        + (f" (the process kept {share:.0%} of {figures.cores} busy)" if share is not None else "")
        + ": move preprocessing off this machine (the tf.data service) or cache its result"
    )
    return [
        Advice(
            "overlap",
            f"Together they train {_fmt(together)} examples/s, below the slower of the two "
            f"alone ({_fmt(slower)}): {reason}.",
        )
    ]


def advise(figures: Figures) -> tuple[Advice, ...]:
    """The advice for ``figures``, most useful first, one per kind. Pure."""
    factor = factor_of(figures)
    advice: list[Advice] = []
    if factor <= INPUT_BOUND_FACTOR:
        advice.append(
            Advice(
                "compute",
                f"The input is not what limits training: it delivers {1 / factor:.1f}x what "
                "the model consumes. A faster pipeline will not speed training up; the model "
                "step is the place to look (per-replica batch size, mixed precision, XLA with "
                "jit_compile=True, more replicas).",
            )
        )
    else:
        slow = bottleneck(figures.stages, figures.input.examples_per_sec)
        if slow is not None and slow == len(figures.stages):
            advice.append(
                Advice(
                    "distribution",
                    "Every tf.data stage alone is faster than the distributed iterator "
                    f"delivers ({_fmt(figures.input.examples_per_sec)} examples/s): the time "
                    "goes into splitting batches over the replicas and copying them to the "
                    "devices; larger per-replica batches amortise it.",
                )
            )
        elif slow is not None:
            advice.extend(_stage_advice(figures.stages[slow], figures, slow))
        advice.extend(_cpu_advice(figures, advice))
    advice.extend(_overlap_advice(figures))
    unique: dict[str, Advice] = {}
    for item in advice:
        unique.setdefault(item.kind, item)
    return tuple(unique.values())


@dataclasses.dataclass(frozen=True)
class InputDiagnosis:
    """What :func:`~tfdp_utils.diagnose_input` measured and concluded.

    Attributes:
        input_bound: whether the input limits training: ``factor`` above
            :data:`INPUT_BOUND_FACTOR` (1.1).
        factor: ``model_examples_per_sec / input_examples_per_sec``: how many times faster
            the model could train than the pipeline delivers. Above 1 the model waits for
            input; below 1 the input waits for the model (0.2: the pipeline is 5x faster than
            needed).
        input_examples_per_sec: the pipeline alone (the dataset iterated, no model), through
            the strategy's distributed iterator as training reads it.
        model_examples_per_sec: train steps alone, on one batch cached on the devices.
        training_examples_per_sec: train steps fed from the dataset, as ``fit`` runs them.
        steps: steps timed in each of the three phases (input, model, together), after the
            warm-up steps.
        global_batch_size: examples per step over all replicas (the first batch's).
        num_replicas_in_sync: replicas of the model's strategy.
        stages: the pipeline's stages from its source to its end, with the rates of the
            stages timed alone.
        bottleneck: the slow stage (:meth:`Stage.describe`), ``"distributed iterator"``, or
            None when not input-bound or no stage was timed.
        input_cpu_share: the share of this process's cores busy while the pipeline ran alone
            (all threads, from ``os.times()``), or None.
        cores: cores this process may run on.
        advice: what to change, most useful first (:class:`Advice`: ``kind`` and ``message``).
        seconds: wall time of the whole diagnosis, tracing included.
        strategy: the strategy's class name.
        keras: the Keras flavour and version (``"keras3 3.15.1"``).
        dataset: what the dataset is, in words.
        notes: anything that qualifies the figures (e.g. the time budget cut a phase short).
    """

    input_bound: bool
    factor: float
    input_examples_per_sec: float
    model_examples_per_sec: float
    training_examples_per_sec: float
    steps: tuple[int, int, int]
    global_batch_size: int
    num_replicas_in_sync: int
    stages: tuple[Stage, ...]
    bottleneck: str | None
    input_cpu_share: float | None
    cores: int
    advice: tuple[Advice, ...]
    seconds: float
    strategy: str = ""
    keras: str = ""
    dataset: str = ""
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        """The diagnosis as text to paste into a bug report."""
        if self.input_bound:
            verdict = (
                f"INPUT-BOUND: the model could train {self.factor:.1f}x faster than the input "
                "delivers"
            )
        else:
            verdict = (
                f"not input-bound: the input delivers {1 / self.factor:.1f}x what the model "
                "consumes"
            )
        steps_in, steps_model, steps_together = self.steps
        cpu = (
            f"; CPU {self.input_cpu_share:.0%} of {self.cores} core(s)"
            if self.input_cpu_share is not None
            else ""
        )
        lines = [
            f"tfdp-utils diagnose_input: {verdict}",
            f"  strategy     {self.strategy}, {self.num_replicas_in_sync} replica(s); {self.keras}",
            f"  dataset      {self.dataset}; global batch {self.global_batch_size}",
            f"  input alone  {_fmt(self.input_examples_per_sec):>12} examples/s "
            f"({steps_in} steps{cpu})",
            f"  model alone  {_fmt(self.model_examples_per_sec):>12} examples/s "
            f"({steps_model} steps on one cached batch)",
            f"  together     {_fmt(self.training_examples_per_sec):>12} examples/s "
            f"({steps_together} train steps fed from the dataset)",
            f"  factor       {self.factor:12.2f}  (model alone / input alone; input-bound above "
            f"{INPUT_BOUND_FACTOR})",
            "  pipeline (source first; examples/s of the pipeline up to each stage, alone):",
        ]
        for stage in self.stages:
            rate = "" if stage.examples_per_sec is None else f"{_fmt(stage.examples_per_sec):>12}"
            mark = "  <- slow stage" if stage.describe() == self.bottleneck else ""
            lines.append(f"    {stage.describe():<40} {rate}{mark}".rstrip())
        if self.bottleneck == DISTRIBUTED_ITERATOR:
            lines.append(f"    {DISTRIBUTED_ITERATOR:<40} {'':>12}  <- slow stage")
        lines.append("advice:")
        lines.extend(f"  {n}. [{a.kind}] {a.message}" for n, a in enumerate(self.advice, 1))
        lines.extend(f"note: {note}" for note in self.notes)
        lines.append(f"(diagnosis took {self.seconds:.1f} s)")
        return "\n".join(lines)


DISTRIBUTED_ITERATOR = "distributed iterator"


def diagnose(
    figures: Figures,
    *,
    seconds: float,
    global_batch_size: int,
    num_replicas_in_sync: int,
    strategy: str = "",
    keras: str = "",
    dataset: str = "",
    notes: Sequence[str] = (),
) -> InputDiagnosis:
    """The :class:`InputDiagnosis` of ``figures``. Pure."""
    factor = factor_of(figures)
    input_bound = factor > INPUT_BOUND_FACTOR
    slow = bottleneck(figures.stages, figures.input.examples_per_sec) if input_bound else None
    if slow is None:
        slow_name = None
    elif slow == len(figures.stages):
        slow_name = DISTRIBUTED_ITERATOR
    else:
        slow_name = figures.stages[slow].describe()
    return InputDiagnosis(
        input_bound=input_bound,
        factor=factor,
        input_examples_per_sec=figures.input.examples_per_sec,
        model_examples_per_sec=figures.model.examples_per_sec,
        training_examples_per_sec=figures.together.examples_per_sec,
        steps=(figures.input.steps, figures.model.steps, figures.together.steps),
        global_batch_size=global_batch_size,
        num_replicas_in_sync=num_replicas_in_sync,
        stages=figures.stages,
        bottleneck=slow_name,
        input_cpu_share=cpu_share(figures.input, figures.cores),
        cores=figures.cores,
        advice=advise(figures),
        seconds=seconds,
        strategy=strategy,
        keras=keras,
        dataset=dataset,
        notes=tuple(notes),
    )


InputDiagnosis.__module__ = "tfdp_utils"  # public home (tfdp_utils._public)
