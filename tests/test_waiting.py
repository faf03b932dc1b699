"""WaitProgress: a WARNING line every interval of a bounded wait, on a clock the test moves.

Pure. A line says what is awaited, for how long so far, the bound and how to change it; the
"what" is asked again at each line, so it can shrink as the wait goes on.
"""

from __future__ import annotations

import logging

import pytest

from tfdp_utils import _waiting as waiting
from tfdp_utils._waiting import WaitProgress

pytestmark = pytest.mark.pure


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


CHANGE = "auto_strategy(cluster_timeout=SECONDS) or TFDP_CLUSTER_TIMEOUT"


def progress(
    clock: Clock, *, bound: float = 300, interval: float = 30, start: float | None = None
) -> WaitProgress:
    return WaitProgress(
        "peer task(s) worker:1 at 10.0.0.2:2222",
        bound=bound,
        change=CHANGE,
        interval=interval,
        clock=clock,
        start=start,
    )


def seconds_in(lines: list[str]) -> list[str]:
    return [line.split(" after ")[1].split(" s ")[0] for line in lines]


def test_a_line_names_what_is_awaited_the_time_so_far_the_bound_and_the_fix() -> None:
    clock = Clock()
    wait = progress(clock)
    clock.now += 30
    wait.tick()
    assert wait.lines == [
        "tfdp_utils: still waiting for peer task(s) worker:1 at 10.0.0.2:2222 after 30 s "
        "(bound 300 s; change it with auto_strategy(cluster_timeout=SECONDS) or "
        "TFDP_CLUSTER_TIMEOUT)"
    ]


@pytest.mark.parametrize(
    ("ticks", "expected"),
    [
        ([], []),
        ([0, 10, 29.9], []),  # nothing before the first interval
        ([30], ["30"]),
        ([30, 31, 59.9], ["30"]),  # at most one line per interval
        ([30, 60, 90], ["30", "60", "90"]),
        # The next line is an interval after the last one, not on a fixed grid.
        ([45, 60, 74.9, 75, 200], ["45", "75", "200"]),
        ([400], ["400"]),  # a late tick logs once, however many intervals it missed
    ],
)
def test_lines_come_once_per_interval_after_the_last_one(
    ticks: list[float], expected: list[str]
) -> None:
    clock = Clock()
    wait = progress(clock)
    for offset in ticks:
        clock.now = 1000.0 + offset
        wait.tick()
    assert seconds_in(wait.lines) == expected


def test_lines_are_logged_at_warning_on_the_package_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    wait = progress(clock, interval=5)
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        for _ in range(3):
            clock.now += 5
            wait.tick()
    records = [r for r in caplog.records if r.name == "tfdp_utils"]
    assert [r.levelno for r in records] == [logging.WARNING] * 3
    assert [r.getMessage() for r in records] == wait.lines


def test_a_callable_what_is_asked_again_at_each_line() -> None:
    clock = Clock()
    pending = ["worker:1", "worker:2"]
    asked: list[int] = []

    def what() -> str:
        asked.append(len(pending))
        return f"{len(pending)} peer task(s): {', '.join(pending)}"

    wait = WaitProgress(what, bound=60, change="X", interval=10, clock=clock)
    clock.now += 5
    wait.tick()
    assert asked == []  # not asked when no line is due
    clock.now += 5
    wait.tick()
    pending.pop(0)
    clock.now += 10
    wait.tick()
    assert [line.split(" after ")[0] for line in wait.lines] == [
        "tfdp_utils: still waiting for 2 peer task(s): worker:1, worker:2",
        "tfdp_utils: still waiting for 1 peer task(s): worker:2",
    ]


def test_a_given_start_counts_the_time_already_waited() -> None:
    clock = Clock(1000.0)
    wait = progress(clock, start=980.0)
    clock.now = 1009.0
    wait.tick()
    assert wait.lines == []
    clock.now = 1010.0
    wait.tick()
    assert seconds_in(wait.lines) == ["30"]


@pytest.mark.parametrize(("bound", "shown"), [(300, "300"), (1.5, "1.5"), (0.25, "0.25")])
def test_the_bound_is_shown_without_trailing_zeros(bound: float, shown: str) -> None:
    clock = Clock()
    wait = progress(clock, bound=bound)
    clock.now += 30
    wait.tick()
    assert f"(bound {shown} s; " in wait.lines[0]


def test_the_default_interval_is_read_when_the_wait_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert waiting.PROGRESS_INTERVAL == 30.0
    monkeypatch.setattr(waiting, "PROGRESS_INTERVAL", 2.0)
    clock = Clock()
    wait = WaitProgress("x", bound=10, change="Y", clock=clock)
    assert wait.interval == 2.0
    monkeypatch.setattr(waiting, "PROGRESS_INTERVAL", 100.0)  # too late for this wait
    clock.now += 2
    wait.tick()
    assert len(wait.lines) == 1
