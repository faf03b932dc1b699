"""A crashed job always ends: what an uncaught error keeps alive is freed before Python exits.

Pure standard library (no TensorFlow). The hang this prevents (TF 2.21, CPython 3.11): after an
uncaught exception or Ctrl-C in ``fit`` (or in a loop that holds an iterator in a local), the
traceback that Python keeps for post-mortem debugging (``sys.last_traceback``) holds the frames
of ``fit`` and with them a live ``tf.data`` iterator. Nothing frees it before the interpreter
starts finalizing; from then on every thread that wants the GIL is ended by CPython, among
them TensorFlow's threads running a ``from_generator`` reader (an ``EagerPyFunc``). The final
garbage collection then destroys the iterator, whose prefetch thread waits for the reader's
executors, which wait for the Python threads that were ended: the process never exits, still
holding its allocation.

The guard breaks this while the interpreter can still run threads. It is installed as the
``exit-guard`` change of :mod:`tfdp_utils.compat` (listed by ``tdu.compat.status()``, undone by
``tdu.compat.undo("exit-guard")``) the first time tfdp-utils builds a strategy, a dataset or a
train step:

* an ``atexit`` handler (``atexit`` runs before the interpreter is marked as finalizing) that,
  after an uncaught error, clears the frames of the kept traceback (and of the exceptions
  chained to it), drops ``sys.last_*`` and collects garbage, so the iterator is destroyed as it
  is when it goes out of scope during training (0.3-2 s for a busy pipeline);
* a backstop for what that cannot free (an iterator in a module global, a thread that never
  ends, another ``atexit`` handler that hangs): armed when the uncaught error is reported,
  :func:`faulthandler.dump_traceback_later` with ``exit=True``, a C thread that needs no GIL,
  prints every thread's stack and ends the process with status 1 when it is still alive
  :data:`DEFAULT_GRACE` seconds later (``TFDP_EXIT_GRACE`` changes it, ``0`` or ``off`` turns
  it off);
* a ``sys.excepthook`` wrapper, chained to the hook it replaces, that only records the status
  (1 for an exception, 130 for KeyboardInterrupt);
* a ``sys.unraisablehook`` wrapper: Ctrl-C that lands while Python runs a finalizer (a
  ``__del__``, a weakref callback: the input pipeline's iterators run many) is printed as
  "Exception ignored in ..." and lost, and the job trains on as if never interrupted; the
  wrapper prints it as before and delivers SIGINT again (``_thread.interrupt_main``), until it
  lands in the program's own code;
* after Ctrl-C (KeyboardInterrupt), once the release is done and logging and stdio are
  flushed, the process ends at once by SIGINT, as CPython ends an interrupted run after its
  teardown (a parent sees -2, a shell 130): a multi-worker runtime can keep that teardown
  waiting, and the backstop could only end it with status 1.

Nothing happens on a clean exit or after ``sys.exit()``. The backstop is never armed in an
interactive session (``python -i``, IPython, Jupyter) or under pytest; the release is harmless
there (it drops references kept for debugging when the interpreter is exiting anyway).
SIGTERM with its default disposition ends the process at once without running Python, so it
needs nothing. ``TFDP_EXIT_GUARD=0`` keeps the guard from being installed.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import faulthandler
import gc
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from tfdp_utils import _variables
from tfdp_utils._validate import env_seconds, is_off_word

DEFAULT_GRACE = 8.0
"""Seconds a process may take to exit after its uncaught error is reported (the backstop)."""

MAX_GRACE = 1e9
"""The longest ``TFDP_EXIT_GRACE`` taken: ``faulthandler.dump_traceback_later`` raises
OverflowError past about 9.2e9 s (its timer counts nanoseconds in 64 bits)."""

ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], Any]

_lock = threading.Lock()
_before_traceback: list[Callable[[BaseException], str | None]] = []
_registered = False
_armed = False
_status: int | None = None


def wanted(environ: dict[str, str] | None = None) -> bool:
    """Whether the guard may be installed: ``TFDP_EXIT_GUARD`` is unset or not an off word."""
    source = os.environ if environ is None else environ
    return not is_off_word(source.get(_variables.EXIT_GUARD, "1") or "1")


def grace(environ: dict[str, str] | None = None) -> float | None:
    """The backstop's seconds: ``TFDP_EXIT_GRACE`` or :data:`DEFAULT_GRACE`; None when off
    (``0``, or an off word: ``off``, ``no``, ``false``, ``none``).

    Raises:
        ValueError: a value that is not a number of seconds, a negative one, or one above
            :data:`MAX_GRACE`.
    """
    source = os.environ if environ is None else environ
    name = _variables.EXIT_GRACE
    text = source.get(name, "").strip()
    if not text:
        return DEFAULT_GRACE
    if is_off_word(text):  # as for TFDP_EXIT_BARRIER and TFDP_COLLECTIVE_TIMEOUT
        return None
    seconds = env_seconds(name, text, example=DEFAULT_GRACE)
    # faulthandler refuses a timeout that is not finite, when the backstop is armed.
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(
            f"{name} must be a number of seconds >= 0, but received {name}={text!r}. Set it "
            f"to e.g. {DEFAULT_GRACE:g}, or 0 to turn the backstop off."
        )
    # ... and one it cannot wait for (OverflowError past ~9.2e9 s), which would surface only
    # when the backstop is armed: in the excepthook of a crashed job, or at a preemption's exit.
    if seconds > MAX_GRACE:
        raise ValueError(
            f"{name} must be at most {MAX_GRACE:g} seconds (the longest wait the backstop's "
            f"timer takes here), but received {name}={text!r}. Set it to e.g. "
            f"{DEFAULT_GRACE:g}, or 0 to turn the backstop off."
        )
    return seconds or None


def interactive() -> bool:
    """True in ``python -i``, the plain REPL, IPython and Jupyter kernels."""
    if sys.flags.interactive or hasattr(sys, "ps1"):
        return True
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    try:
        return bool(get_ipython is not None and get_ipython() is not None)
    except Exception:  # a broken IPython must not break exiting
        return False


def under_pytest() -> bool:
    """True when pytest runs this process (the backstop must never end a test runner)."""
    return "PYTEST_CURRENT_TEST" in os.environ or "_pytest" in sys.modules


def status_for(error: type[BaseException] | None) -> int | None:
    """The status an uncaught ``error`` ends the process with; None for none or SystemExit.

    After Ctrl-C every error is Ctrl-C's (130): in a multi-worker job the interrupted call can
    fail first with the error of a peer that Ctrl-C ended too.
    """
    if error is None or issubclass(error, SystemExit):
        return None
    return 130 if INTERRUPTED or issubclass(error, KeyboardInterrupt) else 1


INTERRUPTED = False
"""Whether SIGINT (Ctrl-C) reached this process while the guard's handler was installed."""


