"""Who holds up a stuck multi-worker step, and doing what: each worker's phase, published.

When :class:`~tfdp_utils.strategy._faults.CollectiveWatchdog` ends a step that waited too long,
the workers that wait in the step's collective cannot tell from TensorFlow which peer did not
come, nor why. So the watchdog thread, which samples the training thread's frames once an
interval anyway, also reads from them the phase this worker is in:

* a Keras callback method on the stack: in a callback (``Script.on_train_batch_end``);
* checkpoint or model-saving code on the stack: saving (or loading) a checkpoint;
* the training thread inside one TensorFlow call of ``fit``: inside step ``k`` (``k`` from the
  model's optimizer ``iterations``), or reading input for step ``k`` when the dataset's input
  clock (``tfdp_input_clock``, builder datasets) says the loop started a fetch that has not
  completed: the train function fetches its batch in the graph, so frames cannot tell; inside
  ``evaluate`` (fit's validation): validating;
* anything else: in Python (the innermost function).

A phase is published only once the training thread has stayed in it for a whole interval
(the same frame at two samples), and only when it differs from the last one published: a job
of steps shorter than the interval publishes nothing per step, and a stuck worker publishes
within two intervals. Publishing goes through TensorFlow's coordination service key-value
store (one key per worker, written by a helper thread, so a slow service never delays the
watchdog); it does not depend on the collectives it diagnoses. When the watchdog fires, it
reads the other workers' keys (bounded) and words one line::

    tfdp-utils: step 12 stuck: worker 1 is reading input for step 12 (for 31 s); worker 0
    (this one) waits in the step's collective

Pure: no TensorFlow import here; the TensorFlow reads (the step counter, the input clock, the
store) are injected, so the logic is tested on fakes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, Literal

from tfdp_utils.cluster._coordination import KeyValueStore

logger = logging.getLogger("tfdp_utils")

PhaseKind = Literal["input", "step", "callback", "saving", "python"]

KEY_PREFIX = "tfdp/phase"
"""Coordination-service keys ``tfdp/phase/<worker>`` hold each worker's last published phase."""

ABORT_PREFIX = "tfdp/aborted"
"""Keys ``tfdp/aborted/<worker>`` mark the workers whose watchdog aborted their collectives."""

READ_TIMEOUT = 2.0
"""Seconds the firing watchdog spends at most reading the other workers' phases."""

_SAVING_PATHS = tuple(
    os.sep.join(("", *parts, ""))
    for parts in (
        ("tensorflow", "python", "checkpoint"),
        ("tensorflow", "python", "saved_model"),
        ("keras", "src", "saving"),
        ("tf_keras", "src", "saving"),
        ("h5py",),
    )
)
_SAVING_NAMES = frozenset({"save", "save_weights", "save_model"})
_LOADING_WORDS = ("restore", "load", "read")
_CALLBACK_LISTS = frozenset({"CallbackList"})  # Keras' dispatchers, not callbacks themselves


@dataclasses.dataclass(frozen=True)
class Phase:
    """What a worker's training thread was doing, as last seen.

    Attributes:
        kind: ``"input"``, ``"step"``, ``"callback"``, ``"saving"`` or ``"python"``.
        step: the step it reads input for or runs (``input`` / ``step``), or the last step
            it finished (the others); None when unknown (no ``fit`` on the stack).
        where: the callback method (``Script.on_train_batch_end``), the saving call, or the
            Python function; empty for steps.
        since: wall-clock time (``time.time()``) when this phase was first seen.
    """

    kind: PhaseKind
    step: int | None = None
    where: str = ""
    since: float = 0.0

    def same_as(self, other: Phase | None) -> bool:
        """Whether ``other`` says the same, whenever it was seen."""
        return other is not None and (self.kind, self.step, self.where) == (
            other.kind,
            other.step,
            other.where,
        )

    def describe(self) -> str:
        """The phase in words: ``reading input for step 12``, ``in a callback (...)``..."""
        step = "" if self.step is None else f" {self.step}"
        after = "" if self.step is None else f" after step {self.step}"
        if self.kind == "input":
            return f"reading input for step{step}"
        if self.kind == "step" and self.where == "validation":
            return f"validating{after}"
        if self.kind == "step":
            return f"inside step{step}" if step else "inside a TensorFlow call"
        if self.kind == "callback":
            return f"in a callback ({self.where}){after}"
        if self.kind == "saving":
            action = "loading" if self.where.startswith("loading") else "saving"
            where = self.where.removeprefix("loading ")
            return f"{action} a checkpoint ({where}){after}"
        return f"in Python ({self.where}){after}"

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> Phase:
        return cls(**json.loads(text))


