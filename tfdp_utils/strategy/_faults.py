"""Bounded collectives: a watchdog that ends a multi-worker step stuck waiting for a peer.

TensorFlow 2.21 already notices a peer *process* that dies: its socket resets at once, and
the coordination service stops hearing heartbeats from a frozen or lost task within seconds;
either way the survivors' collectives fail with ``tf.errors.UnavailableError``. What it does
not notice is a peer that is alive but never joins the next collective (stuck reading data,
deadlocked in Python, a different number of steps per worker, a long save on one task): the
survivors wait forever.

TensorFlow's own bound, ``CommunicationOptions(timeout_seconds=...)``, starts one sleeping
thread per collective for the whole timeout (its docstring says "debugging only"); measured
here (``benchmarks/scale_out.py``), 600 steps of a small model with a 300 s timeout left
about 2,500 threads alive on Keras 3 (4,900 on tf_keras) and ran at 0.66-0.68x the step rate
of an unbounded job. So :func:`tfdp_utils.auto_strategy` bounds collectives with
:class:`CollectiveWatchdog` instead: one thread that samples the training thread once a
second, and when that thread has sat inside one TensorFlow call for ``collective_timeout``
seconds, aborts the process's collectives (as TensorFlow's own health check does) with a
message naming the bound and how to change it. ``model.fit`` then raises
``tf.errors.DeadlineExceededError`` carrying that message.

The same thread publishes this worker's phase (reading input, inside step k, in a callback,
saving) through the coordination service when it lasts an interval, and the message starts
with a diagnosis that names the workers that did not reach the step (see
:mod:`tfdp_utils.strategy._stuck`).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

from tfdp_utils import _variables
from tfdp_utils._validate import is_off_word
from tfdp_utils._waiting import WaitProgress
from tfdp_utils.strategy._stuck import PhaseTracker

logger = logging.getLogger("tfdp_utils")

DEFAULT_COLLECTIVE_TIMEOUT = 600.0
"""Seconds one multi-worker call may wait before the watchdog aborts collectives."""

COLLECTIVE_TIMEOUT_VARIABLE = _variables.COLLECTIVE_TIMEOUT
"""Environment variable that replaces :data:`DEFAULT_COLLECTIVE_TIMEOUT`; ``0`` turns it off."""

_RUNNING: weakref.WeakSet[CollectiveWatchdog] = weakref.WeakSet()


@atexit.register
def stop_watchdogs() -> None:
    """Stop every running watchdog (at exit: before finalization, and before the exit
    barrier, so that no helper thread uses the coordination service while the workers leave).
    """
    # A watchdog holds the training thread's frame while that thread is inside a TensorFlow
    # call; dropping it frees the frame's locals (dataset iterators among them). Done by a
    # daemon thread once the interpreter is finalizing, that free aborts the process in
    # TensorFlow's C++ destructors ("FATAL: exception not rethrown"), so every watchdog stops
    # here, before finalization (stopping one that has ended already costs nothing).
    for watchdog in list(_RUNNING):
        watchdog.stop()


def _explain_uncaught(error: BaseException) -> str | None:
    for watchdog in list(_RUNNING):
        line = watchdog.explain(error)
        if line:
            return line
    return None


def resolve_collective_timeout(
    value: float | None, environ: dict[str, str] | None = None
) -> float | None:
    """The collective bound in force: the argument, or ``TFDP_COLLECTIVE_TIMEOUT`` for the default.

    Args:
        value: seconds, :data:`DEFAULT_COLLECTIVE_TIMEOUT`, or None / 0 for no bound.
        environ: variables to read instead of ``os.environ``. Defaults to `None`.

    Returns:
        Seconds, or None when collectives are unbounded.

    Raises:
        ValueError: a negative or non-numeric bound, naming where it came from.
    """
    environ = dict(os.environ) if environ is None else environ
    source = "collective_timeout"
    if value == DEFAULT_COLLECTIVE_TIMEOUT and environ.get(COLLECTIVE_TIMEOUT_VARIABLE, "").strip():
        text = environ[COLLECTIVE_TIMEOUT_VARIABLE].strip()
        source = COLLECTIVE_TIMEOUT_VARIABLE
        if is_off_word(text):
            return None
        try:
            value = float(text)
        except ValueError:
            raise ValueError(
                f"{COLLECTIVE_TIMEOUT_VARIABLE}={text!r} is not a number of seconds; set it to "
                f"e.g. {DEFAULT_COLLECTIVE_TIMEOUT:g}, or 0 to wait without a bound."
            ) from None
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            f"{source}={value!r} must be a positive number of seconds, or 0 / None to wait "
            "without a bound."
        )
    return float(value)


def timeout_message(timeout: float, waited: float, where: str) -> str:
    """The error text for a collective that waited past the bound."""
    return (
        f"tfdp_utils: this worker waited {waited:.0f} s inside one TensorFlow call ({where}) "
        f"with collective_timeout={timeout:g} s, so its collectives were aborted: a peer worker "
        "is stuck or gone (check the other tasks' logs). Restart every task to recover (with "
        "BackupAndRestore, training resumes). If a step, the first trace or a save really "
        "takes that long, raise the bound with auto_strategy(collective_timeout=SECONDS) or "
        f"{COLLECTIVE_TIMEOUT_VARIABLE}=SECONDS (0 turns it off)."
    )


def _tensorflow_dir() -> str:
    from tfdp_utils._tf import tf

    return str(os.path.dirname(os.path.abspath(tf.__file__))) + os.sep


def _abort_collectives(message: str) -> None:
    from tfdp_utils import _tf

    errors = _tf.framework_errors()
    _tf.eager_context().context().abort_collective_ops(errors.DEADLINE_EXCEEDED, message)


class CollectiveWatchdog:
    """Aborts collectives when one thread stays in a single TensorFlow call for too long.

    Args:
        timeout: seconds one call may last.
        thread_id: the ``threading.get_ident()`` of the training thread. Defaults to `None`
            (the calling thread).
        interval: seconds between samples. Defaults to `None` (``min(1, timeout / 10)``).
        abort: called with the message when the bound passes. Defaults to `None` (abort the
            process's collective ops).
        in_call: tells whether a frame is inside a blocking TensorFlow call. Defaults to
            `None` (the innermost frame's file lies in the installed ``tensorflow`` package).
        phases: publishes this worker's phase and reads the others' for the diagnosis (see
            :mod:`tfdp_utils.strategy._stuck`); made with ``in_call`` as its test. Defaults to
            `None` (no phases: the message names no worker).

    Examples:
        >>> watchdog = CollectiveWatchdog(600.0).start()  # doctest: +SKIP
        >>> watchdog.stop()  # doctest: +SKIP
    """

    def __init__(
        self,
        timeout: float,
        *,
        thread_id: int | None = None,
        interval: float | None = None,
        abort: Callable[[str], None] | None = None,
        in_call: Callable[[FrameType], bool] | None = None,
        phases: Callable[[Callable[[FrameType], bool]], PhaseTracker] | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout={timeout!r} must be a positive number of seconds.")
        self.timeout = float(timeout)
        self.thread_id = threading.get_ident() if thread_id is None else thread_id
        self.interval = min(1.0, self.timeout / 10) if interval is None else interval
        self._abort = abort or _abort_collectives
        if in_call is None:
            prefix = _tensorflow_dir()
            in_call = lambda frame: frame.f_code.co_filename.startswith(prefix)  # noqa: E731
        self._in_call = in_call
        self._phases = phases(in_call) if phases is not None else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired: str | None = None
        """The message, once the watchdog has aborted collectives; None before."""
        self.prepared: str | None = None
        """The diagnosis read when the last long call had waited half the bound, or None."""
        self._prepared_ended: float | None = None

    def start(self) -> CollectiveWatchdog:
        """Start sampling in a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="tfdp-collective-watchdog", daemon=True
            )
            self._thread.start()
            _RUNNING.add(self)
            if self._phases is not None:
                from tfdp_utils import _exit_guard

                _exit_guard.before_traceback(_explain_uncaught)
        return self

    def stop(self) -> None:
        """Stop sampling and let go of the training thread's frame (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        _RUNNING.discard(self)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def explain(self, error: BaseException) -> str | None:
        """The diagnosis for ``error`` that ended a long call, when the watchdog did not fire.

        A TensorFlow error within a minute of a call that waited half the bound (or during
        it): the collective failed on its own (a peer aborted, exited or was killed) while
        this worker waited.
        """
        if self.fired or not self.prepared:
            return None
        if not type(error).__module__.startswith("tensorflow"):
            return None
        ended = self._prepared_ended
        if ended is not None and time.monotonic() - ended > 60:
            return None
        return self.prepared

    def _run(self) -> None:
        try:
            self._sample_until_stopped()
        finally:
            if self._phases is not None:
                self._phases.release()
                self._phases.board.close()

    def _track(self, frame: FrameType) -> None:
        """Publish this worker's phase; say so when peers wait for it outside TensorFlow."""
        tracker = self._phases
        if tracker is None:
            return
        try:
            phase = tracker.sample(frame)
            if phase is not None and phase.kind not in ("step", "input"):  # outside TF
                lasted = time.time() - phase.since
                if lasted >= max(2 * self.interval, self.timeout / 2):
                    told = tracker.tell_if_holding_up(frame, lasted)
                    if told:
                        logger.warning("%s", told)
        except Exception as error:  # never let the diagnosis stop the bound
            logger.debug("tfdp_utils: the phase of this worker is not published: %s", error)
            self._phases = None
            tracker.release()
            tracker.board.close()

    def _diagnosis(self, frame: FrameType) -> str | None:
        if self._phases is None:
            return None
        try:
            return self._phases.diagnose(frame)
        except Exception as error:
            logger.debug("tfdp_utils: no diagnosis of the stuck step: %s", error)
            return None

    def _sample_until_stopped(self) -> None:
        # The frame inside a TensorFlow call, held so its identity cannot be reused; None
        # between calls, so the training thread's objects are not kept alive longer than that.
        held: Any = None
        held_lasti = -1
        since = 0.0
        progress: WaitProgress | None = None
        prepared = False  # for the held call
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:
                return  # the training thread has ended
            now = time.monotonic()
            self._track(frame)
            if not self._in_call(frame):
                if held is not None and prepared:
                    self._prepared_ended = now
                held = frame = None
                continue
            if frame is held and frame.f_lasti == held_lasti:
                waited = now - since
                if progress is not None:
                    progress.tick()
                if waited >= self.timeout / 2 and not prepared and self._phases is not None:
                    # Read while every peer and the service are still there: if the step
                    # ends by the collective's own failure first, this is what is said.
                    prepared = True
                    self.prepared, self._prepared_ended = self._diagnosis(frame), None
                if waited >= self.timeout:
                    where = (
                        f"{frame.f_code.co_name} in {os.path.basename(frame.f_code.co_filename)}"
                    )
                    message = timeout_message(self.timeout, waited, where)
                    diagnosis = self._diagnosis(frame)
                    if diagnosis:  # the line a user reads first, logged before the traceback
                        message = f"{diagnosis}.\n{message}"
                    self.fired = message
                    logger.error("%s", message)
                    held = frame = None
                    self._abort(message)
                    return
            else:
                if held is not None and prepared:
                    self._prepared_ended = now
                held, held_lasti, since, prepared = frame, frame.f_lasti, now, False
                progress = WaitProgress(
                    "one multi-worker call (a peer, or a slow step, first trace or save)",
                    bound=self.timeout,
                    change=f"auto_strategy(collective_timeout=SECONDS) or "
                    f"{COLLECTIVE_TIMEOUT_VARIABLE}",
                )
            del frame


def worker_backup_dir(backup_dir: str | os.PathLike[str], strategy: Any = None) -> str:
    """The directory to hand ``keras.callbacks.BackupAndRestore`` on this worker.

    tf_keras's BackupAndRestore coordinates the workers of a MultiWorkerMirroredStrategy
    itself (the chief writes ``backup_dir``, the others scratch copies), so it gets
    ``backup_dir`` unchanged. Keras 3's has no multi-worker support: every worker writes the
    same files (measured here: ``FileExistsError`` from the racing ``makedirs``, and a file
    half-written by two processes), so under Keras 3 each worker of a multi-worker job gets
    ``backup_dir/worker_<rank>``. Workers keep their rank across a restart (TF_CONFIG index,
    SLURM_PROCID), so each restores its own copy; the copies are equal, as synchronous
    training keeps every worker's weights equal.

    Args:
        backup_dir: the job's backup directory (local path or ``tf.io.gfile`` URL).
        strategy: the training strategy. Defaults to `None` (the strategy in scope).

    Returns:
        The directory for this worker.

    Raises:
        TypeError: ``backup_dir`` is not a path, or ``strategy`` is not a
            ``tf.distribute.Strategy`` (a name such as ``"mirrored"`` is not one).
        ValueError: ``backup_dir`` is empty.

    Examples:
        >>> backup = tdu.worker_backup_dir("gs://bucket/job1/backup", strategy)  # doctest: +SKIP
        >>> model.fit(dist, callbacks=[keras.callbacks.BackupAndRestore(backup)])  # doctest: +SKIP
    """
    from tfdp_utils._tf import IS_KERAS3, tf
    from tfdp_utils._validate import strategy as check_strategy
    from tfdp_utils.cluster._topology import position_of

    if not isinstance(backup_dir, (str, os.PathLike)):
        raise TypeError(
            f"backup_dir must be a directory path (str or os.PathLike), but received "
            f"{backup_dir!r} of type {type(backup_dir).__name__}; pass e.g. '/tmp/backup'."
        )
    if strategy is not None:
        check_strategy(strategy)
    base = os.fspath(backup_dir)
    if not base.strip():
        raise ValueError(
            f"backup_dir={base!r} is empty; expected the job's backup directory. Pass e.g. "
            "'/tmp/backup' or 'gs://bucket/job1/backup'."
        )
    position = position_of(strategy if strategy is not None else tf.distribute.get_strategy())
    if not IS_KERAS3 or not position.is_multi_worker:
        return base
    return base.rstrip("/") + f"/worker_{position.index}"
