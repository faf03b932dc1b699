"""The throughput logger's clock: host seconds that leave validation and epoch starts out. Pure."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence


class PausableClock:
    """Host seconds (``time.perf_counter``) that stand still while any pause is held.

    Pauses are named (``"validation"``, ``"epoch_start"``), so that one ending never restarts
    the clock while another is still held.

    Args:
        clock: the host clock. Defaults to `time.perf_counter`.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._excluded = 0.0
        self._paused_at: float | None = None
        self._reasons: set[str] = set()
        self._pauses: list[tuple[float, float]] = []  # the host clock's readings, in order

    def now(self) -> float:
        """Seconds so far, the paused spans left out."""
        now = self._paused_at if self._paused_at is not None else self._clock()
        return now - self._excluded

    def pause(self, reason: str = "validation") -> None:
        """Hold the clock for ``reason`` (validation starts, an epoch ends)."""
        if not self._reasons:
            self._paused_at = self._clock()
        self._reasons.add(reason)

    def resume(self, reason: str = "validation") -> float:
        """Release ``reason``; the clock runs again when no pause is held.

        Returns:
            Seconds since the clock stopped, when this release restarts it; else 0.
        """
        if reason not in self._reasons:
            return 0.0
        self._reasons.discard(reason)
        if self._reasons or self._paused_at is None:
            return 0.0
        now = self._clock()
        held = now - self._paused_at
        self._excluded += held
        self._pauses.append((self._paused_at, now))
        self._paused_at = None
        return held

    def stopped_for(self) -> float:
        """Seconds since the clock stopped (0 while it runs)."""
        return 0.0 if self._paused_at is None else self._clock() - self._paused_at

    def held(self, reason: str) -> bool:
        """Whether a pause for ``reason`` is held."""
        return reason in self._reasons

    def running_within(self, spans: Sequence[tuple[float, float]]) -> float:
        """Seconds of ``spans`` (host clock readings ``(start, end)``, in order, not
        overlapping) during which this clock ran: the parts inside a pause left out.

        Example:
        >>> ticks = iter([10.0, 12.0])
        >>> clock = PausableClock(lambda: next(ticks))
        >>> clock.pause("epoch_start"); _ = clock.resume("epoch_start")  # held 10-12
        >>> clock.running_within([(9.0, 11.0), (12.0, 13.0)])  # 1 s of the first, all the second
        2.0
        """
        pauses = list(self._pauses)
        if self._paused_at is not None:
            pauses.append((self._paused_at, float("inf")))
        total, first = 0.0, 0
        for start, end in spans:
            while first < len(pauses) and pauses[first][1] <= start:
                first += 1
            held, index = 0.0, first
            while index < len(pauses) and pauses[index][0] < end:
                held += max(0.0, min(end, pauses[index][1]) - max(start, pauses[index][0]))
                index += 1
            total += max(0.0, end - start - held)
        return total
