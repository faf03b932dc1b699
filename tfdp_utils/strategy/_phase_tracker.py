"""The watchdog's side of the diagnosis: classify each sample of the training thread, publish
the phases that last an interval, and read the ``fit`` on the stack (the step counter and the
input clock) on a helper thread, bounded. Pure: TensorFlow objects are only read, through the
model and dataset the frames hold.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from tfdp_utils import _helper_calls
from tfdp_utils._dataset_info import record_of
from tfdp_utils.strategy._phase_board import PhaseBoard
from tfdp_utils.strategy._stuck import Phase, StepFacts, diagnose, frame_phase, resolve

logger = logging.getLogger("tfdp_utils")


class PhaseTracker:
    """The watchdog's side of it: classify each sample, publish phases that last an interval.

    Args:
        board: where phases go and are read back.
        in_call: the watchdog's test for a frame inside a TensorFlow call.
        facts: reads the step counter and input clock of the ``fit`` on the stack. Defaults to
            `None` (:func:`fit_facts`).
        clock: wall-clock time. Defaults to `None` (``time.time``).
    """

    def __init__(
        self,
        board: PhaseBoard,
        *,
        in_call: Callable[[FrameType], bool],
        facts: Callable[[FrameType], StepFacts] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.board = board
        self._in_call = in_call
        self._facts = facts or fit_facts
        self._clock = clock or time.time
        self._anchor: FrameType | None = None  # held: a freed frame's id could be reused
        self._since = 0.0
        self._resolved: Phase | None = None  # this anchor's phase, once it lasted an interval
        self.published: Phase | None = None
        self._told: FrameType | None = None

    def sample(self, frame: FrameType) -> Phase | None:
        """Classify ``frame``'s stack; publish its phase once it lasted an interval.

        Returns:
            The phase when it has lasted an interval (the same anchor as the last sample),
            else None.
        """
        seen = frame_phase(frame, self._in_call)
        if seen.anchor is not self._anchor:
            self._anchor, self._since, self._resolved = seen.anchor, self._clock(), None
            return None
        # A step's input may arrive within the same call: re-read it while the call lasts.
        if self._resolved is None or seen.kind == "step":
            self._resolved = resolve(seen, self._facts(frame), since=self._since)
        if not self._resolved.same_as(self.published):
            self.board.publish(self._resolved)
            self.published = self._resolved
        return self._resolved

    def current(self, frame: FrameType) -> Phase:
        """This worker's phase now (for the diagnosis), from ``frame``'s stack."""
        seen = frame_phase(frame, self._in_call)
        since = self._since if seen.anchor is self._anchor else self._clock()
        return resolve(seen, self._facts(frame), since=since)

    def diagnose(self, frame: FrameType) -> str:
        """The one-line diagnosis, with the other workers' phases read from the board."""
        mine = self.current(frame)
        return diagnose(self.board.worker, mine, self.board.read(), now=self._clock())

    def tell_if_holding_up(self, frame: FrameType, lasted: float) -> str | None:
        """Once per stuck phase outside TensorFlow: a diagnosis when peers wait for this worker.

        Its own watchdog never fires (it is not inside a TensorFlow call), so this is how its
        log says what the others' errors say.
        """
        anchor = self._anchor
        if anchor is None or anchor is self._told or self._resolved is None:
            return None
        if self._resolved.kind in ("step", "input"):
            return None  # inside a TensorFlow call: its own watchdog fires
        self._told = anchor
        others = self.board.read()
        if not any(p is not None and p.kind == "step" for p in others.values()):
            return None
        return diagnose(self.board.worker, self._resolved, others, now=self._clock())

    def holding(self) -> tuple[FrameType, ...]:
        """The frames held now (for a caller that lets go of them last, on its own thread)."""
        return tuple(frame for frame in (self._anchor, self._told) if frame is not None)

    def release(self) -> None:
        """Let go of the held frames (the training thread's objects)."""
        self._anchor = self._told = None


READ_COUNTS_TIMEOUT = 0.5
"""Seconds the watchdog waits for the step counter's read (see :func:`fit_facts`)."""


