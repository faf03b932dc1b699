"""A builder dataset of unknown size as one stream of epochs, each padded to learned steps.

TensorFlow glue. A source whose size nobody knows before reading it (a generator, a
``filter``, files not counted) ends each epoch where its data ends, and ``fit`` reads it
through a new distributed iterator every epoch, whose destruction can stall for a large part
of a second. Once ``fit`` has read one epoch to its end, it knows the epoch's steps: the step
at which TensorFlow's distributed iterator ended it, the same on every worker (the workers
that ran out first received empty batches until the last one ran out). :meth:`Learnable.stream`
builds the same data as one stream of whole epochs from then on (the compat change
``fit-one-iterator`` reads it through one iterator, :mod:`tfdp_utils.compat._learned_steps`):

* each worker's epoch is its whole share, batched as the builder batches it, then padded with
  empty batches to the learned steps, as a worker that runs out first receives them; so every
  epoch trains every example once, with the same steps on every worker;
* each epoch shuffles with its own seed (the shuffle seed plus the epoch, per worker where
  workers shuffle their own shares), so the order still changes every epoch;
* an epoch that holds more batches than the learned steps (the source grew since the first
  epoch) fails with an error that says so, rather than leave examples out; an epoch that
  holds fewer (it shrank) is padded like any other, its last steps then empty on every
  replica.

The stream can be built, and its iterator started (:func:`prime`), while the first epoch of
``fit`` still trains (:class:`LearnedSteps`): its first epoch reads its data at once and waits
for the steps only where they decide (each batch's index against them), so that its files are
open and its first batches read when the second epoch starts.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from tfdp_utils._dataset_info import DatasetInfo
from tfdp_utils._tf import tf
from tfdp_utils.data._epoch_examples import epoch_stream
from tfdp_utils.data._epochs import splits_last_step
from tfdp_utils.data._pipeline import (
    Recipe,
    empty_batch,
    split_steps,
    with_options,
)
from tfdp_utils.data._positioned import _read_once
from tfdp_utils.data._sources import dense_only

_ENDLESS = 2**62  # epochs in the stream: never reached
_UNKNOWN, _ABANDONED = -1, -2  # a LearnedSteps' value before the steps are known / given up


class LearnedSteps:
    """The steps of every epoch of a stream, known once the first epoch of ``fit`` has ended.

    A stream built with it reads its first epoch's data at once; where an element's place
    in the epoch is checked against the steps, it reads them from a host variable, and while
    they are unknown a tf.data thread waits in a ``numpy_function`` until :meth:`learn` or
    :meth:`abandon` (the fit's end, whichever way it ends, abandons: that is the wait's
    bound). Abandoned, the stream ends: no later epoch is read.

    Args:
        steps: the steps when already known; None to learn them.
    """

    def __init__(self, steps: int | None = None) -> None:
        from tensorflow.python.ops import resource_variable_ops

        self._lock = threading.Lock()
        self._known = threading.Event()
        self._steps = _UNKNOWN if steps is None else int(steps)
        with tf.init_scope():
            self.variable = resource_variable_ops.ResourceVariable(
                self._steps, dtype=tf.int64, trainable=False, name="tfdp_learned_steps"
            )
        if steps is not None:
            self._known.set()

    def learn(self, steps: int) -> None:
        """The steps every epoch of the stream has (at least 1)."""
        if steps < 1:
            raise ValueError(f"an epoch has at least 1 step, got steps={steps}.")
        self._give(int(steps))

    def abandon(self) -> None:
        """No steps will come: a stream waiting ends (nothing once the steps are known)."""
        self._give(_ABANDONED)

    def _give(self, steps: int) -> None:
        with self._lock:
            if self._known.is_set():
                return
            self._steps = steps
            self.variable.assign(steps)
            self._known.set()

    def _wait(self) -> Any:
        self._known.wait()  # bounded by the fit's end (see the class docstring)
        return np.int64(self._steps)

    def tensor(self) -> Any:
        """The steps inside the stream's functions: the variable, or the wait while unknown."""
        value = self.variable.read_value()

        def wait() -> Any:
            waited = tf.numpy_function(self._wait, [], tf.int64, stateful=True)
            return tf.reshape(waited, [])

        return tf.cond(tf.equal(value, _UNKNOWN), wait, lambda: value)


