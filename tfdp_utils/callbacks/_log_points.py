"""What ``ThroughputLogger`` does at a log point and at the end of a ``fit``, given the step read.

The counter advances to the step, the meter closes a window, the input clock gives the window's
share of waiting, and with several workers one gather brings every worker's rate and share
(all workers take the same log points, so the collectives match); then the events are written
(:mod:`tfdp_utils.callbacks._fit_events`). The hooks decide when; these functions do the rest.
"""

from __future__ import annotations

import math

from tfdp_utils._tf import tf
from tfdp_utils.callbacks._fit_events import FitEvents
from tfdp_utils.callbacks._fit_state import FitState
from tfdp_utils.throughput._meter import ThroughputWindow


def log_point(fit: FitState, step: int, estimate: int, events: FitEvents) -> None:
    """Measure at ``step`` (read at the log point the host-side ``estimate`` reached)."""
    now = fit.clock.now()
    fit.counter.count_to(step)
    was_warm = fit.meter.warmed_up
    window = fit.meter.update(step=step, time=now, replica_examples=fit.counter.counts)
    share = _window_wait(fit, window if was_warm else None)
    # From the host-side estimate, not the read step, so every worker takes the same
    # log points (their collectives must match).
    fit.next_log = estimate + fit.log_every_n_steps
    if not was_warm:
        events.counts(fit, step)
        return
    rates = _gather_workers(fit, window.steps_per_sec if window else math.nan, share)
    if window is None:
        return
    fit.last_window = window
    events.window(fit, window, rates, share)


def final_point(fit: FitState, final: int, events: FitEvents) -> None:
    """Write the fit's last point: its exact counts, and the rate of the last (partial)
    window after warm-up, so TensorBoard ends on the same total as ``summary()``.

    Every worker takes the same branch (the final step and the last written step are the
    same on all of them), so the worker-rate collective matches.
    """
    now = fit.clock.now()
    fit.counter.count_to(final)
    if final <= fit.written_step:
        return
    if not fit.meter.warmed_up:
        events.counts(fit, final)
        return
    window = fit.meter.update(step=final, time=now, replica_examples=fit.counter.counts)
    share = _window_wait(fit, window)
    rates = _gather_workers(fit, window.steps_per_sec if window else math.nan, share)
    if window is None:
        events.counts(fit, final)
        return
    fit.last_window = window
    events.window(fit, window, rates, share)


def _window_wait(fit: FitState, window: ThroughputWindow | None) -> float:
    """The input-wait share of ``window`` (NaN when unknown); None starts a new window."""
    meter = fit.input_wait
    if meter is None:
        return math.nan
    if window is None:
        meter.mark()
        return math.nan
    return meter.window(window.seconds)


def _gather_workers(
    fit: FitState, local_rate: float, local_wait: float
) -> list[tuple[float, float]] | None:
    """Every worker's (steps/s, input-wait share) of this window, by worker index.

    One gather at a log point (all workers take the same log points); None with one worker.
    """
    position = fit.placement.position
    if not position.is_multi_worker:
        return None
    strategy = fit.placement.strategy
    value = strategy.experimental_distribute_values_from_function(
        lambda _ctx: tf.constant([[local_rate, local_wait]], tf.float64)
    )
    gathered = strategy.gather(value, axis=0).numpy().tolist()
    per_worker = len(gathered) // max(1, position.num_workers)
    found = [gathered[w * per_worker] for w in range(position.num_workers)]
    return [(float(rate), float(wait)) for rate, wait in found]
