"""What :func:`~tfdp_utils.diagnose_input` measures, as data: the pipeline's stages, the rates
of the timed phases, and the rules read straight from them (the factor, the CPU share, the slow
stage). Pure Python (no TensorFlow).

The TensorFlow part (:mod:`tfdp_utils.data._diagnose_phases`) fills these records; the advice
(:mod:`tfdp_utils.data._input_advice`) and the verdict (:mod:`tfdp_utils.data._input_report`)
are decided from them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

INPUT_BOUND_FACTOR = 1.1
"""Above this factor (training on cached batches / training fed from the pipeline) the input
is what limits training."""

BOTTLENECK_MARGIN = 1.3
"""A stage whose rate is within this factor of the slowest is taken as the slow one."""

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
    """Everything :func:`diagnose` looks at: the data-stalls study's three runs of the same
    train step on the same strategy (synthetic, cached, real), the pipeline alone, its stages.

    Attributes:
        input: the pipeline alone through the distributed iterator, no model (None: no batch
            came within the budget).
        model: train steps on one batch held on the devices (no input cost); None when not
            timed.
        cached: train steps on batches of the pipeline held in memory, fed through the
            distributed iterator (the input cost of the iterator only); None when not timed.
        together: train steps fed from the pipeline, as ``fit`` runs them; None when not
            timed (the pipeline too slow for the budget).
        stages: the pipeline's stages from its source to its end.
        cores: cores this process may run on.
        builder: whether the dataset came from ``build_distributed_dataset`` (advice names its
            arguments).
        prefetches: whether the pipeline ends in a prefetch.
        cached_after: indices in ``stages`` of the stages a ``cache()`` follows.
        service: whether the pipeline reads from the tf.data service.
        replicas: replicas of the strategy on this worker.
        first_epoch: whether the figures are first-epoch figures: a ``cache()`` in the pipeline
            was being filled while it was timed.
        cached_slowest: the slowest of the cached batches' windows (``cached`` is the
            fastest), or None when there was one.
    """

    input: Rate | None
    model: Rate | None
    together: Rate | None
    cached: Rate | None = None
    stages: tuple[Stage, ...] = ()
    cores: int = 1
    builder: bool = False
    prefetches: bool = True
    cached_after: tuple[int, ...] = ()
    service: bool = False
    replicas: int = 1
    first_epoch: bool = False
    cached_slowest: Rate | None = None


def per_sec(rate: Rate | None) -> float | None:
    """``rate``'s examples per second, or None."""
    return None if rate is None else rate.examples_per_sec


def factor_of(figures: Figures) -> float | None:
    """How many times faster training runs on the pipeline's batches held in memory than fed
    from the pipeline (like with like: the same train step both times); the pipeline alone
    stands in when training on it was not timed. Above :data:`INPUT_BOUND_FACTOR`:
    input-bound. None when undetermined (no batch came within the budget)."""
    cached = per_sec(figures.cached) or per_sec(figures.model)
    real = per_sec(figures.together) or per_sec(figures.input)
    if cached is None or not real:
        return None
    return cached / real


def input_bound(figures: Figures) -> bool | None:
    """Whether the input limits training: :func:`factor_of` above :data:`INPUT_BOUND_FACTOR`,
    and every window of training on cached batches faster than the fastest fed from the
    pipeline (a difference within the windows' own spread is load, not input). None when
    undetermined."""
    factor = factor_of(figures)
    if factor is None:
        return None
    slowest, together = per_sec(figures.cached_slowest), per_sec(figures.together)
    apart = slowest is None or together is None or slowest > together
    return factor > INPUT_BOUND_FACTOR and apart


def iterator_factor(figures: Figures) -> float | None:
    """How many times faster the step runs on one batch held on the devices than on batches
    fed through the distributed iterator (the iterator's own cost), or None."""
    held, cached = per_sec(figures.model), per_sec(figures.cached)
    return None if held is None or not cached else held / cached


def cpu_share(rate: Rate | None, cores: int) -> float | None:
    """Share of ``cores`` this process kept busy over ``rate``'s stretch, or None."""
    if rate is None or rate.cpu_seconds is None or rate.seconds <= 0:
        return None
    return rate.cpu_seconds / (rate.seconds * max(cores, 1))


def bottleneck(stages: Sequence[Stage], input_rate: float, replicas: int = 2) -> int | None:
    """Index in ``stages`` of the slow stage, ``len(stages)`` for the distributed iterator
    after the pipeline (only on several ``replicas``: on one it splits nothing), or None when
    no stage was timed.

    Each timed rate is the pipeline up to that stage, so rates fall along the chain and stay
    down after the slow stage: it is the first whose rate is within :data:`BOTTLENECK_MARGIN`
    of the slowest.
    """
    timed = [(i, s.examples_per_sec) for i, s in enumerate(stages) if s.examples_per_sec]
    if not timed:
        return None
    slowest = min(rate for _, rate in timed)
    if input_rate * BOTTLENECK_MARGIN < slowest:
        if replicas < 2:
            return None  # one replica: nothing is split, no stage is the slow one
        return len(stages)  # every tf.data stage is faster than what the iterator delivers
    return next(i for i, rate in timed if rate <= slowest * BOTTLENECK_MARGIN)


def format_rate(rate: float) -> str:
    """``12,345`` examples/s, or ``12.3`` below 100."""
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:,.1f}"