@dataclasses.dataclass(frozen=True)
class Learnable:
    """How to build a builder dataset of unknown size as a stream of padded epochs.

    Attributes:
        strategy: the strategy the dataset was built for.
        recipe: the pipeline's recipe (one pass per epoch).
        source: the source as the pipeline reads it.
        input_options: the ``tf.distribute.InputOptions`` given to the builder, or None.
        info: the dataset's info (its steps per epoch unknown).
        seed_given: whether the recipe's shuffle seed is the caller's ``seed=``.
    """

    strategy: Any
    recipe: Recipe
    source: Any
    input_options: Any
    info: DatasetInfo
    seed_given: bool = True

    @property
    def seed(self) -> int | None:
        """The recipe's shuffle seed (the caller's, or the one the builder chose)."""
        return self.recipe.seed

    @property
    def shuffles(self) -> bool:
        """Whether the epochs are shuffled (then a seed decides their order)."""
        return self.recipe.shuffle_buffer_size is not None

    @staticmethod
    def steps_to_learn() -> LearnedSteps:
        """Steps a :meth:`stream` can read before they are known (learnt later)."""
        return LearnedSteps()

    @staticmethod
    def prime(iterator: Any) -> bool:
        """:func:`prime`: start a primed stream's iterator reading (for callers below this
        pillar, which reach it through the dataset's record)."""
        return prime(iterator)

    def stream(
        self,
        first_epoch: int,
        steps: int | LearnedSteps,
        seed: int | None,
        *,
        end_epoch: int | None = None,
        primed: bool = False,
    ) -> Any:
        """The distributed dataset of whole epochs from ``first_epoch`` on, each ``steps``
        steps long on every worker (a :class:`LearnedSteps` when they are learnt while the
        stream already reads); up to ``end_epoch`` (excluded) when given, so that nothing is
        read past the last epoch of a ``fit`` and its iterator ends drained. ``primed``: one
        empty batch per local replica ahead of the epochs, for the iterator's maker to take
        (:func:`prime`), so that the iterator's prefetching starts then.

        Raises:
            ValueError: steps below 1, a negative epoch, an ``end_epoch`` not after
                ``first_epoch``, or no seed for a shuffled dataset.
        """
        if first_epoch < 0 or (not isinstance(steps, LearnedSteps) and steps < 1):
            raise ValueError(
                f"cannot stream epochs of {steps} steps from epoch {first_epoch}: an epoch "
                "has at least 1 step, and epochs count from 0."
            )
        if end_epoch is not None and end_epoch <= first_epoch:
            raise ValueError(
                f"cannot stream epochs {first_epoch} to {end_epoch} (end excluded): pass an "
                "end_epoch after first_epoch, or None for an endless stream."
            )
        if self.shuffles and seed is None:
            raise ValueError("a shuffled dataset streams its epochs only with its shuffle seed")
        recipe = dataclasses.replace(self.recipe, seed=seed)
        learned = steps if isinstance(steps, LearnedSteps) else LearnedSteps(int(steps))

        def dataset_fn(context: Any) -> Any:
            return learned_worker_dataset(
                recipe,
                self.source,
                context,
                first_epoch,
                learned,
                end_epoch=end_epoch,
                primed=primed,
            )

        from tfdp_utils.data._attach import attach

        dist = self.strategy.distribute_datasets_from_function(
            dataset_fn, options=self.input_options
        )
        return attach(dist, self.info, recipe.plan)


def learnable(
    strategy: Any, recipe: Recipe, source: Any, input_options: Any, info: DatasetInfo
) -> Learnable | None:
    """A :class:`Learnable` for a built dataset, or None where its epochs cannot be streamed.

    Only a dataset that ends each epoch at a step nobody knows (one pass per epoch, size
    unknown), keeps partial steps (an empty batch pads them; ``drop_remainder=True`` keeps
    full batches of a static size) and is read by its own per-worker pipeline (not tf.data's
    autoshard of a dataset).
    """
    plan = recipe.plan
    if recipe.repeat or info.repeat or info.steps_per_epoch is not None:
        return None
    if recipe.drop_remainder or plan.num_workers < 1:
        return None
    if plan.source_kind == "dataset" and plan.policy in ("file", "hint"):
        return None
    seed_given = recipe.seed is not None
    return Learnable(strategy, recipe, source, input_options, info, seed_given=seed_given)


def _one_epoch(
    recipe: Recipe, read_once: Any, index: int, workers: int, epoch: Any, *, split: bool
) -> Any:
    """Epoch ``epoch`` of worker ``index``: shuffled with the epoch's seed, mapped, batched
    (whole steps with ``split``, replica batches without)."""
    dataset = epoch_stream(recipe, read_once, index, workers, epoch, exact=False)
    size = recipe.shape.per_replica_batch_size * (recipe.replicas_per_worker if split else 1)
    return dataset.batch(size)


