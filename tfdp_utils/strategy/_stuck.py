"""Who holds up a stuck multi-worker step, and doing what: each worker's phase, published.

When :class:`~tfdp_utils.strategy._faults.CollectiveWatchdog` ends a step that waited too long,
the workers that wait in the step's collective cannot tell from TensorFlow which peer did not
come, nor why. So the watchdog thread, which samples the training thread's frames once an
interval anyway, also reads from them the phase this worker is in:

* a Keras callback method on the stack: in a callback (``Script.on_train_batch_end``);
* checkpoint or model-saving code on the stack: saving (or loading) a checkpoint;
* the training thread inside one TensorFlow call of ``fit``: inside step ``k`` (``k`` from the
  model's optimizer ``iterations``), or reading input for step ``k`` when the dataset's input
  clock (``tfdp.input_clock``, builder datasets) says the loop started a fetch that has not
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
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Literal

logger = logging.getLogger("tfdp_utils")

PhaseKind = Literal["input", "step", "callback", "saving", "python"]

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
_STDLIB = os.path.dirname(os.__file__) + os.sep  # Python's own library: threading, queue...
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
    return FramePhase("python", _python_where(frame), frame)


def _frame_name(frame: FrameType) -> str:
    return f"{_qualname(frame)} in {os.path.basename(frame.f_code.co_filename)}"


def _python_where(frame: FrameType) -> str:
    """The innermost function, and the caller it waits for when that is Python's own library.

    A thread parked in ``Condition.wait in threading.py`` says nothing of what it waits for;
    the first frame outside the standard library (``Future.result`` is in it too) does:
    ``"Condition.wait in threading.py, from CallbackList.on_train_batch_end in
    callback_list.py"``.
    """
    where = _frame_name(frame)
    current: FrameType | None = frame
    while current is not None and _in_stdlib(current):
        current = current.f_back
    if current is not None and current is not frame:
        where += f", from {_frame_name(current)}"
    return where


def _in_stdlib(frame: FrameType) -> bool:
    filename = frame.f_code.co_filename
    return filename.startswith(_STDLIB) and "site-packages" not in filename


def calls_into(package_dir: str) -> Callable[[FrameType], bool]:
    """A test of whether a thread's innermost frame is inside a call of the package at
    ``package_dir`` (its directory, ending with the path separator).

    A frame of Python's own library counts as its first caller outside it: TensorFlow waits
    on its own threads in ``threading`` (an eager cross-worker reduce, as a metric's reset in
    ``fit`` runs, is launched on a thread pool while the caller waits in ``pool.map``), and
    that wait is as much a TensorFlow call as one in its C++ core.
    """

    def in_call(frame: FrameType) -> bool:
        current: FrameType | None = frame
        while current is not None and _in_stdlib(current):
            current = current.f_back
        return current is not None and current.f_code.co_filename.startswith(package_dir)

    return in_call


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
