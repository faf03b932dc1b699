"""The exit guard's parts, without TensorFlow: statuses, the release, its variables.

Real processes that crash are in tests/test_crash_exits.py.
"""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import weakref
from typing import Any

import pytest
from support.processes import run_python

from tfdp_utils import _exit_guard as guard

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ValueError, 1),
        (RuntimeError, 1),
        (KeyboardInterrupt, 130),
        (SystemExit, None),
        (None, None),
    ],
)
def test_each_uncaught_error_has_its_status(error: Any, status: int | None) -> None:
    assert guard.status_for(error) == status


class Held:
    """An object whose collection a weak reference can see."""


def _fails_holding(held: Held) -> None:
    local = held  # noqa: F841 - the frame's local keeps it alive
    raise ValueError("boom")


def test_releasing_an_uncaught_error_frees_what_its_frames_held(monkeypatch) -> None:
    held = Held()
    alive = weakref.ref(held)
    try:
        _fails_holding(held)
    except ValueError as error:
        monkeypatch.setattr(sys, "last_value", error, raising=False)
        monkeypatch.setattr(sys, "last_traceback", error.__traceback__, raising=False)
    del held
    gc.collect()
    assert alive() is not None  # the kept traceback holds the frame, and the frame the object
    assert guard.release_uncaught() is True
    assert alive() is None
    assert sys.last_value is None and sys.last_traceback is None
    assert guard.release_uncaught() is False  # nothing left to release


def test_chained_errors_are_released_too() -> None:
    held = Held()
    alive = weakref.ref(held)
    try:
        try:
            _fails_holding(held)
        except ValueError as first:
            raise RuntimeError("while handling") from first
    except RuntimeError as error:
        caught = error
    del held
    guard.clear_frames(caught)
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize(
    ("value", "seconds"), [("", guard.DEFAULT_GRACE), ("2.5", 2.5), ("0", None)]
)
def test_the_backstop_grace_comes_from_the_variable(value: str, seconds: float | None) -> None:
    assert guard.grace({"TFDP_EXIT_GRACE": value}) == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", "TFDP_EXIT_GRACE must be a number of seconds, but received TFDP_EXIT_GRACE='abc'"),
        ("-1", "TFDP_EXIT_GRACE must be a number of seconds >= 0, but received"),
    ],
)
def test_a_bad_grace_is_refused(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        guard.grace({"TFDP_EXIT_GRACE": value})


@pytest.mark.parametrize(
    ("value", "wanted"), [("", True), ("1", True), ("0", False), ("off", False)]
)
def test_the_guard_can_be_kept_out(value: str, wanted: bool) -> None:
    assert guard.wanted({"TFDP_EXIT_GUARD": value}) is wanted


def test_an_excepthook_chained_before_the_guard_still_runs() -> None:
    seen: list[str] = []
    hook = guard.make_excepthook(lambda t, e, tb: seen.append(t.__name__))
    hook(KeyboardInterrupt, KeyboardInterrupt(), None)
    assert seen == ["KeyboardInterrupt"]


STUCK = """
import sys, threading, time
from tfdp_utils import _exit_guard as guard

guard.ACTIVE, guard.GRACE = True, float(sys.argv[1]) or None
guard.register_at_exit()
sys.excepthook = guard.make_excepthook(sys.excepthook)
threading.Thread(target=time.sleep, args=(3600,)).start()  # a thread that never ends
raise ValueError("boom")
"""


def test_the_backstop_ends_a_process_that_a_thread_keeps_alive() -> None:
    done = run_python(STUCK, timeout=60, args=("1",))
    assert done.returncode == 1, done.stderr[-2000:]
    assert "ValueError: boom" in done.stderr
    assert "Timeout (0:00:01)!" in done.stderr  # faulthandler's dump of every thread


def test_without_the_backstop_the_same_process_stays_alive() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(STUCK, timeout=10, args=("0",))


def test_after_ctrl_c_every_error_is_ctrl_cs(monkeypatch: pytest.MonkeyPatch) -> None:
    # A multi-worker call interrupted by Ctrl-C can fail first with a peer's error.
    monkeypatch.setattr(guard, "INTERRUPTED", False)
    with pytest.raises(KeyboardInterrupt):
        guard.interrupt_handler(signal.SIGINT, None)
    assert guard.INTERRUPTED is True
    assert guard.status_for(RuntimeError) == 130


def test_the_sigint_handler_is_replaced_only_where_python_s_own_is_in_place() -> None:
    # An earlier test in this process may have installed the guard: start from Python's own.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        patch = guard.note_interrupts()
        assert patch is not None and patch.installed()
        assert signal.getsignal(signal.SIGINT) is guard.interrupt_handler
        assert guard.note_interrupts() is None  # not Python's own any more: left alone
        patch.undo()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


SWALLOWED = """
import os, signal, sys, time
from tfdp_utils import _exit_guard as guard

# As a program started from a terminal: a runner started in the background may pass SIGINT on
# ignored (bash's asynchronous commands ignore it), and Python then keeps it ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)

guard.note_interrupts()
if sys.argv[1] == "wrapped":
    sys.unraisablehook = guard.make_unraisablehook(sys.unraisablehook)


class Finalized:
    def __del__(self):  # Ctrl-C arrives while a finalizer runs, as in an input pipeline's
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)


Finalized()  # dropped at once: its __del__ runs here
for _ in range(200):
    time.sleep(0.01)
print("NOT INTERRUPTED", flush=True)
"""


def test_ctrl_c_that_a_finalizer_swallowed_is_delivered_again() -> None:
    done = run_python(SWALLOWED, timeout=60, args=("wrapped",))
    assert "Exception ignored in" in done.stderr, done.stderr[-2000:]
    assert "NOT INTERRUPTED" not in done.stdout
    assert done.returncode in (-signal.SIGINT, 130), done.stderr[-2000:]


def test_without_the_wrapper_a_swallowed_ctrl_c_is_lost() -> None:
    done = run_python(SWALLOWED, timeout=60, args=("plain",))
    assert "Exception ignored in" in done.stderr, done.stderr[-2000:]
    assert "NOT INTERRUPTED" in done.stdout
    assert done.returncode == 0


def test_the_unraisable_wrapper_leaves_other_errors_alone() -> None:
    seen: list[Any] = []
    hook = guard.make_unraisablehook(seen.append)
    unraisable = type("Unraisable", (), {"exc_type": ValueError})()
    hook(unraisable)  # would raise KeyboardInterrupt later if it delivered SIGINT
    assert seen == [unraisable]
