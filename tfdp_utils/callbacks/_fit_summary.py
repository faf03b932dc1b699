"""The figures of one ``fit`` as plain values: ``ThroughputLogger.summary()`` and the epoch logs.

Built from the :class:`~tfdp_utils.callbacks._fit_state.FitState` the logger measured with, at
the end of each epoch (the global rates Keras' epoch ``logs`` get) and at train end (the dict
:meth:`~tfdp_utils.callbacks.ThroughputLogger.summary` returns). Reads no device.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

from tfdp_utils.callbacks._fit_state import FitState
from tfdp_utils.throughput._input_wait import straggler, verdict

EXAMPLES_PER_SEC_KEY = "examples_per_sec"
STEPS_PER_SEC_KEY = "steps_per_sec"


def epoch_figures(fit: FitState, step: int) -> dict[str, float]:
    """The epoch's global rates from the end of its first step to the end of its last."""
    if fit.epoch_mark is None:
        return {}
    started, from_step, from_examples = fit.epoch_mark
    # The clock stopped at the epoch's last step (the boundary started there).
    seconds = fit.clock.now() - started
    steps = step - from_step
    if steps <= 0 or seconds <= 0:
        return {}
    examples = sum(fit.counter.counts) - from_examples
    return {EXAMPLES_PER_SEC_KEY: examples / seconds, STEPS_PER_SEC_KEY: steps / seconds}


def build_summary(fit: FitState, final_step: int, *, log_dir: str) -> dict[str, Any]:
    """What ``summary()`` returns for the fit that ended at ``final_step``."""
    position = fit.placement.position
    result = fit.meter.summary()
    result["examples"] = sum(fit.counter.counts)
    result["replica_examples"] = list(fit.counter.counts)
    result.update(
        step=final_step,
        steps_trained=final_step - fit.counter.origin,
        log_every_n_steps=fit.log_every_n_steps,
        warmup_steps=fit.warmup_steps,
        accumulation_steps=fit.accumulation_steps,
        epoch_start_seconds=list(fit.epoch_starts),
        num_replicas=fit.placement.num_replicas,
        num_workers=position.num_workers,
        worker=position.index,
        is_chief=position.is_chief,
        local_replicas=list(position.local_replicas),
        count_source=fit.counter.source,
        exact=fit.exact,
        derived_reason=fit.derived_reason,
        log_dir=log_dir,
        shape_change=fit.shape_change,
    )
    last = fit.last_window
    if last is not None:
        result["last_window"] = {
            "step": last.step,
            "steps": last.steps,
            "seconds": last.seconds,
            "examples_per_sec": last.examples_per_sec,
            "steps_per_sec": last.steps_per_sec,
        }
    if "steps_per_sec" in result and fit.accumulation_steps > 1:
        result["updates_per_sec"] = result["steps_per_sec"] / fit.accumulation_steps
    if fit.last_spread is not None:
        low, high, skew = fit.last_spread
        result["worker_steps_per_sec"] = {"min": low, "max": high, "skew": skew}
    if fit.peak_memory:
        result["peak_memory_bytes"] = {str(k): v for k, v in fit.peak_memory.items()}
    result.update(input_wait_summary(fit))
    return result


def input_wait_summary(fit: FitState) -> dict[str, Any]:
    """The input-wait share, each worker's, the straggler and the verdict (or why unknown)."""
    meter = fit.input_wait
    share = None if meter is None else meter.share
    result: dict[str, Any] = {"input_wait_share": share}
    if meter is not None and fit.input_wait_note is not None:  # timing stopped in the fit
        result.update(
            input_wait_share=None,
            input_wait_note=fit.input_wait_note,
            input_wait_verdict=verdict({}, unknown=fit.input_wait_note),
        )
        return result
    if meter is None:
        result["input_wait_note"] = fit.input_wait_note
    elif share is None:
        result["input_wait_note"] = "no window was measured after warm-up"
    if fit.worker_wait:
        shares = {
            w: statistics.fmean(v) if all(x == x for x in v) else math.nan
            for w, v in sorted(fit.worker_wait.items())
        }
        result["worker_input_wait_share"] = [None if s != s else s for s in shares.values()]
        named = straggler(shares)
        result["straggler"] = None if named is None else dataclasses.asdict(named)
        result["input_wait_verdict"] = verdict(shares, unknown=fit.input_wait_note)
    elif share is not None:
        result["input_wait_verdict"] = verdict({fit.placement.position.index: share})
    elif fit.input_wait_note is not None:
        result["input_wait_verdict"] = verdict({}, unknown=fit.input_wait_note)
    return result
