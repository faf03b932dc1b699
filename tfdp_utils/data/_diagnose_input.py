"""``diagnose_input``: is training input-bound, where is the pipeline slow, what to change.

TensorFlow glue around the pure :mod:`tfdp_utils.data._input_report`: it checks the
arguments, walks the dataset's chain (:func:`tfdp_utils._tf.dataset_chain`, the one walker)
into stages, times four things on the model's own strategy and hands the figures over:

1. the input alone: the distributed iterator drained, no model;
2. each stage of the tf.data pipeline alone (up to that stage), to find the slow one;
3. the model alone: the compiled train function on one batch cached on the devices;
4. the two together: the same train function fed from the dataset, as ``fit`` runs it.

Each phase is a function of :mod:`tfdp_utils.data._diagnose_phases`; ``diagnose_input`` runs
them in order and builds the report from their results. Every variable the steps change
(weights, optimizer state, metrics) is read before and written back after, so the user's
model is as it was.
"""

from __future__ import annotations

import time
from typing import Any

from tfdp_utils import _tf
from tfdp_utils._tf import tf
from tfdp_utils.data._diagnose_checks import strategy_name
from tfdp_utils.data._diagnose_phases import (
    InputAlone,
    Run,
    StagesAlone,
    Together,
    checked,
    restore,
    snapshot,
    time_input,
    time_model,
    time_stages_alone,
    time_together,
    trace,
    train_function,
)
from tfdp_utils.data._input_figures import Figures, Rate
from tfdp_utils.data._input_report import InputDiagnosis, diagnose
from tfdp_utils.data._step_timing import Exhausted, cores

DEFAULT_STEPS = 20
"""Steps timed in each phase by default (after the warm-up)."""

DEFAULT_MAX_SECONDS = 10.0
"""Default budget in seconds for the timed phases (tracing the train step comes on top)."""


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
    run = checked(model, dataset, steps=steps, max_seconds=max_seconds)
    alone = time_input(run)  # 1. the input alone
    train = train_function(run, alone)
    saved = snapshot(model)
    try:
        trace(run, alone, train)
        stages = time_stages_alone(run, alone.global_batch)  # 2. each stage alone
        model_alone = time_model(run, train, alone.global_batch)  # 3. the model alone
        together = time_together(run, train, alone.global_batch)  # 4. the two together
    except Exhausted:
        raise ValueError(
            "dataset ended at once when iterated again: it gives its batches only once (e.g. "
            "a one-shot generator). Pass a dataset that can be iterated again."
        ) from None
    finally:
        restore(model, saved)
    return _report(run, alone, stages, model_alone, together, started=started)


# ----------------------------------------------------------------------- the report


def _describe_dataset(run: Run) -> str:
    """What the dataset is, in words."""
    builder = run.info is not None
    if builder and run.distributed:
        return "build_distributed_dataset (distributed)"
    if builder:
        return "build_distributed_dataset (tf.data.Dataset)"
    if run.distributed:
        return f"distributed dataset ({type(run.dataset).__name__})"
    return "tf.data.Dataset, distributed here as fit would"


def _report(
    run: Run,
    alone: InputAlone,
    stages: StagesAlone,
    model_alone: Rate,
    together: Together,
    *,
    started: float,
) -> InputDiagnosis:
    """The phases' figures, with the notes that qualify them, handed to the pure
    :func:`~tfdp_utils.data._input_report.diagnose` (``started``: when the diagnosis began)."""
    notes: list[str] = []
    if together.restarts:
        notes.append(
            f"the dataset ended {together.restarts} time(s) while training was timed and was "
            "started again (as the next epoch); its startup is in the figures"
        )
    if any(rate.steps < run.steps for rate in (alone.rate, model_alone, together.rate)):
        notes.append(
            f"max_seconds={run.max_seconds:g} cut a phase short of steps={run.steps} (the "
            "steps timed are listed); the figures are over fewer steps"
        )
    chain_names = [name for name, _ in _tf.dataset_chain(run.pipeline)]
    figures = Figures(
        input=alone.rate,
        model=model_alone,
        together=together.rate,
        stages=stages.stages,
        cores=cores(),
        builder=run.info is not None,
        prefetches="_PrefetchDataset" in chain_names[:3],
        cached_after=stages.cached_after,
        service=any("DataService" in name for name in chain_names),
    )
    return diagnose(
        figures,
        seconds=time.perf_counter() - started,
        global_batch_size=alone.global_batch,
        num_replicas_in_sync=int(run.strategy.num_replicas_in_sync),
        strategy=strategy_name(run.strategy),
        keras=f"{_tf.KERAS_FLAVOUR} {_tf.KERAS_VERSION}; TensorFlow {tf.__version__}",
        dataset=_describe_dataset(run),
        notes=notes,
    )


diagnose_input.__module__ = "tfdp_utils"  # public home (tfdp_utils._public)
