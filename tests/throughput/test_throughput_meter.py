"""ThroughputMeter: the pure accumulator, tested without TensorFlow."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfdp_utils.throughput._meter import ThroughputMeter, spread, window_plan

pytestmark = pytest.mark.pure


def test_rates_cover_the_window_since_the_previous_update() -> None:
    meter = ThroughputMeter(num_replicas=2)
    assert meter.update(step=0, time=10.0, replica_examples=[0, 0]) is None
    window = meter.update(step=100, time=12.0, replica_examples=[800, 600])
    assert window is not None
    assert window.steps == 100
    assert window.seconds == pytest.approx(2.0)
    assert window.steps_per_sec == pytest.approx(50.0)
    assert window.replica_examples_per_sec == pytest.approx((400.0, 300.0))
    assert window.examples_per_sec == pytest.approx(700.0)
    assert window.examples == 1400
    second = meter.update(step=150, time=13.0, replica_examples=[1000, 800])
    assert second is not None
    assert second.steps_per_sec == pytest.approx(50.0)
    assert second.examples_per_sec == pytest.approx(400.0)


def test_warmup_steps_are_left_out_of_every_rate() -> None:
    meter = ThroughputMeter(warmup_steps=10)
    assert meter.update(step=0, time=0.0, replica_examples=[0]) is None
    # A slow warm-up (tracing): 5 steps in 100 s.
    assert meter.update(step=5, time=100.0, replica_examples=[40]) is None
    assert not meter.warmed_up
    assert meter.update(step=10, time=101.0, replica_examples=[80]) is None
    assert meter.warmed_up
    window = meter.update(step=20, time=102.0, replica_examples=[160])
    assert window is not None and window.examples_per_sec == pytest.approx(80.0)
    summary = meter.summary()
    assert summary["steps_per_sec"] == pytest.approx(10.0)
    assert summary["measured_steps"] == 10
    assert summary["examples"] == 160  # cumulative count includes warm-up examples


def test_warmup_counts_from_the_first_update_not_from_zero() -> None:
    meter = ThroughputMeter(warmup_steps=10)
    meter.update(step=5000, time=0.0, replica_examples=[0])  # a resumed run
    assert meter.update(step=5005, time=1.0, replica_examples=[5]) is None
    assert not meter.warmed_up
    meter.update(step=5010, time=2.0, replica_examples=[10])
    assert meter.warmed_up


def test_flops_and_mfu() -> None:
    meter = ThroughputMeter(num_replicas=4, flops_per_example=1e9, peak_flops_per_replica=1e12)
    meter.update(step=0, time=0.0, replica_examples=[0] * 4)
    window = meter.update(step=10, time=1.0, replica_examples=[100] * 4)
    assert window is not None
    assert window.flops_per_sec == pytest.approx(4e11)
    assert window.mfu == pytest.approx(0.1)
    assert meter.summary()["mfu"] == pytest.approx(0.1)
    plain = ThroughputMeter()
    plain.update(step=0, time=0.0, replica_examples=[0])
    got = plain.update(step=1, time=1.0, replica_examples=[1])
    assert got is not None and got.flops_per_sec is None and got.mfu is None


def test_summary_before_any_window_has_counts_only() -> None:
    meter = ThroughputMeter(warmup_steps=3)
    meter.update(step=0, time=0.0, replica_examples=[7])
    summary = meter.summary()
    assert summary["examples"] == 7 and summary["windows"] == 0
    assert "examples_per_sec" not in summary


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_replicas": 0}, ValueError, "num_replicas=0"),
        ({"warmup_steps": -1}, ValueError, r"warmup_steps=-1\. Pass 0 to measure"),
        ({"warmup_steps": 1.5}, TypeError, r"warmup_steps must be an integer.*1\.5"),
        ({"flops_per_example": -3.0}, ValueError, "flops_per_example=-3.0"),
        ({"peak_flops_per_replica": 1e12}, ValueError, "without flops_per_example"),
    ],
)
def test_bad_arguments_are_explained(kwargs: dict[str, object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ThroughputMeter(**kwargs)  # type: ignore[arg-type]


def test_counters_going_backwards_are_rejected() -> None:
    meter = ThroughputMeter(num_replicas=2)
    meter.update(step=10, time=5.0, replica_examples=[10, 10])
    with pytest.raises(ValueError, match="goes back"):
        meter.update(step=9, time=6.0, replica_examples=[10, 10])
    with pytest.raises(ValueError, match="cumulative"):
        meter.update(step=11, time=6.0, replica_examples=[9, 10])
    with pytest.raises(ValueError, match="one per replica"):
        meter.update(step=11, time=6.0, replica_examples=[10])


def test_spread() -> None:
    assert spread([100.0, 90.0, 95.0]) == (90.0, 100.0, pytest.approx(0.1))
    assert spread([5.0])[2] == 0.0
    with pytest.raises(ValueError, match="at least one"):
        spread([])


@given(
    st.lists(
        st.tuples(st.integers(1, 50), st.floats(0.01, 10.0), st.integers(0, 64)),
        min_size=2,
        max_size=30,
    )
)
def test_total_rate_is_total_examples_over_total_time(
    increments: list[tuple[int, float, int]],
) -> None:
    meter = ThroughputMeter()
    step, now, examples = 0, 0.0, 0
    meter.update(step=step, time=now, replica_examples=[examples])
    for d_step, d_time, d_examples in increments:
        step, now, examples = step + d_step, now + d_time, examples + d_examples
        meter.update(step=step, time=now, replica_examples=[examples])
    total = meter.total()
    assert total is not None
    assert total.examples_per_sec == pytest.approx(examples / now)
    assert total.steps_per_sec == pytest.approx(step / now)
    assert meter.windows == len(increments)


@pytest.mark.parametrize(
    ("total", "expected"),
    [
        (None, (100, 10)),  # unknown length: the defaults
        (0, (100, 10)),
        (4, (1, 1)),  # 3 windows of 1 step after 1 warm-up step
        (20, (2, 2)),  # 9 windows
        (144, (16, 10)),  # the Keras tutorial: 8 windows instead of 1
        (810, (100, 10)),
        (100_000, (100, 10)),  # long jobs keep the overhead-measured setting
    ],
)
def test_window_plan_fits_the_job(total: int | None, expected: tuple[int, int]) -> None:
    every, warmup = window_plan(total)
    assert (every, warmup) == expected
    if total and total >= 2:
        assert (total - warmup) // every >= 2  # a curve, not a lone point


def test_window_plan_keeps_given_values() -> None:
    assert window_plan(20, log_every_n_steps=7) == (7, 2)
    assert window_plan(20, warmup_steps=0) == (2, 0)
    assert window_plan(None, log_every_n_steps=3, warmup_steps=4) == (3, 4)


def test_excluded_steps_and_examples_leave_the_window_and_the_total() -> None:
    # Steps 0..10 warm up; 10..20 measured; an epoch boundary's first step (20..21, 16
    # examples) whose time the caller's clock left out; 21..30 measured.
    meter = ThroughputMeter(num_replicas=2, warmup_steps=10)
    meter.update(step=0, time=0.0, replica_examples=[0, 0])
    meter.update(step=10, time=1.0, replica_examples=[80, 80])
    first = meter.update(step=20, time=2.0, replica_examples=[160, 160])
    meter.exclude(steps=1, replica_examples=[8, 8])
    second = meter.update(step=30, time=2.9, replica_examples=[240, 240])
    assert first is not None and second is not None
    assert (second.step, second.steps, second.examples) == (30, 9, 480)  # axis and counts as given
    assert second.examples_per_sec == pytest.approx(9 * 16 / 0.9)
    summary = meter.summary()
    assert summary["measured_steps"] == 19
    assert summary["examples_per_sec"] == pytest.approx(19 * 16 / 1.9)
    assert summary["examples"] == 480


def test_a_window_of_excluded_steps_only_is_no_window() -> None:
    meter = ThroughputMeter(warmup_steps=0)
    meter.update(step=0, time=0.0, replica_examples=[0])
    meter.exclude(steps=2, replica_examples=[16])
    assert meter.update(step=2, time=0.5, replica_examples=[16]) is None
    assert meter.windows == 0
