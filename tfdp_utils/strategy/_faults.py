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
import contextlib
import logging
import os
import re
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from types import FrameType

from tfdp_utils import _helper_calls
from tfdp_utils._public import public
from tfdp_utils._waiting import WaitProgress
from tfdp_utils.strategy._collective_bound import COLLECTIVE_TIMEOUT_VARIABLE, timeout_message
from tfdp_utils.strategy._phase_tracker import PhaseTracker
from tfdp_utils.strategy._stuck import calls_into

logger = logging.getLogger("tfdp_utils")

NEWS_EVERY = 2.0
"""Seconds between two reads of the peers' abort marks by a worker stuck outside TensorFlow."""

_RUNNING: weakref.WeakSet[CollectiveWatchdog] = weakref.WeakSet()


@atexit.register
def stop_watchdogs() -> None:
    """Stop every running watchdog (at exit: before finalization, and before the exit
    barrier, so that no helper thread uses the coordination service while the workers leave).
    """
    # A watchdog holds the training thread's frames (dataset iterators in their locals);
    # freed by a daemon thread while the interpreter finalizes, they abort the process in
    # TensorFlow's C++ destructors ("FATAL: exception not rethrown"), so every watchdog stops
    # here, and its helper threads' TensorFlow calls (phase writes, counter reads) end here.
    for watchdog in list(_RUNNING):
        watchdog.stop()
    _helper_calls.drain()


def _explain_uncaught(error: BaseException) -> str | None:
    for watchdog in list(_RUNNING):
        line = watchdog.explain(error)
        if line:
            return line
    return None


STUCK_STATUS = 1
"""The status a worker ends with when it cannot rejoin its job (the peers' uncaught error's)."""


def end_grace(timeout: float) -> float:
    """Seconds after its collectives were aborted that a worker still held ends its process.

    A collective's abort ends the call within milliseconds; a call it cannot end (input that
    never arrives, an op that never returns) holds the worker past this, and so does Python
    code (a callback) once a peer gave up on it: ``min(10, max(2, timeout / 2))``.
    """
    return min(10.0, max(2.0, timeout / 2))


def ended_message(worker: int | None, doing: str, why: str) -> str:
    """The line a worker that cannot rejoin its job logs before it ends its process."""
    who = "this worker" if worker is None else f"worker {worker} (this one)"
    return (
        f"tfdp-utils: {who} ends with status {STUCK_STATUS}: it has been {doing}, and {why}; "
        "it cannot rejoin the job, so it exits instead of holding its allocation (every "
        "thread's stack follows). Restart every task: with PreemptionCheckpoint or "
        "BackupAndRestore, training resumes."
    )


def _end_process(message: str) -> None:
    """Dump every thread's stack and end the process with :data:`STUCK_STATUS`, at once."""
    end_now(STUCK_STATUS)


def end_now(status: int) -> None:
    """Flush logging and stdio, dump every thread's stack and end the process with ``status``:
    ``os._exit``, without the teardown a stuck training thread would hold up."""
    import faulthandler

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing more to say
            stream.flush()
    with contextlib.suppress(Exception):  # stderr without a file descriptor
        faulthandler.dump_traceback(all_threads=True)
    os._exit(status)


_REMOTE_TASK = re.compile(r"remote target (/job:[\w-]+/replica:\d+/task:\d+)")
_UNHEALTHY_TASK = re.compile(
    r"(?:unhealthy|stopped sending heartbeats|heartbeat)[^/]*(/job:[\w-]+/replica:\d+/task:\d+)",
    re.IGNORECASE,
)
_GONE_WORDS = (
    "connection reset by peer",
    "socket closed",
    "connection refused",
    "failed to connect",
    "broken pipe",
    "heartbeat",
    "unhealthy",
)


