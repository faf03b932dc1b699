"""Where a fit's time went (its ledger) and the job's goodput, written at train end.

The chief writes its fit's :class:`~tfdp_utils.throughput._goodput.FitLedger` as a text into
the ``global`` run, reads the ledgers the job's earlier fits wrote there (a job resumed after a
preemption is one job), and writes the job's goodput and its losses as scalars at the fit's
last step: ``tfdp-utils report LOGDIR`` itemises them.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from tfdp_utils.callbacks._fit_events import FitEvents
from tfdp_utils.callbacks._fit_state import FitState
from tfdp_utils.throughput import _tags as tags
from tfdp_utils.throughput._events import read_runs
from tfdp_utils.throughput._goodput import (
    FitLedger,
    job_goodput,
    ledgers_of,
    process_start_time,
)
from tfdp_utils.throughput._tags import GLOBAL_RUN

logger = logging.getLogger("tfdp_utils")

PROCESS_START = process_start_time()
"""When this process started (None off Linux): its import of TensorFlow counts as start-up."""

LEDGER_DESCRIPTION = (
    "Where this fit's time went, measured by the chief (JSON): its start and end, the process "
    "start, the steps' time, each epoch's start, validation, input waits, the time after the "
    "last step. tfdp-utils report LOGDIR adds up every fit's into the job's goodput."
)


def fit_ledger(fit: FitState, final_step: int, *, epoch_start: str) -> FitLedger:
    """This fit's ledger, at train end (``epoch_start``: the clock's epoch-boundary pause)."""
    now = time.time()
    after = 0.0
    if fit.clock.held(epoch_start):  # the last step's end began the boundary still held
        after = max(0.0, fit.clock.stopped_for() - fit.validation_in_boundary)
    meter = fit.input_wait
    waited = None if meter is None or fit.input_wait_note is not None else meter.total_seconds
    return FitLedger(
        fit_begin=fit.wall_begin,
        train_begin=fit.train_begin,
        fit_end=now,
        process_start=PROCESS_START,
        first_step=fit.counter.origin,
        last_step=final_step,
        step_seconds=max(0.0, fit.clock.now() - fit.clock_origin),
        epoch_start_seconds=tuple(fit.epoch_starts),
        validation_seconds=fit.validation_seconds,
        input_wait_seconds=waited,
        after_last_step_seconds=after,
        worker=fit.placement.position.index,
    )


def earlier_ledgers(log_dir: str, since: float) -> list[FitLedger]:
    """The ledgers of the fits logged into ``log_dir``'s global run before ``since`` (a
    stand-in for a fit killed without one). Local directories only: none for a URL."""
    folder = os.path.join(log_dir, GLOBAL_RUN)
    if "://" in log_dir or not os.path.isdir(folder):
        return []
    try:
        run = read_runs(folder).get(".")
    except Exception as error:  # a damaged earlier file must not fail this fit's end
        logger.warning(
            "tfdp_utils: the job's earlier fits in %s could not be read (%s): the goodput "
            "written now covers this fit only",
            folder,
            error,
        )
        return []
    if run is None or not len(run.fits) == len(run.ledgers) == len(run.fit_walls):
        return []
    found = ledgers_of(run.fits, run.ledgers, run.fit_walls)
    return [
        ledger for ledger, (first, _) in zip(found, run.fit_walls, strict=True) if first < since
    ]


def write_goodput(
    fit: FitState, final_step: int, events: FitEvents, log_dir: str, *, epoch_start: str
) -> dict[str, Any] | None:
    """Write the fit's ledger and the job's goodput (chief only); the goodput, or None."""
    if not fit.placement.position.is_chief:
        return None
    ledger = fit_ledger(fit, final_step, epoch_start=epoch_start)
    job = job_goodput([*earlier_ledgers(log_dir, fit.wall_begin), ledger])
    writers = events.writers
    writers.text(GLOBAL_RUN, tags.GOODPUT_LEDGER, ledger.to_json(), final_step, LEDGER_DESCRIPTION)
    events.put(GLOBAL_RUN, tags.GOODPUT, job.goodput, final_step)
    for loss in job.losses:
        events.put(GLOBAL_RUN, tags.GOODPUT_LOSS_PREFIX + loss.name, loss.seconds, final_step)
    return job.as_dict()
