"""PausableClock: host seconds that stand still while any named pause is held.

The tests give it a clock they move by hand, and compare with the running time summed here
from the timeline: the spans in which no pause was held.
"""

from __future__ import annotations

import pytest

from tfdp_utils.throughput._clock import PausableClock

pytestmark = pytest.mark.pure


class HandClock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def hand() -> HandClock:
    return HandClock()


def test_it_runs_with_the_host_clock_until_paused(hand: HandClock) -> None:
    clock = PausableClock(hand)
    start = clock.now()
    hand.now += 2.5
    assert clock.now() - start == 2.5


def test_a_pause_stops_it_and_the_resume_says_how_long_it_stood(hand: HandClock) -> None:
    clock = PausableClock(hand)
    start = clock.now()
    hand.now += 1.0
    clock.pause()
    assert clock.held("validation")
    hand.now += 4.0
    assert clock.now() - start == 1.0  # stands still while paused
    assert clock.resume() == 4.0
    assert not clock.held("validation")
    hand.now += 0.5
    assert clock.now() - start == 1.5  # runs on from where it stopped


def test_one_pause_ending_does_not_restart_it_while_another_is_held(hand: HandClock) -> None:
    clock = PausableClock(hand)
    start = clock.now()
    clock.pause("epoch_start")
    hand.now += 1.0
    clock.pause("validation")
    hand.now += 2.0
    assert clock.resume("epoch_start") == 0.0  # validation still holds it
    assert clock.held("validation") and not clock.held("epoch_start")
    hand.now += 3.0
    assert clock.now() == start
    assert clock.resume("validation") == 6.0  # since the clock first stopped
    hand.now += 1.0
    assert clock.now() - start == 1.0


def test_resuming_a_pause_that_is_not_held_changes_nothing(hand: HandClock) -> None:
    clock = PausableClock(hand)
    start = clock.now()
    assert clock.resume("validation") == 0.0
    clock.pause("validation")
    hand.now += 2.0
    assert clock.resume("epoch_start") == 0.0
    assert clock.held("validation")
    assert clock.now() == start


def test_a_reason_paused_twice_is_released_by_one_resume(hand: HandClock) -> None:
    clock = PausableClock(hand)
    clock.pause("validation")
    hand.now += 1.0
    clock.pause("validation")  # the reason is held or not; pauses are not counted
    hand.now += 1.0
    assert clock.resume("validation") == 2.0
    assert not clock.held("validation")


# A timeline of (seconds since start, action, reason); the clock is read after each event.
TIMELINES = [
    [(1, "pause", "validation"), (3, "resume", "validation"), (7, "read", "")],
    [
        (0, "pause", "epoch_start"),
        (2, "resume", "epoch_start"),
        (5, "pause", "validation"),
        (6, "pause", "epoch_start"),
        (8, "resume", "validation"),
        (9, "resume", "epoch_start"),
        (12, "read", ""),
    ],
    [
        (1, "pause", "a"),
        (2, "pause", "b"),
        (3, "resume", "a"),
        (4, "pause", "a"),
        (5, "resume", "b"),
        (6, "resume", "a"),
        (6, "pause", "b"),
        (10, "resume", "b"),
        (11, "read", ""),
    ],
    [(2, "resume", "x"), (3, "pause", "x"), (4, "resume", "y"), (9, "read", "")],
]


@pytest.mark.parametrize("timeline", TIMELINES)
def test_it_counts_exactly_the_spans_in_which_no_pause_is_held(
    hand: HandClock, timeline: list[tuple[float, str, str]]
) -> None:
    clock = PausableClock(hand)
    origin = hand.now
    start = clock.now()
    held: set[str] = set()
    running, last = 0.0, 0.0
    for at, action, reason in timeline:
        if not held:
            running += at - last
        last = at
        if action == "pause":
            held.add(reason)
        elif action == "resume":
            held.discard(reason)
        hand.now = origin + at
        if action == "pause":
            clock.pause(reason)
        elif action == "resume":
            clock.resume(reason)
        assert clock.now() - start == running, (at, action, reason)


@pytest.mark.parametrize(
    ("span", "running"),
    [
        pytest.param((500.0, 505.0), 5.0, id="before-any-pause"),
        pytest.param((508.0, 512.0), 2.0, id="across-a-pause-start"),
        pytest.param((511.0, 514.0), 0.0, id="inside-a-pause"),
        pytest.param((513.0, 517.0), 2.0, id="across-a-pause-end"),
        pytest.param((509.0, 522.0), 5.0, id="across-two-pauses"),
        pytest.param((523.0, 530.0), 2.0, id="into-the-open-pause"),
    ],
)
def test_running_within_leaves_out_the_paused_parts(
    hand: HandClock, span: tuple[float, float], running: float
) -> None:
    # Timeline: runs 500-510, paused 510-515 (epoch start), runs 515-518, paused 518-521
    # (validation, with an epoch start held inside it), runs 521-525, paused from 525 on.
    clock = PausableClock(hand)
    for at, action, reason in [
        (510.0, "pause", "epoch_start"),
        (515.0, "resume", "epoch_start"),
        (518.0, "pause", "validation"),
        (519.0, "pause", "epoch_start"),
        (520.0, "resume", "epoch_start"),
        (521.0, "resume", "validation"),
        (525.0, "pause", "epoch_start"),
    ]:
        hand.now = at
        getattr(clock, action)(reason)
    hand.now = 530.0
    assert clock.running_within([span]) == pytest.approx(running)
    # Several spans at once: each counted alone, and the sum of their parts.
    spans = [(500.0, 505.0), (508.0, 512.0), (513.0, 517.0)]
    assert clock.running_within(spans) == pytest.approx(5.0 + 2.0 + 2.0)
