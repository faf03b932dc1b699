"""What :func:`~tfdp_utils.diagnose_input` concludes from its figures: the verdict, the slow
stage and the advice, as one :class:`InputDiagnosis`. Pure Python (no TensorFlow).

The TensorFlow part (:mod:`tfdp_utils.data._diagnose_input`) walks the dataset's chain into
:class:`~tfdp_utils.data._input_figures.Stage` records, times the pipeline, the model and the
two together, and hands the figures (:mod:`tfdp_utils.data._input_figures`) to
:func:`diagnose`; everything it decides is decided here and in
:mod:`tfdp_utils.data._input_advice`, so each rule is tested as a table without TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tfdp_utils.data._input_advice import Advice, advise
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


@dataclasses.dataclass(frozen=True)
class InputDiagnosis:
    """What :func:`~tfdp_utils.diagnose_input` measured and concluded.

    Attributes:
        input_bound: whether the input limits training: ``factor`` above
            :data:`INPUT_BOUND_FACTOR` (1.1) with every window of training on cached batches
            faster than the fastest fed from the pipeline (a difference within the windows'
            spread is load); None when undetermined (no batch came within ``max_seconds``).
        factor: ``cached_examples_per_sec / training_examples_per_sec``: how many times faster
            the same train step runs on the pipeline's batches held in memory than fed from
            the pipeline (the pipeline alone stands in when training on it was not timed).
            About 1: the input costs training nothing; 3: training waits for input two
            thirds of the time. None when undetermined.
        input_examples_per_sec: the pipeline alone (the dataset iterated, no model), through
            the strategy's distributed iterator as training reads it; None when no batch came.
        model_examples_per_sec: train steps on one batch held on the devices (no input
            cost at all), or None when not timed.
        training_examples_per_sec: train steps fed from the dataset, as ``fit`` runs them, or
            None when not timed.
        steps: steps timed in each phase (input alone, model on one held batch, cached
            batches, fed from the dataset), after the warm-up; 0 for a phase not timed.
        global_batch_size: examples per step over all replicas (the first batch's).
        num_replicas_in_sync: replicas of the model's strategy.
        stages: the pipeline's stages from its source to its end, with the rates of the
            stages timed alone.
        bottleneck: the slow stage (:meth:`Stage.describe`), ``"distributed iterator"`` (on
            several replicas only), or None when not input-bound or no stage was timed.
        input_cpu_share: the share of this process's cores busy while the pipeline ran alone
            (all threads, from ``os.times()``), or None.
        cores: cores this process may run on.
        advice: what to change, most useful first (:class:`Advice`: ``kind`` and ``message``).
        seconds: wall time of the whole diagnosis, tracing included.
        strategy: the strategy's class name.
        keras: the Keras flavour and version (``"keras3 3.15.1"``).
        dataset: what the dataset is, in words.
        notes: anything that qualifies the figures (e.g. the time budget cut a phase short).
        cached_examples_per_sec: train steps on batches of the pipeline held in memory, fed
            through the distributed iterator (the iterator's cost only), or None.
        cut_short: the phases ``max_seconds`` cut short (``"input"``, ``"model"``,
            ``"cached"``, ``"together"``, ``"stages"``).
        first_epoch: whether the figures are first-epoch figures: a ``cache()`` in the
            pipeline was being filled while they were measured (later epochs read it).
    """

    input_bound: bool | None
    factor: float | None
    input_examples_per_sec: float | None
    model_examples_per_sec: float | None
    training_examples_per_sec: float | None
    steps: tuple[int, ...]
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
    cached_examples_per_sec: float | None = None
    cut_short: tuple[str, ...] = ()
    first_epoch: bool = False

    def _verdict(self) -> str:
        if self.factor is None:
            return "UNDETERMINED: no batch came from the pipeline within the time budget"
        if self.input_bound:
            return (
                f"INPUT-BOUND: training fed from the pipeline runs {self.factor:.1f}x slower "
                "than on the same batches held in memory"
            )
        return "not input-bound: training fed from the pipeline keeps up with cached batches"

    def summary(self) -> str:
        """The diagnosis as text to paste into a bug report."""
        steps = dict(zip(_PHASES, self.steps, strict=False))
        cpu = (
            f"; CPU {self.input_cpu_share:.0%} of {self.cores} core(s)"
            if self.input_cpu_share is not None
            else ""
        )
        first = " (first epoch: a cache() being filled)" if self.first_epoch else ""
        lines = [
            f"tfdp-utils diagnose_input: {self._verdict()}{first}",
            f"  strategy     {self.strategy}, {self.num_replicas_in_sync} replica(s); {self.keras}",
            f"  dataset      {self.dataset}; global batch {self.global_batch_size}",
            _rate_line("input alone", self.input_examples_per_sec, steps["input"], "steps" + cpu),
            _rate_line(
                "model alone", self.model_examples_per_sec, steps["model"], "steps, one held batch"
            ),
            _rate_line(
                "cached", self.cached_examples_per_sec, steps["cached"], "steps, batches in memory"
            ),
            _rate_line(
                "together", self.training_examples_per_sec, steps["together"], "steps, as fit"
            ),
            f"  factor       {_factor_text(self.factor)}  (cached / together; input-bound "
            f"above {INPUT_BOUND_FACTOR})",
            "  pipeline (source first; examples/s of the pipeline up to each stage, alone):",
        ]
        for stage in self.stages:
            per_sec = stage.examples_per_sec
            rate = "" if per_sec is None else f"{format_rate(per_sec):>12}"
            mark = "  <- slow stage" if stage.describe() == self.bottleneck else ""
            lines.append(f"    {stage.describe():<40} {rate}{mark}".rstrip())
        if self.bottleneck == DISTRIBUTED_ITERATOR:
            lines.append(f"    {DISTRIBUTED_ITERATOR:<40} {'':>12}  <- slow stage")
        lines.append("advice:")
        lines.extend(f"  {n}. [{a.kind}] {a.message}" for n, a in enumerate(self.advice, 1))
        lines.extend(f"note: {note}" for note in self.notes)
        lines.append(f"(diagnosis took {self.seconds:.1f} s)")
        return "\n".join(lines)


_PHASES = ("input", "model", "cached", "together")


def _rate_line(name: str, rate: float | None, steps: int, what: str) -> str:
    figure = "not timed" if rate is None else format_rate(rate)
    return f"  {name:<12} {figure:>12} examples/s ({steps} {what})"


def _factor_text(factor: float | None) -> str:
    return f"{'-':>12}" if factor is None else f"{factor:12.2f}"


DISTRIBUTED_ITERATOR = "distributed iterator"


def _cut_note(cut_short: Sequence[str]) -> list[str]:
    if not cut_short:
        return []
    return [
        f"max_seconds cut short: {', '.join(cut_short)} (the steps timed are listed; a phase "
        "with 0 steps was not timed)"
    ]


def _first_epoch_note(figures: Figures) -> list[str]:
    if not figures.first_epoch:
        return []
    return [
        "first-epoch figures: a cache() in the pipeline was being filled while it was timed "
        "(unless an earlier pass filled it); later epochs read the cache and skip the stages "
        "before it, so advice for those stages is about the first epoch only"
    ]


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
    cut_short: Sequence[str] = (),
) -> InputDiagnosis:
    """The :class:`InputDiagnosis` of ``figures``. Pure."""
    factor = factor_of(figures)
    bound = input_bound(figures)
    slow = None
    if bound is not False:
        input_rate = per_sec(figures.input) or 0.0
        slow = bottleneck(figures.stages, input_rate, figures.replicas)
    if slow is None:
        slow_name = None
    elif slow == len(figures.stages):
        slow_name = DISTRIBUTED_ITERATOR
    else:
        slow_name = figures.stages[slow].describe()
    rates = (figures.input, figures.model, figures.cached, figures.together)
    return InputDiagnosis(
        input_bound=bound,
        factor=factor,
        input_examples_per_sec=per_sec(figures.input),
        model_examples_per_sec=per_sec(figures.model),
        training_examples_per_sec=per_sec(figures.together),
        steps=tuple(0 if rate is None else rate.steps for rate in rates),
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
        notes=(*_first_epoch_note(figures), *_cut_note(cut_short), *notes),
        cached_examples_per_sec=per_sec(figures.cached),
        cut_short=tuple(cut_short),
        first_epoch=figures.first_epoch,
    )


InputDiagnosis.__module__ = "tfdp_utils"  # public home (tfdp_utils._public)
