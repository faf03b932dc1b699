"""The save and notice path: a checkpoint of the run's position, and the stop after a notice.

A save writes the position (:mod:`._position`) and the variables: every worker takes part, the
chief's copy is kept (:mod:`._store`). With several workers a notice becomes a request every
worker acts on at the same step (:mod:`._agreement`); after the stop's save they wait for each
other's part, bounded by the grace period, and ``fit`` ends (exit status 75, or returns).

TensorFlow glue: the running Keras is read from :mod:`tfdp_utils._tf`, the variables are written
by the run's ``tf.train.Checkpoint``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import NoReturn

from tfdp_utils import _tf
from tfdp_utils.cluster import _coordination as coordination
from tfdp_utils.compat import _fit_binding as fit_binding
from tfdp_utils.preemption import _agreement as agreement
from tfdp_utils.preemption import _elastic as elastic
from tfdp_utils.preemption import _position as position
from tfdp_utils.preemption import _signals as signals_
from tfdp_utils.preemption import _store as store
from tfdp_utils.preemption._run import Run

logger = logging.getLogger("tfdp_utils")

KERAS = _tf.KERAS_VERSION if _tf.IS_KERAS3 else "tf_keras"
"""The running Keras as a checkpoint records it (and a resume checks it)."""


def save(run: Run, *, keep: int, reason: str) -> str:
    """Save the run's position and variables; the checkpoint's folder (on a worker other than
    the chief: the folder the chief's copy goes to)."""
    state = position.record(
        epoch=run.epoch,
        step=run.done,
        steps_per_epoch=run.steps_per_epoch,
        seed=run.seed,
        facts=run.facts,
        model=run.model,
        optimizer=run.optimizer,
        keras=KERAS,
        reason=reason,
        saved_at=time.time(),
    )
    rest = run.rest_record()
    if rest is not None:
        state[elastic.REST_KEY] = rest
    checkpoint = run.checkpoint
    if run.worker != 0:
        # Every worker takes part in writing (reading synchronised values is collective);
        # only the chief's copy is kept.
        store.scratch_save(run.directory, run.worker, lambda prefix: checkpoint.write(prefix))
        return os.path.join(run.directory, store.folder_name(run.global_step))
    saved = store.save(
        run.directory,
        run.global_step,
        state,
        lambda prefix: checkpoint.write(prefix),
        keep=keep,
    )
    return saved.path


def stop_reason(notice: signals_.Notice, request: agreement.Request | None) -> str:
    """Why the run stops, as a checkpoint records it: this worker's notice, or the agreed one."""
    if request is None:
        return f"notice {notice.signal_name}"
    return f"notice {request.reason} on worker {request.worker}"


def end(
    run: Run,
    notice: signals_.Notice,
    *,
    reason: str,
    saved: str | None,
    exit: bool,
    grace_seconds: float,
    started: float,
) -> NoReturn:
    """End the run after a notice: wait for the other workers' part of the save (bounded by
    ``grace_seconds``), say where it stopped, and end ``fit`` (the process exits with status 75
    when ``exit``).

    Args:
        run: the run.
        notice: the notice, of this worker or of another.
        reason: why (:func:`stop_reason`).
        saved: the checkpoint saved at the stop, or None (nothing trained since the last).
        exit: whether the process exits after ``fit``.
        grace_seconds: the bound of the wait for the other workers.
        started: ``time.monotonic()`` when the stop began.
    """
    if run.channel is not None:
        # The others may still be writing: wait for every worker's part, bounded.
        agreement.barrier(
            coordination.CoordinationStore(),
            f"tfdp/preemption/{run.serial}/saved/{run.global_step}",
            worker=run.worker,
            num_workers=run.num_workers,
            timeout=grace_seconds,
        )
    run.close()
    received = notice.received_at or started
    logger.warning(
        "tfdp_utils: PreemptionCheckpoint: %s; %s at epoch %d, step %d of %d "
        "(%.1f s after the notice). %s",
        reason,
        f"saved {saved}" if saved is not None else "nothing trained since the last save",
        run.epoch + 1,
        run.done,
        run.steps_per_epoch,
        time.monotonic() - received,
        f"Exiting with status {signals_.PREEMPTED_EXIT_STATUS}: run the same command to resume."
        if exit
        else "Training ends here (exit=False).",
    )
    raise fit_binding.StopFit(
        "stopped by a preemption notice",
        exit_status=signals_.PREEMPTED_EXIT_STATUS if exit else None,
        batches=run.global_step,
    )


def open_channel(run: Run, grace_seconds: float) -> agreement.CoordinationChannel:
    """The channel through which the run's workers agree on the step to stop at."""
    return agreement.CoordinationChannel(
        coordination.CoordinationStore(),
        f"tfdp/preemption/{run.serial}",
        worker=run.worker,
        num_workers=run.num_workers,
        ack_timeout=grace_seconds,
        exists_error=_tf.tf.errors.AlreadyExistsError,
    )


def requests_due(
    run: Run, channel: agreement.CoordinationChannel, whole: bool
) -> Iterator[agreement.Request]:
    """The agreed requests to act on at this step, in order, each counted as acted on when
    given. A stop waits for a step where no gradients are pending (``whole``): the same step
    on every worker, as the accumulators fill in step."""
    for request in channel.received()[run.acted :]:
        if request.call > run.global_step:
            break
        if request.action == "stop" and not whole:
            break
        run.acted += 1
        yield request


def ask_to_stop(run: Run, channel: agreement.CoordinationChannel, notice: signals_.Notice) -> None:
    """Ask every worker to stop after this step (once per run: marked as asked)."""
    run.asked = True
    agreed = channel.propose("stop", after_call=run.global_step, reason=str(notice.signal_name))
    if agreed.action == agreement.CLOSED:  # the fit ended on another worker: no step is left
        logger.warning(
            "tfdp_utils: PreemptionCheckpoint: %s on worker %d after the fit ended on worker "
            "%d; no stop to agree on.",
            notice.signal_name,
            run.worker,
            agreed.worker,
        )
        return
    logger.warning(
        "tfdp_utils: PreemptionCheckpoint: %s on worker %d; every worker stops after step %d.",
        notice.signal_name,
        run.worker,
        agreed.call,
    )


def say_exit_outside_fit(signal_name: str) -> None:
    """A notice before or after ``fit``: nothing to save, and the job must still be run again."""
    logger.warning(
        "tfdp_utils: PreemptionCheckpoint: %s outside fit: nothing trained since the last "
        "checkpoint. Exiting with status %d: run the same command to resume.",
        signal_name,
        signals_.PREEMPTED_EXIT_STATUS,
    )
