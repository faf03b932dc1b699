"""The bound on a trainer's wait for the tf.data service. Pure Python.

TensorFlow's service client waits forever for a service worker that died holding part of
the epoch. The trainer's pipeline tells :class:`ServiceWatch` when it asks the service for
the next chunk (:meth:`ServiceWatch.asked`, called just before the read) and when a chunk
arrives (:meth:`ServiceWatch.arrived`). A request that stays unanswered for ``timeout``
seconds is a trainer waiting on the service, whatever happens downstream: a trainer that
pauses (a long callback, validation) stops asking once its buffers are full, and a partial
chunk that leaves a batch unfinished is followed by a new request at once.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable

from tfdp_utils import _variables
from tfdp_utils._waiting import WaitProgress

logger = logging.getLogger("tfdp_utils")

SERVICE_TIMEOUT_VARIABLE = _variables.SERVICE_TIMEOUT
"""Environment variable that replaces the default ``service_timeout``."""
CHANGE = f"build_distributed_dataset(service_timeout=SECONDS) or {SERVICE_TIMEOUT_VARIABLE}"
"""How a user changes the bound, for the messages."""


def exit_process(message: str) -> None:
    """Log ``message`` and end the process with exit status 1.

    The trainer's thread is blocked inside TensorFlow's service client, which nothing can
    cancel from Python: the process ends, with the reason on stderr and in the log.
    """
    logger.error("tfdp_utils: %s", message)
    sys.stderr.write(f"tfdp_utils: {message}\n")
    sys.stderr.flush()
    os._exit(1)


class ServiceWatch:
    """Ends the process when a request to the tf.data service goes unanswered too long.

    A WARNING names the wait every 30 s; at ``timeout`` seconds ``abort`` is called with a
    message naming the bound and how to change it. The checks run on a daemon thread that
    starts with the first request and ends with the watch (it holds only a weak reference).

    Args:
        address: the dispatcher's address, for the messages.
        timeout: seconds a request may wait before ``abort``.
        abort: called with the message. Defaults to `None` (:func:`exit_process`).
        clock: a monotonic clock. Defaults to `time.monotonic`.
        poll: seconds between checks. Defaults to `1.0`.
        progress_interval: seconds between progress lines. Defaults to `None` (30 s).
    """

    def __init__(
        self,
        address: str,
        timeout: float,
        *,
        abort: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        poll: float = 1.0,
        progress_interval: float | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self._abort = abort or exit_process
        self._clock = clock
        self._poll = poll
        self._interval = progress_interval
        self._lock = threading.Lock()
        self._asks: dict[int, float] = {}  # unanswered requests of the current read
        self._end: int | None = None  # the index answered with the read's end
        self._progress: WaitProgress | None = None
        self._thread: threading.Thread | None = None
        self.message: str | None = None

    @property
    def pending_since(self) -> float | None:
        """When the oldest unanswered request was made; None when none is."""
        with self._lock:
            return min(self._asks.values(), default=None)

    def asked(self, index: int) -> None:
        """The pipeline asks the service for chunk ``index`` of a read (0: a new read).

        The requests after a read's end (answered with the end of the data, not with a
        chunk) are not waits.
        """
        with self._lock:
            if index == 0:
                self._asks.clear()
                self._end = None
            if self._end is not None and index > self._end:
                return
            self._asks[index] = self._clock()
        self._start()

    def arrived(self, index: int, size: int) -> None:
        """Chunk ``index`` of the read came, with ``size`` examples (0: the read ended).

        Marks may run on other threads than the requests, so each names its request.
        """
        with self._lock:
            self._asks.pop(index, None)
            if size == 0:
                self._end = index
                self._asks = {i: t for i, t in self._asks.items() if i < index}
            self._progress = None

    def check(self) -> str | None:
        """One check; returns (and hands to ``abort``) the message when the bound passed."""
        with self._lock:
            since = min(self._asks.values(), default=None)
            if since is None:
                self._progress = None
                return None
            waited = self._clock() - since
            if self._progress is None:
                self._progress = WaitProgress(
                    f"the next chunk of data from the tf.data service at {self.address}",
                    bound=self.timeout,
                    change=CHANGE,
                    interval=self._interval,
                    clock=self._clock,
                    start=since,
                )
            progress = self._progress
        if waited < self.timeout:
            progress.tick()
            return None
        self.message = (
            f"the trainer waited {waited:.0f} s for data from the tf.data service at "
            f"{self.address} and received nothing, beyond service_timeout={self.timeout:g} s "
            f"(change it with {CHANGE}): a service worker that held part of the epoch is gone "
            "(TensorFlow's client waits for it forever), or the dispatcher is. Restart the "
            "service worker, or the job."
        )
        self._abort(self.message)
        return self.message

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            ref = weakref.ref(self)
            self._thread = threading.Thread(
                target=_watch, args=(ref, self._poll), name="tfdp-service-watch", daemon=True
            )
        self._thread.start()


def _watch(ref: weakref.ref[ServiceWatch], poll: float) -> None:
    while True:
        time.sleep(poll)
        watch = ref()
        if watch is None or watch.check() is not None:
            return
        del watch
