"""``diagnose_input``: is training input-bound, where is the pipeline slow, what to change.

TensorFlow glue around the pure :mod:`tfdp_utils.data._input_report`: it checks the
arguments, times the data-stalls study's differential runs on the model's own strategy (the
same compiled train step on one batch held on the devices, on the pipeline's batches held in
memory, and fed from the pipeline as ``fit`` runs it: :mod:`tfdp_utils.data._diagnose_phases`),
then, when the input is the limit, each stage of the tf.data pipeline alone on a thread with a
deadline, and hands the figures over. Every phase has a share of ``max_seconds``; every variable
the steps change (weights, optimizer state, metrics) is read before and written back after, so
the user's model is as it was.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from tfdp_utils import _tf
from tfdp_utils._tf import tf
from tfdp_utils.data._diagnose_checks import strategy_name
from tfdp_utils.data._diagnose_phases import (
    FIRST_BATCH_SHARE,
    InputAlone,
    Run,
    Together,
    TrainFunction,
    cached_dataset,
    checked,
    time_cached,
    time_held,
    time_input,
    time_together,
    trace,
    train_function,
)
from tfdp_utils.data._diagnose_state import restore, snapshot
from tfdp_utils.data._input_figures import Figures, Rate, Stage, input_bound
from tfdp_utils.data._input_report import InputDiagnosis, diagnose
from tfdp_utils.data._stage_timing import cached_after, chain, first_rank, time_stages, timed_cuts
from tfdp_utils.data._step_timing import Exhausted, Feed, Timed, cores

DEFAULT_STEPS = 20
"""Steps timed in each phase by default (after the warm-up)."""

DEFAULT_MAX_SECONDS = 10.0
"""Default budget in seconds for the whole call."""

HELD_SHARE = 0.15
"""Share of the time left after the trace for the model on one held batch."""

ROUNDS = ((0.15, 0.2), (0.2, 0.3), (0.3, 0.6))
"""Shares of the time left as each starts for the cached batches and the pipeline, in three
interleaved rounds (the faster of each kept: a load spike only slows a window)."""

STAGES_SHARE = 0.9
"""Share of the time left at the end for the stages alone (a margin kept for the report; the
phases before leave them :data:`~tfdp_utils.data._diagnose_phases.STAGES_RESERVE` of
``max_seconds`` at least)."""


def diagnose_input(
    model: Any,
    dataset: Any,
    *,
    steps: int = DEFAULT_STEPS,
    max_seconds: float = DEFAULT_MAX_SECONDS,
) -> InputDiagnosis:
    """Tell whether training is input-bound, which stage of the pipeline is slow, what to change.

    The differential method of the data-stalls study (Mohan et al., "Analyzing and Mitigating
    Data Stalls in DNN Training", VLDB 2021), on the model's own strategy
    (``model.distribute_strategy``) and with its own compiled train step, as ``fit`` calls it:
    the step on one batch held on the devices (no input cost: "model alone"); on the pipeline's
    first batches held in memory and fed through the distributed iterator (the iterator's cost
    only: "cached"); and fed from the pipeline (as ``fit`` runs it, a builder dataset through
    the one iterator ``fit`` keeps: "together"). The input is the limit when training on the
    cached batches is more than 1.1x faster than training fed from the pipeline (``factor``):
    like is compared with like, the same step measured the same way. Before them the pipeline
    alone is drained (no model); when the input is the limit, each stage of the ``tf.data``
    pipeline is timed alone to find the slow one. The advice comes from the pipeline's
    transformations and the figures, and only what applies to the strategy at hand (the
    distributed iterator is named only on several replicas; no tf.data service for Python
    stages, which cannot run on its workers, nor for first-epoch figures).

    The model is left as it was: every weight, optimizer variable (``iterations`` included)
    and metric variable is read before the first step and written back after the last, also
    when a step fails. A model that is not built yet is built first, as ``fit`` would (its
    weights then keep their fresh initial values).

    Bounded: the whole call takes at most about ``max_seconds`` (1.2x it at worst, whatever the
    source). The first batch may take 45 % of it, the pipeline alone has the first 25 %; the
    train step is traced once (``fit``'s first call, on the cached batches) and the phases
    after it share what is left (15 %, 25 %, 50 % of what remains as each starts, the stages
    the rest). A ``next()`` of the pipeline is waited for on a thread up to its deadline and
    left behind when late; no train step starts that the last one's duration says would end
    past the deadline. A phase times ``steps`` steps after a warm-up, longer while under 0.5 s
    (within its share), fewer when its share runs out: ``cut_short`` names those phases. A
    train step or a trace longer than the whole budget cannot be cut. On several workers, call
    it on every worker at the same time with the same arguments: the phases that step the
    strategy then run exactly ``steps`` steps (every worker must take part in each), and
    ``max_seconds`` bounds only the local timing of the pipeline.

    A ``cache()`` in the pipeline is being filled while it is timed: the figures are then
    first-epoch figures, and the report says so (``first_epoch``). A pipeline that ends before
    the phases do is started again, as ``fit``'s next epoch would.

    Args:
        model: a compiled Keras model (Keras 3 or tf_keras), built and compiled under the
            strategy that trains (or none).
        dataset: a batched ``tf.data.Dataset`` (as given to ``fit``; distributed here as
            ``fit`` would), or a distributed dataset from
            :func:`~tfdp_utils.build_distributed_dataset` (or
            ``strategy.experimental_distribute_dataset``) made with the model's strategy.
        steps: steps to time in each phase. Defaults to `20`.
        max_seconds: the time budget of the whole call, in seconds. Defaults to `10.0`.

    Returns:
        An :class:`~tfdp_utils.InputDiagnosis`; ``print(report.summary())`` for a bug report.
        ``input_bound`` is None when no batch came within the budget.

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
    run = checked(model, dataset, steps=steps, max_seconds=max_seconds, started=started)
    alone = _first_phase(run)  # 1. the input alone
    if not alone.batches:
        return _report(run, _Phases(alone))
    train = train_function(run, alone)
    saved = snapshot(model)
    try:
        feed = trace(run, train, alone, cached_dataset(run, alone))
        held = time_held(run, train, alone, HELD_SHARE)  # 2. no input cost
        cached, together = _interleaved(run, train, alone, feed)  # 3. and 4.
    except Exhausted:
        raise _once_only() from None
    finally:
        restore(model, saved)
    return _report(run, _Phases(alone, held, cached, together))


def _first_phase(run: Run) -> InputAlone:
    try:
        return time_input(run)
    except Exhausted:
        raise ValueError(
            "dataset gave no batch: it is empty (a filter that drops everything, an empty "
            "file, a take(0)). Pass the dataset you train on."
        ) from None


def _once_only() -> ValueError:
    return ValueError(
        "dataset ended at once when iterated again: it gives its batches only once (e.g. "
        "a one-shot generator). Pass a dataset that can be iterated again."
    )


def _seconds_per_step(rate: Rate | None) -> float:
    return 0.0 if rate is None or not rate.steps else rate.seconds / rate.steps


def _faster(first: Timed | None, second: Timed) -> Timed:
    """The faster of two windows of one phase, the slowest of all kept (cut short if both
    were)."""
    if first is None:
        return second
    rates = [r for r in (first.rate, second.rate, first.slowest) if r is not None]
    rate = max(rates, key=lambda r: r.examples_per_sec, default=None)
    slowest = min(rates, key=lambda r: r.examples_per_sec, default=None)
    return Timed(rate, first.cut and second.cut, slowest)


def _interleaved(
    run: Run, train: TrainFunction, alone: InputAlone, feed: Feed
) -> tuple[Timed, Together]:
    """Phases 3 (the cached batches: the iterator's cost only) and 4 (the pipeline, as fit
    runs it) in interleaved rounds, the faster window of each kept."""
    cached: Timed | None = None
    together: Together | None = None
    for cached_share, together_share in ROUNDS if not run.fixed else ROUNDS[:1]:
        cached = _faster(cached, time_cached(run, train, alone, feed, cached_share))
        expected = _seconds_per_step(cached.rate) + (alone.first_seconds or 0.0)
        this = time_together(run, train, alone, expected, together_share)
        best = _faster(None if together is None else together.timed, this.timed)
        restarts = this.restarts + (0 if together is None else together.restarts)
        together = Together(best, restarts)
    feed.close()
    assert cached is not None and together is not None  # ROUNDS is not empty
    return cached, together


@dataclasses.dataclass(frozen=True)
class _Phases:
    """The timed phases' results (the later ones None when no batch came)."""

    alone: InputAlone
    held: Timed | None = None
    cached: Timed | None = None
    together: Together | None = None


# ----------------------------------------------------------------------- the stages


def _stages(run: Run, rates: dict[int, float | None] | None) -> tuple[Stage, ...]:
    return tuple(
        Stage(s.name, s.kind, s.parallel, s.python, s.files, None if rates is None else rates[i])
        for i, (s, _) in enumerate(chain(run.pipeline))
    )


def _time_stages(run: Run, global_batch: int) -> tuple[tuple[Stage, ...], bool]:
    """Each stage of the pipeline alone (up to that stage), on a thread given the time left:
    the stages, with the rates of those timed, and whether the budget cut it short. Only the
    pipeline's own copies are iterated there, so a late one is safely left behind (not a
    daemon: the interpreter's exit waits for its window to end rather than stop it inside
    TensorFlow)."""
    stages = chain(run.pipeline)
    seconds = STAGES_SHARE * max(0.0, run.end - time.perf_counter())
    rates: dict[int, float | None] = {}
    done, stop = threading.Event(), threading.Event()

    def work() -> None:
        cuts = timed_cuts(stages, first_rank(run.pipeline.element_spec))
        time_stages(
            stages,
            cuts,
            run.pipeline.options(),
            chunk=max(1, global_batch),
            limit=4 * run.steps * global_batch,
            seconds=0.8 * seconds,
            into=rates,
            stop=stop,
        )
        done.set()

    thread = threading.Thread(target=work, name="tfdp-diagnose-stages")
    thread.start()
    thread.join(None if run.fixed else seconds)
    stop.set()  # a stage still running ends its window; no other starts
    timed = {i: rates.get(i) for i in range(len(stages))}  # a copy: the thread may go on
    return _stages(run, timed), not done.is_set()


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


def _notes(run: Run, phases: _Phases) -> list[str]:
    notes: list[str] = []
    if phases.together is not None and phases.together.restarts:
        notes.append(
            f"the dataset ended {phases.together.restarts} time(s) while it was timed and was "
            "started again (as fit's next epoch); its startup is in the figures"
        )
    if phases.alone.timed.rate is None and phases.alone.batches:
        notes.append("the input alone is the first batch's figure (the pipeline's start in it)")
    if phases.alone.first_seconds is None and not run.fixed:
        notes.append(
            f"the first batch did not come within {FIRST_BATCH_SHARE * run.max_seconds:.1f} s "
            f"({FIRST_BATCH_SHARE:.0%} of max_seconds={run.max_seconds:g}; the rest is kept for "
            "the model's trace and the timed phases)"
        )
    return notes


def _rate(timed: Timed | None) -> Rate | None:
    return None if timed is None else timed.rate


def _report(run: Run, phases: _Phases) -> InputDiagnosis:
    """The phases' figures, with the notes that qualify them, handed to the pure
    :func:`~tfdp_utils.data._input_report.diagnose`."""
    alone = phases.alone
    together = None if phases.together is None else phases.together.timed
    chain_names = [name for name, _ in _tf.dataset_chain(run.pipeline)]
    cut = [
        name
        for name, clock in (
            ("input", alone.timed),
            ("model", phases.held),
            ("cached", phases.cached),
            ("together", together),
        )
        if clock is not None and clock.cut
    ]
    if not alone.batches:  # no first batch within its share: the later phases never started
        cut += ["model", "cached", "together"]
    stage_list = chain(run.pipeline)
    caches = cached_after(stage_list)
    restarts = 0 if phases.together is None else phases.together.restarts
    figures = Figures(
        input=alone.rate,
        model=_rate(phases.held),
        together=_rate(together),
        cached=_rate(phases.cached),
        stages=_stages(run, None),
        cores=cores(),
        builder=run.info is not None,
        prefetches="_PrefetchDataset" in chain_names[:3],
        cached_after=caches,
        service=any("DataService" in name for name in chain_names),
        replicas=int(run.strategy.num_replicas_in_sync),
        first_epoch=bool(caches) and restarts == 0,
        cached_slowest=None if phases.cached is None else phases.cached.slowest,
    )
    if alone.batches and input_bound(figures) is not False:
        stages, stages_cut = _time_stages(run, alone.global_batch)
        figures = dataclasses.replace(figures, stages=stages)
        cut += ["stages"] if stages_cut else []
    return diagnose(
        figures,
        seconds=time.perf_counter() - run.started,
        global_batch_size=alone.global_batch,
        num_replicas_in_sync=int(run.strategy.num_replicas_in_sync),
        strategy=strategy_name(run.strategy),
        keras=f"{_tf.KERAS_FLAVOUR} {_tf.KERAS_VERSION}; TensorFlow {tf.__version__}",
        dataset=_describe_dataset(run),
        notes=_notes(run, phases),
        cut_short=cut,
    )


diagnose_input.__module__ = "tfdp_utils"  # public home (tfdp_utils._public)
