"""What one ``fit`` looks like to the throughput logger: where it trains, its clock, its state.

:class:`Placement` (strategy, worker position, devices that report memory), a
:class:`PausableClock` that leaves validation and epoch boundaries out, and :class:`FitState`,
the per-``fit`` measuring state that :class:`~tfdp_utils.callbacks.ThroughputLogger` creates at
every train begin.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from typing import Any

from tfdp_utils import _dataset_info as dataset_info
from tfdp_utils._tf import tf
from tfdp_utils.cluster import _topology as topology
from tfdp_utils.data import _input_wait as input_wait
from tfdp_utils.throughput._clock import PausableClock
from tfdp_utils.throughput._counts import ExampleCounter
from tfdp_utils.throughput._input_wait import InputWaitMeter
from tfdp_utils.throughput._meter import ThroughputMeter, ThroughputWindow

UNBOUNDED = 2**62
"""A step count no fit reaches (no check planned, an epoch of unknown length)."""


def local_devices(strategy: Any) -> tuple[str, ...]:
    """The devices of this worker's replicas, in replica order."""
    try:
        return tuple(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError, NotImplementedError):
        # The default strategy (no tf.distribute in use) has no worker_devices; its one
        # replica runs where TensorFlow places ops: the first GPU if there is one.
        gpus = tf.config.list_logical_devices("GPU")
        return (gpus[0].name,) if gpus else ("/device:CPU:0",)


def memory_devices(replicas: tuple[int, ...], devices: tuple[str, ...]) -> dict[int, str]:
    """Replica id -> device name, for this worker's replicas whose device reports memory."""
    found: dict[int, str] = {}
    for replica, device in zip(replicas, devices, strict=False):
        name = device.rsplit("device:", 1)[-1]
        if name.upper().startswith("CPU"):
            continue  # TensorFlow reports zeros (or raises ValueError) for the CPU
        try:
            tf.config.experimental.get_memory_info(name)
        except (ValueError, tf.errors.OpError):
            continue  # a device that reports no memory
        found[replica] = name
    return found


def tf_config_has_several_workers() -> bool:
    """Whether TF_CONFIG names more than one training worker (chief + workers)."""
    environ = {"TF_CONFIG": os.environ.get("TF_CONFIG", "")}  # TF_CONFIG only, not SLURM
    try:
        return topology.position_from_environment(environ).is_multi_worker
    except ValueError:
        # A malformed TF_CONFIG fails loudly where the cluster is built; a property Keras
        # reads must not raise, so here it counts as one worker.
        return False


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one ``fit`` trains: its strategy, this worker's position and memory devices."""

    strategy: Any
    num_replicas: int
    position: topology.WorkerPosition
    memory_devices: Mapping[int, str]


class FitData:
    """What the current ``fit`` trains on: the builder's info, or what kind of data it is.

    Attributes:
        info: the builder's :class:`~tfdp_utils._dataset_info.DatasetInfo`, or None.
        kind: ``"a <type name>"``, for messages.
        static_batch: for a plain ``tf.data.Dataset`` whose every element has the same static
            first dimension (batched with ``drop_remainder=True``), that batch size; else None.
        position: where a resumed builder dataset starts (``PreemptionCheckpoint``), or None.
        input_clock: the builder dataset's clock of waits for input, or None.
    """

    def __init__(self, x: Any) -> None:
        self.info = dataset_info.info_of(x)
        self.position = dataset_info.position_of_stream(x)
        self.input_clock = input_wait.clock_of(x)
        self.kind = f"a {type(x).__name__}"
        self.static_batch = static_batch_size(x) if self.info is None else None


def static_batch_size(data: Any) -> int | None:
    """The examples in every element of a plain ``tf.data.Dataset``, when its spec fixes them."""
    if not isinstance(data, tf.data.Dataset):
        return None
    sizes = set()
    for spec in tf.nest.flatten(data.element_spec):
        shape = getattr(spec, "shape", None)
        if shape is None or shape.rank is None or shape.rank == 0:
            return None
        sizes.add(shape[0])
    return sizes.pop() if len(sizes) == 1 and None not in sizes else None


