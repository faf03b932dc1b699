"""What ``ThroughputLogger``'s train-begin hook sets up, step by step, before the first step.

Where the ``fit`` trains (:func:`place`), the facts its count source is chosen from
(:func:`count_facts`, decided by :mod:`tfdp_utils.throughput._count_source`), the logger's
place among the callbacks that record epoch logs (:func:`run_before_recorders`), and the fit's
measuring state at its first step (:func:`new_fit`): counter, window plan, meter, input clock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tfdp_utils import _tf
from tfdp_utils._dataset_info import DatasetInfo, StreamPosition
from tfdp_utils._tf import tf
from tfdp_utils.callbacks._fit_state import (
    FitData,
    FitState,
    Placement,
    called_from_fit,
    local_devices,
    memory_devices,
)
from tfdp_utils.cluster import _topology as topology
from tfdp_utils.compat import _fit_binding as fit_binding
from tfdp_utils.compat._switch import disabled as keras_patches_disabled
from tfdp_utils.data import _input_wait as input_wait
from tfdp_utils.throughput._clock import PausableClock
from tfdp_utils.throughput._count_source import CountFacts, CountSource, Unbound
from tfdp_utils.throughput._counts import ExampleCounter
from tfdp_utils.throughput._input_wait import InputWaitMeter
from tfdp_utils.throughput._meter import ThroughputMeter, window_plan
from tfdp_utils.training import _accumulation as accumulation
from tfdp_utils.training import _mixed_precision as mixed_precision

# Callbacks that record the epoch's logs when they are called: listed before ThroughputLogger,
# they record the epoch before its figures are added.
_RECORDING_CLASSES = ("CSVLogger", "TensorBoard")
_RECORDING_MODULES = ("mlflow", "wandb", "comet_ml", "neptune", "clearml", "dvclive", "aim")
logger = logging.getLogger("tfdp_utils")


def place(model: Any, *, memory: bool) -> Placement:
    """Where ``model`` trains; with ``memory``, the local replicas' devices that report it."""
    strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    position = topology.position_of(strategy)
    devices: dict[int, str] = {}
    if memory:
        devices = memory_devices(position.local_replicas, local_devices(strategy))
    return Placement(strategy, int(strategy.num_replicas_in_sync), position, devices)


def count_facts(
    placement: Placement,
    data: FitData | None,
    *,
    given: DatasetInfo | None,
    global_batch_size: int | None,
    model: Any,
) -> CountFacts:
    """What the count source is chosen from: the logger's figures and the data ``fit`` hands it."""
    if data is None:
        return CountFacts(
            num_replicas=placement.num_replicas,
            strategy=type(placement.strategy).__name__,
            global_batch_size=global_batch_size,
            given=given,
            unbound=_unbound(model),
        )
    return CountFacts(
        num_replicas=placement.num_replicas,
        strategy=type(placement.strategy).__name__,
        global_batch_size=global_batch_size,
        given=given,
        trained=data.kind,
        trained_info=data.info,
        static_batch=data.static_batch,
        resumed_from=None if data.position is None else data.position.built_from,
    )


def _unbound(model: Any) -> Unbound:
    """Why ``fit`` handed the logger no data."""
    if not fit_binding.installed():
        return "patches_off" if keras_patches_disabled() else "undone"
    return "late" if called_from_fit(model) else "outside_fit"


def run_before_recorders(callback: Any, caller: Any) -> None:
    """Move ``callback`` ahead of the callbacks that record epoch logs, in this fit's list.

    ``caller`` is the object calling the train-begin hook: Keras' ``CallbackList``, which
    calls its callbacks in list order with one ``logs`` dict, so a recorder listed earlier
    (``CSVLogger``, ``TensorBoard``, MLflow's or W&B's callback) would write each epoch before
    the logger adds its figures. Moving the logger within the list during ``on_train_begin``
    keeps the loop that is calling it correct: the callbacks it moves past have had their
    ``on_train_begin`` already, and the loop goes on with the callback that followed it.
    """
    callbacks = getattr(caller, "callbacks", None)
    if not isinstance(callbacks, list) or callback not in callbacks:
        return
    mine = callbacks.index(callback)
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


