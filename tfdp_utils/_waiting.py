"""Progress lines for bounded waits: what is awaited, for how long, and how to change the bound.

Pure Python. Every wait in tfdp-utils that can last long (peers joining a cluster, parameter
servers, a TPU probe, a multi-worker call stuck on a peer) calls :meth:`WaitProgress.tick` in
its loop, so a user watching the log sees a WARNING at least every
:data:`PROGRESS_INTERVAL` seconds instead of silence until the bound ends the wait.
"""

from __future__ import annotations

import logging
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
