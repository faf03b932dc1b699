"""Helper threads' TensorFlow calls end before the interpreter finalizes (``_helper_calls``),
without TensorFlow: marks, the refusal once the exit began, the bounded wait and its WARNING.

The real process (a helper thread's TensorFlow call returning while Python finalizes) is in
tests/test_crash_exits.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from tfdp_utils import _helper_calls

pytestmark = pytest.mark.pure


@pytest.fixture
def calls() -> Iterator[None]:
    _helper_calls.reopen()
    yield
    _helper_calls.reopen()


def _in_thread(target: object) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)  # type: ignore[arg-type]
    thread.start()
    return thread


def test_the_exit_waits_for_a_call_in_flight_then_refuses_new_ones(calls: None) -> None:
    entered, release, ended = threading.Event(), threading.Event(), []

    def helper() -> None:
        with _helper_calls.call("a slow read"):
            entered.set()
            release.wait(5)
        ended.append(time.monotonic())

    _in_thread(helper)
    assert entered.wait(5)
    assert _helper_calls.in_flight()[0].startswith("a slow read (")
    threading.Timer(0.3, release.set).start()
    started = time.monotonic()
    assert _helper_calls.drain(bound=5) == []
    assert ended and ended[0] >= started  # drain returned after the call had ended
    refused: list[BaseException] = []

    def late() -> None:
        try:
            with _helper_calls.call("a late read"):
                pass
        except _helper_calls.Closed as error:
            refused.append(error)

    _in_thread(late).join(5)
    assert refused and "a late read: not started, the interpreter is exiting" in str(refused[0])


def test_a_call_that_outlives_the_bound_is_named(calls: None, caplog) -> None:
    entered, release = threading.Event(), threading.Event()

    def helper() -> None:
        with _helper_calls.call("a write of 'k' to the coordination service"):
            entered.set()
            release.wait(10)

    _in_thread(helper)
    assert entered.wait(5)
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        left = _helper_calls.drain(bound=0.2)
    release.set()
    assert len(left) == 1 and left[0].startswith("a write of 'k' to the coordination service")
    assert "still inside a TensorFlow call at exit after 0.2 s" in caplog.text


def test_the_main_threads_calls_are_not_marked_nor_refused(calls: None) -> None:
    _helper_calls.drain(bound=0)
    with _helper_calls.call("the exit barrier's own read"):
        assert _helper_calls.in_flight() == []


def test_nested_calls_of_one_thread_are_waited_for_to_the_outer_end(calls: None) -> None:
    inner_done, release = threading.Event(), threading.Event()

    def helper() -> None:
        with _helper_calls.call("outer"):
            with _helper_calls.call("inner"):
                pass
            inner_done.set()
            release.wait(5)

    _in_thread(helper)
    assert inner_done.wait(5)
    assert [c.split(" (")[0] for c in _helper_calls.in_flight()] == ["outer"]
    release.set()
    assert _helper_calls.drain(bound=5) == []