def interrupt_handler(signum: int, frame: Any) -> None:
    """Python's own SIGINT handler (raise KeyboardInterrupt), noting that Ctrl-C came."""
    global INTERRUPTED
    INTERRUPTED = True
    raise KeyboardInterrupt


class HandlerPatch:
    """The SIGINT handler replaced by :func:`interrupt_handler`, undone like a compat ``Patch``."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def installed(self) -> bool:
        """Whether :func:`interrupt_handler` still handles SIGINT."""
        return bool(signal.getsignal(signal.SIGINT) is interrupt_handler)

    def undo(self) -> None:
        """Put the previous handler back (only if ours is still the one installed)."""
        if self.installed():
            signal.signal(signal.SIGINT, self.previous)

    def describe(self) -> str:
        """What this patch replaced, in words."""
        return "signal SIGINT handler"


def note_interrupts() -> HandlerPatch | None:
    """Handle SIGINT with :func:`interrupt_handler` where Python's default handler is in place
    (main thread only); None when another handler is the program's own."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        return None
    signal.signal(signal.SIGINT, interrupt_handler)
    return HandlerPatch(previous)


UnraisableHook = Callable[[Any], Any]


def make_unraisablehook(previous: UnraisableHook) -> UnraisableHook:
    """A ``sys.unraisablehook`` that calls ``previous`` (which prints), then, for a Ctrl-C that
    a finalizer swallowed while :func:`interrupt_handler` handles SIGINT, delivers SIGINT
    again to the main thread."""

    def unraisablehook(unraisable: Any) -> Any:
        try:
            return previous(unraisable)
        finally:
            error_type = getattr(unraisable, "exc_type", None)
            if (
                isinstance(error_type, type)
                and issubclass(error_type, KeyboardInterrupt)
                and signal.getsignal(signal.SIGINT) is interrupt_handler
            ):
                # From a helper thread, a moment later: delivered now, it would land in the
                # rest of this hook, which is still inside the finalizer's call.
                _thread.start_new_thread(_interrupt_main_soon, ())

    return unraisablehook


def _interrupt_main_soon() -> None:
    time.sleep(0.01)
    _thread.interrupt_main(signal.SIGINT)


def before_traceback(explain: Callable[[BaseException], str | None]) -> None:
    """Have ``explain(error)``'s line (when not None) printed before an uncaught error's traceback.

    The collective watchdog uses it: a step that a peer held up and that ended by the
    collective's own failure gets the line that names that peer.
    """
    with _lock:
        if explain not in _before_traceback:
            _before_traceback.append(explain)