def peer_gone(message: str) -> str | None:
    """The line naming the peer task whose connection failed, from a TensorFlow error. Pure.

    TensorFlow reports a peer that died mid-step (SIGKILL, out of memory, a crash, a lost
    host) inside a long ``UnavailableError`` message (``Collective ops is aborted by:
    recvmsg:Connection reset by peer ... from remote target /job:worker/replica:0/task:1``);
    this says it in one line before the traceback. None when the message names no such peer.
    """
    lowered = message.lower()
    if not any(word in lowered for word in _GONE_WORDS):
        return None
    found = _REMOTE_TASK.search(message) or _UNHEALTHY_TASK.search(message)
    if found is None:
        return None
    return (
        f"tfdp-utils: the peer task {found.group(1)} is gone: its connection failed during a "
        "multi-worker call (its process ended: killed, out of memory, preempted or crashed; "
        "its own log says which). Restart every task: with PreemptionCheckpoint or "
        "BackupAndRestore, training resumes."
    )


def _tensorflow_dir() -> str:
    from tfdp_utils._tf import tf

    return str(os.path.dirname(os.path.abspath(tf.__file__))) + os.sep


def _abort_collectives(message: str) -> None:
    from tfdp_utils import _tf

    errors = _tf.framework_errors()
    _tf.eager_context().context().abort_collective_ops(errors.DEADLINE_EXCEEDED, message)


