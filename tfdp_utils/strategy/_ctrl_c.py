"""Ctrl-C ends a worker that waits inside a multi-worker call: its collectives are aborted.

A collective returns only when every worker has joined it. Ctrl-C reaches the workers of a
job at slightly different moments: one is between two steps and stops at once, another is
already inside the next step's all-reduce, waiting for it. Python's ``KeyboardInterrupt``
comes only when that call returns: after ``collective_timeout``, or once the peer's process
has ended and its heartbeats have stopped (about 10 s measured here), so the waiting worker
outlives Ctrl-C for that long (a peer that is stuck, not ended, holds it for the whole bound).

:class:`CtrlCAbort` hears SIGINT from a helper thread (:mod:`tfdp_utils._interrupts`). When
the training thread is inside one TensorFlow call and still there :data:`SETTLE` seconds
later, it aborts the process's collectives (as TensorFlow's own health check does) with a
message that says why; the call fails at once, Python raises ``KeyboardInterrupt`` and the
exit guard ends the process by SIGINT. A call still held :data:`END_AFTER` seconds after the
abort (something the abort cannot end) ends the process with status 130 and every thread's
stack. A call that returns within :data:`SETTLE` is left alone: Ctrl-C lands as usual.

Installed by :func:`tfdp_utils.auto_strategy` for a strategy over 2 or more workers (listed by
``tdu.compat.status()`` as ``ctrl-c-abort``, undone by ``tdu.compat.undo("ctrl-c-abort")``).
After the abort the process's collectives stay failed: a program that catches
``KeyboardInterrupt`` cannot train on, which it could not with a peer gone either.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

logger = logging.getLogger("tfdp_utils")

SETTLE = 1.0
"""Seconds the training thread may take to leave its call after Ctrl-C before the abort."""

END_AFTER = 8.0
"""Seconds after the abort that a call still held ends the process (status 130)."""

INTERRUPTED_STATUS = 130
"""The status of a process ended by Ctrl-C, as a shell reports it."""


def interrupt_message(where: str) -> str:
    """The line logged when Ctrl-C aborts this worker's collectives. Pure."""
    return (
        f"tfdp-utils: Ctrl-C (SIGINT) reached this worker while it waited inside a "
        f"multi-worker call ({where}), which returns only once every worker joins it; its "
        "collectives were aborted so that it stops now. The job cannot go on: restart every "
        "task (with PreemptionCheckpoint or BackupAndRestore, training resumes)."
    )


def _abort_collectives(message: str) -> None:
    from tfdp_utils import _tf

    errors = _tf.framework_errors()
    _tf.eager_context().context().abort_collective_ops(errors.CANCELLED, message)


def _end_interrupted(message: str) -> None:
    """Dump every thread's stack and end the process with status 130, at once (any thread)."""
    from tfdp_utils.strategy._faults import end_now

    end_now(INTERRUPTED_STATUS)


def _in_tensorflow() -> Callable[[FrameType], bool]:
    """The watchdog's test (:func:`~tfdp_utils.strategy._stuck.calls_into`): the innermost
    frame, or its first caller outside Python's own library, lies in TensorFlow. A custom
    loop's ``next(iterator)`` waits for its eager cross-worker reduce in ``pool.map``, in
    ``threading``: Ctrl-C that the kernel hands to another thread leaves that wait held."""
    from tfdp_utils.strategy._faults import _tensorflow_dir
    from tfdp_utils.strategy._stuck import calls_into

    return calls_into(_tensorflow_dir())


class CtrlCAbort:
    """Aborts collectives when Ctrl-C finds the training thread held inside one call.

    Args:
        thread_id: the ``threading.get_ident()`` of the training thread. Defaults to `None`
            (the calling thread).
        in_call: tells whether a frame is inside a blocking TensorFlow call. Defaults to
            `None` (the innermost frame's file, or its first caller outside Python's own
            library, lies in the installed ``tensorflow`` package).
        abort: called with the message to end the held call. Defaults to `None` (abort the
            process's collective ops with ``CANCELLED``).
        end: called with the message when the call outlives the abort by ``end_after``
            seconds. Defaults to `None` (every thread's stack, then status 130).
        settle: seconds the call may take to return by itself. Defaults to :data:`SETTLE`.
        end_after: seconds after the abort. Defaults to :data:`END_AFTER`.
        interval: seconds between two looks at the training thread. Defaults to 0.05.
    """

    def __init__(
        self,
        thread_id: int | None = None,
        *,
        in_call: Callable[[FrameType], bool] | None = None,
        abort: Callable[[str], None] | None = None,
        end: Callable[[str], None] | None = None,
        settle: float = SETTLE,
        end_after: float = END_AFTER,
        interval: float = 0.05,
    ) -> None:
        self.thread_id = threading.get_ident() if thread_id is None else thread_id
        self._in_call = in_call or _in_tensorflow()
        self._abort = abort or _abort_collectives
        self._end = end or _end_interrupted
        self.settle, self.end_after, self.interval = settle, end_after, interval
        self._busy = threading.Lock()
        self.fired: str | None = None
        """The message, once Ctrl-C has aborted the collectives; None before."""

    def on_interrupt(self) -> None:
        """Look at the training thread from a helper thread (returns at once)."""
        if self._busy.acquire(blocking=False):  # a second Ctrl-C while one is handled: same
            threading.Thread(target=self._handle, name="tfdp-ctrl-c", daemon=True).start()

    def _handle(self) -> None:
        try:
            frame = sys._current_frames().get(self.thread_id)
            if frame is None or not self._in_call(frame):
                return
            lasti = frame.f_lasti
            where = f"{frame.f_code.co_name} in {os.path.basename(frame.f_code.co_filename)}"
            if not self._held_for(frame, lasti, self.settle):
                return
            message = interrupt_message(where)
            self.fired = message
            logger.warning("%s", message)
            self._abort(message)
            if self._held_for(frame, lasti, self.end_after):
                self._end(
                    f"{message} The call has not returned {self.end_after:g} s after the "
                    "abort, so the process ends now (status 130)."
                )
        finally:
            self._busy.release()

    def _held_for(self, frame: FrameType, lasti: int, seconds: float) -> bool:
        """Whether the training thread stays at ``frame``'s instruction ``lasti`` that long."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(self.interval)
            current = sys._current_frames().get(self.thread_id)
            held = current is frame and current is not None and current.f_lasti == lasti
            del current
            if not held:
                return False
        return True
