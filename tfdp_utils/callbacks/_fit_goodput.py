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
from collections.abc import Collection, Iterable
from typing import Any, Protocol, runtime_checkable

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


@runtime_checkable
class SaveTimer(Protocol):
    """A callback of the same ``fit`` call that saves checkpoints between steps and times its
    saves (``PreemptionCheckpoint``)."""

    def fit_save_spans(self) -> tuple[tuple[float, float], ...]:
        """When the fit's saves between its steps ran (``time.perf_counter()`` readings)."""


def save_timers(callbacks: Any) -> tuple[SaveTimer, ...]:
    """The :class:`SaveTimer` callbacks among a ``fit`` call's ``callbacks`` argument."""
    if not isinstance(callbacks, Iterable) or isinstance(callbacks, (str, bytes)):
        return ()
    return tuple(c for c in callbacks if isinstance(c, SaveTimer))


def fit_ledger(
    fit: FitState, final_step: int, *, epoch_start: str, save_seconds: float = 0.0
) -> FitLedger:
    """This fit's ledger, at train end (``epoch_start``: the clock's epoch-boundary pause;
    ``save_seconds``: the checkpoint saves between its steps)."""
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
        first_step=fit.first_step,
        last_step=final_step,
        step_seconds=max(0.0, fit.clock.now() - fit.clock_origin),
        epoch_start_seconds=tuple(fit.epoch_starts),
        validation_seconds=fit.validation_seconds,
        input_wait_seconds=waited,
        after_last_step_seconds=after,
        worker=fit.placement.position.index,
        checkpoint_save_seconds=save_seconds,
    )


def earlier_ledgers(log_dir: str, since: float, *, own: Collection[str] = ()) -> list[FitLedger]:
    """The ledgers of the fits logged into ``log_dir``'s global run before ``since`` (a
    stand-in for a fit killed without one). Local directories only: none for a URL.
    ``own``: the event files this fit writes (it has no ledger yet), left unread."""
    folder = os.path.join(log_dir, GLOBAL_RUN)
    if "://" in log_dir or not os.path.isdir(folder):
        return []
    try:
        run = read_runs(folder, exclude=own).get(".")
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
    fit: FitState,
    final_step: int,
    events: FitEvents,
    log_dir: str,
    *,
    epoch_start: str,
    timers: Iterable[SaveTimer] = (),
) -> dict[str, Any] | None:
    """Write the fit's ledger and the job's goodput (chief only); the goodput, or None.

    ``timers``: the same ``fit`` call's callbacks that time their checkpoint saves.
    """
    if not fit.placement.position.is_chief:
        return None
    # The saves' parts while the step clock ran: one at an epoch's end (the clock held for
    # the boundary) or after the last step is in epoch_starts or after_last_step already.
    spans = sorted(span for timer in timers for span in timer.fit_save_spans())
    saves = fit.clock.running_within(spans)
    ledger = fit_ledger(fit, final_step, epoch_start=epoch_start, save_seconds=saves)
    own = events.writers.files(GLOBAL_RUN)
    job = job_goodput([*earlier_ledgers(log_dir, fit.wall_begin, own=own), ledger])
    writers = events.writers
    writers.text(GLOBAL_RUN, tags.GOODPUT_LEDGER, ledger.to_json(), final_step, LEDGER_DESCRIPTION)
    with writers.batch():
        events.put(GLOBAL_RUN, tags.GOODPUT, job.goodput, final_step)
        for loss in job.losses:
            events.put(GLOBAL_RUN, tags.GOODPUT_LOSS_PREFIX + loss.name, loss.seconds, final_step)
    return job.as_dict()
