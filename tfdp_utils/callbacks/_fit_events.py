"""What ``ThroughputLogger`` writes into its TensorBoard runs over one ``fit``.

The schema of :mod:`tfdp_utils.throughput._tags` applied to a fit's figures: which runs this
worker writes (``global`` on the chief, ``worker_<w>``, ``replica_<k>``), the counts note and
dashboard layout at train begin, the counts, each measured window, the epoch starts and the
input-wait note. The encoding is :class:`~tfdp_utils.callbacks._event_writer.RunWriters`' job;
the only device read here is the memory of the replicas' devices, at each window.
"""

from __future__ import annotations

from typing import Any

from tfdp_utils._tf import tf
from tfdp_utils.callbacks._event_writer import RunWriters
from tfdp_utils.callbacks._fit_state import FitState
from tfdp_utils.cluster import _topology as topology
from tfdp_utils.throughput import _tags as tags
from tfdp_utils.throughput._meter import ThroughputWindow, spread
from tfdp_utils.throughput._tags import GLOBAL_RUN, replica_run, worker_run


class FitEvents:
    """The runs of this worker under ``log_dir``, and the events each hook writes into them.

    Args:
        log_dir: directory for the TensorBoard runs (local path or any ``tf.io.gfile`` URL).
    """

    def __init__(self, log_dir: str) -> None:
        self.writers = RunWriters(log_dir)
        self.per_replica = True
        self.runs: list[str] = []
        # Each (run, tag, fields)'s filled-in description: a log point formats none.
        self._descriptions: dict[tuple[Any, ...], str] = {}

    def open(self, position: topology.WorkerPosition, *, per_replica: bool) -> None:
        """Open this worker's runs for a new fit (``replica_<k>`` runs with ``per_replica``).

        Raises:
            OSError: a run directory cannot be created or written.
        """
        self.per_replica = per_replica
        self.runs = []
        if position.is_chief:
            self.runs.append(GLOBAL_RUN)
        if position.is_multi_worker:
            self.runs.append(worker_run(position.index))
        if per_replica:
            self.runs.extend(replica_run(k) for k in position.local_replicas)
        self.writers.open(self.runs)

    def begin(self, fit: FitState, step: int, *, flops: bool) -> None:
        """At train begin: where the counts come from, the dashboard, the starting counts."""
        note = tags.counts_note(
            exact=fit.exact, source=fit.counter.source, reason=fit.derived_reason
        )
        for run in self.runs:
            self.writers.text(run, tags.COUNTS, note, step, tags.COUNTS_DESCRIPTION)
        self.input_wait_note(fit, step)
        position = fit.placement.position
        if position.is_chief:
            job = tags.layout(
                multi_worker=position.is_multi_worker,
                flops=flops,
                memory=bool(fit.placement.memory_devices),
                input_wait=fit.input_wait is not None,
            )
            self.writers.layout(GLOBAL_RUN, job)
        # The starting count; also pays the first summary write's one-off setup cost here
        # instead of inside the first measured window.
        self.counts(fit, step)

    def put(self, run: str, tag: str, value: float, step: int, **fields: str) -> None:
        """Write one scalar of the schema, with the description the schema gives it."""
        key = (run, tag, *fields.items())
        description = self._descriptions.get(key)
        if description is None:
            description = self._descriptions[key] = tags.describe(run, tag, **fields)
        self.writers.scalar(run, tag, value, step, description)

    def epoch_start(self, fit: FitState, seconds: float) -> None:
        """The seconds an epoch's start took (left out of the rates), on the chief."""
        if fit.placement.position.is_chief:
            self.put(GLOBAL_RUN, tags.EPOCH_START_SECONDS, seconds, fit.counter.epoch_start)

    def counts(self, fit: FitState, step: int) -> None:
        """The cumulative examples at ``step``: the job's on the chief, each local replica's."""
        with self.writers.batch():
            self._counts(fit, step)

    def _counts(self, fit: FitState, step: int) -> None:
        counter = fit.counter
        fit.written_step = step
        counted = tags.count_origin(
            exact=fit.exact, source=counter.source, reason=fit.derived_reason
        )
        if fit.placement.position.is_chief:
            self.put(GLOBAL_RUN, tags.EXAMPLES, sum(counter.counts), step, counted=counted)
        if self.per_replica:
            for k in fit.placement.position.local_replicas:
                self.put(replica_run(k), tags.EXAMPLES, counter.counts[k], step, counted=counted)

    def input_wait_note(self, fit: FitState, step: int) -> None:
        """Say in the event files why the input-wait share is unknown (``tfdp-utils report``
        reads it back); nothing when it is measured."""
        if fit.input_wait_note is None:
            return
        for run in self.runs:
            self.writers.text(
                run,
                tags.INPUT_WAIT_NOTE,
                fit.input_wait_note,
                step,
                tags.INPUT_WAIT_NOTE_DESCRIPTION,
            )

    def window(
        self,
        fit: FitState,
        window: ThroughputWindow,
        workers: list[tuple[float, float]] | None,
        share: float,
    ) -> None:
        """A measured window: its counts, rates, input-wait shares, worker spread, memory
        (one event per run)."""
        with self.writers.batch():
            self._window(fit, window, workers, share)

    def _window(
        self,
        fit: FitState,
        window: ThroughputWindow,
        workers: list[tuple[float, float]] | None,
        share: float,
    ) -> None:
        position = fit.placement.position
        timing = tags.window_timing(fit.log_every_n_steps)
        self._counts(fit, window.step)
        if workers:
            waits = {w: wait for w, (_, wait) in enumerate(workers)}
            fit.last_worker_wait = waits
            for w, wait in waits.items():
                fit.worker_wait.setdefault(w, []).append(wait)
        if position.is_chief:
            self._global(window, timing, tags.step_unit(fit.accumulation_steps))
            if workers:
                fit.last_spread = spread([rate for rate, _ in workers])
                self._spread(fit.last_spread, window.step)
            job_wait = max(fit.last_worker_wait.values()) if workers else share
            if job_wait == job_wait:  # not NaN: measured
                self.put(GLOBAL_RUN, tags.INPUT_WAIT_SHARE, job_wait, window.step, timing=timing)
        if position.is_multi_worker:
            run = worker_run(position.index)
            local = sum(window.replica_examples_per_sec[k] for k in position.local_replicas)
            self.put(
                run,
                tags.STEPS_PER_SEC,
                window.steps_per_sec,
                window.step,
                timing=timing,
                steps=tags.step_unit(fit.accumulation_steps),
            )
            self.put(run, tags.EXAMPLES_PER_SEC, local, window.step, timing=timing)
            if share == share:
                self.put(run, tags.INPUT_WAIT_SHARE, share, window.step, timing=timing)
        if self.per_replica:
            self._replicas(fit, window, timing)

    def _global(self, window: ThroughputWindow, timing: str, units: str) -> None:
        step = window.step
        self.put(GLOBAL_RUN, tags.EXAMPLES_PER_SEC, window.examples_per_sec, step, timing=timing)
        self.put(
            GLOBAL_RUN, tags.STEPS_PER_SEC, window.steps_per_sec, step, timing=timing, steps=units
        )
        if window.flops_per_sec is not None:
            self.put(GLOBAL_RUN, tags.FLOPS_PER_SEC, window.flops_per_sec, step)
        if window.mfu is not None:
            self.put(GLOBAL_RUN, tags.MFU, window.mfu, step)

    def _spread(self, worker_spread: tuple[float, float, float], step: int) -> None:
        low, high, skew = worker_spread
        self.put(GLOBAL_RUN, tags.WORKER_STEPS_PER_SEC_MIN, low, step)
        self.put(GLOBAL_RUN, tags.WORKER_STEPS_PER_SEC_MAX, high, step)
        self.put(GLOBAL_RUN, tags.WORKER_SKEW, skew, step)

    def _replicas(self, fit: FitState, window: ThroughputWindow, timing: str) -> None:
        info = fit.counter.info
        exactness = tags.replica_split(exact=info is not None and fit.exact)
        for k in fit.placement.position.local_replicas:
            run = replica_run(k)
            rate = window.replica_examples_per_sec[k]
            self.put(
                run, tags.EXAMPLES_PER_SEC, rate, window.step, exactness=exactness, timing=timing
            )
            device = fit.placement.memory_devices.get(k)
            if device is None:
                continue
            try:
                memory = tf.config.experimental.get_memory_info(device)
            except (ValueError, tf.errors.OpError):
                continue
            fit.peak_memory[k] = int(memory["peak"])
            self.put(
                run, tags.MEMORY_CURRENT_BYTES, float(memory["current"]), window.step, device=device
            )
            self.put(run, tags.MEMORY_PEAK_BYTES, float(memory["peak"]), window.step, device=device)

    def flush(self) -> None:
        """Flush every open run."""
        self.writers.flush()

    def close(self) -> None:
        """Flush and close every open run."""
        self.writers.close()
