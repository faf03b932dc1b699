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
)


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
            f"  input alone  {format_rate(self.input_examples_per_sec):>12} examples/s "
            f"({steps_in} steps{cpu})",
            f"  model alone  {format_rate(self.model_examples_per_sec):>12} examples/s "
            f"({steps_model} steps on one cached batch)",
            f"  together     {format_rate(self.training_examples_per_sec):>12} examples/s "
            f"({steps_together} train steps fed from the dataset)",
            f"  factor       {self.factor:12.2f}  (model alone / input alone; input-bound above "
            f"{INPUT_BOUND_FACTOR})",
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
