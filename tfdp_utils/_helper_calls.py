"""Helper threads' calls into TensorFlow, finished before the interpreter finalizes. Pure stdlib.

CPython 3.11-3.13 ends a daemon thread that asks for the GIL once the interpreter is
finalizing, by ``pthread_exit``. A thread returning from a TensorFlow call asks for it inside
TensorFlow's C++ frames (a binding's GIL release), which that exit cannot unwind: the process
dies by SIGABRT after its last output line (``terminate called after throwing an instance of
...`` / ``FATAL: exception not rethrown``, exit status -6), whatever the program did before.
tfdp-utils runs some TensorFlow calls on helper threads, each bounded for its caller but left
to finish when the bound passes: reads and writes of the coordination service's key-value
store (the preemption agreement's watcher, the phase board's writer and readers) and the
watchdog's reads of the step counter. Under load, or when a peer has gone, one of them could
still be running when a finished job's interpreter finalizes.

So each such call is marked with :func:`call`, and an ``atexit`` handler (:func:`drain`,
registered at import, so that it runs after the handlers registered later: the exit barrier,
the watchdogs' stop) refuses new marked calls and waits up to :data:`BOUND` seconds for those
in flight. A call still in flight after the bound is named in a WARNING (a call into a service
that no longer answers may never return, and one that never returns does no harm). Calls of
the main thread are not marked: that thread is the one that finalizes.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Iterator

logger = logging.getLogger("tfdp_utils")

BOUND = 10.0
"""Seconds the exit waits for helper threads' TensorFlow calls in flight."""

_lock = threading.Condition()
_inside: dict[int, list[tuple[str, float]]] = {}  # thread ident -> its calls (what, since)
_closed = False


class Closed(RuntimeError):
    """The interpreter is exiting: a helper thread may start no TensorFlow call."""


@contextlib.contextmanager
def call(what: str) -> Iterator[None]:
    """Mark the body as a TensorFlow call of a helper thread (nothing on the main thread).

    Args:
        what: the call, as the exit's WARNING names it (``"a read of the key-value store"``).

    Raises:
        Closed: the interpreter's exit has begun (:func:`drain`); the call is not made.
    """
    if threading.current_thread() is threading.main_thread():
        yield
        return
    ident = threading.get_ident()
    with _lock:
        if _closed:
            raise Closed(f"{what}: not started, the interpreter is exiting")
        _inside.setdefault(ident, []).append((what, time.monotonic()))
    try:
        yield
    finally:
        with _lock:
            calls = _inside.get(ident, [])
            if calls:
                calls.pop()
            if not calls:
                _inside.pop(ident, None)
                _lock.notify_all()


def in_flight() -> list[str]:
    """The helper threads' TensorFlow calls running now, each with its seconds so far."""
    now = time.monotonic()
    with _lock:
        return [
            f"{what} ({now - since:.1f} s)" for calls in _inside.values() for what, since in calls
        ]


def drain(bound: float = BOUND) -> list[str]:
    """Refuse new marked calls and wait up to ``bound`` seconds for those in flight.

    Returns:
        The calls still in flight at the bound (each named in a WARNING); empty when none.
    """
    global _closed
    deadline = time.monotonic() + bound
    with _lock:
        _closed = True
        while _inside and (left := deadline - time.monotonic()) > 0:
            _lock.wait(min(left, 0.5))
    left_running = in_flight()
    for running in left_running:
        logger.warning(
            "tfdp_utils: a helper thread is still inside a TensorFlow call at exit after %g s: "
            "%s. If it returns while Python finalizes, the process ends by SIGABRT; a call "
            "into a service that no longer answers may never return, and then does no harm.",
            bound,
            running,
        )
    return left_running


def reopen() -> None:
    """Accept marked calls again (for tests that drain inside a process that goes on)."""
    global _closed
    with _lock:
        _closed = False


atexit.register(drain)
