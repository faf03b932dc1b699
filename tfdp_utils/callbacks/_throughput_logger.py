"""``ThroughputLogger``: the Keras hooks that log examples/s per replica, worker and job.

A thin Keras adapter over :class:`tfdp_utils.throughput._meter.ThroughputMeter`. It decides when to
measure from the batch indices Keras passes to its hooks (host-side integers, no device
read), and only at those log points reads the optimizer's iteration count (the exact step,
also under ``steps_per_execution > 1``) and the host clock. Counting examples is
:mod:`tfdp_utils.throughput._counts`' job, which worker this is
:mod:`tfdp_utils.cluster._topology`'s,
the run and tag names are :mod:`tfdp_utils.throughput._tags`', the per-``fit`` state and
clock :mod:`tfdp_utils.callbacks._fit_state`'s, and the event files are written by
:mod:`tfdp_utils.callbacks._event_writer`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from tfdp_utils import _dataset_info as dataset_info
from tfdp_utils import _tf
from tfdp_utils._dataset_info import DatasetInfo
from tfdp_utils._tf import keras, tf
from tfdp_utils._validate import boolean, positive_int
from tfdp_utils.callbacks._event_writer import RunWriters
from tfdp_utils.callbacks._fit_state import (
    UNBOUNDED,
    FitData,
    FitState,
    Placement,
    called_from_fit,
    local_devices,
    memory_devices,
    tf_config_has_several_workers,
)
from tfdp_utils.cluster import _topology as topology
from tfdp_utils.compat import _fit_binding as fit_binding
from tfdp_utils.compat._switch import disabled as keras_patches_disabled
from tfdp_utils.data import _input_wait as input_wait
from tfdp_utils.throughput import _tags as tags
from tfdp_utils.throughput._clock import PausableClock
from tfdp_utils.throughput._counts import ExampleCounter, even_split
from tfdp_utils.throughput._input_wait import InputWaitMeter, straggler, verdict
from tfdp_utils.throughput._meter import ThroughputMeter, ThroughputWindow, spread, window_plan
from tfdp_utils.throughput._tags import GLOBAL_RUN, replica_run, worker_run
from tfdp_utils.training import _accumulation as accumulation
from tfdp_utils.training import _mixed_precision as mixed_precision

_Callback: Any = keras.callbacks.Callback
_EPOCH_START = "epoch_start"
EXAMPLES_PER_SEC_KEY = "examples_per_sec"
STEPS_PER_SEC_KEY = "steps_per_sec"
# Callbacks that record the epoch's logs when they are called: listed before ThroughputLogger,
# they record the epoch before its figures are added.
_RECORDING_CLASSES = ("CSVLogger", "TensorBoard")
_RECORDING_MODULES = ("mlflow", "wandb", "comet_ml", "neptune", "clearml", "dvclive", "aim")
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
        self.log_every_n_steps = (
            None
            if log_every_n_steps is None
            else positive_int(
                log_every_n_steps,
                "log_every_n_steps",
                hint="Pass the number of steps each measured window covers, e.g. 100, or "
                "None to choose it from the length of each fit.",
            )
        )
        self.warmup_steps = (
            None
            if warmup_steps is None
            else positive_int(
                warmup_steps,
                "warmup_steps",
                minimum=0,
                hint="Pass 0 to measure from the first step, or a positive number of steps "
                "to leave out while tracing warms up, e.g. 10.",
            )
        )
        self.global_batch_size = (
            None
            if global_batch_size is None
            else positive_int(
                global_batch_size,
                "global_batch_size",
                hint="Pass the examples per step summed over all replicas, e.g. 256.",
            )
        )
        self._given_info = self._dataset_info(dataset)
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
        self._writers = RunWriters(self.log_dir)
        self._carried: tuple[int, ...] = ()  # counts at the end of the last fit
        self._summary: dict[str, Any] = {}
        self._fit: FitState | None = None  # set from train begin to train end
        self._fit_data: FitData | None = None  # set by fit_binding for one fit
        fit_binding.install(applied_by="ThroughputLogger()")  # off under TFDP_NO_KERAS_PATCHES

    def _dataset_info(self, dataset: Any) -> DatasetInfo | None:
        if dataset is None:
            return None
        info = dataset if isinstance(dataset, DatasetInfo) else dataset_info.info_of(dataset)
        if info is None:
            raise TypeError(
                f"dataset={type(dataset).__name__} carries no DatasetInfo; expected a dataset "
                "from tfdp_utils.build_distributed_dataset or a DatasetInfo. For other "
                "datasets pass global_batch_size= instead."
            )
        if self.global_batch_size is not None and info.global_batch_size != (
            self.global_batch_size
        ):
            raise ValueError(
                f"global_batch_size={self.global_batch_size} disagrees with the dataset's "
                f"global batch size {info.global_batch_size}; pass only dataset=."
            )
        return info

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
        self._writers.close()  # left open when a previous fit raised before on_train_end
        if self.epoch_logs:
            self._run_before_recorders()
        self._fit = None
        model = self.model
        if getattr(model, "optimizer", None) is None:
            raise ValueError(
                "ThroughputLogger needs a compiled model with an optimizer (its iteration "
                "count is the step axis); call model.compile(optimizer=...) before fit."
            )
        placement = self._place(model)
        counting = self._count_source(placement)
        exact, derived_reason = self._exactness(counting[0], counting[1])
        self._writers.open(self._run_names(placement.position))
        position = None if self._fit_data is None else self._fit_data.position
        steps_from_host = _tf.IS_KERAS3 and mixed_precision.is_loss_scale_optimizer(model.optimizer)
        origin = self._read_step()
        steps = (getattr(self, "params", None) or {}).get("steps")
        if steps_from_host and position is not None and steps:
            # The optimizer's count leaves out the steps the loss scale skipped; the step
            # axis is Keras' batch positions, which the resumed stream's position gives.
            origin = position.epoch * int(steps) + position.step
        counter = ExampleCounter(
            num_replicas=placement.num_replicas,
            step=origin,
            carried=self._carried,
            global_batch_size=self.global_batch_size,
        )
        counter.info, counter.source = counting
        if position is not None:
            counter.continue_job()  # a resumed job: its counts go on from the runs before
        planned = self._planned_steps()
        every, warmup = window_plan(
            planned, log_every_n_steps=self.log_every_n_steps, warmup_steps=self.warmup_steps
        )
        if planned is not None and self.warmup_steps is not None and self.warmup_steps >= planned:
            logger.warning(
                "tfdp_utils: ThroughputLogger(warmup_steps=%d) leaves out all %d steps of this "
                "fit, so it measures no window: examples/s stays empty (the example counts are "
                "still logged). Pass a warmup_steps below %d, or leave it out (a tenth of the "
                "fit is left out).",
                self.warmup_steps,
                planned,
                planned,
            )
        meter = ThroughputMeter(
            num_replicas=placement.num_replicas,
            warmup_steps=warmup,
            flops_per_example=self.flops_per_example,
            peak_flops_per_replica=self.peak_flops_per_replica,
        )
        fit = FitState(
            placement,
            counter,
            meter,
            PausableClock(),
            every,
            warmup,
            accumulation_steps=accumulation.accumulation_steps(model),
            exact=exact,
            derived_reason=derived_reason,
        )
        fit.steps_from_host = steps_from_host
        fit.host_step = origin
        fit.batch_zero = origin - (position.step if position is not None else 0)
        self._start_input_wait(fit)
        meter.update(step=origin, time=fit.clock.now(), replica_examples=counter.counts)
        fit.next_log = fit.next_check = origin + (warmup or every)
        self._fit = fit
        if derived_reason is not None:
            logger.warning(
                "tfdp_utils: ThroughputLogger's example counts (and examples/s) in this fit are "
                "derived, not exact: %s. summary()['exact'] is False and the TensorBoard runs "
                "say so (%s).",
                derived_reason,
                tags.COUNTS,
            )
        note = tags.counts_note(exact=exact, source=counter.source, reason=derived_reason)
        for run in self._run_names(placement.position):
            self._writers.text(run, tags.COUNTS, note, origin, tags.COUNTS_DESCRIPTION)
        self._write_input_wait_note(fit, origin)
        if placement.position.is_chief:
            mfu = self.flops_per_example is not None and self.peak_flops_per_replica is not None
            job = tags.layout(
                multi_worker=placement.position.is_multi_worker,
                flops=mfu,
                memory=bool(placement.memory_devices),
                input_wait=fit.input_wait is not None,
            )
            self._writers.layout(GLOBAL_RUN, job)
        # The starting count; also pays the first summary write's one-off setup cost here
        # instead of inside the first measured window.
        self._write_counts(fit, origin)
        # From here to the end of the first step is the first epoch's start (tf_keras builds
        # the iterator now; the first step traces).
        self._start_epoch_boundary(fit)

    def _start_input_wait(self, fit: FitState) -> None:
        """Measure the share of time spent waiting for input, where the data allows it."""
        data = self._fit_data
        clock = None if data is None else data.input_clock
        if clock is None:
            what = "the data fit trains on" if data is None else data.kind
            if data is not None and data.info is not None:
                fit.input_wait_note = (
                    "unknown: build_distributed_dataset returned a plain tf.data.Dataset (no "
                    "tf.distribute strategy in use), whose iterator Keras makes; the wait for "
                    "input is measured for the datasets it distributes under a strategy"
                )
            else:
                fit.input_wait_note = (
                    f"unknown: fit trains on {what}; the wait for input is measured inside the "
                    "step for datasets from tfdp_utils.build_distributed_dataset only"
                )
            return
        if input_wait.determinism_enabled():
            fit.input_wait_note = f"unknown: {input_wait.UNTIMED_UNDER_DETERMINISM}"
            logger.info("tfdp_utils: ThroughputLogger's input-wait share: %s", fit.input_wait_note)
            return
        fit.input_wait = InputWaitMeter(lambda: clock.progress().waited_seconds)

    def _planned_steps(self) -> int | None:
        params = getattr(self, "params", None) or {}
        steps, epochs = params.get("steps"), params.get("epochs")
        if not steps or not epochs:
            return None
        return int(steps) * int(epochs)

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
        if fit.placement.position.is_chief:
            self._put(GLOBAL_RUN, tags.EPOCH_START_SECONDS, seconds, fit.counter.epoch_start)

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        steps = (getattr(self, "params", None) or {}).get("steps")
        fit = self._fit
        if fit is None:
            return
        with self._lock:
            fit.steps_in_epoch = int(steps) if steps else UNBOUNDED
            fit.epoch_last = fit.batch_zero + fit.steps_in_epoch if steps else UNBOUNDED
            self._schedule(fit)

    @staticmethod
    def _epoch_figures(fit: FitState, step: int) -> dict[str, float]:
        """The epoch's global rates from the end of its first step to the end of its last."""
        if fit.epoch_mark is None:
            return {}
        started, from_step, from_examples = fit.epoch_mark
        # The clock stopped at the epoch's last step (the boundary started there).
        seconds = fit.clock.now() - started
        steps = step - from_step
        if steps <= 0 or seconds <= 0:
            return {}
        examples = sum(fit.counter.counts) - from_examples
        return {EXAMPLES_PER_SEC_KEY: examples / seconds, STEPS_PER_SEC_KEY: steps / seconds}

    def _run_before_recorders(self) -> None:
        """Move this logger ahead of the callbacks that record epoch logs, in this fit's list.

        Keras' ``CallbackList`` calls its callbacks in list order with one ``logs`` dict, so a
        recorder listed earlier (``CSVLogger``, ``TensorBoard``, MLflow's or W&B's callback)
        would write each epoch before this logger adds its figures. Moving this logger within
        the list during ``on_train_begin`` keeps the loop that is calling it correct: the
        callbacks it moves past have had their ``on_train_begin`` already, and the loop goes
        on with the callback that followed it.
        """
        caller = sys._getframe(2).f_locals.get("self")  # CallbackList.on_train_begin's self
        callbacks = getattr(caller, "callbacks", None)
        if not isinstance(callbacks, list) or self not in callbacks:
            return
        mine = callbacks.index(self)
        earlier = [
            i
            for i, c in enumerate(callbacks[:mine])
            if type(c).__name__ in _RECORDING_CLASSES
            or type(c).__module__.split(".")[0] in _RECORDING_MODULES
        ]
        if not earlier:
            return
        names = ", ".join(type(callbacks[i]).__name__ for i in earlier)
        callbacks.insert(earlier[0], callbacks.pop(mine))
        logger.info(
            "tfdp_utils: ThroughputLogger now runs before %s in this fit, so that they record "
            "its epoch figures; list it first to keep your order.",
            names,
        )

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
        estimate = fit.batch_zero + min(batch + 1, fit.steps_in_epoch)
        fit.host_step = estimate
        if estimate < fit.next_check:
            return
        with self._lock:
            if self._fit is not fit or estimate < fit.next_check:
                return
            if fit.clock.held(_EPOCH_START):
                self._end_epoch_boundary(fit)
            if estimate >= fit.next_log:
                self._log_point(fit, estimate)
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
                logs.update(self._epoch_figures(fit, step))
            fit.epoch_mark = None
            fit.counter.end_epoch(step)
            fit.batch_zero = step
            fit.epoch_last = UNBOUNDED
            self._schedule(fit)
            self._writers.flush()

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
                if started is not None and fit.clock.held(_EPOCH_START):
                    fit.validation_in_boundary += time.perf_counter() - started

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        fit = self._fit
        if fit is None:
            return
        with self._lock:
            self._fit = None
            final = self._read_step(fit)
            self._final_point(fit, final)
            self._carried = tuple(fit.counter.counts)
            clock = None if self._fit_data is None else self._fit_data.input_clock
            if clock is not None and clock.untimed and fit.input_wait is not None:
                fit.input_wait_note = f"unknown: {clock.untimed}"  # determinism came on in fit
                self._write_input_wait_note(fit, final)
            self._summary = self._build_summary(fit, final)
            self._writers.close()

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

    def _place(self, model: Any) -> Placement:
        strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
        position = topology.position_of(strategy)
        memory: dict[int, str] = {}
        if self.memory and self.per_replica:
            memory = memory_devices(position.local_replicas, local_devices(strategy))
        return Placement(strategy, int(strategy.num_replicas_in_sync), position, memory)

    def _run_names(self, position: topology.WorkerPosition) -> list[str]:
        runs = []
        if position.is_chief:
            runs.append(GLOBAL_RUN)
        if position.is_multi_worker:
            runs.append(worker_run(position.index))
        if self.per_replica:
            runs.extend(replica_run(k) for k in position.local_replicas)
        return runs

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

    def _log_point(self, fit: FitState, estimate: int) -> None:
        step = self._read_step()
        now = fit.clock.now()
        fit.counter.count_to(step)
        was_warm = fit.meter.warmed_up
        window = fit.meter.update(step=step, time=now, replica_examples=fit.counter.counts)
        share = self._window_wait(fit, window if was_warm else None)
        # From the host-side estimate, not the read step, so every worker takes the same
        # log points (their collectives must match).
        fit.next_log = estimate + fit.log_every_n_steps
        if not was_warm:
            self._write_counts(fit, step)
            return
        rates = self._gather_workers(fit, window.steps_per_sec if window else math.nan, share)
        if window is None:
            return
        fit.last_window = window
        self._write_window(fit, window, rates, share)

    @staticmethod
    def _window_wait(fit: FitState, window: ThroughputWindow | None) -> float:
        """The input-wait share of ``window`` (NaN when unknown); None starts a new window."""
        meter = fit.input_wait
        if meter is None:
            return math.nan
        if window is None:
            meter.mark()
            return math.nan
        return meter.window(window.seconds)

    def bind_fit_data(self, x: Any) -> None:
        """Receive the data of the ``fit`` call this logger is a callback of (None after it).

        Called by the ``Model.fit`` wrapper of :mod:`tfdp_utils.compat._fit_binding`: the logger
        counts
        with the layout of exactly this call's training data, never with state left by
        another dataset, another model or another ``fit``.
        """
        self._fit_data = None if x is None else FitData(x)

    def _final_point(self, fit: FitState, final: int) -> None:
        """Write the fit's last point: its exact counts, and the rate of the last (partial)
        window after warm-up, so TensorBoard ends on the same total as :meth:`summary`.

        Every worker takes the same branch (the final step and the last written step are the
        same on all of them), so the worker-rate collective matches.
        """
        now = fit.clock.now()
        fit.counter.count_to(final)
        if final <= fit.written_step:
            return
        if not fit.meter.warmed_up:
            self._write_counts(fit, final)
            return
        window = fit.meter.update(step=final, time=now, replica_examples=fit.counter.counts)
        share = self._window_wait(fit, window)
        rates = self._gather_workers(fit, window.steps_per_sec if window else math.nan, share)
        if window is None:
            self._write_counts(fit, final)
            return
        fit.last_window = window
        self._write_window(fit, window, rates, share)

    def _count_source(self, placement: Placement) -> tuple[DatasetInfo | None, str]:
        """The dataset layout to count with, and where it comes from, in words.

        In order: ``dataset=``, the builder dataset this ``fit`` trains on, ``global_batch_size=``.
        Each given figure is checked against what ``fit`` trains on where the logger can see
        it. Raises before the first step when a figure disagrees with the data, or when
        nothing says how many examples a step holds.
        """
        data = self._fit_data
        fit_info = None if data is None else data.info
        info = self._given_info
        position = None if data is None else data.position
        if info is not None and position is not None and position.built_from == info:
            info = None  # the dataset passed, resumed by PreemptionCheckpoint: count its stream
        if info is not None:
            if fit_info is not None and fit_info != info:
                raise ValueError(self._other_dataset_message(info, fit_info))
            source = "the DatasetInfo passed as dataset="
        elif fit_info is not None:
            if self.global_batch_size is not None and (
                self.global_batch_size != fit_info.global_batch_size
            ):
                raise ValueError(
                    f"ThroughputLogger(global_batch_size={self.global_batch_size}) disagrees "
                    "with the dataset fit trains on: build_distributed_dataset built it with "
                    f"{fit_info.global_batch_size} examples per step "
                    f"({fit_info.per_replica_batch_size} per replica on "
                    f"{fit_info.num_replicas_in_sync}), so every count would be off. Pass no "
                    "global_batch_size= (the logger counts from that dataset, partial steps "
                    f"included), or global_batch_size={fit_info.global_batch_size}."
                )
            info = fit_info
            source = "the dataset built by build_distributed_dataset that fit trains on"
        elif self.global_batch_size is not None:
            self._check_global_batch(self.global_batch_size, placement, data)
            return None, (
                f"global_batch_size={self.global_batch_size}, split evenly over the replicas "
                "(the first taking any remainder, as tf.distribute splits a batch)"
            )
        else:
            raise ValueError(
                f"ThroughputLogger cannot count examples: {self._why_no_data(data)}, and no "
                "global_batch_size= or dataset= was given. Pass ThroughputLogger(..., "
                "global_batch_size=<examples per step over all replicas>), or dataset=<a "
                "dataset from build_distributed_dataset>, or train on a dataset from "
                "build_distributed_dataset (fit hands it to the logger: exact counts)."
            )
        if info.num_replicas_in_sync != placement.num_replicas:
            raise ValueError(
                f"The dataset was built for {info.num_replicas_in_sync} replicas but the "
                f"model trains on {placement.num_replicas} "
                f"({type(placement.strategy).__name__}). "
                "Build the dataset under the strategy the model was created in."
            )
        return info, source

    def _why_no_data(self, data: FitData | None) -> str:
        """Why no data says how many examples a step holds, true for every way in."""
        if data is not None:
            return (
                f"fit trains on {data.kind}, which is not a dataset from "
                "tfdp_utils.build_distributed_dataset"
            )
        if not fit_binding.installed():
            if keras_patches_disabled():
                return (
                    "TFDP_NO_KERAS_PATCHES=1 keeps Keras' Model.fit unwrapped, so fit does not "
                    "hand ThroughputLogger the data it trains on"
                )
            return (
                "Keras' Model.fit is not wrapped (tfdp_utils.compat.undo() removed the "
                "wrapper), so fit does not hand ThroughputLogger the data it trains on"
            )
        if called_from_fit(self.model):
            return (
                "this fit call started before Keras' Model.fit was wrapped to hand its data "
                "to callbacks (ThroughputLogger wraps it when it is created, too late for a "
                "fit call that creates the logger in its own arguments; create the logger "
                "before calling fit), so it did not see the data"
            )
        return (
            "its hooks run outside Model.fit (e.g. a custom training loop calls them), so no "
            "fit call hands it the data"
        )

    @staticmethod
    def _check_global_batch(global_batch: int, placement: Placement, data: FitData | None) -> None:
        """``global_batch_size=`` against the replicas and a batch size the data fixes."""
        if (
            data is not None
            and data.static_batch is not None
            and data.static_batch != (global_batch)
        ):
            raise ValueError(
                f"ThroughputLogger(global_batch_size={global_batch}) disagrees with the "
                f"dataset fit trains on: {data.kind} whose every element holds "
                f"{data.static_batch} examples (its element_spec), so every count would be "
                f"off. Pass global_batch_size={data.static_batch}."
            )
        replicas = placement.num_replicas
        if global_batch % replicas:
            low = global_batch - global_batch % replicas
            shares = sorted(set(even_split(global_batch, replicas)), reverse=True)
            raise ValueError(
                f"ThroughputLogger(global_batch_size={global_batch}) is not divisible by the "
                f"{replicas} replicas in sync of {type(placement.strategy).__name__}: "
                f"tf.distribute would give them {' and '.join(map(str, shares))} examples per "
                "step, which Keras' step cannot sum (Keras 3 fails inside it). Use a multiple of "
                f"{replicas} (e.g. {max(low, replicas)} or {low + replicas}) as the batch size "
                "of the dataset and here, or build the dataset with "
                "tdu.build_distributed_dataset, which checks it."
            )

    @staticmethod
    def _other_dataset_message(given: DatasetInfo, trained: DatasetInfo) -> str:
        differ = [
            f"{field.name} {getattr(given, field.name)!r} vs {getattr(trained, field.name)!r}"
            for field in dataclasses.fields(DatasetInfo)
            if getattr(given, field.name) != getattr(trained, field.name)
        ]
        return (
            "ThroughputLogger(dataset=...) describes another dataset than the one fit trains "
            f"on ({'; '.join(differ)}: given vs trained on), so its counts would be those of "
            "the other dataset. Pass no dataset= (fit hands the logger the builder dataset it "
            "trains on), or the dataset you pass to fit."
        )

    def _exactness(self, info: DatasetInfo | None, source: str) -> tuple[bool, str | None]:
        """Whether this fit's counts are exact, and if not, why (for the warning and marker)."""
        if info is not None:
            reason = info.derived_reason()
            return reason is None, reason
        data = self._fit_data
        if data is not None and data.static_batch == self.global_batch_size:
            return True, None
        what = "the data fit trains on" if data is None else data.kind
        return False, (
            f"every step is counted as {source}; the logger cannot check the batches of "
            f"{what}, so a partial last batch is counted as full (a dataset from "
            "build_distributed_dataset gives exact counts)"
        )

    def _gather_workers(
        self, fit: FitState, local_rate: float, local_wait: float
    ) -> list[tuple[float, float]] | None:
        """Every worker's (steps/s, input-wait share) of this window, by worker index.

        One gather at a log point (all workers take the same log points); None with one worker.
        """
        position = fit.placement.position
        if not position.is_multi_worker:
            return None
        strategy = fit.placement.strategy
        value = strategy.experimental_distribute_values_from_function(
            lambda _ctx: tf.constant([[local_rate, local_wait]], tf.float64)
        )
        gathered = strategy.gather(value, axis=0).numpy().tolist()
        per_worker = len(gathered) // max(1, position.num_workers)
        found = [gathered[w * per_worker] for w in range(position.num_workers)]
        return [(float(rate), float(wait)) for rate, wait in found]

    # ------------------------------------------------------------------ writing

    def _put(self, run: str, tag: str, value: float, step: int, **fields: str) -> None:
        """Write one scalar of the schema, with the description the schema gives it."""
        self._writers.scalar(run, tag, value, step, tags.describe(run, tag, **fields))

    def _write_counts(self, fit: FitState, step: int) -> None:
        counter = fit.counter
        fit.written_step = step
        counted = tags.count_origin(
            exact=fit.exact, source=counter.source, reason=fit.derived_reason
        )
        if fit.placement.position.is_chief:
            self._put(GLOBAL_RUN, tags.EXAMPLES, sum(counter.counts), step, counted=counted)
        if self.per_replica:
            for k in fit.placement.position.local_replicas:
                self._put(replica_run(k), tags.EXAMPLES, counter.counts[k], step, counted=counted)

    def _write_input_wait_note(self, fit: FitState, step: int) -> None:
        """Say in the event files why the input-wait share is unknown (``tfdp-utils report``
        reads it back); nothing when it is measured."""
        if fit.input_wait_note is None:
            return
        for run in self._run_names(fit.placement.position):
            self._writers.text(
                run,
                tags.INPUT_WAIT_NOTE,
                fit.input_wait_note,
                step,
                tags.INPUT_WAIT_NOTE_DESCRIPTION,
            )

    def _write_window(
        self,
        fit: FitState,
        window: ThroughputWindow,
        workers: list[tuple[float, float]] | None,
        share: float,
    ) -> None:
        position = fit.placement.position
        timing = tags.window_timing(fit.log_every_n_steps)
        self._write_counts(fit, window.step)
        if workers:
            waits = {w: wait for w, (_, wait) in enumerate(workers)}
            fit.last_worker_wait = waits
            for w, wait in waits.items():
                fit.worker_wait.setdefault(w, []).append(wait)
        if position.is_chief:
            self._write_global(window, timing, tags.step_unit(fit.accumulation_steps))
            if workers:
                fit.last_spread = spread([rate for rate, _ in workers])
                self._write_spread(fit.last_spread, window.step)
            job_wait = max(fit.last_worker_wait.values()) if workers else share
            if job_wait == job_wait:  # not NaN: measured
                self._put(GLOBAL_RUN, tags.INPUT_WAIT_SHARE, job_wait, window.step, timing=timing)
        if position.is_multi_worker:
            run = worker_run(position.index)
            local = sum(window.replica_examples_per_sec[k] for k in position.local_replicas)
            self._put(
                run,
                tags.STEPS_PER_SEC,
                window.steps_per_sec,
                window.step,
                timing=timing,
                steps=tags.step_unit(fit.accumulation_steps),
            )
            self._put(run, tags.EXAMPLES_PER_SEC, local, window.step, timing=timing)
            if share == share:
                self._put(run, tags.INPUT_WAIT_SHARE, share, window.step, timing=timing)
        if self.per_replica:
            self._write_replicas(fit, window, timing)

    def _write_global(self, window: ThroughputWindow, timing: str, units: str) -> None:
        step = window.step
        self._put(GLOBAL_RUN, tags.EXAMPLES_PER_SEC, window.examples_per_sec, step, timing=timing)
        self._put(
            GLOBAL_RUN, tags.STEPS_PER_SEC, window.steps_per_sec, step, timing=timing, steps=units
        )
        if window.flops_per_sec is not None:
            self._put(GLOBAL_RUN, tags.FLOPS_PER_SEC, window.flops_per_sec, step)
        if window.mfu is not None:
            self._put(GLOBAL_RUN, tags.MFU, window.mfu, step)

    def _write_spread(self, worker_spread: tuple[float, float, float], step: int) -> None:
        low, high, skew = worker_spread
        self._put(GLOBAL_RUN, tags.WORKER_STEPS_PER_SEC_MIN, low, step)
        self._put(GLOBAL_RUN, tags.WORKER_STEPS_PER_SEC_MAX, high, step)
        self._put(GLOBAL_RUN, tags.WORKER_SKEW, skew, step)

    def _write_replicas(self, fit: FitState, window: ThroughputWindow, timing: str) -> None:
        info = fit.counter.info
        exactness = tags.replica_split(exact=info is not None and fit.exact)
        for k in fit.placement.position.local_replicas:
            run = replica_run(k)
            rate = window.replica_examples_per_sec[k]
            self._put(
                run, tags.EXAMPLES_PER_SEC, rate, window.step, exactness=exactness, timing=timing
            )
            device = fit.placement.memory_devices.get(k)
            if device is None:
                continue
            try:
                info = tf.config.experimental.get_memory_info(device)
            except (ValueError, tf.errors.OpError):
                continue
            fit.peak_memory[k] = int(info["peak"])
            self._put(
                run, tags.MEMORY_CURRENT_BYTES, float(info["current"]), window.step, device=device
            )
            self._put(run, tags.MEMORY_PEAK_BYTES, float(info["peak"]), window.step, device=device)

    # ------------------------------------------------------------------ results

    def _build_summary(self, fit: FitState, final_step: int) -> dict[str, Any]:
        position = fit.placement.position
        result = fit.meter.summary()
        result["examples"] = sum(fit.counter.counts)
        result["replica_examples"] = list(fit.counter.counts)
        result.update(
            step=final_step,
            steps_trained=final_step - fit.counter.origin,
            log_every_n_steps=fit.log_every_n_steps,
            warmup_steps=fit.warmup_steps,
            accumulation_steps=fit.accumulation_steps,
            epoch_start_seconds=list(fit.epoch_starts),
            num_replicas=fit.placement.num_replicas,
            num_workers=position.num_workers,
            worker=position.index,
            is_chief=position.is_chief,
            local_replicas=list(position.local_replicas),
            count_source=fit.counter.source,
            exact=fit.exact,
            derived_reason=fit.derived_reason,
            log_dir=self.log_dir,
        )
        last = fit.last_window
        if last is not None:
            result["last_window"] = {
                "step": last.step,
                "steps": last.steps,
                "seconds": last.seconds,
                "examples_per_sec": last.examples_per_sec,
                "steps_per_sec": last.steps_per_sec,
            }
        if "steps_per_sec" in result and fit.accumulation_steps > 1:
            result["updates_per_sec"] = result["steps_per_sec"] / fit.accumulation_steps
        if fit.last_spread is not None:
            low, high, skew = fit.last_spread
            result["worker_steps_per_sec"] = {"min": low, "max": high, "skew": skew}
        if fit.peak_memory:
            result["peak_memory_bytes"] = {str(k): v for k, v in fit.peak_memory.items()}
        result.update(self._input_wait_summary(fit))
        return result

    @staticmethod
    def _input_wait_summary(fit: FitState) -> dict[str, Any]:
        meter = fit.input_wait
        share = None if meter is None else meter.share
        result: dict[str, Any] = {"input_wait_share": share}
        if meter is not None and fit.input_wait_note is not None:  # timing stopped in the fit
            result.update(
                input_wait_share=None,
                input_wait_note=fit.input_wait_note,
                input_wait_verdict=verdict({}, unknown=fit.input_wait_note),
            )
            return result
        if meter is None:
            result["input_wait_note"] = fit.input_wait_note
        elif share is None:
            result["input_wait_note"] = "no window was measured after warm-up"
        if fit.worker_wait:
            shares = {
                w: statistics.fmean(v) if all(x == x for x in v) else math.nan
                for w, v in sorted(fit.worker_wait.items())
            }
            result["worker_input_wait_share"] = [None if s != s else s for s in shares.values()]
            named = straggler(shares)
            result["straggler"] = None if named is None else dataclasses.asdict(named)
            result["input_wait_verdict"] = verdict(shares, unknown=fit.input_wait_note)
        elif share is not None:
            result["input_wait_verdict"] = verdict({fit.placement.position.index: share})
        elif fit.input_wait_note is not None:
            result["input_wait_verdict"] = verdict({}, unknown=fit.input_wait_note)
        return result

    def summary(self) -> dict[str, Any]:
        """The figures measured in the last ``fit`` as a plain dict.

        Keys include ``examples`` and ``replica_examples`` (cumulative examples trained, over
        every ``fit`` this logger saw), ``steps_per_sec``, ``examples_per_sec`` and
        ``replica_examples_per_sec`` (over all windows after warm-up; absent when no window
        completed), ``measured_steps``, ``measured_seconds``, ``windows``, ``step``,
        ``num_replicas``, ``num_workers``, ``worker``, ``is_chief``, ``count_source``,
        ``exact`` (whether the counts are exact) and ``derived_reason`` (why not, else None),
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


# GLOBAL_RUN, replica_run and worker_run live in tfdp_utils.throughput._tags; kept importable here.

ThroughputLogger.__module__ = "tfdp_utils.callbacks"  # public home (tfdp_utils._public)