def called_from_fit(model: Any) -> bool:
    """Whether a ``fit`` method of ``model`` is on the call stack (the logger's hook runs in it).

    Only to word an error: the data comes from :mod:`tfdp_utils.compat._fit_binding`.
    """
    frame: Any = sys._getframe(1)
    for _ in range(200):
        if frame is None:
            return False
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            return True
        frame = frame.f_back
    return False


@dataclasses.dataclass
class FitState:
    """What one ``fit`` measures: a new one at every train begin, dropped at train end."""

    placement: Placement
    counter: ExampleCounter
    meter: ThroughputMeter
    clock: PausableClock
    log_every_n_steps: int
    warmup_steps: int
    accumulation_steps: int = 1  # batches per optimizer update (gradient accumulation)
    next_check: int = UNBOUNDED  # min(next_log, epoch_last): the batch-end hook's one comparison
    next_log: int = UNBOUNDED  # the next log point
    epoch_last: int = UNBOUNDED  # the step that ends this epoch, when fit knows its length
    steps_in_epoch: int = UNBOUNDED
    # The step before Keras' batch 0 of this epoch: the epoch's start, and for a resumed
    # epoch (numbered from its position by PreemptionCheckpoint) the start of the whole epoch.
    batch_zero: int = 0
    written_step: int = -1  # the step of the last counts written
    last_window: ThroughputWindow | None = None
    last_spread: tuple[float, float, float] | None = None
    peak_memory: dict[int, int] = dataclasses.field(default_factory=dict)
    epoch_starts: list[float] = dataclasses.field(default_factory=list)
    exact: bool = True  # whether the counts are exact
    derived_reason: str | None = None  # why they are not
    # (step, counts) where the current epoch boundary began: its steps are left out of rates.
    boundary_from: tuple[int, tuple[int, ...]] = (0, ())
    validation_started: float | None = None  # host time of on_test_begin
    validation_in_boundary: float = 0.0  # validation seconds inside the epoch boundary
    # (clock seconds, step, examples) at the end of the epoch's first step: the epoch's figures
    # for Keras' logs run from here to its last step.
    epoch_mark: tuple[float, int, int] | None = None
    # The share of each window spent waiting for input (a builder dataset's clock), or None
    # when fit trains on other data; with several workers, each worker's shares so far.
    input_wait: InputWaitMeter | None = None
    input_wait_note: str | None = None  # why the share is unknown
    worker_wait: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    last_worker_wait: dict[int, float] = dataclasses.field(default_factory=dict)
    # Keras 3's LossScaleOptimizer counts only the steps it applied: the step axis then follows
    # Keras' own batch indices (host_step), read where the device's count would be.
    steps_from_host: bool = False
    host_step: int = 0
    # The step this fit started at (a resumed job's restored step; the counter's origin is
    # the dataset layout's, 0 for a resumed stream of epochs).
    first_step: int = 0
    # For the fit's ledger (goodput): when it began (wall clock), the clock's reading at train
    # begin, and the seconds of validation (evaluate inside fit).
    wall_begin: float = 0.0  # fit called (through tfdp-utils' fit binding), else train begin
    train_begin: float = 0.0
    clock_origin: float = 0.0
    validation_seconds: float = 0.0
    # An elastic resume: "at step k: <old shape> -> <new shape>", or None.
    shape_change: str | None = None

    def pause(self, reason: str) -> None:
        """Stop the clock (and the input-wait total with it) for ``reason``."""
        self.clock.pause(reason)
        if self.input_wait is not None:
            self.input_wait.pause(reason)

    def resume(self, reason: str) -> float:
        """Release ``reason``; the seconds the clock stood still, if it restarts.

        The clock restarts first: reading the input-wait total (a host read of a variable) then
        falls inside the measured time, as the hook's other work does, and the paused span
        stays the boundary itself.
        """
        held = self.clock.resume(reason)
        if self.input_wait is not None:
            self.input_wait.resume(reason)
        return held
