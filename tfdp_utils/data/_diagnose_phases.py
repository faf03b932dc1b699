"""The timed phases of :func:`~tfdp_utils.diagnose_input`, each a function with its result as a
small frozen record: the data-stalls study's differential method (Mohan et al., VLDB 2021), the
same compiled train step run three ways on the model's strategy, after the pipeline alone.

1. :func:`time_input`: the input alone, the distributed iterator drained on a thread with a
   deadline (a slow ``next()`` is left behind, never waited for past it); its first batches are
   kept;
2. :func:`time_held`: the train step on one batch held on the devices (no input cost);
3. :func:`time_cached`: the train step fed through the distributed iterator from the first
   batches held in memory (the iterator's cost only);
4. :func:`time_together`: the train step fed from the pipeline, as ``fit`` runs it (a builder
   dataset through the one stream of epochs ``fit`` iterates).

:func:`checked` comes first (the arguments, and the dataset to iterate, as a :class:`Run`);
between phases 1 and 2 the model is built (:func:`train_function`) and its train step traced on
the cached batches (:func:`trace`), never on the pipeline. Each phase has a share of
``max_seconds``; a phase never starts a step that the last one's duration says would end past
its deadline. TensorFlow glue: the clock is :mod:`tfdp_utils.data._step_timing`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from tfdp_utils import _tf, _validate
from tfdp_utils._dataset_info import DatasetInfo, info_of
from tfdp_utils._tf import tf
from tfdp_utils.compat._one_iterator import swap_for_stream
from tfdp_utils.data._diagnose_checks import (
    check_batched,
    check_dataset,
    check_model,
    check_strategies,
    is_distributed,
)
from tfdp_utils.data._diagnose_misfit import fitting
from tfdp_utils.data._input_figures import Rate
from tfdp_utils.data._step_timing import (
    LATE,
    MIN_WINDOW_SECONDS,
    Feed,
    Fetcher,
    Timed,
    examples_in,
    per_call_steps,
    timed,
)

INPUT_SHARE = 0.25
"""Share of ``max_seconds`` for the input alone, from the call's start."""

FIRST_BATCH_SHARE = 0.45
"""Share of ``max_seconds`` the first batch may take to come (the model is built on it)."""

STAGES_RESERVE = 0.2
"""Share of ``max_seconds`` kept for timing the stages alone, when the input is the limit."""

HELD_BATCHES = 4
"""Batches of the pipeline kept from the input phase and held in memory for the cached phase."""


@dataclasses.dataclass(frozen=True)
class Run:
    """What every phase reads: the checked arguments and the dataset as training reads it.

    Attributes:
        model: the compiled Keras model.
        strategy: its strategy (``model.distribute_strategy``).
        dataset: the dataset as given.
        distributed: whether ``dataset`` came distributed.
        pipeline: the ``tf.data.Dataset`` behind it (this worker's first, when distributed).
        distributed_dataset: the dataset as ``fit`` iterates it (distributed here if need be;
            a builder dataset's one stream of epochs where ``fit`` swaps it in).
        info: the builder's record of the dataset, or None.
        steps: steps to time in each phase.
        max_seconds: the budget of the whole call.
        fixed: several workers: each phase times exactly ``steps``, without a deadline.
        started: when the call began (``time.perf_counter()``).
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
    started: float

    @property
    def end(self) -> float:
        """When the call's budget runs out."""
        return self.started + self.max_seconds

    @property
    def phases_end(self) -> float:
        """When the timed phases' part of the budget runs out (the stages have the rest)."""
        return self.started + (1.0 - STAGES_RESERVE) * self.max_seconds

    def since_start(self, share: float) -> float:
        """The deadline ``share`` of ``max_seconds`` after the call's start."""
        return self.started + share * self.max_seconds

    def deadline(self, share: float) -> float | None:
        """When a phase starting now stops: ``share`` of the time left (None: never, on
        several workers)."""
        now = time.perf_counter()
        return None if self.fixed else now + share * max(0.0, self.phases_end - now)


def _as_fit_iterates(model: Any, dataset: Any) -> Any:
    """The dataset ``fit`` iterates for ``dataset`` over several epochs: a builder dataset's
    one stream of whole epochs where ``fit`` swaps it in, else the dataset itself."""
    arguments: dict[str, Any] = {"x": dataset, "epochs": 2, "initial_epoch": 0}
    return arguments["x"] if swap_for_stream(model, arguments) else dataset


def checked(model: Any, dataset: Any, *, steps: Any, max_seconds: Any, started: float) -> Run:
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
        pipeline, dist = pipelines[0], _as_fit_iterates(model, dataset)
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
        started=started,
    )


