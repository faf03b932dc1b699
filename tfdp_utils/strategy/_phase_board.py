"""Each worker's phase and abort mark, shared through the coordination service's store.

The watchdog's helper thread writes this worker's last phase (``tfdp/phase/<worker>``); a
watchdog that aborts its collectives marks it (``tfdp/aborted/<worker>``); every read of the
other workers' keys is bounded, so a store that does not answer never holds up the watchdog.
Pure: the store is injected (:class:`~tfdp_utils.cluster._coordination.CoordinationStore` in
a job, an in-memory one in tests).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading

from tfdp_utils.cluster._coordination import KeyValueStore
from tfdp_utils.strategy._stuck import Phase

logger = logging.getLogger("tfdp_utils")

KEY_PREFIX = "tfdp/phase"
"""Coordination-service keys ``tfdp/phase/<worker>`` hold each worker's last published phase."""

ABORT_PREFIX = "tfdp/aborted"
"""Keys ``tfdp/aborted/<worker>`` mark the workers whose watchdog aborted their collectives."""

READ_TIMEOUT = 2.0
"""Seconds the firing watchdog spends at most reading the other workers' phases."""


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