@public("tfdp_utils.strategy")
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
            `None` (the innermost frame's file, or its first caller outside Python's own
            library, lies in the installed ``tensorflow`` package).
        phases: publishes this worker's phase and reads the others' for the diagnosis (see
            :mod:`tfdp_utils.strategy._stuck`); made with ``in_call`` as its test. Defaults to
            `None` (no phases: the message names no worker).
        end: called with the message when this worker cannot rejoin the job (see
            :meth:`_linger` and :meth:`_end_if_given_up`). Defaults to `None` (dump every
            thread's stack and end the process with :data:`STUCK_STATUS`).

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
        end: Callable[[str], None] | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout={timeout!r} must be a positive number of seconds.")
        self.timeout = float(timeout)
        self.thread_id = threading.get_ident() if thread_id is None else thread_id
        self.interval = min(1.0, self.timeout / 10) if interval is None else interval
        self._abort = abort or _abort_collectives
        if in_call is None:
            in_call = calls_into(_tensorflow_dir())
        self._in_call = in_call
        self._phases = phases(in_call) if phases is not None else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held: FrameType | None = None  # the frame inside a TensorFlow call, if any
        self.fired: str | None = None
        """The message, once the watchdog has aborted collectives; None before."""
        self.prepared: str | None = None
        """The diagnosis read when the last long call had waited half the bound, or None."""
        self._prepared_ended: float | None = None
        self._end = end or _end_process
        self.ended: str | None = None
        """The message, once this worker gave up on rejoining the job; None before."""
        self._news_at = 0.0

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
        """Stop sampling; the calling thread lets go of the held frames last (idempotent).

        Held frames keep a returned ``fit``'s iterators alive; destroyed by the watchdog's
        thread at exit, they outlived the join under load and TensorFlow aborted the process
        in the interpreter's finalization (status -6): the caller destroys them itself.
        """
        tracker = self._phases
        kept = [self._held, *(tracker.holding() if tracker is not None else ())]
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        _RUNNING.discard(self)
        if tracker is not None:
            tracker.release()
        self._held = None
        kept.clear()  # the last references, when the watchdog's thread has ended

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def explain(self, error: BaseException) -> str | None:
        """The diagnosis for ``error`` that ended a long call, when the watchdog did not fire.

        A TensorFlow error within a minute of a call that waited half the bound (or during
        it): the collective failed on its own (a peer aborted, exited or was killed) while
        this worker waited. Otherwise, an error whose message says a peer's connection failed
        (a worker killed or crashed mid-step): that peer named (:func:`peer_gone`).
        """
        if self.fired or not type(error).__module__.startswith("tensorflow"):
            return None
        ended = self._prepared_ended
        if self.prepared and (ended is None or time.monotonic() - ended <= 60):
            return self.prepared
        return peer_gone(str(error))

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
                    self._end_if_given_up(tracker, phase.describe(), lasted)
        except Exception as error:  # never let the diagnosis stop the bound
            logger.debug("tfdp_utils: the phase of this worker is not published: %s", error)
            self._phases = None
            tracker.release()
            tracker.board.close()

    def _end_if_given_up(self, tracker: PhaseTracker, doing: str, lasted: float) -> None:
        """End this worker, stuck outside TensorFlow, once its peers cannot go on with it.

        Its own watchdog never fires (no TensorFlow call to abort), so it reads the others'
        abort marks (every :data:`NEWS_EVERY` seconds, bounded): a peer that aborted its
        collectives has left the step this worker would join. A store that no longer answers
        means the coordination service is gone (its leader exited); that ends it too once it
        has been stuck for the whole bound, when every peer waiting for it has given up.
        """
        now = time.monotonic()
        if self.ended is not None or now - self._news_at < NEWS_EVERY:
            return
        self._news_at = now
        news = tracker.board.read_aborted()
        if news.gave_up:
            why = "; ".join(g.describe() for g in news.gave_up) + " (collective_timeout)"
        elif not news.answered and lasted >= self.timeout:
            why = (
                "the job's coordination service no longer answers (its leader, worker 0, has "
                "ended or is unreachable)"
            )
        else:
            return
        self._give_up(
            ended_message(tracker.board.worker, f"{doing} for {lasted:.0f} s", why),
        )

    def _give_up(self, message: str) -> None:
        self.ended = message
        logger.error("%s", message)
        frame = sys._current_frames().get(self.thread_id)
        if frame is not None:  # the training thread's stack first: where it is stuck
            stack = "".join(traceback.format_stack(frame))
            del frame
            logger.error("tfdp-utils: the training thread (most recent call last):\n%s", stack)
        self._stop.set()  # the process ends; an injected end returns: sample no more
        self._end(message)

    def _linger(self, frame: FrameType, lasti: int, where: str) -> None:
        """After the abort: end this worker when its training thread stays in the same call.

        An aborted collective returns within milliseconds; a call still held :func:`end_grace`
        seconds later waits for something the abort cannot end.
        """
        fired = time.monotonic()
        grace = end_grace(self.timeout)
        while not self._stop.wait(self.interval):
            current = sys._current_frames().get(self.thread_id)
            held = current is frame and current is not None and current.f_lasti == lasti
            del current
            if not held:
                return  # the call ended: its error takes the usual way
            if time.monotonic() - fired >= grace:
                doing = "inside one TensorFlow call"
                if self._phases is not None:
                    try:
                        doing = self._phases.current(frame).describe()
                    except Exception as error:
                        logger.debug("tfdp_utils: no phase for the held call: %s", error)
                worker = None if self._phases is None else self._phases.board.worker
                why = (
                    f"its collectives were aborted {time.monotonic() - fired:.0f} s ago "
                    f"(collective_timeout={self.timeout:g} s) but the call has not returned: "
                    "it waits for something the abort cannot end"
                )
                self._give_up(ended_message(worker, f"{doing} ({where})", why))
                return

    def _mark_aborted(self, frame: FrameType, waited: float) -> None:
        assert self._phases is not None
        try:
            step = self._phases.current(frame).step
        except Exception as error:
            logger.debug("tfdp_utils: no step for the abort mark: %s", error)
            step = None
        self._phases.board.mark_aborted(step, waited)

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
        # An attribute, not a local: stop() takes it over (see there).
        self._held = None
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
                if self._held is not None and prepared:
                    self._prepared_ended = now
                self._held = frame = None
                continue
            if frame is self._held and frame.f_lasti == held_lasti:
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
                    if self._phases is not None:  # the peers stuck outside TensorFlow end
                        self._mark_aborted(frame, waited)
                    self._abort(message)
                    self._held = None
                    self._linger(frame, held_lasti, where)
                    return
            else:
                if self._held is not None and prepared:
                    self._prepared_ended = now
                self._held, held_lasti, since, prepared = frame, frame.f_lasti, now, False
                progress = WaitProgress(
                    "one multi-worker call (a peer, or a slow step, first trace or save)",
                    bound=self.timeout,
                    change=f"auto_strategy(collective_timeout=SECONDS) or "
                    f"{COLLECTIVE_TIMEOUT_VARIABLE}",
                )
            del frame
