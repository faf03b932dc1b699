"""The preemption notice: which signals announce it, and a handler that only notes it.

Pure Python (no TensorFlow). A handler may run between any two bytecodes of the training
thread, so it does nothing but record the signal and the time: the callback reads the
:class:`Notice` at its next step boundary and acts there.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

PREEMPTED_EXIT_STATUS = 75
"""The exit status of a job that saved a checkpoint and stopped on a preemption notice.

75 is ``EX_TEMPFAIL`` of ``sysexits.h``: a temporary failure, to be retried. Any non-zero
status makes SLURM's ``--requeue`` and a Kubernetes Job's restart policy run the job again;
a Kubernetes ``podFailurePolicy`` can match 75 to retry without counting a failure.
"""

DEFAULT_SIGNALS: tuple[str, ...] = ("SIGTERM",)

Handler = Callable[[int, Any], Any] | int | signal.Handlers | None


def signal_numbers(signals: Any) -> tuple[signal.Signals, ...]:
    """``signals`` (names like ``"SIGTERM"``/``"TERM"``, numbers, or ``signal.Signals``) checked.

    Raises:
        TypeError: ``signals`` is not a sequence of names or numbers.
        ValueError: an unknown signal, one that cannot be caught (SIGKILL, SIGSTOP), SIGINT
            (Ctrl-C stays an interrupt), or an empty list.
    """
    if isinstance(signals, (str, int)):
        signals = (signals,)
    if not isinstance(signals, Sequence) or isinstance(signals, bytes):
        raise TypeError(
            f"signals={signals!r} is not a list of signals; pass names such as "
            "['SIGTERM', 'SIGUSR1'] (the default is ['SIGTERM'])."
        )
    if not signals:
        raise ValueError(
            "signals=[] would make the preemption notice impossible to receive; pass at "
            "least one signal, e.g. ['SIGTERM'] (the default)."
        )
    numbers: list[signal.Signals] = []
    for item in signals:
        number = _one_signal(item)
        if number not in numbers:
            numbers.append(number)
    return tuple(numbers)


def _one_signal(item: Any) -> signal.Signals:
    if isinstance(item, bool) or not isinstance(item, (str, int)):
        raise TypeError(
            f"signals contains {item!r} ({type(item).__name__}); expected a signal name such "
            "as 'SIGTERM' or 'SIGUSR1', or a signal number."
        )
    try:
        if isinstance(item, str):
            name = item.upper()
            number = signal.Signals[name if name.startswith("SIG") else "SIG" + name]
        else:
            number = signal.Signals(item)
    except (KeyError, ValueError):
        raise ValueError(
            f"signals contains {item!r}, which is not a signal on this system; expected a "
            "name such as 'SIGTERM' or 'SIGUSR1'."
        ) from None
    if number in (signal.SIGKILL, signal.SIGSTOP):
        raise ValueError(
            f"{number.name} cannot be caught by any process, so it cannot announce a "
            "preemption; the notice before it is usually SIGTERM (Kubernetes, spot VMs) or "
            "the signal of SLURM's --signal option."
        )
    if number == signal.SIGINT:
        raise ValueError(
            "SIGINT is Ctrl-C, which stops a job without saving; pass the signal your "
            "scheduler sends before it stops the job (SIGTERM, or SLURM's --signal)."
        )
    return number


@dataclasses.dataclass
class Notice:
    """What the signal handler recorded: the first signal, when, and how many came.

    Attributes:
        signal_name: the first signal's name, or None before any.
        received_at: ``time.monotonic()`` of the first signal, or None.
        count: how many signals arrived.
    """

    signal_name: str | None = None
    received_at: float | None = None
    count: int = 0

    def note(self, number: int) -> None:
        """Record one signal (the handler's only work)."""
        self.count += 1
        if self.signal_name is None:
            self.signal_name = signal.Signals(number).name
            self.received_at = time.monotonic()

    @property
    def received(self) -> bool:
        """Whether a signal arrived."""
        return self.signal_name is not None


class SignalHandlers:
    """Install a noting handler for ``signals``; :meth:`restore` puts the previous ones back.

    Only on the main thread (Python delivers signals there); elsewhere nothing is installed
    and :attr:`installed` is False.
    """

    def __init__(
        self,
        signals: Sequence[signal.Signals],
        notice: Notice,
        also: Callable[[], Any] | None = None,
    ) -> None:
        self.notice = notice
        self.also = also  # called after each note, on the main thread (it must be as small)
        self.previous: dict[signal.Signals, Handler] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for number in signals:
            self.previous[number] = signal.signal(number, self._handle)

    def _handle(self, number: int, frame: Any) -> None:
        self.notice.note(number)
        if self.also is not None:
            self.also()

    @property
    def installed(self) -> bool:
        """Whether the handlers are in place."""
        return bool(self.previous)

    def restore(self) -> None:
        """Put back each previous handler that ours still occupies; idempotent."""
        for number, previous in self.previous.items():
            if signal.getsignal(number) == self._handle:
                signal.signal(number, previous if previous is not None else signal.SIG_DFL)
        self.previous = {}


class ExitOutsideFit:
    """Before a fit (and after one): a notice ends the process at once with
    :data:`PREEMPTED_EXIT_STATUS`, as nothing has trained since the last save.

    Installed only on the main thread and only over the default disposition (a program's own
    handler is left alone). ``say(signal_name)`` runs first (a log line), then
    ``SystemExit(75)`` is raised in the main thread, which unwinds the program's ``finally``
    blocks. Inside ``fit`` the callback's noting handler takes the signal's place.
    """

    def __init__(self, signals: Sequence[signal.Signals], say: Callable[[str], Any]) -> None:
        self._say = say
        self.installed: list[signal.Signals] = []
        if threading.current_thread() is not threading.main_thread():
            return
        for number in signals:
            if signal.getsignal(number) is signal.SIG_DFL:
                signal.signal(number, self._handle)
                self.installed.append(number)

    def _handle(self, number: int, frame: Any) -> None:
        self._say(signal.Signals(number).name)
        raise SystemExit(PREEMPTED_EXIT_STATUS)

    def remove(self) -> None:
        """Put the default disposition back where this handler still holds the signal."""
        for number in self.installed:
            if signal.getsignal(number) == self._handle:
                signal.signal(number, signal.SIG_DFL)
        self.installed = []
