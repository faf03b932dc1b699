"""The preemption notice without TensorFlow: which signals, the noting handler, the exit status.

``signal_numbers`` turns what a user passes as ``signals=`` into catchable signals or refuses it
with a message naming what it received and what it expects; a :class:`Notice` keeps the first
signal and counts the rest; :class:`SignalHandlers` installs on the main thread only and
``restore()`` puts the previous handlers back. Real signals (SIGUSR1, SIGUSR2) are sent to this
process, with the original handlers put back in ``finally``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tfdp_utils.preemption import _signals
from tfdp_utils.preemption._signals import (
    PREEMPTED_EXIT_STATUS,
    Notice,
    SignalHandlers,
    signal_numbers,
)

pytestmark = pytest.mark.pure


def test_the_preempted_exit_status_is_75_ex_tempfail() -> None:
    assert PREEMPTED_EXIT_STATUS == 75
    assert PREEMPTED_EXIT_STATUS == os.EX_TEMPFAIL


def test_the_exit_status_is_public_in_the_preemption_package() -> None:
    import tfdp_utils.preemption as preemption

    assert preemption.PREEMPTED_EXIT_STATUS == 75


def test_the_default_notice_is_sigterm() -> None:
    assert signal_numbers(_signals.DEFAULT_SIGNALS) == (signal.SIGTERM,)


@pytest.mark.parametrize(
    "given",
    ["SIGTERM", "TERM", "sigterm", "term", 15, signal.SIGTERM, ["SIGTERM"], ("TERM",), [15]],
)
def test_a_signal_is_accepted_by_name_number_or_enum_alone_or_in_a_list(given: Any) -> None:
    numbers = signal_numbers(given)
    assert numbers == (signal.SIGTERM,)
    assert all(isinstance(number, signal.Signals) for number in numbers)


def test_several_signals_keep_their_order_without_repeats() -> None:
    given = ["SIGUSR1", "SIGTERM", "TERM", 15, signal.SIGUSR1, "usr2"]
    assert signal_numbers(given) == (signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR2)


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ("SIGKILL", "SIGKILL"),
        ("KILL", "SIGKILL"),
        (9, "SIGKILL"),
        (signal.SIGKILL, "SIGKILL"),
        ("SIGSTOP", "SIGSTOP"),
        (signal.SIGSTOP, "SIGSTOP"),
        (["SIGTERM", "SIGKILL"], "SIGKILL"),
    ],
)
def test_a_signal_that_cannot_be_caught_is_refused_by_name(given: Any, named: str) -> None:
    with pytest.raises(ValueError) as raised:
        signal_numbers(given)
    message = str(raised.value)
    assert named in message
    assert "cannot be caught" in message
    assert "SIGTERM" in message  # what to pass instead


@pytest.mark.parametrize("given", ["SIGINT", "int", 2, signal.SIGINT, ["SIGUSR1", "INT"]])
def test_sigint_is_refused_because_ctrl_c_must_stay_an_interrupt(given: Any) -> None:
    with pytest.raises(ValueError) as raised:
        signal_numbers(given)
    message = str(raised.value)
    assert "SIGINT" in message and "Ctrl-C" in message
    assert "SIGTERM" in message


@pytest.mark.parametrize("given", ["SIGNOPE", "NOPE", "", 999, -1, ["SIGTERM", "SIGTREM"]])
def test_an_unknown_signal_is_refused_naming_what_was_received(given: Any) -> None:
    received = given[-1] if isinstance(given, list) else given
    with pytest.raises(ValueError) as raised:
        signal_numbers(given)
    message = str(raised.value)
    assert repr(received) in message
    assert "not a signal" in message
    assert "'SIGTERM'" in message  # an example of what is expected


@pytest.mark.parametrize("given", [15.0, None, b"SIGTERM", {"SIGTERM"}, object()])
def test_a_value_that_is_not_a_list_of_signals_is_a_type_error(given: Any) -> None:
    with pytest.raises(TypeError) as raised:
        signal_numbers(given)
    message = str(raised.value)
    assert repr(given) in message
    assert "not a list of signals" in message
    assert "SIGTERM" in message


@pytest.mark.parametrize(
    ("item", "type_name"), [(None, "NoneType"), (15.0, "float"), (True, "bool"), (b"x", "bytes")]
)
def test_an_item_that_is_not_a_name_or_number_is_a_type_error_naming_its_type(
    item: Any, type_name: str
) -> None:
    with pytest.raises(TypeError) as raised:
        signal_numbers(["SIGTERM", item])
    message = str(raised.value)
    assert repr(item) in message and type_name in message
    assert "'SIGTERM'" in message and "signal number" in message


def test_true_is_not_taken_for_signal_one() -> None:
    with pytest.raises(TypeError, match="bool"):
        signal_numbers(True)


def test_an_empty_list_is_refused_because_no_notice_could_arrive() -> None:
    for empty in ([], ()):
        with pytest.raises(ValueError) as raised:
            signal_numbers(empty)
        assert "signals=[]" in str(raised.value)
        assert "'SIGTERM'" in str(raised.value)


def test_a_fresh_notice_has_received_nothing() -> None:
    notice = Notice()
    assert notice.received is False
    assert (notice.signal_name, notice.received_at, notice.count) == (None, None, 0)


def test_a_notice_records_the_first_signal_and_counts_the_repeats() -> None:
    notice = Notice()
    before = time.monotonic()
    notice.note(signal.SIGUSR1)
    after = time.monotonic()
    assert notice.received is True
    assert notice.signal_name == "SIGUSR1"
    assert notice.received_at is not None and before <= notice.received_at <= after
    first_at = notice.received_at
    notice.note(int(signal.SIGTERM))
    notice.note(signal.SIGUSR1)
    assert notice.signal_name == "SIGUSR1"  # the first one stays
    assert notice.received_at == first_at
    assert notice.count == 3


class Previous:
    """A stand-in for the handler that was there before: it counts its calls."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, number: int, frame: Any) -> None:
        self.calls.append(number)