def _checked(learned: LearnedSteps, unit: int) -> Any:
    """The filter that keeps an epoch's first steps' batches (``unit`` a step) and fails on
    one more with data (the epoch grew past the learned steps)."""

    def check(index: Any, *batch: Any) -> Any:
        steps = learned.tensor()
        units = steps * unit
        size = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
        grew = tf.logical_and(tf.equal(index, units), size > 0)
        message = tf.strings.join(
            [
                # No quotes: the error shows them escaped.
                "build_distributed_dataset: an epoch of this dataset of unknown size holds "
                "more than the ",
                tf.strings.as_string(steps),
                " steps its first epoch in this fit had (the source grew between epochs), "
                "and fit reads every epoch after the first through one iterator with the "
                "steps of the first, so the last examples of this epoch would not be "
                "trained. Give every epoch the same examples, or undo the compat change "
                "fit-one-iterator before fit with tdu.compat.undo (then a new iterator every "
                "epoch, each read to its end).",
            ]
        )
        assertion = tf.debugging.Assert(tf.logical_not(grew), [message])
        with tf.control_dependencies([assertion]):
            return tf.less(index, units)

    return check


def _within(learned: LearnedSteps, unit: int) -> Any:
    """The predicate that ends an epoch one batch past its steps (that batch is checked)."""

    def within(index: Any, *batch: Any) -> Any:
        return tf.less_equal(index, learned.tensor() * unit)

    return within


def _drop_index(index: Any, *batch: Any) -> Any:
    return batch[0] if len(batch) == 1 else batch


def learned_worker_dataset(
    recipe: Recipe,
    source: Any,
    context: Any,
    first_epoch: int,
    learned: LearnedSteps,
    *,
    end_epoch: int | None = None,
    primed: bool = False,
) -> Any:
    """This worker's stream of whole epochs from ``first_epoch`` on (to ``end_epoch``,
    excluded, when given), ``learned`` steps each (the first epoch reads before they are
    known; the later ones start once they are, or the stream ends when they are abandoned).

    Raises:
        RuntimeError: the strategy has a different number of input pipelines than the plan.
        ValueError: elements that are not all dense (an empty batch cannot pad them).
    """
    workers, index = int(context.num_input_pipelines), int(context.input_pipeline_id)
    if workers != recipe.plan.num_workers:
        raise RuntimeError(
            f"the plan was made for {recipe.plan.num_workers} workers but the strategy has "
            f"{workers} input pipelines; build the dataset with the strategy that trains."
        )
    read_once = _read_once(recipe, source, context, index, workers)
    local = recipe.replicas_per_worker
    # Dense elements (checked before the stream is asked for): whole steps are cut evenly.
    split = splits_last_step(local, drop_remainder=False, repeat_by_example=False, dense=True)
    unit = 1 if split else local  # elements per step: whole steps, or replica batches
    check, within = _checked(learned, unit), _within(learned, unit)

    def padded(epoch: Any) -> Any:
        data = _one_epoch(recipe, read_once, index, workers, epoch, split=split)
        if not dense_only(data.element_spec):
            raise ValueError(
                "a stream of padded epochs needs dense elements (an empty batch pads them), "
                f"got {data.element_spec}."
            )
        empty = tf.data.Dataset.from_tensors(empty_batch(data.element_spec)).repeat()
        # One batch past the epoch: an empty one, unless the epoch grew (the check fails).
        bounded = data.concatenate(empty).enumerate().take_while(within)
        return bounded.filter(check).map(_drop_index)

    def known(epoch: Any) -> Any:
        # An epoch after the first starts once the first has ended, so the steps are known
        # by then (or abandoned: the stream ends).
        return tf.logical_or(tf.equal(epoch, first_epoch), learned.variable.read_value() >= 0)

    end = _ENDLESS if end_epoch is None else end_epoch
    dataset = tf.data.Dataset.range(first_epoch, end).take_while(known).flat_map(padded)
    if split:
        dataset = split_steps(dataset, local)
    if primed:  # one empty batch per local replica, taken by prime() (the first step's)
        first = tf.data.Dataset.from_tensors(empty_batch(dataset.element_spec)).repeat(local)
        dataset = first.concatenate(dataset)
    off = tf.data.experimental.AutoShardPolicy.OFF
    return with_options(recipe, dataset, off, deterministic=recipe.keeps_order)


def prime(iterator: Any) -> bool:
    """Take the empty batches ahead of a primed stream (one per local replica) from each of
    this worker's iterators of ``iterator``, a tf.distribute iterator: that starts its
    prefetching, so the stream reads before the training loop asks for its first batch.

    Only this worker's own tf.data iterators are read (no collective, untimed by the input
    clock). Returns False, having read nothing, where ``iterator`` is not made of them (the
    caller then drops it).
    """
    workers: list[Any] = list(getattr(iterator, "_iterators", None) or ())
    inner: list[Any] = [getattr(worker, "_iterator", None) for worker in workers]
    if not inner or not all(callable(getattr(i, "get_next", None)) for i in inner):
        return False
    for worker, own in zip(workers, inner, strict=True):
        with tf.device(worker._worker):
            own.get_next()  # one element per device of the worker
    return True
