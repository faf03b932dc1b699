"""Ctrl-C heard from a helper thread, and the abort it makes of a call that holds the worker.

The real case (a 2-worker job, Ctrl-C inside an all-reduce) is in test_scale_out_stuck.py;
here the pieces: the wakeup socket hears SIGINT in its own thread, and :class:`CtrlCAbort`
aborts only a call that holds the training thread, ends the process only when the abort
cannot end it, and leaves a call that returns by itself alone.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from tfdp_utils import _interrupts
from tfdp_utils.strategy._ctrl_c import CtrlCAbort, interrupt_message

pytestmark = pytest.mark.pure


@pytest.fixture
def quiet_sigint() -> Iterator[None]:
    """SIGINT handled by a Python handler that does nothing (the test process goes on)."""
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        yield
    finally:
        _interrupts.uninstall()
        signal.signal(signal.SIGINT, previous)


def test_sigint_is_heard_in_the_reader_thread_and_the_listener_can_be_removed(quiet_sigint):
    heard: list[str] = []
    event = threading.Event()

    def listener() -> None:
        heard.append(threading.current_thread().name)
        event.set()

    remove = _interrupts.listen(listener)
    assert remove is not None and _interrupts.installed()
    os.kill(os.getpid(), signal.SIGINT)
    assert event.wait(5), "the listener was not called"
    assert heard == ["tfdp-interrupts"]
    remove()
    event.clear()
    os.kill(os.getpid(), signal.SIGINT)
    assert not event.wait(0.5) and heard == ["tfdp-interrupts"]
    _interrupts.uninstall()
    assert signal.set_wakeup_fd(-1) == -1  # the process's wakeup descriptor is put back


def test_another_wakeup_descriptor_is_left_in_place(quiet_sigint):
    import socket

    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno())
    try:
        assert _interrupts.listen(lambda: None) is None
        assert signal.set_wakeup_fd(writer.fileno()) == writer.fileno()  # still the program's
    finally:
        signal.set_wakeup_fd(-1)
        reader.close()
        writer.close()


def test_listen_off_the_main_thread_is_refused(quiet_sigint):
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(_interrupts.listen(lambda: None)))
    thread.start()
    thread.join(5)
    assert results == [None] and not _interrupts.installed()


def _blocked_thread() -> tuple[threading.Thread, threading.Event]:
    release = threading.Event()
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    return thread, release


def _wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_held_call_is_aborted_after_the_settle_time():
    thread, release = _blocked_thread()
    aborted: list[tuple[float, str]] = []
    ended: list[str] = []

    def abort(message: str) -> None:
        aborted.append((time.monotonic(), message))
        release.set()  # the call returns, as an aborted collective does

    guard = CtrlCAbort(
        thread.ident,
        in_call=lambda f: True,
        abort=abort,
        end=ended.append,
        settle=0.5,
        end_after=1.0,
        interval=0.02,
    )
    start = time.monotonic()
    guard.on_interrupt()
    _wait_for(lambda: bool(aborted))
    thread.join(5)
    time.sleep(1.3)  # past end_after: the call returned, so nothing ends the process
    assert len(aborted) == 1 and ended == []
    at, message = aborted[0]
    assert 0.5 <= at - start < 0.5 + 1.0  # this test's clock: after the settle time, soon
    assert message == guard.fired
    assert message.startswith(
        "tfdp-utils: Ctrl-C (SIGINT) reached this worker while it waited "
        "inside a multi-worker call (wait in threading.py)"
    )


def test_a_call_that_returns_by_itself_is_left_alone():
    thread, release = _blocked_thread()
    aborted: list[str] = []
    guard = CtrlCAbort(
        thread.ident,
        in_call=lambda f: True,
        abort=aborted.append,
        end=aborted.append,
        settle=1.0,
        interval=0.02,
    )
    guard.on_interrupt()
    time.sleep(0.2)
    release.set()  # Ctrl-C lands in Python as usual
    thread.join(5)
    time.sleep(1.2)
    assert aborted == [] and guard.fired is None


def test_a_thread_outside_tensorflow_is_left_alone():
    thread, release = _blocked_thread()
    aborted: list[str] = []
    guard = CtrlCAbort(
        thread.ident,
        in_call=lambda f: False,
        abort=aborted.append,
        end=aborted.append,
        settle=0.2,
        interval=0.02,
    )
    guard.on_interrupt()
    time.sleep(0.6)
    release.set()
    assert aborted == [] and guard.fired is None


def test_a_call_the_abort_cannot_end_ends_the_process_after_end_after():
    thread, release = _blocked_thread()
    aborted: list[float] = []
    ended: list[tuple[float, str]] = []
    guard = CtrlCAbort(
        thread.ident,
        in_call=lambda f: True,
        abort=lambda m: aborted.append(time.monotonic()),
        end=lambda m: ended.append((time.monotonic(), m)),
        settle=0.2,
        end_after=1.0,
        interval=0.02,
    )
    try:
        guard.on_interrupt()
        guard.on_interrupt()  # a second Ctrl-C while the first is handled: one abort
        _wait_for(lambda: bool(ended))
    finally:
        release.set()
    assert len(aborted) == 1 and len(ended) == 1
    at, message = ended[0]
    assert 1.0 <= at - aborted[0] < 1.0 + 1.0
    assert message.startswith(interrupt_message("wait in threading.py"))
    assert message.endswith(
        "The call has not returned 1 s after the abort, so the process ends now (status 130)."
    )