@pytest.fixture
def previous() -> Iterator[Previous]:
    """SIGUSR1 and SIGUSR2 handled by a counting :class:`Previous`; the originals put back."""
    handler = Previous()
    originals = {number: signal.getsignal(number) for number in (signal.SIGUSR1, signal.SIGUSR2)}
    try:
        for number in originals:
            signal.signal(number, handler)
        yield handler
    finally:
        for number, original in originals.items():
            signal.signal(number, original if original is not None else signal.SIG_DFL)


def _send(number: signal.Signals, arrived: Any) -> None:
    """Send ``number`` to this process and wait (1 s at most) until ``arrived()`` is true."""
    os.kill(os.getpid(), number)
    deadline = time.monotonic() + 1.0
    while not arrived() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_installed_handlers_note_real_signals_instead_of_the_previous_handler(
    previous: Previous,
) -> None:
    notice = Notice()
    handlers = SignalHandlers((signal.SIGUSR1, signal.SIGUSR2), notice)
    try:
        assert handlers.installed is True
        _send(signal.SIGUSR2, lambda: notice.count >= 1)
        assert notice.signal_name == "SIGUSR2"
        assert notice.count == 1
        _send(signal.SIGUSR1, lambda: notice.count >= 2)
        assert notice.count == 2
        assert notice.signal_name == "SIGUSR2"
        assert previous.calls == []  # the noting handler replaced it
    finally:
        handlers.restore()


def test_restore_puts_the_previous_handlers_back(previous: Previous) -> None:
    notice = Notice()
    handlers = SignalHandlers((signal.SIGUSR1, signal.SIGUSR2), notice)
    handlers.restore()
    assert handlers.installed is False
    assert signal.getsignal(signal.SIGUSR1) is previous
    assert signal.getsignal(signal.SIGUSR2) is previous
    _send(signal.SIGUSR1, lambda: len(previous.calls) >= 1)
    assert previous.calls == [signal.SIGUSR1]
    assert notice.count == 0 and notice.received is False


def test_restore_twice_changes_nothing_more(previous: Previous) -> None:
    handlers = SignalHandlers((signal.SIGUSR1,), Notice())
    handlers.restore()
    later = Previous()
    signal.signal(signal.SIGUSR1, later)
    handlers.restore()
    assert signal.getsignal(signal.SIGUSR1) is later


def test_restore_leaves_a_handler_installed_after_ours_in_place(previous: Previous) -> None:
    handlers = SignalHandlers((signal.SIGUSR1, signal.SIGUSR2), Notice())
    mine = Previous()
    try:
        signal.signal(signal.SIGUSR1, mine)  # someone else took SIGUSR1 after us
    finally:
        handlers.restore()
    assert signal.getsignal(signal.SIGUSR1) is mine
    assert signal.getsignal(signal.SIGUSR2) is previous


def test_off_the_main_thread_nothing_is_installed(previous: Previous) -> None:
    notice = Notice()
    made: list[SignalHandlers] = []
    errors: list[BaseException] = []

    def make() -> None:
        try:
            handlers = SignalHandlers((signal.SIGUSR1, signal.SIGUSR2), notice)
            made.append(handlers)
            handlers.restore()
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join(timeout=5)
    assert errors == []
    assert len(made) == 1 and made[0].installed is False
    assert signal.getsignal(signal.SIGUSR1) is previous
    assert signal.getsignal(signal.SIGUSR2) is previous
    _send(signal.SIGUSR1, lambda: len(previous.calls) >= 1)
    assert previous.calls == [signal.SIGUSR1]
    assert notice.count == 0