@dataclasses.dataclass(frozen=True)
class InputAlone:
    """Phase 1: the input alone, through the distributed iterator.

    Attributes:
        timed: the batches drained, no model (``rate`` None: none timed after the first).
        first_seconds: how long the first batch took to come (the pipeline's start included),
            or None when it did not come within its share of the budget.
        batches: the first batches (up to :data:`HELD_BATCHES`), as distributed elements.
        fetcher: the iterator, closed (a late ``next()`` may still hold it).
        examples: examples in each of ``batches``, over this worker's replicas.
    """

    timed: Timed
    first_seconds: float | None
    batches: tuple[Any, ...]
    fetcher: Fetcher
    examples: tuple[int, ...] = ()

    @property
    def rate(self) -> Rate | None:
        """The input alone's rate; the first batch's when no other was timed."""
        if self.timed.rate is not None or not self.batches or not self.first_seconds:
            return self.timed.rate
        return Rate(self.global_batch, 1, self.first_seconds)

    @functools.cached_property
    def held(self) -> _Held:
        """The first batch as an iterator that gives it forever (one object: tf_keras traces
        its train function for each)."""
        return _Held(self.batches[0])

    @property
    def global_batch(self) -> int:
        """Examples in the first batch, over this worker's replicas."""
        return self.examples[0] if self.examples else 0


def time_input(run: Run) -> InputAlone:
    """Phase 1: the distributed iterator drained, as training reads it, without the model;
    each ``next()`` waited for on a thread up to the phase's deadline."""
    fetcher = Fetcher(Feed(run.distributed_dataset))
    began = time.perf_counter()
    wait_until = math.inf if run.fixed else run.since_start(FIRST_BATCH_SHARE)
    first = fetcher.next(wait_until)
    if first is LATE:
        fetcher.feed.close()
        return InputAlone(Timed(None, cut=True), None, (), fetcher)
    first_seconds = time.perf_counter() - began
    batches = [first]
    examples = [examples_in(run.strategy, first)]

    if examples[0] == 0:
        raise ValueError("dataset's first batch holds no example; pass the dataset you train on.")
    deadline = None if run.fixed else run.since_start(INPUT_SHARE)

    def next_batch() -> Any:
        element = fetcher.next(math.inf if deadline is None else deadline)
        if element is LATE:
            return LATE
        count = examples_in(run.strategy, element)
        if len(batches) < HELD_BATCHES:
            batches.append(element)
            examples.append(count)
        return count

    clock = timed(
        next_batch,
        steps=run.steps,
        deadline=deadline,
        warmup=1,
        min_seconds=MIN_WINDOW_SECONDS,
        expected=first_seconds,
    )
    fetcher.feed.close()  # its prefetch threads stop competing with the phases after it
    return InputAlone(clock, first_seconds, tuple(batches), fetcher, tuple(examples))


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
    replica_batch = run.strategy.experimental_local_results(alone.batches[0])[0]
    with fitting(run.model, run.pipeline.element_spec):
        _tf.build_for_training(run.model, replica_batch)
    run.model.make_train_function()
    return TrainFunction(run.model.train_function, _tf.steps_per_execution(run.model))


def _from_list(batches: list[Any], spec: Any) -> Any:
    """The ``batches`` as a dataset with the static shapes of ``spec`` (the pipeline's, e.g. a
    batch dimension of any size), so that the train step traced on it is the one the
    pipeline's batches run."""
    dataset = tf.data.Dataset.from_tensors(batches[0])
    for batch in batches[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))

    def relax(*element: Any) -> Any:
        value = element if len(element) > 1 else element[0]
        flat = [
            tf.raw_ops.PlaceholderWithDefault(input=part, shape=part_spec.shape)
            for part, part_spec in zip(tf.nest.flatten(value), tf.nest.flatten(spec), strict=True)
        ]
        return tf.nest.pack_sequence_as(spec, flat)

    return dataset.map(relax)


def cached_dataset(run: Run, alone: InputAlone) -> Any:
    """The first batches of the input phase held in memory and repeated, distributed as the
    dataset is: the pipeline's own batches at the input cost of the iterator alone. On several
    workers, or for elements that are not dense tensors, the pipeline's first batches are
    cached from the pipeline itself instead."""
    strategy, spec = run.strategy, run.pipeline.element_spec
    options = _tf.distributed_input_options(run.dataset) if run.distributed else None
    from_function = run.distributed and _tf.distributed_from_function(run.dataset)
    dense = all(type(part) is tf.TensorSpec for part in tf.nest.flatten(spec))
    local = max(1, len(strategy.extended.worker_devices))  # this worker's replicas
    if run.fixed or not dense:
        repeated = run.pipeline.take(local if from_function else 1).cache().repeat()
    else:
        parts = [strategy.experimental_local_results(batch) for batch in alone.batches]
        if from_function:  # each element is one replica's batch
            batches = [replica for replicas in parts for replica in replicas]
        else:  # each element is a global batch, split over the replicas
            batches = [
                tf.nest.map_structure(lambda *split: tf.concat(split, 0), *replicas)
                for replicas in parts
            ]
        repeated = _from_list(batches, spec).repeat()
    if from_function:
        return strategy.distribute_datasets_from_function(lambda _: repeated, options=options)
    return strategy.experimental_distribute_dataset(repeated, options=options)


