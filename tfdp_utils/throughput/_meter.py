"""``ThroughputMeter``: cumulative counters in, windowed rates out. Pure Python, no TensorFlow.

The meter knows nothing of Keras or TensorBoard. Whoever drives it (the
:class:`tfdp_utils.callbacks.ThroughputLogger`, a custom training loop, a test) reads the
counters it already has at the points where it wants a figure and calls
:meth:`ThroughputMeter.update`; the meter returns the rates over the window since the
previous update. Updates during warm-up (the first ``warmup_steps`` steps, where tracing
and the first batches make steps slow) produce no rates and are excluded from every figure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tfdp_utils._public import public
from tfdp_utils._validate import positive_float, positive_int


@public("tfdp_utils.throughput")
@dataclasses.dataclass(frozen=True)
class ThroughputWindow:
    """Rates over one window between two updates of a :class:`ThroughputMeter`.

    Attributes:
        step: the step count at the end of the window (e.g. the optimizer's iterations).
        steps: steps measured in the window (steps left out by :meth:`ThroughputMeter.exclude`
            are not).
        seconds: wall-clock seconds the window covers.
        examples: cumulative examples trained at ``step``, warm-up included.
        replica_examples: cumulative examples per replica at ``step`` (by replica id).
        steps_per_sec: ``steps / seconds``.
        examples_per_sec: examples trained in the window, all replicas, per second.
        replica_examples_per_sec: examples each replica trained in the window, per second.
        flops_per_sec: ``examples_per_sec * flops_per_example``, or None without FLOPs.
        mfu: model FLOPs utilisation, ``flops_per_sec / (peak_flops_per_replica *
            num_replicas)``, or None unless both FLOPs figures were given.
    """

    step: int
    steps: int
    seconds: float
    examples: int
    replica_examples: tuple[int, ...]
    steps_per_sec: float
    examples_per_sec: float
    replica_examples_per_sec: tuple[float, ...]
    flops_per_sec: float | None = None
    mfu: float | None = None


def _optional_positive(value: Any, name: str) -> float | None:
    return None if value is None else positive_float(value, name, hint="Or pass None.")


_Point = tuple[int, float, tuple[int, ...], int, tuple[int, ...]]
"""(step, time, examples, measured steps, measured examples) at one update."""


@public("tfdp_utils")
class ThroughputMeter:
    """Turns cumulative step / example counters and a clock into windowed rates.

    Each :meth:`update` gives the meter the cumulative state at one point in time: the step
    count, the examples each replica has trained so far, and a clock reading in seconds.
    The rates it returns cover the window since the previous update. Updates before
    ``warmup_steps`` steps past the first update's step are warm-up: they return None,
    and the first update at or past the end of warm-up only sets the start of the first
    window. :meth:`summary` gives the rates over all windows together. Steps whose time the
    caller's clock leaves out (e.g. each epoch's first step, which waits for a rebuilt input
    pipeline) are left out of the rates with :meth:`exclude`.

    Args:
        num_replicas: replicas whose examples are counted separately. Defaults to `1`.
        warmup_steps: steps, counted from the first update, excluded from every rate.
            Defaults to `0`.
        flops_per_example: training FLOPs per example (forward and backward), to report
            FLOPs/s. Defaults to `None`.
        peak_flops_per_replica: the peak FLOPs/s of one replica's device, to report model
            FLOPs utilisation; needs ``flops_per_example``. Defaults to `None`.

    Raises:
        ValueError: for ``num_replicas < 1``, negative ``warmup_steps``, non-positive FLOPs
            figures, or ``peak_flops_per_replica`` without ``flops_per_example``.

    Examples:
    >>> meter = ThroughputMeter(num_replicas=2, warmup_steps=10)
    >>> meter.update(step=0, time=0.0, replica_examples=[0, 0]) is None
    True
    >>> meter.update(step=10, time=3.0, replica_examples=[40, 40]) is None  # warm-up ends
    True
    >>> window = meter.update(step=110, time=5.0, replica_examples=[440, 440])
    >>> window.steps_per_sec, window.examples_per_sec, window.replica_examples_per_sec
    (50.0, 400.0, (200.0, 200.0))
    """

    def __init__(
        self,
        *,
        num_replicas: int = 1,
        warmup_steps: int = 0,
        flops_per_example: float | None = None,
        peak_flops_per_replica: float | None = None,
    ) -> None:
        self.num_replicas = positive_int(num_replicas, "num_replicas")
        self.warmup_steps = positive_int(
            warmup_steps,
            "warmup_steps",
            minimum=0,
            hint="Pass 0 to measure from the first step, or a positive number of steps to "
            "leave out while tracing warms up.",
        )
        self.flops_per_example = _optional_positive(flops_per_example, "flops_per_example")
        self.peak_flops_per_replica = _optional_positive(
            peak_flops_per_replica, "peak_flops_per_replica"
        )
        if self.peak_flops_per_replica is not None and self.flops_per_example is None:
            raise ValueError(
                "peak_flops_per_replica was given without flops_per_example; model FLOPs "
                "utilisation needs both. Pass flops_per_example (training FLOPs per example)."
            )
        self.reset()

    def reset(self) -> None:
        """Forget every update (e.g. at the start of another ``fit``)."""
        self._origin_step: int | None = None
        # Points are (step, time, examples, measured steps, measured examples): the counters
        # as given, and the same minus what exclude() left out (for the rates).
        self._start: _Point | None = None
        self._last: _Point | None = None
        self._latest_examples: tuple[int, ...] = (0,) * self.num_replicas
        self._windows = 0
        self._excluded_steps = 0
        self._excluded_examples: tuple[int, ...] = (0,) * self.num_replicas

    def exclude(self, *, steps: int, replica_examples: Sequence[int]) -> None:
        """Leave ``steps`` steps and the examples they trained out of every later rate.

        For a span whose time the caller's clock already leaves out: the counters passed to
        later updates still include these steps and examples; the meter takes them off the
        window they fall in (and the totals). Call it after the span, before the next update.

        Args:
            steps: steps in the span (>= 0).
            replica_examples: examples each replica trained in the span (each >= 0).

        Raises:
            ValueError: for negative figures or the wrong number of replicas.
        """
        counts = tuple(int(x) for x in replica_examples)
        if int(steps) < 0 or any(c < 0 for c in counts) or len(counts) != self.num_replicas:
            raise ValueError(
                f"exclude(steps={steps!r}, replica_examples={list(counts)}) needs steps >= 0 "
                f"and one count >= 0 per replica ({self.num_replicas}): the span's own steps "
                "and examples, not cumulative ones."
            )
        self._excluded_steps += int(steps)
        self._excluded_examples = tuple(
            e + c for e, c in zip(self._excluded_examples, counts, strict=True)
        )

    @property
    def warmed_up(self) -> bool:
        """Whether warm-up has ended (a window has started)."""
        return self._start is not None

    @property
    def windows(self) -> int:
        """Windows measured so far."""
        return self._windows

    def update(
        self, *, step: int, time: float, replica_examples: Sequence[int]
    ) -> ThroughputWindow | None:
        """Record the cumulative counters at one point; return the window that just ended.

        Args:
            step: cumulative steps trained (e.g. the optimizer's iterations).
            time: a clock reading in seconds (any monotonic clock, e.g. ``time.perf_counter()``).
            replica_examples: cumulative examples trained by each replica, by replica id.

        Returns:
            The :class:`ThroughputWindow` since the previous update, or None during warm-up,
            at the update that ends warm-up, or when no step passed since the last update.

        Raises:
            ValueError: when ``replica_examples`` has the wrong length, or a counter or the
                clock goes backwards.
        """
        try:
            counts = tuple(int(x) for x in replica_examples)
            point = (int(step), float(time), counts)
        except (TypeError, ValueError):
            raise TypeError(
                f"update() takes numbers: step (cumulative steps), time (seconds) and "
                f"replica_examples (cumulative examples per replica), but received "
                f"step={step!r}, time={time!r}, replica_examples={replica_examples!r}."
            ) from None
        if len(counts) != self.num_replicas:
            raise ValueError(
                f"replica_examples has {len(counts)} entries; expected one per replica "
                f"({self.num_replicas})."
            )
        if self._last is not None:
            last_step, last_time, last_counts = self._last[:3]
            if point[0] < last_step or point[1] < last_time:
                raise ValueError(
                    f"update(step={step}, time={time}) goes back from step={last_step}, "
                    f"time={last_time}; counters and the clock must not decrease."
                )
            if any(c < p for c, p in zip(counts, last_counts, strict=True)):
                raise ValueError(
                    f"replica_examples={list(counts)} is below the previous "
                    f"{list(last_counts)}; pass cumulative counts."
                )
        self._latest_examples = counts
        measured = tuple(c - e for c, e in zip(counts, self._excluded_examples, strict=True))
        full: _Point = (*point, point[0] - self._excluded_steps, measured)
        if self._origin_step is None:
            self._origin_step = point[0]
        if self._start is None:
            if point[0] - self._origin_step >= self.warmup_steps:
                self._start = full
            self._last = full
            return None
        assert self._last is not None
        previous = self._last
        if full[3] == previous[3] or point[1] == previous[1]:
            return None  # no measured step, or no time, since the last update
        self._last = full
        self._windows += 1
        return self._window(previous, full)

    def _window(self, begin: _Point, end: _Point) -> ThroughputWindow:
        steps = end[3] - begin[3]
        seconds = end[1] - begin[1]
        replica_rates = tuple((e - b) / seconds for b, e in zip(begin[4], end[4], strict=True))
        examples_per_sec = sum(replica_rates)
        flops = (
            None if self.flops_per_example is None else examples_per_sec * self.flops_per_example
        )
        mfu = None
        if flops is not None and self.peak_flops_per_replica is not None:
            mfu = flops / (self.peak_flops_per_replica * self.num_replicas)
        return ThroughputWindow(
            step=end[0],
            steps=steps,
            seconds=seconds,
            examples=sum(end[2]),
            replica_examples=end[2],
            steps_per_sec=steps / seconds,
            examples_per_sec=examples_per_sec,
            replica_examples_per_sec=replica_rates,
            flops_per_sec=flops,
            mfu=mfu,
        )

    def total(self) -> ThroughputWindow | None:
        """Rates over all windows together (end of warm-up to the last update), or None."""
        if self._start is None or self._last is None or self._last[3] == self._start[3]:
            return None
        if self._last[1] == self._start[1]:
            return None
        return self._window(self._start, self._last)

    def summary(self) -> dict[str, Any]:
        """The measured figures as a plain dict (for notebooks, logs and tests).

        Keys: ``examples`` and ``replica_examples`` (cumulative, warm-up included),
        ``windows``, and, once a window has been measured, ``measured_steps``,
        ``measured_seconds``, ``steps_per_sec``, ``examples_per_sec``,
        ``replica_examples_per_sec``, and ``flops_per_sec`` / ``mfu`` when FLOPs were given.
        """
        result: dict[str, Any] = {
            "examples": sum(self._latest_examples),
            "replica_examples": list(self._latest_examples),
            "windows": self._windows,
            "warmup_steps": self.warmup_steps,
        }
        total = self.total()
        if total is not None:
            result.update(
                measured_steps=total.steps,
                measured_seconds=total.seconds,
                steps_per_sec=total.steps_per_sec,
                examples_per_sec=total.examples_per_sec,
                replica_examples_per_sec=list(total.replica_examples_per_sec),
            )
            if total.flops_per_sec is not None:
                result["flops_per_sec"] = total.flops_per_sec
            if total.mfu is not None:
                result["mfu"] = total.mfu
        return result


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """``(min, max, skew)`` of positive rates; skew is ``(max - min) / max`` (0 = all equal).

    Examples:
    >>> spread([90.0, 100.0])
    (90.0, 100.0, 0.1)
    """
    if not values:
        raise ValueError("spread() needs at least one value.")
    low, high = min(values), max(values)
    skew = 0.0 if high <= 0 else (high - low) / high
    return low, high, skew


DEFAULT_LOG_EVERY_N_STEPS = 100
"""Window length when the job's length is unknown or long (the overhead goal's setting)."""
DEFAULT_WARMUP_STEPS = 10
"""Warm-up when the job's length is unknown or long."""
WINDOWS_IN_A_SHORT_JOB = 8
"""Windows a job shorter than ``8 x 100`` steps is cut into by the automatic rule."""


