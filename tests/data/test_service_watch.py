"""ServiceWatch: the bound on a wait for the tf.data service, on a clock the test moves."""

from __future__ import annotations

import pytest

from tfdp_utils.data.service._watch import ServiceWatch

pytestmark = pytest.mark.pure


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _watch(clock: Clock, aborted: list[str]) -> ServiceWatch:
    # A long poll: the test calls check() itself, the watch's thread never does.
    return ServiceWatch("grpc://host:5050", 5.0, abort=aborted.append, clock=clock, poll=3600)


def test_an_unanswered_request_ends_the_wait_at_the_bound() -> None:
    clock, aborted = Clock(), []
    watch = _watch(clock, aborted)
    watch.asked(0)
    watch.arrived(0, 4)
    watch.asked(1)
    clock.now += 4.9
    assert watch.check() is None
    clock.now += 0.2
    message = watch.check()
    assert message is not None and aborted == [message]
    assert "waited 5 s" in message and "grpc://host:5050" in message
    assert "service_timeout=5 s" in message and "TFDP_SERVICE_TIMEOUT" in message


def test_a_partial_chunk_then_a_request_still_counts_as_waiting() -> None:
    # The case of a service worker that dies after its last, partial chunk: the trainer's
    # batch is unfinished and it asks again at once; nothing downstream is taken.
    clock, aborted = Clock(), []
    watch = _watch(clock, aborted)
    for index in range(3):
        watch.asked(index)
        clock.now += 0.1
        watch.arrived(index, 4 if index < 2 else 2)
    watch.asked(3)
    clock.now += 6
    assert watch.check() is not None


def test_a_paused_trainer_that_stops_asking_is_not_waiting() -> None:
    clock, aborted = Clock(), []
    watch = _watch(clock, aborted)
    watch.asked(0)
    watch.arrived(0, 4)
    clock.now += 3600  # buffers full, no request in flight
    assert watch.check() is None and aborted == []


def test_marks_from_other_threads_in_any_order() -> None:
    # Request 2 marked before the arrival of chunk 1: chunk 1 must not answer request 2.
    clock, aborted = Clock(), []
    watch = _watch(clock, aborted)
    watch.asked(0)
    watch.arrived(0, 4)
    watch.asked(1)
    watch.asked(2)
    watch.arrived(1, 4)
    assert watch.pending_since == pytest.approx(100.0)
    clock.now += 6
    assert watch.check() is not None


def test_requests_after_the_end_of_a_read_are_not_waits_and_a_new_read_is() -> None:
    clock, aborted = Clock(), []
    watch = _watch(clock, aborted)
    watch.asked(0)
    watch.arrived(0, 4)
    watch.asked(1)
    watch.asked(2)  # marked before the end's arrival: dropped with it
    watch.arrived(1, 0)  # the end of the read
    watch.asked(3)  # answered by the end of the data, not by a chunk
    clock.now += 60
    assert watch.check() is None and watch.pending_since is None
    watch.asked(0)  # the next epoch's read
    clock.now += 6
    assert watch.check() is not None


def test_progress_lines_name_the_wait_before_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    clock, aborted = Clock(), []
    watch = ServiceWatch(
        "grpc://host:5050",
        100.0,
        abort=aborted.append,
        clock=clock,
        poll=3600,
        progress_interval=30,
    )
    watch.asked(0)
    with caplog.at_level("WARNING", logger="tfdp_utils"):
        for _ in range(4):
            clock.now += 15
            assert watch.check() is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert all("grpc://host:5050" in line and "TFDP_SERVICE_TIMEOUT" in line for line in lines)
