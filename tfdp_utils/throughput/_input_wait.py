"""The share of training time spent waiting for input, per window, and the worker it names. Pure.

:class:`InputWaitMeter` turns a running total of seconds waited (a builder dataset's
:class:`~tfdp_utils.data._input_wait.InputClock`, read only at log points) into the share of
each measured window: it stands still over the same spans as the logger's clock (validation,
epoch starts), so a window's share is the wait inside the seconds its rates cover.
:func:`straggler` names the worker the others wait for, from the workers' shares.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping

from tfdp_utils.throughput._clock import PausableClock

STRAGGLER_MIN_SHARE = 0.10
"""A worker is named only when it waits for input at least this share of the time ..."""
STRAGGLER_MIN_GAP = 0.10
"""... and this much more than the median of the other workers."""


class InputWaitMeter:
    """Seconds waited for input inside the measured windows, and each window's share.

    Args:
        waited: the running total of seconds the training loop waited for its next batch.
    """

    def __init__(self, waited: Callable[[], float]) -> None:
        self._clock = PausableClock(waited)
        self._mark = self._origin = self._clock.now()
        self.waited_seconds = 0.0  # inside measured windows
        self.measured_seconds = 0.0

    def pause(self, reason: str) -> None:
        """Leave what follows out (the logger's clock pauses for the same ``reason``)."""
        self._clock.pause(reason)

    def resume(self, reason: str) -> None:
        """Count again from here."""
        self._clock.resume(reason)

    def mark(self) -> None:
        """Start a window here (the logger's meter took a point that is no window end)."""
        self._mark = self._clock.now()

    def window(self, seconds: float) -> float:
        """The share of a window of ``seconds`` that ends now, counted into the totals."""
        now = self._clock.now()
        waited, self._mark = max(0.0, now - self._mark), now
        self.waited_seconds += waited
        self.measured_seconds += seconds
        return min(1.0, waited / seconds) if seconds > 0 else 0.0

    @property
    def total_seconds(self) -> float:
        """Seconds waited since the meter started, paused spans left out (reads the total)."""
        return max(0.0, self._clock.now() - self._origin)

    @property
    def share(self) -> float | None:
        """The share over every window so far, or None before the first."""
        if self.measured_seconds <= 0:
            return None
        return min(1.0, self.waited_seconds / self.measured_seconds)


@dataclasses.dataclass(frozen=True)
class Straggler:
    """The worker whose input holds the job up.

    Attributes:
        worker: its index.
        share: its input-wait share.
        others: the median share of the other workers.
    """

    worker: int
    share: float
    others: float

    def describe(self) -> str:
        return (
            f"worker {self.worker} is the slowest: it waits for input {self.share:.0%} of the "
            f"time, the others {self.others:.0%}"
        )


def straggler(shares: Mapping[int, float]) -> Straggler | None:
    """The worker that waits for input clearly more than the others, or None.

    Named when its share is at least :data:`STRAGGLER_MIN_SHARE` and exceeds the median of the
    other workers' by at least :data:`STRAGGLER_MIN_GAP`. The other workers' own waits are in
    the collectives (waiting for it), which the share leaves out.

    Examples:
    >>> straggler({0: 0.03, 1: 0.62}).describe()
    'worker 1 is the slowest: it waits for input 62% of the time, the others 3%'
    >>> straggler({0: 0.03, 1: 0.04}) is None
    True
    """
    known = {w: s for w, s in shares.items() if s == s}  # NaN: not measured
    if len(known) < 2:
        return None
    worker = max(known, key=lambda w: known[w])
    share = known[worker]
    others = statistics.median(s for w, s in known.items() if w != worker)
    if share < STRAGGLER_MIN_SHARE or share - others < STRAGGLER_MIN_GAP:
        return None
    return Straggler(worker, share, others)


def verdict(shares: Mapping[int, float], *, unknown: str | None = None) -> str:
    """One line on the workers' input-wait shares, for the report and the summary.

    Args:
        shares: each worker's share, NaN where it was not measured.
        unknown: why no share was measured, as the logger notes it (``"unknown: op
            determinism is on ..."``); used when no worker's share is known. Defaults to
            `None` (the reason is not known).

    Examples:
    >>> verdict({0: float("nan")}, unknown="unknown: op determinism is on")
    'input wait: unknown: op determinism is on'
    """
    known = {w: s for w, s in sorted(shares.items()) if s == s}
    if not known:
        if unknown:
            return f"input wait: {unknown}"
        return "input wait: unknown (no worker's share was measured)"
    named = straggler(known)
    if named is not None:
        return f"input: {named.describe()}"
    listed = ", ".join(f"worker {w} {s:.0%}" for w, s in known.items())
    if len(known) == 1:
        (share,) = known.values()
        bound = " (input-bound)" if share >= 0.5 else ""
        return f"input wait: {share:.0%} of the time{bound}"
    return f"input wait: no worker stands out ({listed})"