@dataclasses.dataclass(frozen=True)
class FramePhase:
    """The phase as far as frames tell (no step number, no input clock): cheap, every sample.

    ``anchor`` is the frame that defines it (the callback's or the save's outermost frame, the
    innermost frame otherwise): the same object at two samples means the same phase went on.
    """

    kind: PhaseKind
    where: str
    anchor: FrameType


def _qualname(frame: FrameType) -> str:
    return str(getattr(frame.f_code, "co_qualname", frame.f_code.co_name))


def _is_callback_method(frame: FrameType) -> bool:
    code = frame.f_code
    if not code.co_name.startswith(("on_", "_on_")):
        return False
    owner, _, _ = _qualname(frame).rpartition(".")
    return bool(owner) and owner not in _CALLBACK_LISTS and "<locals>" not in owner


def _is_saving(frame: FrameType) -> bool:
    code = frame.f_code
    return code.co_name in _SAVING_NAMES or any(p in code.co_filename for p in _SAVING_PATHS)


def frame_phase(frame: FrameType, in_call: Callable[[FrameType], bool]) -> FramePhase:
    """Classify the training thread's stack from its innermost ``frame``. Pure, microseconds.

    Args:
        frame: the innermost frame of the training thread.
        in_call: whether a frame is inside a TensorFlow call (the watchdog's test).

    Returns:
        The kind, where, and the anchor frame (see :class:`FramePhase`).
    """
    callback: FrameType | None = None
    saving: FrameType | None = None
    validating = False
    current: FrameType | None = frame
    while current is not None:  # innermost to outermost: keep the outermost of each
        if _is_callback_method(current) and not in_call(current):
            callback = current
        elif _is_saving(current):
            saving = current
        elif current.f_code.co_name == "evaluate":  # fit's validation (or a user's evaluate)
            validating = True
        current = current.f_back
    if saving is not None:
        name = _qualname(saving)
        loading = any(word in saving.f_code.co_name for word in _LOADING_WORDS)
        where = _qualname(callback) if callback is not None else name
        return FramePhase("saving", ("loading " if loading else "") + where, saving)
    if callback is not None:
        return FramePhase("callback", _qualname(callback), callback)
    if in_call(frame):
        return FramePhase("step", "validation" if validating else "", frame)
    where = f"{_qualname(frame)} in {os.path.basename(frame.f_code.co_filename)}"
    return FramePhase("python", where, frame)


@dataclasses.dataclass(frozen=True)
class StepFacts:
    """What the ``fit`` call on the stack tells: steps finished, and a fetch that waits.

    Attributes:
        finished: the optimizer's ``iterations`` (exact between steps); None unknown.
        counted_early: whether that counter already counts a step while it runs (tf_keras'
            optimizer increments it with no dependency on the step's input or collectives,
            so it runs first; Keras 3's and tf_keras' legacy one after the update).
        input_waits_for: the fetch the loop waits for (the input clock's ``requested`` when
            it exceeds ``received``); None when no fetch waits or there is no clock.
    """

    finished: int | None = None
    counted_early: bool = False
    input_waits_for: int | None = None


def resolve(seen: FramePhase, facts: StepFacts, *, since: float) -> Phase:
    """The published phase: the frames' phase with the step number (and input) filled in."""
    if seen.kind == "step" and seen.where == "validation":
        return Phase("step", facts.finished, "validation", since)  # the clock is fit's x's
    if seen.kind == "step":
        step = facts.finished
        if step is not None and not facts.counted_early:
            step += 1
        if facts.input_waits_for is not None:
            return Phase("input", step if step is not None else facts.input_waits_for, "", since)
        return Phase("step", step, "", since)
    return Phase(seen.kind, facts.finished, seen.where, since)


