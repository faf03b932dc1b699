"""The four timed phases of :func:`~tfdp_utils.diagnose_input`, each a function with its
result as a small frozen record, and the model's state read before and written back after.

1. :func:`time_input`: the input alone, the distributed iterator drained, no model;
2. :func:`time_stages_alone`: each stage of the tf.data pipeline alone (up to that stage);
3. :func:`time_model`: the compiled train function on one batch cached on the devices;
4. :func:`time_together`: the same train function fed from the dataset, as ``fit`` runs it.

:func:`checked` comes first (the arguments, and the dataset to iterate, as a :class:`Run`);
between phases 1 and 2 the model is built (:func:`train_function`) and its train step traced
on the dataset's iterator (:func:`trace`). TensorFlow glue: the clock is
:mod:`tfdp_utils.data._step_timing`'s, the stages :mod:`tfdp_utils.data._stage_timing`'s.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from tfdp_utils import _tf, _validate
from tfdp_utils._dataset_info import DatasetInfo, info_of
from tfdp_utils.data._diagnose_checks import (
    check_batched,
    check_dataset,
    check_model,
    check_strategies,
    is_distributed,
)
from tfdp_utils.data._diagnose_misfit import fitting
from tfdp_utils.data._input_figures import Rate, Stage
from tfdp_utils.data._stage_timing import (
    cached_after,
    chain,
    first_rank,
    time_stages,
    timed_cuts,
)
from tfdp_utils.data._step_timing import (
    MIN_WINDOW_SECONDS,
    Exhausted,
    Feed,
    examples_in,
    per_call_steps,
    timed,
)

# Share of max_seconds each phase may use: input, stages, model, together.
_BUDGET = {"input": 0.3, "stages": 0.2, "model": 0.15, "together": 0.35}


@dataclasses.dataclass(frozen=True)
class Run:
    """What every phase reads: the checked arguments and the dataset as training reads it.

    Attributes:
        model: the compiled Keras model.
        strategy: its strategy (``model.distribute_strategy``).
        dataset: the dataset as given.
        distributed: whether ``dataset`` came distributed.
        pipeline: the ``tf.data.Dataset`` behind it (this worker's first, when distributed).
        distributed_dataset: the dataset as training iterates it (distributed here if need be).
        info: the builder's record of the dataset, or None.
        steps: steps to time in each phase.
        max_seconds: the budget of the timed phases.
        fixed: several workers: each phase times exactly ``steps``, without a deadline.
    """

    model: Any
    strategy: Any
    dataset: Any
    distributed: bool
    pipeline: Any
    distributed_dataset: Any
    info: DatasetInfo | None
    steps: int
    max_seconds: float
    fixed: bool

    def budget(self, phase: str) -> float:
        """Seconds ``phase`` may use: its share of ``max_seconds``."""
        return _BUDGET[phase] * self.max_seconds

    def deadline(self, phase: str) -> float | None:
        """When ``phase``, starting now, stops timing (None: never, on several workers)."""
        return None if self.fixed else time.perf_counter() + self.budget(phase)


def checked(model: Any, dataset: Any, *, steps: Any, max_seconds: Any) -> Run:
    """The arguments checked, before anything runs, and the dataset to iterate."""
    steps = _validate.positive_int(steps, "steps", hint="Pass e.g. steps=20.")
    max_seconds = _validate.positive_float(
        max_seconds, "max_seconds", unit="number of seconds", hint="Pass e.g. max_seconds=10."
    )
    strategy = check_model(model)
    check_dataset(dataset)
    distributed = is_distributed(dataset)
    check_strategies(model, strategy, dataset, distributed)
    if distributed:
        pipelines = _tf.distributed_pipelines(dataset)
        if not pipelines:
            raise TypeError(
                f"dataset is a {type(dataset).__name__} whose tf.data pipeline cannot be read "
                "here; pass the tf.data.Dataset before distribution, or a dataset from "
                "tdu.build_distributed_dataset."
            )
        pipeline, dist = pipelines[0], dataset
    else:
        check_batched(model, dataset)
        pipeline, dist = dataset, strategy.experimental_distribute_dataset(dataset)
    return Run(
        model=model,
        strategy=strategy,
        dataset=dataset,
        distributed=distributed,
        pipeline=pipeline,
        distributed_dataset=dist,
        info=info_of(dataset),
        steps=steps,
        max_seconds=max_seconds,
        fixed=_tf.in_multi_worker_mode(strategy),
    )


@dataclasses.dataclass(frozen=True)
class InputAlone:
    """Phase 1: the input alone, through the distributed iterator.

    Attributes:
        rate: the batches drained, no model.
        global_batch: examples in the first batch, over this worker's replicas.
        replica_batch: the first batch's part on the first replica (the model is built on it).
        feed: the iterator drained, still open: the train step is traced on it.
    """

    rate: Rate
    global_batch: int
    replica_batch: Any
    feed: Feed


def time_input(run: Run) -> InputAlone:
    """Phase 1: the distributed iterator drained, as training reads it, without the model."""
    feed = Feed(run.distributed_dataset)
    first: list[Any] = []

    def next_batch() -> int:
        element = feed.run(next)
        if not first:
            first.append(element)
        return examples_in(run.strategy, element)

    try:
        rate = timed(
            next_batch,
            steps=run.steps,
            deadline=run.deadline("input"),
            min_seconds=MIN_WINDOW_SECONDS,
        )
    except Exhausted:
        raise ValueError(
            "dataset gave no batch: it is empty (a filter that drops everything, an empty "
            "file, a take(0)). Pass the dataset you train on."
        ) from None
    global_batch = examples_in(run.strategy, first[0])
    if global_batch == 0:
        raise ValueError("dataset's first batch holds no example; pass the dataset you train on.")
    replica_batch = run.strategy.experimental_local_results(first[0])[0]
    return InputAlone(rate, global_batch, replica_batch, feed)


@dataclasses.dataclass(frozen=True)
class TrainFunction:
    """The model's compiled train function, as ``fit`` calls it.

    Attributes:
        call: the train function: one call takes its batches from an iterator.
        steps_per_call: train steps one call runs (``steps_per_execution``).
    """

    call: Callable[[Iterator[Any]], Any]
    steps_per_call: int


def train_function(run: Run, alone: InputAlone) -> TrainFunction:
    """The model built on the first batch (as ``fit`` does before its first step, so that its
    state can be read) and its train function made."""
    with fitting(run.model, run.pipeline.element_spec):
        _tf.build_for_training(run.model, alone.replica_batch)
    run.model.make_train_function()
    return TrainFunction(run.model.train_function, _tf.steps_per_execution(run.model))


def trace(run: Run, alone: InputAlone, train: TrainFunction) -> None:
    """The train step traced for the dataset's iterator now, so that the clock of the together
    phase never runs while the pipeline fills its buffers during a trace; then phase 1's
    iterator let go. The model's first call on a batch: elements that do not fit it fail here.
    """
    with fitting(run.model, run.pipeline.element_spec):
        alone.feed.run(train.call)
    alone.feed.close()


@dataclasses.dataclass(frozen=True)
class StagesAlone:
    """Phase 2: each stage of the pipeline alone.

    Attributes:
        stages: the pipeline's stages, source first, with the rates of those timed.
        cached_after: indices in ``stages`` of the stages a ``cache()`` follows.
    """

    stages: tuple[Stage, ...]
    cached_after: tuple[int, ...]


def time_stages_alone(run: Run, global_batch: int) -> StagesAlone:
    """Phase 2: the pipeline up to each stage iterated alone, in the stages' share of time."""
    stages = chain(run.pipeline)
    cuts = timed_cuts(stages, first_rank(run.pipeline.element_spec))
    rates = time_stages(
        stages,
        cuts,
        run.pipeline.options(),
        chunk=max(1, global_batch),
        limit=4 * run.steps * global_batch,
        seconds=run.budget("stages"),
    )
    return StagesAlone(
        stages=tuple(
            Stage(s.name, s.kind, s.parallel, s.python, s.files, rates[i])
            for i, (s, _) in enumerate(stages)
        ),
        cached_after=cached_after(stages),
    )


def _cached(run: Run) -> Any:
    """A distributed dataset that repeats this worker's first step, cached."""
    strategy, dataset, pipeline = run.strategy, run.dataset, run.pipeline
    options = _tf.distributed_input_options(dataset) if run.distributed else None
    if run.distributed and _tf.distributed_from_function(dataset):
        local = max(1, len(strategy.extended.worker_devices))  # this worker's replicas
        repeated = pipeline.take(local).cache().repeat()
        return strategy.distribute_datasets_from_function(lambda _: repeated, options=options)
    return strategy.experimental_distribute_dataset(
        pipeline.take(1).cache().repeat(), options=options
    )


def time_model(run: Run, train: TrainFunction, global_batch: int) -> Rate:
    """Phase 3: the train function alone, on one batch cached on the devices."""
    per_call = train.steps_per_call
    cached = Feed(_cached(run))
    cached_examples = global_batch * per_call

    def cached_step() -> int:
        cached.run(train.call)
        return cached_examples

    rate = timed(
        cached_step,
        steps=math.ceil(run.steps / per_call),
        deadline=run.deadline("model"),
        min_seconds=MIN_WINDOW_SECONDS,
    )
    cached.close()
    return per_call_steps(rate, per_call)


@dataclasses.dataclass(frozen=True)
class Together:
    """Phase 4: the two together.

    Attributes:
        rate: train steps fed from a fresh iterator of the dataset.
        restarts: times the dataset ended while timed and was started again.
    """

    rate: Rate
    restarts: int


def time_together(run: Run, train: TrainFunction, global_batch: int) -> Together:
    """Phase 4: the train function fed from a fresh iterator of the dataset, as ``fit`` runs
    it (a builder dataset's steps counted exactly, its last partial one included)."""
    per_call = train.steps_per_call
    fresh = Feed(run.distributed_dataset)
    position = [0]

    def together_step() -> int:
        fresh.run(train.call)
        first_step = position[0]
        position[0] += per_call
        if run.info is not None and fresh.restarts == 0:
            return sum(run.info.examples_in_steps(first_step, position[0]))
        return global_batch * per_call

    rate = timed(
        together_step,
        steps=math.ceil(run.steps / per_call),
        deadline=run.deadline("together"),
        min_seconds=MIN_WINDOW_SECONDS,
    )
    fresh.close()
    return Together(per_call_steps(rate, per_call), fresh.restarts)


# ----------------------------------------------------------------------- model state


def _state_variables(model: Any) -> list[Any]:
    """Every variable a train step may change: weights, optimizer state, metrics."""
    optimizer_variables = getattr(model.optimizer, "variables", [])
    if callable(optimizer_variables):  # legacy optimizers: a method
        optimizer_variables = optimizer_variables()
    metric_variables = [v for metric in getattr(model, "metrics", []) for v in metric.variables]
    # tf_keras' LossScaleOptimizer keeps its loss scale and good-step count out of its
    # variables: the diagnosis's steps move them, and the fit after it would start elsewhere.
    loss_scale = getattr(model.optimizer, "_loss_scale", None)
    scale_variables = list((getattr(loss_scale, "_weights", None) or {}).values())
    seen: dict[int, Any] = {}
    for variable in [*model.variables, *optimizer_variables, *metric_variables, *scale_variables]:
        seen.setdefault(id(variable), variable)
    return list(seen.values())


def snapshot(model: Any) -> list[tuple[Any, Any]]:
    """Each variable a train step may change, with its value now."""
    return [(variable, variable.numpy()) for variable in _state_variables(model)]


def restore(model: Any, saved: list[tuple[Any, Any]]) -> None:
    """The values of :func:`snapshot` written back; metrics the steps made, reset."""
    for variable, value in saved:
        variable.assign(value)
    known = {id(variable) for variable, _ in saved}
    for metric in getattr(model, "metrics", []):
        if any(id(v) not in known for v in metric.variables):
            metric.reset_state()  # made by the steps (tf_keras builds metrics in the first)