def window_plan(
    total_steps: int | None,
    *,
    log_every_n_steps: int | None = None,
    warmup_steps: int | None = None,
) -> tuple[int, int]:
    """The window length and warm-up for a job of ``total_steps`` steps. Pure.

    Given values are kept. Otherwise, for a job of known length, the warm-up is a tenth of
    it (at least 1, at most :data:`DEFAULT_WARMUP_STEPS`) and the rest is cut into
    :data:`WINDOWS_IN_A_SHORT_JOB` windows (at least 1 step, at most
    :data:`DEFAULT_LOG_EVERY_N_STEPS`): a job of 20 steps gets 9 windows of 2 steps, a job
    of 4 steps 3 windows of 1 step, and a long job the defaults, whose overhead is measured
    in ``benchmarks/``. Unknown length: the defaults.

    Args:
        total_steps: the steps ``fit`` will run (steps per epoch x epochs), None if unknown.
        log_every_n_steps: the user's window length, or None for the rule.
        warmup_steps: the user's warm-up, or None for the rule.

    Returns:
        ``(log_every_n_steps, warmup_steps)``.
    """
    if warmup_steps is None:
        warmup_steps = (
            DEFAULT_WARMUP_STEPS
            if not total_steps
            else min(DEFAULT_WARMUP_STEPS, max(1, total_steps // 10))
        )
    if log_every_n_steps is None:
        log_every_n_steps = (
            DEFAULT_LOG_EVERY_N_STEPS
            if not total_steps
            else min(
                DEFAULT_LOG_EVERY_N_STEPS,
                max(1, (total_steps - warmup_steps) // WINDOWS_IN_A_SHORT_JOB),
            )
        )
    return log_every_n_steps, warmup_steps
