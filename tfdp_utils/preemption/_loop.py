"""A custom training loop's batches, positioned and saved by a ``PreemptionCheckpoint``.

:meth:`PreemptionCheckpoint.loop` makes a :class:`CustomLoop`: entered, it positions the
dataset at the latest checkpoint (or the start), installs the notice's handlers and reads the
checkpoint back; iterated, it yields ``(epoch, step, batch)`` and, when the next batch is asked
for, acts on the step before as the callback's batch-end hook does (a save where due, a stop
after a notice); left, it restores the handlers and ends a stopped loop. The checkpoint does the
TensorFlow work.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any, Protocol

from tfdp_utils.compat import _fit_binding as fit_binding
from tfdp_utils.preemption import _signals as signals_
from tfdp_utils.preemption._agreement import Request
from tfdp_utils.preemption._run import Run


class Owner(Protocol):
    """What the loop needs of its ``PreemptionCheckpoint``."""

    signals: tuple[signal.Signals, ...]
    notice: signals_.Notice

    def _position(
        self,
        x: Any,
        initial_epoch: Any,
        *,
        beside: list[Any] | None = None,
        receiver: str = "fit",
    ) -> tuple[Run, Any]: ...

    def _begin(self, run: Run, model: Any, optimizer: Any) -> None: ...

    def _after_step(self, run: Run, done: int) -> None: ...

    def _stop(self, run: Run, *, save: bool, request: Request | None = None) -> None: ...


class CustomLoop:
    """A custom training loop's batches, positioned and saved by a ``PreemptionCheckpoint``.

    Made by :meth:`PreemptionCheckpoint.loop`; see there.

    Attributes:
        epoch: the epoch of the last batch yielded (0-based).
        step: its step within the epoch (0-based).
    """

    def __init__(
        self,
        owner: Owner,
        model: Any,
        optimizer: Any,
        dataset: Any,
        epochs: int,
        initial_epoch: int,
    ) -> None:
        self._owner, self._model, self._optimizer = owner, model, optimizer
        self._dataset, self._epochs, self._initial = dataset, epochs, initial_epoch
        self._run: Run | None = None
        self._stream: Any = None
        self._handlers: signals_.SignalHandlers | None = None
        self.epoch, self.step = 0, -1

    def __enter__(self) -> CustomLoop:
        owner = self._owner
        run, self._stream = owner._position(self._dataset, self._initial, receiver="loop()")
        self._handlers = signals_.SignalHandlers(owner.signals, owner.notice)
        try:
            owner._begin(run, self._model, self._optimizer)
        except BaseException:
            self._handlers.restore()
            raise
        self._run = run
        return self

    def __iter__(self) -> Iterator[tuple[int, int, Any]]:
        run, owner = self._run, self._owner
        if run is None:
            raise RuntimeError("iterate over the loop inside its with block")
        if run.channel is None and owner.notice.received:
            owner._stop(run, save=False)
        iterator = iter(self._stream)
        started = False
        while True:
            if started:
                owner._after_step(run, run.done + 1)
            if run.epoch >= self._epochs:
                return
            started = True
            self.epoch, self.step = run.epoch, run.done
            yield run.epoch, run.done, next(iterator)

    def __exit__(self, error_type: Any, error: Any, traceback: Any) -> bool:
        if self._handlers is not None:
            self._handlers.restore()
        if self._run is not None:
            self._run.close()
        if isinstance(error, fit_binding.StopFit):
            fit_binding.end_stopped(error)  # exits, unless exit=False
            return True  # the with block ends
        return False
