"""One prepared ``fit`` call (or custom loop) of a ``PreemptionCheckpoint``: its position, the
objects it saves, and the grace monitor that says when a save outlasts the scheduler's grace.

Pure (no TensorFlow): the checkpoint, model and optimizer are held, not used, here.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tfdp_utils.preemption import _agreement as agreement
from tfdp_utils.preemption import _position as position
from tfdp_utils.preemption import _signals as signals_
from tfdp_utils.preemption import _store as store

logger = logging.getLogger("tfdp_utils")

_fits = itertools.count()  # keys of each prepared fit: the same on every worker of a job


class Run:
    """The position and the objects of one prepared ``fit`` call."""

    def __init__(
        self,
        *,
        directory: str,
        facts: dict[str, Any],
        seed: int | None,
        steps_per_epoch: int,
        epoch: int,
        done: int,
        restore: store.Saved | None,
    ) -> None:
        self.directory = directory
        self.facts = facts
        self.seed = seed
        self.steps_per_epoch = steps_per_epoch
        self.epoch = epoch
        self.done = done
        self.restore = restore
        self.checkpoint: Any = None
        self.model: Any = None
        self.optimizer: Any = None
        self.strategy: Any = None
        self.per_step = True  # whether a batch hook acts at each step boundary
        self.training = False  # between this fit's on_train_begin and on_train_end
        self.monitor: GraceMonitor | None = None
        self.serial = next(_fits)
        self.worker, self.num_workers = 0, 1
        self.channel: agreement.CoordinationChannel | None = None
        self.acted = 0  # agreed requests acted on
        self.asked = False  # whether this worker asked for a stop
        self.accumulation = 1  # batches per optimizer update
        self.steps_per_execution = 1
        self.begun: int | None = None  # the step index of the last execution begun
        self.periodic_mark: int | None = None  # global_step // every_steps at the last save
        self.phase = "training step"  # what runs now: "training step", "validation", "save"
        # The periodic saves of this fit: (start, end), time.perf_counter() readings.
        self.periodic_saves: list[tuple[float, float]] = []
        self.start_step = 0  # global_step when this fit's first step began
        self.held = False  # a save at an earlier step ended this fit's saves (DivergenceGuard)
        # The rest of an interrupted epoch laid out on this shape (an EpochRest: files sharded
        # by file, resumed on another shape), and the step of that epoch it starts at.
        self.rest: Any = None
        self.rest_start = 0
        # Steps trained before this run's epoch numbering began: the global step goes on from
        # the checkpoint's where an epoch has another number of steps on this shape.
        self.step_offset = 0

    def close(self) -> None:
        """Stop the grace monitor and the watcher thread."""
        self.training = False
        if self.monitor is not None:
            self.monitor.stop()
        if self.channel is not None:
            self.channel.close()

    @property
    def global_step(self) -> int:
        """Steps trained since the first epoch of the job began."""
        return self.step_offset + position.global_step(self.epoch, self.done, self.steps_per_epoch)

    def rest_record(self) -> dict[str, Any] | None:
        """The rest of the epoch still to train, as a checkpoint at this position records
        it; None outside a rest."""
        if self.rest is None or self.epoch != self.rest.epoch:
            return None
        record: dict[str, Any] = self.rest.after(self.done - self.rest_start).to_json()
        return record


class GraceMonitor:
    """Logs a WARNING when a save is still running ``grace`` seconds after the notice."""

    def __init__(
        self,
        notice: signals_.Notice,
        grace: float,
        phase: Callable[[], str] = lambda: "training step",
    ) -> None:
        self._notice, self._grace, self._phase = notice, grace, phase
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tfdp-preemption", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stopped.wait(0.25):
            received = self._notice.received_at
            if received is not None and time.monotonic() - received > self._grace:
                phase = self._phase()
                logger.warning(
                    "tfdp_utils: PreemptionCheckpoint: %s came %.0f s ago and the %s running "
                    "then has not finished; the scheduler's SIGKILL will cut it short, and the "
                    "job will resume from the previous checkpoint. Give the job a longer grace "
                    "period (terminationGracePeriodSeconds, SLURM --signal=...@seconds)%s.",
                    self._notice.signal_name,
                    self._grace,
                    phase,
                    " or validate less at a time (validation_steps, validation_freq)"
                    if phase == "validation"
                    else "",
                )
                return

    def stop(self) -> None:
        self._stopped.set()