def diagnose(me: int, mine: Phase | None, others: Mapping[int, Phase | None], *, now: float) -> str:
    """The one-line diagnosis of a stuck step. Pure.

    The workers inside a step (in a TensorFlow call, not waiting for input) wait in its
    collective; every other one did not reach it and is named with its phase. The step's
    number comes from the workers named (the step they read input for, or the one after the
    last they finished): inside a running step the optimizer's counter may already count it
    (tf_keras increments it apart from the collectives), between steps it is exact.

    Args:
        me: this worker's index.
        mine: this worker's phase, or None.
        others: every other worker's last published phase (None: none was read).
        now: wall-clock time, for how long each phase has lasted.

    Returns:
        ``"tfdp-utils: step 12 stuck: worker 1 is reading input for step 12 (for 31 s);
        worker 0 (this one) waits in the step's collective"``.
    """
    phases = {**others, me: mine}
    waiting, stuck, unknown, steps = [], [], [], []
    for worker in sorted(phases):
        phase = phases[worker]
        name = f"worker {worker}" + (" (this one)" if worker == me else "")
        if phase is None:
            unknown.append(name)
        elif phase.kind == "step":
            waiting.append(name)
        else:
            lasted = max(0.0, now - phase.since)
            stuck.append(f"{name} is {phase.describe()} (for {lasted:.0f} s)")
            if phase.step is not None:
                steps.append(phase.step if phase.kind == "input" else phase.step + 1)
    if not steps:  # nobody named: the step the waiting workers are inside
        steps = [p.step for p in phases.values() if p is not None and p.step is not None]
    head = f"tfdp-utils: step {min(steps) if stuck else max(steps)} stuck: " if steps else ""
    head = head or "tfdp-utils: a step stuck: "
    parts = list(stuck)
    if waiting:
        verb = "waits" if len(waiting) == 1 else "wait"
        where = "the step's collective" if stuck else "the step (none is named: every worker "
        where += "" if stuck else "reached it; the wait is inside it, a collective or an op)"
        parts.append(f"{_join(waiting)} {verb} in {where}")
    if unknown:
        parts.append(
            f"{_join(unknown)}: no phase known (its watchdog publishes none: not started by "
            "auto_strategy, or no collective_timeout)"
        )
    return head + "; ".join(parts)


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


@dataclasses.dataclass(frozen=True)
class GaveUp:
    """A worker whose watchdog aborted its collectives: the step it waited in, and how long.

    Attributes:
        worker: its index.
        step: the step it gave up on; None when unknown.
        waited: seconds it had waited in that step's call.
    """

    worker: int
    step: int | None
    waited: float

    def describe(self) -> str:
        """``worker 0 gave up on step 12 after waiting 600 s``."""
        step = "its step" if self.step is None else f"step {self.step}"
        return f"worker {self.worker} gave up on {step} after waiting {self.waited:.0f} s"


@dataclasses.dataclass(frozen=True)
class PeerNews:
    """What the other workers' abort marks say, read from the store.

    Attributes:
        gave_up: the workers that aborted their collectives (marks found).
        answered: whether the store answered every read within the bound (False: the
            coordination service is gone or does not answer, so the job is ending).
    """

    gave_up: tuple[GaveUp, ...]
    answered: bool


