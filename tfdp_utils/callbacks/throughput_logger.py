"""``ThroughputLogger``: examples/s per replica, per worker and for the whole job, in TensorBoard.

A thin Keras adapter over :class:`tfdp_utils.throughput.ThroughputMeter`. It decides when to
measure from the batch indices Keras passes to its hooks (host-side integers, no device
read), and only at those log points reads the optimizer's iteration count (the exact step,
also under ``steps_per_execution > 1``) and the host clock, turns steps into exact example
counts through the dataset's :class:`~tfdp_utils.dataset_info.DatasetInfo` (or
``global_batch_size``), and writes the window's rates as scalar summaries through
TensorBoard's own event writer (a few microseconds each, written on its own thread; the
same tensor events ``tf.summary.scalar`` writes, without building TensorFlow ops).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from tensorboard.compat.proto import (
    event_pb2,
    summary_pb2,
    tensor_pb2,
    tensor_shape_pb2,
    types_pb2,
)
from tensorboard.plugins.scalar import summary_v2 as scalar_summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from tfdp_utils import dataset_info as _dataset_info
from tfdp_utils._tf import keras, tf
from tfdp_utils.dataset_info import DatasetInfo
from tfdp_utils.throughput import ThroughputMeter, ThroughputWindow, spread

GLOBAL_RUN = "global"
"""Run written by the chief: the job's rates, and the worker spread in multi-worker jobs."""


def replica_run(replica_id: int) -> str:
    """Run name of the replica with global replica id ``replica_id``."""
    return f"replica_{replica_id}"


def worker_run(worker_index: int) -> str:
    """Run name of worker ``worker_index`` (multi-worker jobs only)."""
    return f"worker_{worker_index}"


_Callback: Any = keras.callbacks.Callback
_UNBOUNDED = 2**62


def _positive_int(name: str, value: Any, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} is not an int; {hint}")
    if value <= 0:
        raise ValueError(f"{name}={value} must be positive; {hint}")
    return value


def _even_split(global_batch_size: int, replicas: int) -> tuple[int, ...]:
    # tf.distribute splits a global batch as evenly as it can, the first replicas taking
    # the remainder.
    base, extra = divmod(global_batch_size, replicas)
    return tuple(base + (1 if i < extra else 0) for i in range(replicas))


def _examples_in_epoch_range(info: DatasetInfo, first: int, last: int) -> tuple[int, ...]:
    """Per-replica examples in the steps at positions ``first .. last - 1`` of one epoch.

    Positions past the dataset's epoch count nothing: Keras 3 can run one more (empty) step
    than the epoch has batches before the iterator reports its end.
    """
    replicas = info.num_replicas_in_sync
    if last <= first:
        return (0,) * replicas
    if info.full_steps is None:
        return (info.per_replica_batch_size * (last - first),) * replicas
    full = max(0, min(last, info.full_steps) - max(first, 0))
    totals = [info.per_replica_batch_size * full] * replicas
    end = min(last, info.full_steps + len(info.tail))
    for position in range(max(first, info.full_steps), end):
        for i, value in enumerate(info.tail[position - info.full_steps]):
            totals[i] += value
    return tuple(totals)


def _local_devices(strategy: Any) -> tuple[str, ...]:
    """The devices of this worker's replicas, in replica order."""
    try:
        return tuple(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError, NotImplementedError):
        # The default strategy (no tf.distribute in use) has no worker_devices; its one
        # replica runs where TensorFlow places ops: the first GPU if there is one.
        gpus = tf.config.list_logical_devices("GPU")
        return (gpus[0].name,) if gpus else ("/device:CPU:0",)


def _is_multi_worker(strategy: Any) -> bool:
    probe = getattr(strategy.extended, "_in_multi_worker_mode", None)
    return bool(probe()) if callable(probe) else False