def new_fit(
    model: Any,
    placement: Placement,
    counting: CountSource,
    data: FitData | None,
    *,
    params: Mapping[str, Any],
    carried: tuple[int, ...],
    global_batch_size: int | None,
    log_every_n_steps: int | None,
    warmup_steps: int | None,
    flops_per_example: float | None,
    peak_flops_per_replica: float | None,
) -> FitState:
    """The measuring state of a fit, its first point taken at the step it starts at.

    ``params`` are Keras' (``steps`` per epoch and ``epochs``, when known): the window plan
    follows the steps the fit will run.
    """
    position = None if data is None else data.position
    steps_from_host, origin = _origin(model, position, params.get("steps"))
    counter = ExampleCounter(
        num_replicas=placement.num_replicas,
        step=origin,
        carried=carried,
        global_batch_size=global_batch_size,
    )
    counter.info, counter.source = counting.info, counting.source
    if position is not None:
        counter.layout_offset = position.step_offset
        counter.continue_job()  # a resumed job: its counts go on from the runs before
    planned = _planned_steps(params)
    every, warmup = window_plan(
        planned, log_every_n_steps=log_every_n_steps, warmup_steps=warmup_steps
    )
    if planned is not None and warmup_steps is not None and warmup_steps >= planned:
        _warn_no_window(warmup_steps, planned)
    meter = ThroughputMeter(
        num_replicas=placement.num_replicas,
        warmup_steps=warmup,
        flops_per_example=flops_per_example,
        peak_flops_per_replica=peak_flops_per_replica,
    )
    fit = FitState(
        placement,
        counter,
        meter,
        PausableClock(),
        every,
        warmup,
        accumulation_steps=accumulation.accumulation_steps(model),
        exact=counting.exact,
        derived_reason=counting.derived_reason,
    )
    fit.steps_from_host = steps_from_host
    fit.host_step = fit.first_step = origin
    fit.batch_zero = origin - (position.step if position is not None else 0)
    if position is not None and position.shape_change is not None:
        fit.shape_change = f"at step {origin}: {position.shape_change}"
        logger.info("tfdp_utils: ThroughputLogger: the job's shape changed %s", fit.shape_change)
    _start_input_wait(fit, data)
    meter.update(step=origin, time=fit.clock.now(), replica_examples=counter.counts)
    fit.next_log = fit.next_check = origin + (warmup or every)
    return fit


def _origin(model: Any, position: StreamPosition | None, steps: Any) -> tuple[bool, int]:
    """Whether the step axis follows Keras' batch indices, and the step the fit starts at."""
    steps_from_host = _tf.IS_KERAS3 and mixed_precision.is_loss_scale_optimizer(model.optimizer)
    origin = accumulation.batches_trained(model)
    if steps_from_host and position is not None and steps:
        # The optimizer's count leaves out the steps the loss scale skipped; the step
        # axis is Keras' batch positions, which the resumed stream's position gives (with the
        # steps before its epoch numbering, where a rest of files changed the epoch's steps).
        origin = position.step_offset + position.epoch * int(steps) + position.step
    return steps_from_host, origin


def _planned_steps(params: Mapping[str, Any]) -> int | None:
    steps, epochs = params.get("steps"), params.get("epochs")
    if not steps or not epochs:
        return None
    return int(steps) * int(epochs)


def _warn_no_window(warmup_steps: int, planned: int) -> None:
    logger.warning(
        "tfdp_utils: ThroughputLogger(warmup_steps=%d) leaves out all %d steps of this "
        "fit, so it measures no window: examples/s stays empty (the example counts are "
        "still logged). Pass a warmup_steps below %d, or leave it out (a tenth of the "
        "fit is left out).",
        warmup_steps,
        planned,
        planned,
    )


def _start_input_wait(fit: FitState, data: FitData | None) -> None:
    """Measure the share of time spent waiting for input, where the data allows it."""
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
    fit.input_wait = InputWaitMeter(clock.waited_seconds)