def _explain(error: BaseException) -> None:
    for explain in list(_before_traceback):
        try:
            line = explain(error)
        except Exception:  # an explanation must never hide the error itself
            line = None
        if line:
            print(line, file=sys.stderr, flush=True)


def make_excepthook(previous: ExceptHook) -> ExceptHook:
    """A ``sys.excepthook`` that calls ``previous`` (which prints), then records the status.

    Lines registered with :func:`before_traceback` are printed first.
    """

    def excepthook(
        error_type: type[BaseException], error: BaseException, tb: TracebackType | None
    ) -> Any:
        global _status
        try:
            _explain(error)
            return previous(error_type, error, tb)
        finally:
            _status = status_for(error_type)
            if _status is not None:
                arm_backstop()  # from the error's report on: thread joins, atexit, teardown

    return excepthook


def clear_frames(error: BaseException | None) -> None:
    """Clear the locals of every finished frame in ``error``'s traceback and its chain.

    ``frame.clear()`` also finalizes a suspended generator's frame (Keras' epoch iterators);
    a frame that is still running is left alone.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        tb = error.__traceback__
        while tb is not None:
            with contextlib.suppress(RuntimeError):  # a running frame is left alone
                tb.tb_frame.clear()
            tb = tb.tb_next
        error = error.__cause__ or error.__context__


def release_uncaught() -> bool:
    """Free what the uncaught exception keeps alive (``sys.last_*``) and collect it now.

    Returns:
        True when there was an uncaught exception to release.
    """
    error = getattr(sys, "last_value", None) or getattr(sys, "last_exc", None)
    if error is None:
        return False
    clear_frames(error)
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    del error
    gc.collect()
    return True


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # a closed stream must not stop the exit
            pass


def _at_exit() -> None:
    """Release the uncaught error's frames; arm the backstop (not interactive, not pytest)."""
    global _status
    if not ACTIVE:
        return
    status = _status if _status is not None else status_for(getattr(sys, "last_type", None))
    _status = status  # kept: the release below drops sys.last_* (the exit barrier reads it)
    if status is not None:
        arm_backstop()  # before the release, which can itself wait (a once-armed timer stays)
    release_uncaught()
    if status == 130 and not interactive() and not under_pytest():
        _die_by_sigint()


def arm_backstop() -> None:
    """End the process (status 1, every thread's stack dumped) :data:`GRACE` seconds from now.

    Armed once, when the uncaught error is reported (or at exit, when another excepthook
    replaced the guard's): a C thread without the GIL, so it fires even while the
    interpreter's teardown is stuck. Never in an interactive session or under pytest.
    """
    global _armed
    if _armed or not ACTIVE or not GRACE or interactive() or under_pytest():
        return
    _armed = True
    _flush()
    faulthandler.dump_traceback_later(GRACE, exit=True)


def exit_within(status: int) -> None:
    """Make the coming ``SystemExit(status)`` end the process with ``status``, without teardown.

    For exits made on purpose (a preemption after its checkpoint): the ``SystemExit`` still
    unwinds the program's ``finally`` blocks and runs its ``atexit`` handlers, but the handler
    registered here (the last, so the first to run) flushes logging and stdio and ends the
    process before the interpreter's teardown, where a live input pipeline can keep a process
    alive (see the module docstring). The backstop (:func:`arm_backstop`, status 1 with every
    thread's stack) covers a program thread that never ends before ``atexit``.
    """

    def end() -> None:
        logging.shutdown()
        _flush()
        os._exit(status)

    atexit.register(end)
    if GRACE and not interactive() and not under_pytest():
        _flush()
        faulthandler.dump_traceback_later(GRACE, exit=True)


def _die_by_sigint() -> None:
    """End the process now as an interrupted Python process ends: by SIGINT (a shell's 130).

    CPython ends a run stopped by Ctrl-C this way too, but only after its teardown, which a
    multi-worker job's runtime can keep waiting; Ctrl-C means "stop now", and a backstop
    could only end the process with status 1. Logging handlers and stdio are flushed first.
    """
    logging.shutdown()
    _flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    os._exit(130)  # not reached where SIGINT ends the process


ACTIVE = False
"""Whether the guard acts at exit (set when it is installed; the registry's undo clears it)."""

GRACE: float | None = DEFAULT_GRACE
"""The backstop's seconds in force, read from ``TFDP_EXIT_GRACE`` when it is installed."""


def register_at_exit() -> None:
    """Register the ``atexit`` handler once per process (it does nothing unless :data:`ACTIVE`)."""
    global _registered
    with _lock:
        if not _registered:
            atexit.register(_at_exit)
            _registered = True