def _tf_config_workers() -> int:
    text = os.environ.get("TF_CONFIG", "")
    if not text:
        return 1
    import json

    try:
        cluster = json.loads(text).get("cluster", {})
    except (ValueError, AttributeError):
        return 1
    return sum(len(cluster.get(job, [])) for job in ("chief", "worker"))


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

    The step axis is the optimizer's iteration count. Rates cover windows of
    ``log_every_n_steps`` steps after ``warmup_steps`` warm-up steps; time spent in
    validation during ``fit`` is left out. Counts come, in this order, from ``dataset``, from
    ``global_batch_size``, or from the dataset built by
    :func:`tfdp_utils.build_distributed_dataset` that ``fit`` iterates (exact per-replica
    counts, partial batches included).

    Args:
        log_dir: directory for the TensorBoard runs (local path or any ``tf.io.gfile`` URL).
        dataset: a dataset from :func:`tfdp_utils.build_distributed_dataset` or its
            :class:`~tfdp_utils.dataset_info.DatasetInfo`, for exact counts. Defaults to
            `None` (use ``global_batch_size``, else the builder dataset ``fit`` iterates).
        global_batch_size: examples per step over all replicas, for datasets not made by
            the builder; every step then counts this many examples, split evenly over the
            replicas. Defaults to `None`.
        log_every_n_steps: steps per measured window. Defaults to `100`.
        warmup_steps: steps at the start of each ``fit`` left out of every rate (tracing,
            first batches). Defaults to `10`.
        per_replica: write the ``replica_<k>`` runs. Defaults to `True`.
        memory: write device memory where the device reports it (GPU, TPU; not the CPU).
            Defaults to `True`.
        flops_per_example: training FLOPs per example (forward + backward), to log
            FLOPs/s. Defaults to `None`.
        peak_flops_per_replica: peak FLOPs/s of one replica's device, to log model FLOPs
            utilisation (needs ``flops_per_example``). Defaults to `None`.

    Raises:
        TypeError: for arguments of the wrong type (e.g. a plain ``tf.data.Dataset`` as
            ``dataset``).
        ValueError: for non-positive ``log_every_n_steps`` or ``global_batch_size``,
            negative ``warmup_steps``, or inconsistent FLOPs arguments. At train begin: no
            way to count examples, or a dataset built for another number of replicas.
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
        log_every_n_steps: int = 100,
        warmup_steps: int = 10,
        per_replica: bool = True,
        memory: bool = True,
        flops_per_example: float | None = None,
        peak_flops_per_replica: float | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(log_dir, (str, os.PathLike)) or not os.fspath(log_dir):
            raise TypeError(f"log_dir={log_dir!r} is not a directory path; pass e.g. 'logs/run1'.")
        self.log_dir = os.fspath(log_dir)
        self.log_every_n_steps = _positive_int(
            "log_every_n_steps",
            log_every_n_steps,
            "pass the number of steps each measured window covers, e.g. 100.",
        )
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int):
            raise TypeError(f"warmup_steps={warmup_steps!r} is not an int; pass e.g. 10.")
        if warmup_steps < 0:
            raise ValueError(
                f"warmup_steps={warmup_steps} is negative; pass 0 to measure from the first "
                "step, or a positive number of steps to leave out while tracing warms up."
            )
        self.warmup_steps = warmup_steps
        self.global_batch_size = (
            None
            if global_batch_size is None
            else _positive_int(
                "global_batch_size",
                global_batch_size,
                "pass the examples per step summed over all replicas, e.g. 256.",
            )
        )
        self._given_info: DatasetInfo | None = None
        if dataset is not None:
            info = dataset if isinstance(dataset, DatasetInfo) else _dataset_info.info_of(dataset)
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
            self._given_info = info
        self.per_replica = bool(per_replica)
        self.memory = bool(memory)
        # Validates the FLOPs arguments now rather than at train begin.
        ThroughputMeter(
            flops_per_example=flops_per_example, peak_flops_per_replica=peak_flops_per_replica
        )
        self.flops_per_example = flops_per_example
        self.peak_flops_per_replica = peak_flops_per_replica
        # tf_keras: take logs as tensors instead of forcing a host copy every batch.
        self._supports_tf_logs = True
        self._lock = threading.Lock()
        self._writers: dict[str, Any] = {}
        self._metadata: dict[tuple[str, str], Any] = {}
        self._carried: tuple[int, ...] | None = None
        self._summary: dict[str, Any] = {}
        self._reset_fit_state()

    # Keras 3 dispatches batch-end hooks on a thread pool when every callback is async safe.
    # A multi-worker log point runs a collective, which must happen in the same order on
    # every worker, so there the hooks stay on the training thread.
    @property
    def async_safe(self) -> bool:
        """Whether Keras 3 may call the batch hooks off the training thread."""
        model = getattr(self, "_model", None) or getattr(self, "model", None)
        strategy = getattr(model, "distribute_strategy", None) if model is not None else None
        if strategy is None and tf.distribute.has_strategy():
            strategy = tf.distribute.get_strategy()
        if strategy is not None and _is_multi_worker(strategy):
            return False
        return _tf_config_workers() <= 1

    # ------------------------------------------------------------------ state

    def _reset_fit_state(self) -> None:
        self._meter: ThroughputMeter | None = None
        self._info: DatasetInfo | None = None
        self._source = ""
        self._in_fit = False
        self._origin = 0
        self._epoch_base = 0
        self._next_check = _UNBOUNDED  # no log point before on_train_begin sets one
        self._steps_in_epoch = _UNBOUNDED
        self._counted_step = 0
        self._counts: list[int] = []
        self._excluded = 0.0
        self._paused_at: float | None = None
        self._strategy: Any = None
        self._devices: tuple[str, ...] = ()
        self._num_replicas = 1
        self._num_workers = 1
        self._worker = 0
        self._is_chief = True
        self._multi_worker = False
        self._local_replicas: tuple[int, ...] = (0,)
        self._memory_devices: dict[int, str] = {}
        self._last_window: ThroughputWindow | None = None
        self._last_spread: tuple[float, float, float] | None = None
        self._peak_memory: dict[int, int] = {}

    # ------------------------------------------------------------------ hooks

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self._close_writers()  # left open when a previous fit raised before on_train_end
        self._reset_fit_state()
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError(
                "ThroughputLogger needs a compiled model with an optimizer (its iteration "
                "count is the step axis); call model.compile(optimizer=...) before fit."
            )
        strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
        self._strategy = strategy
        self._num_replicas = int(strategy.num_replicas_in_sync)
        self._multi_worker = _is_multi_worker(strategy)
        self._devices = _local_devices(strategy)
        local = max(1, len(self._devices))
        if self._multi_worker:
            self._worker, self._num_workers, self._is_chief = self._worker_position(strategy)
        first = self._worker * local
        self._local_replicas = tuple(range(first, min(first + local, self._num_replicas)))
        self._resolve_counts(at_train_begin=True)
        self._open_writers()
        if self.memory and self.per_replica:
            self._memory_devices = self._probe_memory(self._devices)
        self._origin = self._read_step()
        self._epoch_base = self._origin
        self._counted_step = self._origin
        self._meter = ThroughputMeter(
            num_replicas=self._num_replicas,
            warmup_steps=self.warmup_steps,
            flops_per_example=self.flops_per_example,
            peak_flops_per_replica=self.peak_flops_per_replica,
        )
        if self._carried is None or len(self._carried) != self._num_replicas:
            self._carried = (0,) * self._num_replicas
        self._counts = list(self._carried)
        self._meter.update(step=self._origin, time=self._clock(), replica_examples=self._counts)
        self._next_check = self._origin + (
            self.warmup_steps if self.warmup_steps else self.log_every_n_steps
        )
        self._in_fit = True
        if self._is_chief:
            self._write_layout()
        # The starting count; also pays the first summary write's one-off setup cost here
        # instead of inside the first measured window.
        self._write_counts(self._origin)

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        steps = (getattr(self, "params", None) or {}).get("steps")
        self._steps_in_epoch = int(steps) if steps else _UNBOUNDED

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        # Runs every step (off the training thread on Keras 3): integers only until a log point.
        # Keras 3 rounds the last batch index of an epoch up to a multiple of
        # steps_per_execution, hence the clamp to the epoch's length.
        estimate = self._epoch_base + min(batch + 1, self._steps_in_epoch)
        if estimate < self._next_check or not self._in_fit:
            return
        with self._lock:
            if estimate < self._next_check or not self._in_fit:
                return
            self._log_point(estimate)

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        if not self._in_fit:
            return
        with self._lock:
            # Keras has just synced the epoch's logs; one more read here costs nothing and
            # keeps the next epoch's host-side step estimate and example positions exact.
            step = self._read_step()
            self._count_to(step)
            self._epoch_base = step
            for writer in self._writers.values():
                writer.flush()

    def on_test_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        if self._in_fit:
            with self._lock:
                self._paused_at = time.perf_counter()

    def on_test_end(self, logs: Mapping[str, Any] | None = None) -> None:
        if self._in_fit:
            with self._lock:
                if self._paused_at is not None:
                    self._excluded += time.perf_counter() - self._paused_at
                    self._paused_at = None

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        if not self._in_fit:
            return
        with self._lock:
            self._in_fit = False
            final = self._read_step()
            self._count_to(final)
            self._carried = tuple(self._counts)
            self._summary = self._build_summary(final)
            self._close_writers()

    def _close_writers(self) -> None:
        for writer in self._writers.values():
            writer.flush()
            writer.close()
        self._writers = {}

    # ------------------------------------------------------------------ measuring

    def _clock(self) -> float:
        now = self._paused_at if self._paused_at is not None else time.perf_counter()
        return now - self._excluded

    def _read_step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def _count_to(self, step: int) -> None:
        if step <= self._counted_step:
            return
        if self._info is None:
            self._resolve_counts(at_train_begin=False)
        first = self._counted_step - self._origin
        last = step - self._origin
        if self._info is not None and self._info.repeat:
            # A repeating dataset is iterated on across fit's epochs: its own layout, counted
            # from the start of iteration, decides.
            added = self._info.examples_in_steps(first, last)
        elif self._info is not None:
            # Epochs as fit ran them (not the dataset's steps_per_epoch): positions count
            # from the step at which this epoch began.
            start = self._epoch_base - self._origin
            added = _examples_in_epoch_range(self._info, first - start, last - start)
        else:
            assert self.global_batch_size is not None
            per_step = _even_split(self.global_batch_size, self._num_replicas)
            added = tuple(n * (last - first) for n in per_step)
        for i, value in enumerate(added):
            self._counts[i] += value
        self._counted_step = step

    def _log_point(self, estimate: int) -> None:
        assert self._meter is not None
        step = self._read_step()
        now = self._clock()
        self._count_to(step)
        was_warm = self._meter.warmed_up
        window = self._meter.update(step=step, time=now, replica_examples=self._counts)
        # From the host-side estimate, not the read step, so every worker takes the same
        # log points (their collectives must match).
        self._next_check = estimate + self.log_every_n_steps
        if not was_warm:
            self._write_counts(step)
            return
        rates = self._gather_worker_rates(window.steps_per_sec if window else math.nan)
        if window is None:
            return
        self._last_window = window
        self._write_window(window, rates)

    def _resolve_counts(self, *, at_train_begin: bool) -> None:
        info = self._given_info
        source = "the DatasetInfo passed as dataset="
        if info is None and self.global_batch_size is None:
            info = _dataset_info.last_iterated()
            source = "the dataset built by build_distributed_dataset"
        if info is None and self.global_batch_size is None:
            if at_train_begin and _dataset_info.datasets_built() > 0:
                return  # read at the first log point, once fit iterates the dataset
            raise ValueError(
                "ThroughputLogger cannot count examples: no global_batch_size was given and "
                "the model is not trained on a dataset from tfdp_utils.build_distributed_dataset. "
                "Pass ThroughputLogger(..., global_batch_size=<examples per step over all "
                "replicas>) or train on a dataset from build_distributed_dataset."
            )
        if info is not None:
            if info.num_replicas_in_sync != self._num_replicas:
                raise ValueError(
                    f"The dataset was built for {info.num_replicas_in_sync} replicas but the "
                    f"model trains on {self._num_replicas} ({type(self._strategy).__name__}). "
                    "Build the dataset under the strategy the model was created in."
                )
            self._info = info
            self._source = source
        else:
            self._source = "global_batch_size, split evenly over the replicas"

    def _worker_position(self, strategy: Any) -> tuple[int, int, bool]:
        resolver = strategy.cluster_resolver
        spec = resolver.cluster_spec().as_dict()
        chiefs = len(spec.get("chief", []))
        workers = len(spec.get("worker", []))
        task_type, task_id = resolver.task_type, int(resolver.task_id or 0)
        # Same order as MultiWorkerMirroredStrategy's replica ids: chief first, then workers.
        index = 0 if task_type == "chief" else chiefs + task_id
        is_chief = task_type == "chief" or (chiefs == 0 and task_type == "worker" and task_id == 0)
        return index, chiefs + workers, is_chief

    def _gather_worker_rates(self, local_rate: float) -> list[float] | None:
        if not self._multi_worker:
            return None
        strategy = self._strategy
        value = strategy.experimental_distribute_values_from_function(
            lambda _ctx: tf.constant([local_rate], tf.float64)
        )
        gathered = strategy.gather(value, axis=0).numpy().tolist()
        per_worker = len(gathered) // max(1, self._num_workers)
        return [float(gathered[w * per_worker]) for w in range(self._num_workers)]

    def _probe_memory(self, devices: tuple[str, ...]) -> dict[int, str]:
        found: dict[int, str] = {}
        for replica, device in zip(self._local_replicas, devices, strict=False):
            name = device.rsplit("device:", 1)[-1]
            if name.upper().startswith("CPU"):
                continue  # TensorFlow reports zeros (or raises ValueError) for the CPU
            try:
                tf.config.experimental.get_memory_info(name)
            except (ValueError, tf.errors.OpError):
                continue  # the CPU reports no memory
            found[replica] = name
        return found

    # ------------------------------------------------------------------ writing

    def _open_writers(self) -> None:
        runs = []
        if self._is_chief:
            runs.append(GLOBAL_RUN)
        if self._multi_worker:
            runs.append(worker_run(self._worker))
        if self.per_replica:
            runs.extend(replica_run(k) for k in self._local_replicas)
        for run in runs:
            path = os.path.join(self.log_dir, run)
            probe = os.path.join(path, f".tfdp_write_check.{os.getpid()}")
            try:
                tf.io.gfile.makedirs(path)
                with tf.io.gfile.GFile(probe, "w") as handle:
                    handle.write("")
                tf.io.gfile.remove(probe)
            except (OSError, tf.errors.OpError) as exc:
                raise OSError(
                    f"ThroughputLogger cannot write its TensorBoard run to {path!r} "
                    f"(log_dir={self.log_dir!r}): {getattr(exc, 'message', exc)}. Pass a "
                    "log_dir this process can create and write."
                ) from exc
            self._writers[run] = EventFileWriter(path)

    def _scalar(self, run: str, tag: str, value: float, step: int, description: str) -> None:
        writer = self._writers.get(run)
        if writer is None:
            return
        key = (tag, description)
        metadata = self._metadata.get(key)
        if metadata is None:
            # What tf.summary.scalar writes: a float32 scalar tensor with the scalars
            # plugin's metadata; built once per tag and reused.
            metadata = scalar_summary.scalar_pb(tag, 0.0, description=description).value[0].metadata
            self._metadata[key] = metadata
        summary = summary_pb2.Summary(
            value=[
                summary_pb2.Summary.Value(
                    tag=tag,
                    metadata=metadata,
                    tensor=tensor_pb2.TensorProto(
                        dtype=types_pb2.DT_FLOAT,
                        tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                        float_val=[float(value)],
                    ),
                )
            ]
        )
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def _write_counts(self, step: int) -> None:
        counted = self._count_description()
        if self._is_chief:
            self._scalar(
                GLOBAL_RUN,
                "throughput/examples",
                sum(self._counts),
                step,
                f"{counted} All replicas.",
            )
        if self.per_replica:
            for k in self._local_replicas:
                self._scalar(
                    replica_run(k), "throughput/examples", self._counts[k], step, f"{counted}"
                )

    def _count_description(self) -> str:
        kind = "Exact count" if self._info is not None else "Derived count"
        return f"{kind}: cumulative examples trained, from {self._source or 'the dataset'}."

    def _write_window(self, window: ThroughputWindow, worker_rates: list[float] | None) -> None:
        step = window.step
        n = self.log_every_n_steps
        timing = (
            f"over the last window (about {n} optimizer steps), wall time on this worker's "
            "host clock at log points, validation excluded"
        )
        self._write_counts(step)
        if self._is_chief:
            self._scalar(
                GLOBAL_RUN,
                "throughput/examples_per_sec",
                window.examples_per_sec,
                step,
                f"Measured: examples trained per second, all replicas, {timing}.",
            )
            self._scalar(
                GLOBAL_RUN,
                "throughput/steps_per_sec",
                window.steps_per_sec,
                step,
                f"Measured: optimizer steps per second {timing}.",
            )
            if window.flops_per_sec is not None:
                self._scalar(
                    GLOBAL_RUN,
                    "throughput/flops_per_sec",
                    window.flops_per_sec,
                    step,
                    "Derived: measured examples/s times the flops_per_example given to "
                    "ThroughputLogger.",
                )
            if window.mfu is not None:
                self._scalar(
                    GLOBAL_RUN,
                    "throughput/mfu",
                    window.mfu,
                    step,
                    "Derived: model FLOPs utilisation, flops_per_sec / (peak_flops_per_replica "
                    "x replicas), from the FLOPs figures given to ThroughputLogger.",
                )
            if worker_rates:
                low, high, skew = spread(worker_rates)
                self._last_spread = (low, high, skew)
                described = "Derived from the workers' measured steps/s, gathered at this step"
                self._scalar(
                    GLOBAL_RUN, "throughput/worker_steps_per_sec_min", low, step, f"{described}."
                )
                self._scalar(
                    GLOBAL_RUN, "throughput/worker_steps_per_sec_max", high, step, f"{described}."
                )
                self._scalar(
                    GLOBAL_RUN,
                    "throughput/worker_skew",
                    skew,
                    step,
                    f"{described}: (max - min) / max; 0 when all workers step alike.",
                )
        if self._multi_worker:
            run = worker_run(self._worker)
            local = sum(window.replica_examples_per_sec[k] for k in self._local_replicas)
            self._scalar(
                run,
                "throughput/steps_per_sec",
                window.steps_per_sec,
                step,
                f"Measured: this worker's optimizer steps per second {timing}.",
            )
            self._scalar(
                run,
                "throughput/examples_per_sec",
                local,
                step,
                f"Measured: examples this worker's replicas trained per second {timing}.",
            )
        if not self.per_replica:
            return
        exactness = (
            "exact per-replica counts"
            if self._info is not None
            else ("global_batch_size split evenly (assumed)")
        )
        for k in self._local_replicas:
            run = replica_run(k)
            self._scalar(
                run,
                "throughput/examples_per_sec",
                window.replica_examples_per_sec[k],
                step,
                f"Derived: examples this replica trained ({exactness}) divided by the "
                f"worker's measured window time; replicas of one worker step together. {timing}.",
            )
            device = self._memory_devices.get(k)
            if device is None:
                continue
            try:
                info = tf.config.experimental.get_memory_info(device)
            except (ValueError, tf.errors.OpError):
                continue
            self._peak_memory[k] = int(info["peak"])
            self._scalar(
                run,
                "memory/current_bytes",
                float(info["current"]),
                step,
                f"Measured: bytes allocated on {device} at this step.",
            )
            self._scalar(
                run,
                "memory/peak_bytes",
                float(info["peak"]),
                step,
                f"Measured: peak bytes allocated on {device} so far.",
            )

    def _write_layout(self) -> None:
        from tensorboard.plugins.custom_scalar import layout_pb2
        from tensorboard.plugins.custom_scalar import summary as custom_scalar_summary

        def chart(title: str, *tags: str) -> Any:
            return layout_pb2.Chart(
                title=title, multiline=layout_pb2.MultilineChartContent(tag=list(tags))
            )

        layout = layout_pb2.Layout(
            category=[
                layout_pb2.Category(
                    title="throughput",
                    chart=[
                        chart(
                            "examples/s: global, workers and replicas",
                            r"^throughput/examples_per_sec$",
                        ),
                        chart("steps/s: global and workers", r"^throughput/steps_per_sec$"),
                        chart(
                            "worker steps/s spread",
                            r"^throughput/worker_steps_per_sec_(min|max)$",
                        ),
                        chart("worker skew", r"^throughput/worker_skew$"),
                        chart("examples trained", r"^throughput/examples$"),
                        chart("MFU", r"^throughput/mfu$"),
                    ],
                ),
                layout_pb2.Category(
                    title="memory",
                    chart=[chart("device memory per replica", r"^memory/.*_bytes$")],
                    closed=True,
                ),
            ]
        )
        # The plugin builds TensorFlow's Summary proto; the event writer takes TensorBoard's.
        summary = summary_pb2.Summary.FromString(
            custom_scalar_summary.pb(layout).SerializeToString()
        )
        self._writers[GLOBAL_RUN].add_event(
            event_pb2.Event(wall_time=time.time(), step=0, summary=summary)
        )

    # ------------------------------------------------------------------ results

    def _build_summary(self, final_step: int) -> dict[str, Any]:
        assert self._meter is not None
        result = self._meter.summary()
        result["examples"] = sum(self._counts)
        result["replica_examples"] = list(self._counts)
        result.update(
            step=final_step,
            steps_trained=final_step - self._origin,
            log_every_n_steps=self.log_every_n_steps,
            num_replicas=self._num_replicas,
            num_workers=self._num_workers,
            worker=self._worker,
            is_chief=self._is_chief,
            local_replicas=list(self._local_replicas),
            count_source=self._source,
            log_dir=self.log_dir,
        )
        if self._last_window is not None:
            result["last_window"] = {
                "step": self._last_window.step,
                "steps": self._last_window.steps,
                "seconds": self._last_window.seconds,
                "examples_per_sec": self._last_window.examples_per_sec,
                "steps_per_sec": self._last_window.steps_per_sec,
            }
        if self._last_spread is not None:
            low, high, skew = self._last_spread
            result["worker_steps_per_sec"] = {"min": low, "max": high, "skew": skew}
        if self._peak_memory:
            result["peak_memory_bytes"] = {str(k): v for k, v in self._peak_memory.items()}
        return result

    def summary(self) -> dict[str, Any]:
        """The figures measured in the last ``fit`` as a plain dict.

        Keys include ``examples`` and ``replica_examples`` (cumulative examples trained, over
        every ``fit`` this logger saw), ``steps_per_sec``, ``examples_per_sec`` and
        ``replica_examples_per_sec`` (over all windows after warm-up; absent when no window
        completed), ``measured_steps``, ``measured_seconds``, ``windows``, ``step``,
        ``num_replicas``, ``num_workers``, ``worker``, ``is_chief``, ``count_source``,
        and ``flops_per_sec`` / ``mfu`` / ``worker_steps_per_sec`` / ``peak_memory_bytes``
        where measured.

        Returns:
            A new dict; empty before the first ``fit`` ends.
        """
        return dict(self._summary)


__all__ = ["GLOBAL_RUN", "ThroughputLogger", "replica_run", "worker_run"]
