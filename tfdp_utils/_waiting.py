"""Progress lines for bounded waits: what is awaited, for how long, and how to change the bound.

Pure Python. Every wait in tfdp-utils that can last long (peers joining a cluster, parameter
servers, a TPU probe, a multi-worker call stuck on a peer) calls :meth:`WaitProgress.tick` in
its loop, so a user watching the log sees a WARNING at least every
:data:`PROGRESS_INTERVAL` seconds instead of silence until the bound ends the wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("tfdp_utils")

PROGRESS_INTERVAL = 30.0
"""Seconds between two progress lines of one wait."""


class WaitProgress:
    """Logs ``still waiting for ...`` at WARNING every ``interval`` seconds of one wait.

    Args:
        what: what the wait is for, e.g. ``"peer task(s) worker:1 at 10.0.0.2:2222"``; a
            callable is asked again at each line, so the list can shrink as peers arrive.
        bound: the wait's bound in seconds.
        change: how to change the bound, e.g. ``"auto_strategy(cluster_timeout=SECONDS) or
            TFDP_CLUSTER_TIMEOUT"``.
        interval: seconds between lines. Defaults to `None` (:data:`PROGRESS_INTERVAL`, read
            when the wait starts).
        clock: a monotonic clock. Defaults to `time.monotonic`.
        start: when the wait began, on ``clock``. Defaults to `None` (now).
    """

    def __init__(
        self,
        what: str | Callable[[], str],
        *,
        bound: float,
        change: str,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        start: float | None = None,
    ) -> None:
        self._what = what
        self.bound = bound
        self.change = change
        self.interval = PROGRESS_INTERVAL if interval is None else interval
        self._clock = clock
        self.start = clock() if start is None else start
        self._next = self.start + self.interval
        self.lines: list[str] = []
        """Every progress line logged so far."""

    def tick(self) -> None:
        """Log a progress line when ``interval`` seconds have passed since the last one."""
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self.interval
        what = self._what() if callable(self._what) else self._what
        line = (
            f"tfdp_utils: still waiting for {what} after {now - self.start:.0f} s "
            f"(bound {self.bound:g} s; change it with {self.change})"
        )
        self.lines.append(line)
        logger.warning("%s", line)


class Deadline:
    """The end of one bounded wait, on a monotonic clock.

    Args:
        seconds: the bound.
        clock: a monotonic clock. Defaults to `time.monotonic`.
    """

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.start = clock()
        self.end = self.start + seconds

    def elapsed(self) -> float:
        """Seconds since the wait began."""
        return self._clock() - self.start

    def remaining(self) -> float:
        """Seconds left before the bound, never below 0."""
        return max(self.end - self._clock(), 0.0)

    def passed(self) -> bool:
        """Whether the bound has passed."""
        return self._clock() >= self.end

    def slice(self, cap: float, floor: float = 0.0) -> float:
        """A sub-wait of at most ``cap`` seconds that ends with the bound (at least ``floor``)."""
        return min(cap, max(self.remaining(), floor))


def wait_until(
    ready: Callable[[], bool],
    *,
    deadline: Deadline,
    progress: WaitProgress,
    timeout_error: Callable[[], BaseException],
    poll_interval: float,
) -> float:
    """Poll ``ready()`` until it is true, logging progress; raise at the deadline.

    The one wait-until-deadline loop of tfdp-utils: ``ready`` is asked first (a wait that is
    already over costs nothing), then, while it is false, a progress line may be logged, the
    bound checked (``timeout_error()`` is raised once it has passed) and the loop sleeps
    ``poll_interval`` seconds at most, never past the bound.

    Returns:
        The seconds waited.
    """
    while not ready():
        progress.tick()
        if deadline.passed():
            raise timeout_error()
        time.sleep(deadline.slice(poll_interval))
    return deadline.elapsed()


def join_within(thread: threading.Thread, *, deadline: Deadline, progress: WaitProgress) -> bool:
    """Join ``thread`` until it ends or the deadline passes, logging progress; True if it ended."""
    while thread.is_alive() and not deadline.passed():
        thread.join(deadline.slice(min(progress.interval, 0.5), 0.01))
        progress.tick()
    return not thread.is_alive()
