"""``ThroughputLogger``: the Keras hooks that log examples/s per replica, worker and job.

A thin Keras adapter over :class:`tfdp_utils.throughput._meter.ThroughputMeter`. It decides when to
measure from the batch indices Keras passes to its hooks (host-side integers, no device
read), and only at those log points reads the optimizer's iteration count (the exact step,
also under ``steps_per_execution > 1``) and the host clock. Counting examples is
:mod:`tfdp_utils.throughput._counts`' job, choosing what to count with
:mod:`tfdp_utils.throughput._count_source`'s, which worker this is
:mod:`tfdp_utils.cluster._topology`'s,
the run and tag names are :mod:`tfdp_utils.throughput._tags`', the per-``fit`` state and
clock :mod:`tfdp_utils.callbacks._fit_state`'s, the train-begin setup
:mod:`tfdp_utils.callbacks._fit_start`'s, the events each hook writes
:mod:`tfdp_utils.callbacks._fit_events`' (encoded by :mod:`tfdp_utils.callbacks._event_writer`),
and the summary :mod:`tfdp_utils.callbacks._fit_summary`'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from tfdp_utils import _tf
from tfdp_utils._tf import keras, tf
from tfdp_utils._validate import boolean, positive_int
from tfdp_utils.callbacks._fit_events import FitEvents
from tfdp_utils.callbacks._fit_goodput import SaveTimer, save_timers, write_goodput
from tfdp_utils.callbacks._fit_start import (
    count_facts,
    new_fit,
    place,
    run_before_recorders,
)
from tfdp_utils.callbacks._fit_state import (
    UNBOUNDED,
    FitData,
    FitState,
    tf_config_has_several_workers,
)
from tfdp_utils.callbacks._fit_summary import EXAMPLES_PER_SEC_KEY as EXAMPLES_PER_SEC_KEY
from tfdp_utils.callbacks._fit_summary import STEPS_PER_SEC_KEY as STEPS_PER_SEC_KEY
from tfdp_utils.callbacks._fit_summary import build_summary, epoch_figures
from tfdp_utils.callbacks._log_points import final_point, log_point
from tfdp_utils.cluster import _topology as topology
from tfdp_utils.compat import _fit_binding as fit_binding
from tfdp_utils.throughput import _tags as tags
from tfdp_utils.throughput._count_source import choose_count_source, given_info
from tfdp_utils.throughput._meter import ThroughputMeter
from tfdp_utils.throughput._tags import GLOBAL_RUN as GLOBAL_RUN
from tfdp_utils.throughput._tags import replica_run as replica_run
from tfdp_utils.throughput._tags import worker_run as worker_run
from tfdp_utils.training import _accumulation as accumulation

_Callback: Any = keras.callbacks.Callback
_EPOCH_START = "epoch_start"
logger = logging.getLogger("tfdp_utils")


class ThroughputLogger(_Callback):  # type: ignore[misc]
    """Logs measured examples/s and steps/s per replica, per worker and globally to TensorBoard.

    TensorBoard runs under ``log_dir`` (fixed names, so TensorBoard overlays them and
    ``log_dir`` can be shared with Keras' own ``TensorBoard`` callback):

    - ``global`` (written by the chief only): ``throughput/examples_per_sec``,
      ``throughput/steps_per_sec``, ``throughput/examples`` (cumulative), and
      ``throughput/flops_per_sec`` / ``throughput/mfu`` when FLOPs are given; in
      multi-worker jobs also ``throughput/worker_steps_per_sec_min``, ``..._max`` and
      ``throughput/worker_skew`` (``(max - min) / max``).
    - ``replica_<k>`` for each replica of this worker (k = global replica id):
      ``throughput/examples_per_sec``, ``throughput/examples``, and
      ``memory/current_bytes`` / ``memory/peak_bytes`` where the device reports memory.
    - ``worker_<w>`` (multi-worker jobs): this worker's ``throughput/steps_per_sec`` and
      ``throughput/examples_per_sec``.
    - ``input/wait_share`` (``global``, and ``worker_<w>`` with several workers): the share of
      each window the training loop waited for its next batch, measured inside the step by
      the input clock of a :func:`tfdp_utils.build_distributed_dataset` dataset (only this
      worker's own fetch; waits for other workers are left out). ``global`` carries the
      largest worker's share. Unknown (not written) for other data.

    The step axis counts the batches ``fit`` trained on: the optimizer's iterations, or under
    gradient accumulation (Keras 3's ``gradient_accumulation_steps``,
    :func:`tfdp_utils.enable_gradient_accumulation`) the micro-batches, k per update, so that
    examples stay exact; ``steps_per_sec`` then counts micro-batches and says so, and
    ``summary()`` adds ``updates_per_sec``. Rates cover windows of
    ``log_every_n_steps`` steps after ``warmup_steps`` warm-up steps; validation during
    ``fit`` and each epoch boundary (from the end of an epoch's last step to the end of the
    next epoch's first batch, whose examples are left out too) are left out. Every ``fit``
    ends with a last point at its final step: the exact counts, and the rate of the last
    (possibly shorter) window after warm-up.
    Counts come, in this order, from ``dataset``, from the dataset built by
    :func:`tfdp_utils.build_distributed_dataset` that this ``fit`` call trains on (its ``x``;
    exact per-replica counts, partial batches included), or from ``global_batch_size``. Each
    given figure is checked against what ``fit`` trains on before the first step. Counts that
    are derived rather than exact say so: a WARNING once per ``fit``, a ``throughput/counts``
    text in every run, ``summary()["exact"]`` False with ``summary()["derived_reason"]``.
    When nothing says how many examples a step holds, ``fit`` fails before the first step
    with a message saying why and naming ``dataset=`` and ``global_batch_size=``.

    Args:
        log_dir: directory for the TensorBoard runs (local path or any ``tf.io.gfile`` URL).
        dataset: a dataset from :func:`tfdp_utils.build_distributed_dataset` or its
            :class:`~tfdp_utils._dataset_info.DatasetInfo`, for exact counts. Defaults to
            `None` (use ``global_batch_size``, else the builder dataset ``fit`` iterates).
        global_batch_size: examples per step over all replicas, for datasets not made by
            the builder; every step then counts this many examples, split evenly over the
            replicas. Defaults to `None`.
        log_every_n_steps: steps per measured window. Defaults to `None`: chosen per
            ``fit`` from the steps it will run (:func:`tfdp_utils.throughput._meter.window_plan`):
            100 for long or unknown jobs, shorter for short ones, so that a job of 20 steps
            still shows a curve.
        warmup_steps: steps at the start of each ``fit`` left out of every rate (tracing,
            first batches). Defaults to `None`: 10, or a tenth of a short job (at least 1).
        per_replica: write the ``replica_<k>`` runs. Defaults to `True`.
        memory: write device memory where the device reports it (GPU, TPU; not the CPU).
            Defaults to `True`.
        flops_per_example: training FLOPs per example (forward + backward), to log
            FLOPs/s. Defaults to `None`.
        peak_flops_per_replica: peak FLOPs/s of one replica's device, to log model FLOPs
            utilisation (needs ``flops_per_example``). Defaults to `None`.
        epoch_logs: add the epoch's global ``examples_per_sec`` and ``steps_per_sec`` to
            Keras' epoch ``logs``, so that ``History``, ``CSVLogger`` and the Keras callbacks
            of other loggers record them. They cover the epoch from the end of its first step
            to the end of its last (validation left out), and are absent for an epoch of one
            step. List ThroughputLogger before the callbacks that record them: a
            ``UserWarning`` at train begin names a recording callback listed before it.
            Defaults to `True`.

    Raises:
        TypeError: for arguments of the wrong type (e.g. a plain ``tf.data.Dataset`` as
            ``dataset``).
        ValueError: for non-positive ``log_every_n_steps`` or ``global_batch_size``,
            negative ``warmup_steps``, or inconsistent FLOPs arguments. At train begin: no
            way to count examples, a dataset built for another number of replicas, a
            ``global_batch_size`` that disagrees with the data ``fit`` trains on or does not
            split evenly over the replicas, or a ``dataset`` that is not the one ``fit`` trains
            on.
        OSError: at train begin, when ``log_dir`` cannot be created or written.

    Examples:
    ```python
    logger = tdu.callbacks.ThroughputLogger("logs", global_batch_size=256)
    model.fit(dataset, epochs=3, callbacks=[logger])
    logger.summary()["examples_per_sec"]
    ```
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        *,
        dataset: Any = None,
        global_batch_size: int | None = None,
        log_every_n_steps: int | None = None,
        warmup_steps: int | None = None,
        per_replica: bool = True,
        memory: bool = True,
        flops_per_example: float | None = None,
        peak_flops_per_replica: float | None = None,
        epoch_logs: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(log_dir, (str, os.PathLike)) or not os.fspath(log_dir):
            raise TypeError(f"log_dir={log_dir!r} is not a directory path; pass e.g. 'logs/run1'.")
        self.log_dir = os.fspath(log_dir)
        self.log_every_n_steps = _steps_or_none(
            log_every_n_steps,
            "log_every_n_steps",
            hint="Pass the number of steps each measured window covers, e.g. 100, or "
            "None to choose it from the length of each fit.",
        )
        self.warmup_steps = _steps_or_none(
            warmup_steps,
            "warmup_steps",
            minimum=0,
            hint="Pass 0 to measure from the first step, or a positive number of steps "
            "to leave out while tracing warms up, e.g. 10.",
        )
        self.global_batch_size = _steps_or_none(
            global_batch_size,
            "global_batch_size",
            hint="Pass the examples per step summed over all replicas, e.g. 256.",
        )
        self._given_info = given_info(dataset, global_batch_size=self.global_batch_size)
        self.per_replica = boolean(per_replica, "per_replica")
        self.memory = boolean(memory, "memory")
        self.epoch_logs = boolean(epoch_logs, "epoch_logs")
        # Validates the FLOPs arguments now rather than at train begin.
        ThroughputMeter(
            flops_per_example=flops_per_example, peak_flops_per_replica=peak_flops_per_replica
        )
        self.flops_per_example = flops_per_example
        self.peak_flops_per_replica = peak_flops_per_replica
        # tf_keras: take logs as tensors instead of forcing a host copy every batch.
        _tf.accept_tensor_logs(self)
        self._lock = threading.Lock()
        self._events = FitEvents(self.log_dir)
        self._carried: tuple[int, ...] = ()  # counts at the end of the last fit
        self._summary: dict[str, Any] = {}
        self._fit: FitState | None = None  # set from train begin to train end
        self._fit_data: FitData | None = None  # set by fit_binding for one fit
        self._fit_called: float | None = None  # when that fit was called (time.time())
        self._save_timers: tuple[SaveTimer, ...] = ()  # set by prepare_fit for one fit
        fit_binding.install(applied_by="ThroughputLogger()")  # off under TFDP_NO_KERAS_PATCHES

    # Keras 3 dispatches batch-end hooks on a thread pool when every callback is async safe.
    # A multi-worker log point runs a collective, which must happen in the same order on
    # every worker, so there the hooks stay on the training thread.
    @property
    def async_safe(self) -> bool:
        """Whether Keras 3 may call the batch hooks off the training thread."""
        model = getattr(self, "model", None)
        strategy = getattr(model, "distribute_strategy", None) if model is not None else None
        if strategy is None and tf.distribute.has_strategy():
            strategy = tf.distribute.get_strategy()
        if topology.is_multi_worker(strategy):
            return False
        return not tf_config_has_several_workers()

    # ------------------------------------------------------------------ hooks

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        wall_begin = time.time()
        self._events.close()  # left open when a previous fit raised before on_train_end
        if self.epoch_logs:
            # The caller is Keras' CallbackList, whose list this logger moves within.
            run_before_recorders(self, sys._getframe(1).f_locals.get("self"))
        self._fit = None
        model = self.model
        if getattr(model, "optimizer", None) is None:
            raise ValueError(
                "ThroughputLogger needs a compiled model with an optimizer (its iteration "
                "count is the step axis); call model.compile(optimizer=...) before fit."
            )
        placement = place(model, memory=self.memory and self.per_replica)
        facts = count_facts(
            placement,
            self._fit_data,
            given=self._given_info,
            global_batch_size=self.global_batch_size,
            model=model,
        )
        counting = choose_count_source(facts)
        self._events.open(placement.position, per_replica=self.per_replica)
        fit = new_fit(
            model,
            placement,
            counting,
            self._fit_data,
            params=getattr(self, "params", None) or {},
            carried=self._carried,
            global_batch_size=self.global_batch_size,
            log_every_n_steps=self.log_every_n_steps,
            warmup_steps=self.warmup_steps,
            flops_per_example=self.flops_per_example,
            peak_flops_per_replica=self.peak_flops_per_replica,
        )
        self._fit = fit
        fit.train_begin, fit.clock_origin = wall_begin, fit.clock.now()
        fit.wall_begin = self._fit_called or wall_begin
        if counting.derived_reason is not None:
            logger.warning(
                "tfdp_utils: ThroughputLogger's example counts (and examples/s) in this fit are "
                "derived, not exact: %s. summary()['exact'] is False and the TensorBoard runs "
                "say so (%s).",
                counting.derived_reason,
                tags.COUNTS,
            )
        mfu = self.flops_per_example is not None and self.peak_flops_per_replica is not None
        self._events.begin(fit, fit.host_step, flops=mfu)  # host_step: the fit's first step
        # From here to the end of the first step is the first epoch's start (tf_keras builds
        # the iterator now; the first step traces).
        self._start_epoch_boundary(fit)

    # An epoch boundary lasts from the end of an epoch's last step (where fit knows the
    # epoch's length; else from on_epoch_end) to the end of the next epoch's first step: Keras
    # syncs the metrics and rebuilds the iterator, callbacks do their epoch-end work, and the
    # first step waits for the rebuilt input pipeline's first batch. The clock stands still
    # over it, and the meter leaves the first step's examples out, so every window measures
    # steady training. The batch-end hook meets a boundary's ends through ``next_check``, so
    # a step that is no log point still costs one comparison.

    def _start_epoch_boundary(self, fit: FitState) -> None:
        """Stop the clock (once per boundary) and note where the counters stand."""
        if fit.clock.held(_EPOCH_START):
            return
        fit.pause(_EPOCH_START)
        fit.boundary_from = (fit.counter.counted_step, tuple(fit.counter.counts))

    def _end_epoch_boundary(self, fit: FitState) -> None:
        """The epoch's first step has ended: leave it out of the rates, restart the clock."""
        step = self._read_step()
        fit.counter.count_to(step)
        from_step, from_counts = fit.boundary_from
        fit.meter.exclude(
            steps=step - from_step,
            replica_examples=[c - f for c, f in zip(fit.counter.counts, from_counts, strict=True)],
        )
        # Validation inside the boundary is left out of every rate too, but is no part of the
        # epoch's start.
        seconds = max(0.0, fit.resume(_EPOCH_START) - fit.validation_in_boundary)
        fit.validation_in_boundary = 0.0
        fit.epoch_starts.append(seconds)
        fit.epoch_mark = (fit.clock.now(), step, sum(fit.counter.counts))
        self._events.epoch_start(fit, seconds)

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        steps = (getattr(self, "params", None) or {}).get("steps")
        fit = self._fit
        if fit is None:
            return
        with self._lock:
            fit.steps_in_epoch = int(steps) if steps else UNBOUNDED
            fit.epoch_last = fit.batch_zero + fit.steps_in_epoch if steps else UNBOUNDED
            self._schedule(fit)

    def _schedule(self, fit: FitState) -> None:
        """The step at which the batch-end hook next has work: a log point or a boundary end."""
        boundary_end = fit.counter.epoch_start + 1 if fit.clock.held(_EPOCH_START) else UNBOUNDED
        fit.next_check = min(fit.next_log, fit.epoch_last, boundary_end)

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        # Runs every step (off the training thread on Keras 3): integers only until a log point.
        # Keras 3 rounds the last batch index of an epoch up to a multiple of
        # steps_per_execution, hence the clamp to the epoch's length.
        fit = self._fit
        if fit is None:
            return
        done = batch + 1  # (no min(): a call per step)
        if done > fit.steps_in_epoch:
            done = fit.steps_in_epoch
        estimate = fit.host_step = fit.batch_zero + done
        if estimate < fit.next_check:
            return
        with self._lock:
            if self._fit is not fit or estimate < fit.next_check:
                return
            if fit.clock.held(_EPOCH_START):
                self._end_epoch_boundary(fit)
            if estimate >= fit.next_log:
                log_point(fit, self._read_step(), estimate, self._events)
            if estimate >= fit.epoch_last:
                # The epoch's last step: read the step first, so that the clock stops once the
                # device has finished the epoch's steps, not when the host dispatched the last.
                fit.counter.count_to(self._read_step())
                self._start_epoch_boundary(fit)
                fit.epoch_last = UNBOUNDED
            self._schedule(fit)

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        fit = self._fit
        if fit is None:
            return
        with self._lock:
            # Keras has just synced the epoch's logs; one more read here costs nothing and
            # keeps the next epoch's host-side step estimate and example positions exact.
            step = self._read_step()
            fit.counter.count_to(step)
            self._start_epoch_boundary(fit)  # already started at the last step, if known
            if self.epoch_logs and isinstance(logs, dict):
                logs.update(epoch_figures(fit, step))
            fit.epoch_mark = None
            fit.counter.end_epoch(step)
            fit.batch_zero = step
            fit.epoch_last = UNBOUNDED
            self._schedule(fit)
            self._events.flush()

    def on_test_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        fit = self._fit
        if fit is not None:
            with self._lock:
                fit.pause("validation")
                fit.validation_started = time.perf_counter()

    def on_test_end(self, logs: Mapping[str, Any] | None = None) -> None:
        fit = self._fit
        if fit is not None:
            with self._lock:
                fit.resume("validation")
                started, fit.validation_started = fit.validation_started, None
                if started is not None:
                    fit.validation_seconds += time.perf_counter() - started
                if started is not None and fit.clock.held(_EPOCH_START):
                    fit.validation_in_boundary += time.perf_counter() - started

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        fit = self._fit
        if fit is None:
            return
        with self._lock:
            self._fit = None
            final = self._read_step(fit)
            final_point(fit, final, self._events)
            self._carried = tuple(fit.counter.counts)
            clock = None if self._fit_data is None else self._fit_data.input_clock
            if clock is not None and clock.untimed and fit.input_wait is not None:
                fit.input_wait_note = f"unknown: {clock.untimed}"  # determinism came on in fit
                self._events.input_wait_note(fit, final)
            self._summary = build_summary(fit, final, log_dir=self.log_dir)
            self._summary["goodput"] = write_goodput(
                fit,
                final,
                self._events,
                self.log_dir,
                epoch_start=_EPOCH_START,
                timers=self._save_timers,
            )
            self._events.close()

    def on_fit_stopped(self, batches: int | None = None) -> None:
        """A callback ended ``fit`` early (a preemption): write the last point, as at its end.

        Every worker of a job stops after the same step, so the last point's collective
        matches. ``batches`` is the job's batch position at the stop: the step axis when it
        follows Keras' batch indices (this logger's hook for the last batch may not have run
        when the stopping callback ran before it).
        """
        fit = self._fit
        if fit is not None and fit.steps_from_host and batches is not None:
            fit.host_step = max(fit.host_step, batches)
        self.on_train_end()

    # ------------------------------------------------------------------ measuring

    def _read_step(self, fit: FitState | None = None) -> int:
        # Batches trained: optimizer updates, or micro-batches under gradient accumulation
        # (what the dataset's layout and Keras' batch indices count). The read also waits for
        # the device to finish the steps dispatched (the clock's stops rely on it).
        read = accumulation.batches_trained(self.model)
        fit = fit if fit is not None else self._fit
        if fit is not None and fit.steps_from_host:
            # A step Keras 3's loss scale skips (non-finite gradients) is not in the
            # optimizer's count; Keras' batch index counts it (its hooks run after the step).
            return fit.host_step
        return read

    @contextlib.contextmanager
    def prepare_fit(self, model: Any, arguments: dict[str, Any]) -> Iterator[None]:
        """Note the callbacks of the ``fit`` call this logger is one of that time their
        checkpoint saves (``PreemptionCheckpoint``): the job's goodput leaves their saves out
        of the productive time. Called by the ``Model.fit`` wrapper; kept for that call only.
        """
        self._save_timers = save_timers(arguments.get("callbacks"))
        try:
            yield
        finally:
            self._save_timers = ()

    def bind_fit_data(self, x: Any) -> None:
        """Receive the data of the ``fit`` call this logger is a callback of (None after it).

        Called by the ``Model.fit`` wrapper of :mod:`tfdp_utils.compat._fit_binding`: the logger
        counts with the layout of exactly this call's training data, never with state left by
        another dataset, another model or another ``fit``.
        """
        self._fit_data = None if x is None else FitData(x)
        self._fit_called = None if x is None else time.time()  # fit's start, for its ledger

    def summary(self) -> dict[str, Any]:
        """The figures measured in the last ``fit`` as a plain dict.

        Keys include ``examples`` and ``replica_examples`` (cumulative examples trained, over
        every ``fit`` this logger saw), ``steps_per_sec``, ``examples_per_sec`` and
        ``replica_examples_per_sec`` (over all windows after warm-up; absent when no window
        completed), ``measured_steps``, ``measured_seconds``, ``windows``, ``step``,
        ``num_replicas``, ``num_workers``, ``worker``, ``is_chief``, ``count_source``,
        ``exact`` (whether the counts are exact) and ``derived_reason`` (why not, else None),
        ``shape_change`` (a resume on another number of replicas or workers: ``"at step k:
        <before> -> <after>"``, else None),
        ``log_every_n_steps`` and ``warmup_steps`` (as used in that fit),
        ``epoch_start_seconds`` (each epoch's start, left out of the rates),
        ``input_wait_share`` (the share of the measured time spent waiting for input; None
        with ``input_wait_note`` saying why when unknown) and ``input_wait_verdict``, and
        ``flops_per_sec`` / ``mfu`` / ``worker_steps_per_sec`` / ``peak_memory_bytes`` /
        ``worker_input_wait_share`` / ``straggler`` (the worker named as waiting for input
        clearly more than the others, or None) where measured.

        Returns:
            A new dict; empty before the first ``fit`` ends.
        """
        return dict(self._summary)


def _steps_or_none(value: Any, name: str, *, minimum: int = 1, hint: str) -> int | None:
    """A count argument that may be left out: None, or a whole number >= ``minimum``."""
    return None if value is None else positive_int(value, name, minimum=minimum, hint=hint)


# GLOBAL_RUN, replica_run and worker_run live in tfdp_utils.throughput._tags, and the epoch-log
# keys in tfdp_utils.callbacks._fit_summary; kept importable here.


ThroughputLogger.__module__ = "tfdp_utils.callbacks"  # public home (tfdp_utils._public)
