"""The input-wait share's arithmetic and the worker it names, on a hand-driven total."""

from __future__ import annotations

import pytest

from tfdp_utils.throughput._input_wait import InputWaitMeter, straggler, verdict

pytestmark = pytest.mark.pure


class Total:
    """A running total of seconds waited, moved by hand."""

    def __init__(self) -> None:
        self.value = 0.0

    def __call__(self) -> float:
        return self.value


def test_a_window_share_is_the_wait_inside_it_over_its_seconds() -> None:
    total = Total()
    meter = InputWaitMeter(total)
    total.value = 3.0
    assert meter.window(10.0) == pytest.approx(0.3)
    total.value = 4.0
    assert meter.window(2.0) == pytest.approx(0.5)
    assert meter.share == pytest.approx(4.0 / 12.0)


def test_waits_while_paused_are_left_out_as_the_logger_clock_leaves_the_time_out() -> None:
    total = Total()
    meter = InputWaitMeter(total)
    total.value = 1.0
    meter.pause("epoch_start")
    total.value = 6.0  # the next epoch's first batch: the pipeline starts again
    meter.resume("epoch_start")
    total.value = 7.0
    assert meter.window(4.0) == pytest.approx(2.0 / 4.0)


def test_a_mark_starts_a_new_window_and_warm_up_is_not_counted() -> None:
    total = Total()
    meter = InputWaitMeter(total)
    total.value = 5.0  # warm-up: tracing, the pipeline filling up
    meter.mark()
    total.value = 5.5
    assert meter.window(1.0) == pytest.approx(0.5)
    assert meter.share == pytest.approx(0.5)


def test_no_window_no_share() -> None:
    assert InputWaitMeter(Total()).share is None


@pytest.mark.parametrize(
    ("shares", "named"),
    [
        ({0: 0.03, 1: 0.62}, 1),
        ({0: 0.62, 1: 0.03}, 0),
        ({0: 0.03, 1: 0.04}, None),  # nobody waits
        ({0: 0.60, 1: 0.62}, None),  # all input-bound alike: no straggler
        ({0: 0.02, 1: 0.09}, None),  # below the share worth naming
        ({0: 0.02, 1: 0.05, 2: 0.40, 3: 0.03}, 2),
        ({0: 0.5}, None),  # one worker: nobody to compare with
        ({0: float("nan"), 1: 0.7}, None),  # one measured worker
    ],
)
def test_the_straggler_is_the_worker_that_waits_clearly_more(
    shares: dict[int, float], named: int | None
) -> None:
    found = straggler(shares)
    assert (None if found is None else found.worker) == named


def test_the_verdicts_name_the_worker_and_input() -> None:
    assert verdict({0: 0.03, 1: 0.62}) == (
        "input: worker 1 is the slowest: it waits for input 62% of the time, the others 3%"
    )
    assert (
        verdict({0: 0.03, 1: 0.04}) == "input wait: no worker stands out (worker 0 3%, worker 1 4%)"
    )
    assert verdict({0: 0.72}) == "input wait: 72% of the time (input-bound)"
    assert verdict({0: 0.2}) == "input wait: 20% of the time"
    assert verdict({}).startswith("input wait: unknown")


def test_an_unknown_share_is_said_with_its_cause() -> None:
    # Under op determinism no worker's share is timed: the verdict names that, not a dataset.
    why = "unknown: op determinism is on (...), which refuses tf.timestamp"
    nan = float("nan")
    for shares in ({}, {0: nan}, {0: nan, 1: nan}):
        assert verdict(shares, unknown=why) == f"input wait: {why}"
        assert "builder dataset" not in verdict(shares)
    # A measured share wins over a note.
    assert verdict({0: 0.2, 1: nan}, unknown=why) == "input wait: 20% of the time"
