"""The stages' timing passes, their windows scripted: the rates the slow-stage rule is given
when the budget stops the timing part way (the rule itself: test_input_report.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tfdp_utils.data import _stage_timing
from tfdp_utils.data._input_figures import Stage, bottleneck

CUTS = [(0, True), (1, True), (2, True)]


class _Windows:
    """Stands in for one stage's timed window: the next scripted rate, and ``stop`` set once
    ``windows`` have been timed (the caller's budget running out)."""

    def __init__(self, rates: list[float], windows: int) -> None:
        self.rates, self.windows, self.stop = list(rates), windows, threading.Event()

    def __call__(self, node: Any, options: Any, **kwargs: Any) -> float:
        rate = self.rates.pop(0)
        if len(self.rates) <= len(CUTS) * _stage_timing.STAGE_PASSES - self.windows:
            self.stop.set()
        return rate


def _timed(monkeypatch: pytest.MonkeyPatch, rates: list[float], windows: int) -> list[Any]:
    script = _Windows(rates, windows)
    monkeypatch.setattr(_stage_timing, "_time_stage", script)
    stages: list[tuple[Any, Any]] = [(None, f"node-{i}") for i in range(len(CUTS))]
    timed = _stage_timing.time_stages(
        stages, CUTS, None, chunk=8, limit=64, seconds=1.0, stop=script.stop
    )
    return [timed[i] for i in range(len(CUTS))]


def test_both_passes_keep_the_faster_window_of_each_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first pass's last window is slowed by load; the second pass times it again.
    rates = _timed(monkeypatch, [1_000, 1_000, 600, 900, 950, 990], windows=6)
    assert rates == [1_000, 1_000, 990]


def test_a_second_pass_cut_short_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stopped after the second pass timed two stages again, faster (the load eased): kept,
    # they would stand apart from the third stage's one window, which would then look slow.
    rates = _timed(monkeypatch, [1_000, 1_000, 1_000, 1_400, 1_400, 0], windows=5)
    assert rates == [1_000, 1_000, 1_000]
    stages = tuple(Stage(f"s{i}", "map", examples_per_sec=rate) for i, rate in enumerate(rates))
    assert bottleneck(stages, input_rate=1_000) == 0  # the source is the limit, as it is


def test_a_first_pass_cut_short_keeps_the_stages_it_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    rates = _timed(monkeypatch, [1_000, 800, 0, 0, 0, 0], windows=2)
    assert rates == [1_000, 800, None]
