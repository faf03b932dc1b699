"""Goodput: the share of a job's wall time that trained the model, and where the rest went. Pure.

A job is every fit logged into one log dir, in the order they started: a job stopped by a
preemption notice and run again is one job of two fits. Each fit that ended (``on_train_end``)
leaves a :class:`FitLedger`, the chief's measurements of where its time went; a fit killed
without notice leaves none, and what its event file shows (its first and last points' wall
times) stands in for it, marked derived.

``goodput = productive ÷ wall``: *wall* runs from the first process's start (or the first fit's
start, where the process start is unknown) to the last fit's end; *productive* is the step time
of every fit (the logger's clock: validation and epoch starts left out) less the time spent
waiting for input, less the checkpoint saves made between steps (``PreemptionCheckpoint``'s
periodic saves, timed by the checkpoint), less the steps trained twice (a fit that resumed
behind a step an earlier fit had reached: the earlier fit's work on them was lost). The losses
are itemised, each figure marked measured or derived, and what the items do not explain (hooks
of other callbacks, a process's teardown) is left as ``other``.

Example:
>>> fit = FitLedger(fit_begin=100.0, fit_end=160.0, process_start=90.0, first_step=0,
...                 last_step=50, step_seconds=40.0, epoch_start_seconds=(5.0, 1.0),
...                 validation_seconds=6.0, input_wait_seconds=4.0, after_last_step_seconds=2.0)
>>> report = job_goodput([fit])
>>> round(report.goodput, 3), round(report.wall_seconds, 1), round(report.productive_seconds, 1)
(0.514, 70.0, 36.0)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, Literal

from tfdp_utils.throughput._restarts import FitSpan, steps_back

Kind = Literal["measured", "derived"]

LEDGER_VERSION = 1


@dataclasses.dataclass(frozen=True)
class FitLedger:
    """Where one fit's time went, as its chief measured it (wall times in ``time.time()``).

    Attributes:
        fit_begin: when ``fit`` was called (``on_train_begin`` where the call is not seen).
        fit_end: when ``on_train_end`` ran.
        process_start: when the process started, or None when the platform does not say.
        first_step: the step the fit started from.
        last_step: the step it ended at.
        step_seconds: the logger's clock over the fit: training steps, validation and epoch
            starts left out.
        epoch_start_seconds: each epoch's start (the first: the first trace and the first
            batch; then the input pipeline's rebuild and the first step of each epoch).
        validation_seconds: ``evaluate`` inside ``fit`` (``on_test_begin`` to ``on_test_end``).
        input_wait_seconds: the step time spent waiting for the next batch (a builder
            dataset's input clock), or None when it is not measured.
        after_last_step_seconds: from the end of the last step to ``on_train_end``.
        worker: the worker that measured it.
        derived: True for a stand-in read from a killed fit's event file.
        train_begin: when ``on_train_begin`` ran (Keras adapts the data and makes the
            iterator between the call and it); None when unknown.
        checkpoint_save_seconds: the periodic checkpoint saves made between the fit's steps
            while the step clock ran (timed by the ``PreemptionCheckpoint`` of the same ``fit``
            call; left out of the productive time); 0 without one.
    """

    fit_begin: float
    fit_end: float
    process_start: float | None
    first_step: int
    last_step: int
    step_seconds: float
    epoch_start_seconds: tuple[float, ...] = ()
    validation_seconds: float = 0.0
    input_wait_seconds: float | None = None
    after_last_step_seconds: float = 0.0
    worker: int = 0
    derived: bool = False
    train_begin: float | None = None
    checkpoint_save_seconds: float = 0.0

    def to_json(self) -> str:
        """The ledger as the JSON text the logger writes into its ``global`` run."""
        fields = dataclasses.asdict(self)
        fields["epoch_start_seconds"] = list(self.epoch_start_seconds)
        return json.dumps({"version": LEDGER_VERSION, **fields}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FitLedger | None:
        """A ledger from its JSON text; None for a text this version cannot read."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.pop("version", None) != LEDGER_VERSION:
                return None
            data["epoch_start_seconds"] = tuple(data.get("epoch_start_seconds", ()))
            return cls(**data)
        except (TypeError, ValueError):
            return None

    @property
    def started(self) -> float:
        """The process start where known, else the fit's start."""
        return self.fit_begin if self.process_start is None else self.process_start


@dataclasses.dataclass(frozen=True)
class Loss:
    """One item of the time that did not train the model.

    Attributes:
        name: ``startup``, ``restarts``, ``epoch_starts``, ``validation``, ``input_wait``,
            ``checkpoint_saves``, ``steps_trained_twice``, ``after_last_step`` or ``other``.
        seconds: how long.
        kind: ``"measured"`` (read from a clock) or ``"derived"`` (computed from other figures).
        note: what it holds, in words.
    """

    name: str
    seconds: float
    kind: Kind
    note: str


@dataclasses.dataclass(frozen=True)
class Goodput:
    """A job's goodput and its losses.

    Attributes:
        goodput: ``productive_seconds / wall_seconds`` (0 when the wall time is 0).
        wall_seconds: from the first start to the last end.
        productive_seconds: the training steps' time, less input waits, checkpoint saves
            between steps and lost steps.
        losses: the itemised rest, ``other`` last.
        fits: how many fits the job had; ``restarts`` is one less.
        notes: what is unknown or approximate.
    """

    goodput: float
    wall_seconds: float
    productive_seconds: float
    losses: tuple[Loss, ...]
    fits: int
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """Plain values for ``--json`` and ``summary()``."""
        return {
            "goodput": self.goodput,
            "wall_seconds": self.wall_seconds,
            "productive_seconds": self.productive_seconds,
            "fits": self.fits,
            "losses": {
                loss.name: {"seconds": loss.seconds, "kind": loss.kind, "note": loss.note}
                for loss in self.losses
            },
            "notes": list(self.notes),
        }


def _twice(ordered: Sequence[FitLedger]) -> float:
    """Seconds of steps trained twice: each repeated step at the mean step time of the fit
    that first trained it."""
    spans = [FitSpan(f.first_step, f.last_step) for f in ordered]
    seconds = 0.0
    for back in steps_back(spans):
        earlier = ordered[back.reached_by - 1]
        steps = max(1, earlier.last_step - earlier.first_step)
        seconds += back.repeated_steps * earlier.step_seconds / steps
    return seconds


def _same_process(a: FitLedger, b: FitLedger) -> bool:
    return (
        a.process_start is not None
        and b.process_start is not None
        and abs(a.process_start - b.process_start) < 1e-3
    )


def _startup_and_gaps(ordered: Sequence[FitLedger]) -> tuple[float, float]:
    """Start-up: each run's process start to its first fit's call, and in every fit the time
    from its call to its first step's end (data adaptation, the first trace, the first step);
    gaps: one run's end to the next run's start. A fit after another in the same process has
    no start-up before its call (the time between the two is the program's own: ``other``)."""
    startup = gaps = 0.0
    for index, fit in enumerate(ordered):
        previous = ordered[index - 1] if index else None
        if previous is None or not _same_process(previous, fit):
            if fit.process_start is not None:
                startup += max(0.0, fit.fit_begin - fit.process_start)
            if previous is not None:
                gaps += max(0.0, fit.started - previous.fit_end)
        if fit.train_begin is not None:
            startup += max(0.0, fit.train_begin - fit.fit_begin)
        startup += fit.epoch_start_seconds[0] if fit.epoch_start_seconds else 0.0
    return startup, gaps


LOSSES: dict[str, tuple[Kind, str]] = {
    "startup": (
        "measured",
        "process start to each run's first step: import, strategy, model, first trace and step",
    ),
    "restarts": ("measured", "from one run's end to the next run's process start (wall clocks)"),
    "epoch_starts": (
        "measured",
        "each later epoch's start: the input pipeline's rebuild and first step",
    ),
    "validation": ("measured", "evaluate inside fit (validation_data)"),
    "input_wait": ("measured", "steps waiting for their next batch"),
    "checkpoint_saves": (
        "measured",
        "PreemptionCheckpoint's periodic saves while the steps' clock ran (one at an epoch's "
        "end counts in epoch_starts, one after the last step or at a notice after it)",
    ),
    "steps_trained_twice": (
        "derived",
        "steps a resumed run trained again (an older checkpoint), at their mean time",
    ),
    "after_last_step": (
        "measured",
        "from the last step's end to the end of fit (final callbacks and saves)",
    ),
    "other": (
        "derived",
        "the wall time the items above do not hold: other callbacks' hooks, the program's own "
        "time between fits",
    ),
}
"""Each loss: whether it is measured or derived, and what it holds (in the report's order)."""


def _notes(ordered: Sequence[FitLedger]) -> tuple[str, ...]:
    notes = []
    if any(f.process_start is None for f in ordered):
        notes.append("a process start is unknown on this platform: its run counts from fit")
    if any(f.input_wait_seconds is None for f in ordered):
        notes.append(
            "a run's input waits were not timed (its input-wait note says why): they count as "
            "step time there"
        )
    if any(f.derived for f in ordered):
        notes.append(
            "a run killed without notice left no ledger: its figures are read from its event "
            "file's points (derived)"
        )
    return tuple(notes)


def job_goodput(ledgers: Sequence[FitLedger]) -> Goodput:
    """The goodput of the job whose fits left ``ledgers`` (any order; one worker's).

    Raises:
        ValueError: no ledger.
    """
    if not ledgers:
        raise ValueError("no fit ended in this log dir: nothing to compute goodput from.")
    ordered = sorted(ledgers, key=lambda f: f.fit_begin)
    wall = max(0.0, max(f.fit_end for f in ordered) - ordered[0].started)
    twice = _twice(ordered)
    waited = sum(f.input_wait_seconds or 0.0 for f in ordered)
    saves = sum(f.checkpoint_save_seconds for f in ordered)
    productive = max(0.0, sum(f.step_seconds for f in ordered) - waited - saves - twice)
    startup, gaps = _startup_and_gaps(ordered)
    seconds = {
        "startup": startup,
        "restarts": gaps,
        "epoch_starts": sum(sum(f.epoch_start_seconds[1:]) for f in ordered),
        "validation": sum(f.validation_seconds for f in ordered),
        "input_wait": waited,
        "checkpoint_saves": saves,
        "steps_trained_twice": twice,
        "after_last_step": sum(f.after_last_step_seconds for f in ordered),
    }
    seconds["other"] = max(0.0, wall - productive - sum(seconds.values()))
    return Goodput(
        goodput=productive / wall if wall > 0 else 0.0,
        wall_seconds=wall,
        productive_seconds=productive,
        losses=tuple(Loss(name, seconds[name], *LOSSES[name]) for name in LOSSES),
        fits=len(ordered),
        notes=_notes(ordered),
    )


def stand_in(span: FitSpan, first_wall: float, last_wall: float, worker: int = 0) -> FitLedger:
    """A derived ledger for a fit that left none (killed): its points' wall times and steps."""
    return FitLedger(
        fit_begin=first_wall,
        fit_end=last_wall,
        process_start=None,
        first_step=span.first_step,
        last_step=span.last_step,
        step_seconds=max(0.0, last_wall - first_wall),
        worker=worker,
        derived=True,
    )


def process_start_time(proc: str = "/proc") -> float | None:
    """When this process started (``time.time()`` seconds, within 10 ms), or None off Linux.

    Read from the kernel (``/proc/self/stat``'s start time against ``/proc/uptime``), so the
    import of TensorFlow and everything before the logger counts in the job's start-up.
    """
    import os
    import time

    try:
        with open(f"{proc}/self/stat") as handle:
            stat = handle.read()
        with open(f"{proc}/uptime") as handle:
            uptime = float(handle.read().split()[0])
        now = time.time()
        ticks = os.sysconf("SC_CLK_TCK")
        # Fields after the command name (which may hold spaces): state is field 3, start 22.
        started_ticks = int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    age = uptime - started_ticks / ticks
    return now - age if age >= 0 else None


def ledgers_of(
    fits: Sequence[FitSpan],
    texts: Sequence[str | None],
    walls: Sequence[tuple[float, float]],
) -> list[FitLedger]:
    """Each fit's ledger (a stand-in for a fit that wrote none), in the order given."""
    found = []
    for span, text, (first, last) in zip(fits, texts, walls, strict=True):
        ledger = FitLedger.from_json(text) if text else None
        found.append(ledger if ledger is not None else stand_in(span, first, last))
    return found


def goodput_of(
    fits: Sequence[FitSpan],
    texts: Sequence[str | None],
    walls: Sequence[tuple[float, float]],
) -> Goodput | None:
    """The job's goodput from one run's fits (a ``RunSeries``' ``fits``, ``ledgers`` and
    ``fit_walls``); None when no fit wrote a ledger (a log of an older version, or every run
    killed)."""
    if not fits or not len(fits) == len(texts) == len(walls):
        return None
    ledgers = ledgers_of(fits, texts, walls)
    if all(ledger.derived for ledger in ledgers):
        return None
    return job_goodput(ledgers)