class PhaseBoard:
    """Each worker's last phase, in a key-value store; this worker's written by a helper thread.

    Args:
        store: the key-value store (the coordination service's in a job).
        worker: this worker's index.
        num_workers: workers in the job.
        prefix: the keys' prefix. Defaults to :data:`KEY_PREFIX`.
    """

    def __init__(
        self, store: KeyValueStore, *, worker: int, num_workers: int, prefix: str = KEY_PREFIX
    ) -> None:
        self.store, self.worker, self.num_workers, self.prefix = store, worker, num_workers, prefix
        self._pending: Phase | None = None
        self._changed = threading.Condition()
        self._closed = False
        self._writer: threading.Thread | None = None
        self.published = 0
        """Phases written so far (for tests and the benchmark)."""

    def _key(self, worker: int) -> str:
        return f"{self.prefix}/{worker}"

    def publish(self, phase: Phase) -> None:
        """Hand ``phase`` to the writer (returns at once; a newer phase replaces an unwritten
        one)."""
        with self._changed:
            if self._closed:
                return
            self._pending = phase
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write, name="tfdp-phase-writer", daemon=True
                )
                self._writer.start()
            self._changed.notify()

    def _write(self) -> None:
        key = self._key(self.worker)
        while True:
            with self._changed:
                while self._pending is None and not self._closed:
                    self._changed.wait(1.0)
                if self._closed:
                    return
                phase, self._pending = self._pending, None
            assert phase is not None
            try:  # the store refuses to overwrite: delete first (readers retry a missing key)
                self.store.delete(key)
                self.store.set(key, phase.encode())
                self.published += 1
            except Exception as error:  # the service is gone: the job is ending
                logger.debug("tfdp_utils: cannot publish this worker's phase: %s", error)
                return

    def read(self, *, timeout: float = READ_TIMEOUT) -> dict[int, Phase | None]:
        """The other workers' last published phases, within ``timeout`` seconds in all."""
        result: dict[int, Phase | None] = {}
        done = threading.Event()

        def read_all() -> None:
            for worker in range(self.num_workers):
                if worker == self.worker:
                    continue
                result[worker] = None
                try:
                    # A short wait covers the writer's delete-then-set.
                    text = self.store.get(self._key(worker), 200)
                except Exception as error:
                    logger.debug("tfdp_utils: cannot read worker %d's phase: %s", worker, error)
                    break
                try:
                    result[worker] = None if text is None else Phase.decode(text)
                except (ValueError, TypeError) as error:  # another version's record
                    logger.debug("tfdp_utils: worker %d's phase %r: %s", worker, text, error)
            done.set()

        # A thread of its own: a store that does not answer cannot hold up the abort.
        threading.Thread(target=read_all, name="tfdp-phase-reader", daemon=True).start()
        done.wait(timeout)
        return {w: result.get(w) for w in range(self.num_workers) if w != self.worker}

    def mark_aborted(self, step: int | None, waited: float, *, timeout: float = 1.0) -> None:
        """Tell the other workers that this one aborted its collectives (bounded: a store
        that does not answer within ``timeout`` seconds cannot hold up the abort)."""
        text = json.dumps({"step": step, "waited": round(waited, 1)})

        def write() -> None:
            try:
                self.store.set(f"{ABORT_PREFIX}/{self.worker}", text)
            except Exception as error:  # a second abort in this job, or the service is gone
                logger.debug("tfdp_utils: cannot mark this worker's abort: %s", error)

        writer = threading.Thread(target=write, name="tfdp-abort-mark", daemon=True)
        writer.start()
        writer.join(timeout)

    def read_aborted(self, *, timeout: float = READ_TIMEOUT) -> PeerNews:
        """The other workers' abort marks, within ``timeout`` seconds in all."""
        found: list[GaveUp] = []
        answered = threading.Event()

        def read_all() -> None:
            for worker in range(self.num_workers):
                if worker == self.worker:
                    continue
                try:
                    text = self.store.get(f"{ABORT_PREFIX}/{worker}", 50)
                except Exception as error:
                    logger.debug(
                        "tfdp_utils: cannot read worker %d's abort mark: %s", worker, error
                    )
                    return
                if text is None:
                    continue
                try:
                    record = json.loads(text)
                    found.append(GaveUp(worker, record.get("step"), float(record["waited"])))
                except (ValueError, TypeError, KeyError, AttributeError) as error:
                    logger.debug("tfdp_utils: worker %d's abort mark %r: %s", worker, text, error)
                    found.append(GaveUp(worker, None, 0.0))
            answered.set()

        # A thread of its own: a store that does not answer cannot hold up the watchdog.
        threading.Thread(target=read_all, name="tfdp-abort-reader", daemon=True).start()
        ok = answered.wait(timeout)
        return PeerNews(tuple(found), ok)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._writer is not None and self._writer is not threading.current_thread():
            self._writer.join(2.0)


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
    the step counter and ``x.tfdp_input_clock.progress()`` on a helper thread, waiting at most
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
            if clock is None:
                clock = getattr(local.get("x"), "tfdp_input_clock", None)
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
        if clock is not None:  # host variables: read first, they always answer
            progress = clock.progress()
            if int(progress.requested) > int(progress.received):
                waits_for = int(progress.requested)
        if model is not None:
            early = counts_running_step(model.optimizer)
            finished = count(model)
    except Exception as error:  # a read during teardown: the phase goes without a number
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