class _BoundedReads:
    """Runs one read at a time on a helper thread; the caller waits a bounded time.

    A variable on an accelerator is read after the work queued before it on the device: in a
    step stuck in a collective that read may never return, and the watchdog must still fire.
    A read that did not return in time is left to finish; until it does, no new one starts.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._job: Callable[[], None] | None = None
        self._posted = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def _serve(self) -> None:
        while True:
            with self._posted:
                while self._job is None:
                    self._posted.wait()
                job = self._job
            try:
                job()
            finally:
                with self._lock:
                    self._job = None

    def run(self, read: Callable[[], StepFacts], timeout: float) -> StepFacts | None:
        result: list[StepFacts] = []
        done = threading.Event()

        def job() -> None:
            try:
                result.append(read())
            finally:
                done.set()

        with self._posted:
            if self._job is not None:
                return None  # the previous read still waits
            self._job = job
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="tfdp-phase-read", daemon=True
                )
                self._thread.start()
            self._posted.notify()
        done.wait(timeout)
        return result[0] if result else None


_READS = _BoundedReads()


def fit_facts(
    frame: FrameType,
    *,
    timeout: float = READ_COUNTS_TIMEOUT,
    count: Callable[[Any], int] | None = None,
) -> StepFacts:
    """The step counter and input clock of the ``fit`` call on ``frame``'s stack.

    Finds the ``fit`` frames (Keras' ``fit``: ``self`` the model, ``x`` the data) and reads
    the step counter and ``x.tfdp.input_clock.progress()`` on a helper thread, waiting at most
    ``timeout`` seconds (nothing known after that). Called only for a phase that lasted an
    interval.

    Args:
        frame: the training thread's innermost frame.
        timeout: seconds the reads may take. Defaults to :data:`READ_COUNTS_TIMEOUT`.
        count: reads the model's step counter. Defaults to `None` (the optimizer's
            ``iterations``; the watchdog passes the batches trained, as users count steps).
    """
    model: Any = None
    clock: Any = None
    current: FrameType | None = frame
    while current is not None:
        if current.f_code.co_name == "fit":
            local = current.f_locals
            if model is None and getattr(local.get("self"), "optimizer", None) is not None:
                model = local["self"]
            record = record_of(local.get("x"))
            if clock is None and record is not None:
                clock = record.input_clock
        current = current.f_back
    if model is None and clock is None:
        return StepFacts()
    read = count or _updates
    return _READS.run(lambda: _read_counts(model, clock, read), timeout) or StepFacts()


def _updates(model: Any) -> int:
    return int(model.optimizer.iterations.numpy())


def _read_counts(model: Any, clock: Any, count: Callable[[Any], int] = _updates) -> StepFacts:
    finished = waits_for = None
    early = False
    try:
        with _helper_calls.call("the collective watchdog's read of the step counter"):
            if clock is not None:  # host variables: read first, they always answer
                progress = clock.progress()
                if int(progress.requested) > int(progress.received):
                    waits_for = int(progress.requested)
            if model is not None:
                early = counts_running_step(model.optimizer)
                finished = count(model)
    except Exception as error:  # a read during teardown or the exit: no number
        logger.debug("tfdp_utils: cannot read the step counter: %s", error)
    return StepFacts(finished, early, waits_for)


def counts_running_step(optimizer: Any) -> bool:
    """Whether ``optimizer.iterations`` counts a step while it runs (see :class:`StepFacts`).

    tf_keras' optimizer (``tf_keras/src/optimizers/optimizer.py``,
    ``_distributed_apply_gradients_fn``) returns ``self.iterations.assign_add(1)`` without a
    dependency on the updates, so in a step that waits (for input or a collective) it has run.
    Its ``LossScaleOptimizer`` increments it inside the branch chosen by the gradients'
    finiteness, so after the step's input and collectives: not early.
    """
    if any(cls.__name__.startswith("LossScaleOptimizer") for cls in type(optimizer).__mro__):
        return False
    return any(
        cls.__name__ == "Optimizer" and cls.__module__ == "tf_keras.src.optimizers.optimizer"
        for cls in type(optimizer).__mro__
    )