def trace(run: Run, train: TrainFunction, alone: InputAlone, cached: Any) -> Feed:
    """The train step traced (``fit``'s first call) on the cached batches' iterator, never on
    the pipeline, whose batches are timed only by the phases, then called once on the held
    batch (tf_keras traces it for that iterator object, Keras 3 its step on one batch);
    returns the cached batches' iterator. The model's first call on a batch: elements that do
    not fit it fail here."""
    feed = Feed(cached)
    with fitting(run.model, run.pipeline.element_spec):
        feed.run(train.call)
        train.call(alone.held)
    return feed


class _Held:
    """An iterator that gives one distributed batch, held on the devices, forever."""

    def __init__(self, element: Any) -> None:
        self.element = element

    def __iter__(self) -> _Held:
        return self

    def __next__(self) -> Any:
        return self.element

    def get_next(self) -> Any:
        return self.element

    def get_next_as_optional(self) -> Any:
        return tf.experimental.Optional.from_value(self.element)


def _train_steps(
    run: Run, train: TrainFunction, feed: Callable[[], Any], examples: Callable[[], int]
) -> Callable[[], int]:
    def step() -> int:
        train.call(feed())
        return examples() * train.steps_per_call

    return step


def time_held(run: Run, train: TrainFunction, alone: InputAlone, share: float) -> Timed:
    """Phase 2: the train function on the first batch held on the devices: no input cost (on
    tf_keras its first call traces the step for the held batch)."""
    held = alone.held
    clock = timed(
        _train_steps(run, train, lambda: held, lambda: alone.global_batch),
        steps=math.ceil(run.steps / train.steps_per_call),
        deadline=run.deadline(share),
        min_seconds=MIN_WINDOW_SECONDS,
    )
    return Timed(per_call_steps(clock.rate, train.steps_per_call), clock.cut)


def time_cached(
    run: Run, train: TrainFunction, alone: InputAlone, feed: Feed, share: float
) -> Timed:
    """Phase 3: the train function fed through the distributed iterator from the first batches
    held in memory (``feed``, the traced iterator, left open): the iterator's cost only."""
    position = [0]

    def examples() -> int:
        position[0] += 1
        return alone.examples[(position[0] - 1) % len(alone.examples)]

    def next_iterator() -> Any:
        return feed.iterator

    clock = timed(
        _train_steps(run, train, next_iterator, examples),
        steps=math.ceil(run.steps / train.steps_per_call),
        deadline=run.deadline(share),
        min_seconds=MIN_WINDOW_SECONDS,
    )
    return Timed(per_call_steps(clock.rate, train.steps_per_call), clock.cut)


@dataclasses.dataclass(frozen=True)
class Together:
    """Phase 4: the train step fed from the pipeline.

    Attributes:
        timed: train steps fed from the input phase's iterator, as ``fit`` runs them.
        restarts: times the dataset ended while timed and was started again (as ``fit``'s
            next epoch would).
    """

    timed: Timed
    restarts: int


def _room_for(run: Run, share: float, seconds: float) -> float | None:
    """The deadline of a phase with ``share`` of the time left, stretched to ``seconds`` from
    now when that is more (a fresh iterator's start must fit), within the phases' budget."""
    deadline = run.deadline(share)
    if deadline is None:
        return None
    return max(deadline, min(run.phases_end, time.perf_counter() + seconds))


def time_together(
    run: Run, train: TrainFunction, alone: InputAlone, expected: float, share: float
) -> Together:
    """Phase 4: the train function fed from a fresh iterator of the dataset, as ``fit`` runs
    it (its prefetch buffers start empty, as in the steady state of an input-bound ``fit``,
    never filled while other phases ran), a builder dataset's steps counted exactly.
    ``expected``: the seconds one step is expected to take, the first batch's wait included
    (no step starts that would end past the deadline)."""
    per_call = train.steps_per_call
    feed = Feed(run.distributed_dataset)
    position = [0]

    def together_step() -> int:
        feed.run(train.call)
        first_step = position[0]
        position[0] += per_call
        if run.info is not None and feed.restarts == 0:
            return sum(run.info.examples_in_steps(first_step, position[0]))
        return alone.global_batch * per_call

    clock = timed(
        together_step,
        steps=math.ceil(run.steps / per_call),
        deadline=_room_for(run, share, 2 * expected * per_call),
        min_seconds=MIN_WINDOW_SECONDS,
        expected=expected * per_call,
    )
    feed.close()
    rate = per_call_steps(clock.rate, per_call)
    return Together(Timed(rate, clock.cut), feed.restarts)
