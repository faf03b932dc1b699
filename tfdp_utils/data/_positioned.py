"""A builder dataset that starts at a given step of a given epoch (resuming a preempted job).

TensorFlow glue. :class:`Resumable` is attached to a builder dataset (``tfdp.resumable``) when
its epochs can be counted and aligned (a sized source of dense elements, read by
``distribute_datasets_from_function``). :meth:`Resumable.at` builds the same data as a stream
of whole epochs that starts at step ``step`` of epoch ``epoch``:

* every epoch is planned as with ``repeat="epochs"``: the same number of steps on every
  worker, each worker's share padded with empty batches, so that step ``s`` of epoch ``e`` is
  the same global batch in every run;
* each epoch shuffles with its own seed, derived from the shuffle seed, the epoch and (where
  workers shuffle their own shares) the worker, and reads its files in an order from the same
  seed, deterministically, so that epoch ``e`` is the same in the interrupted and the resumed
  run (``reshuffle_each_iteration`` would make epoch ``e``'s order depend on how many epochs
  this process iterated before);
* the epoch's first ``step`` whole-step batches are skipped before they are cut into replica
  batches (the examples are read, not trained; a cached or in-memory source skips them
  without touching storage).

Random ops in ``map_fn`` (augmentation) are not replayed unless they are stateless with
seeds derived from the element.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from tfdp_utils._dataset_info import DatasetInfo, StreamPosition
from tfdp_utils._tf import tf, traced_as_written
from tfdp_utils.cluster._topology import position_of
from tfdp_utils.data._epoch_examples import epoch_examples
from tfdp_utils.data._epoch_rest import EpochRest
from tfdp_utils.data._epochs import EpochPlan, StepShape, dataset_info_for
from tfdp_utils.data._pipeline import (
    Recipe,
    batch,
    call_source,
    map_and_cache,
    read_files,
    split_steps,
    with_options,
)
from tfdp_utils.data._replay import example_index
from tfdp_utils.data._rest_stream import rest_batches
from tfdp_utils.data._sources import cardinality

_ENDLESS = 2**62  # epochs in the stream: never reached


@dataclasses.dataclass(frozen=True)
class Resumable:
    """How to rebuild a builder dataset from a step of an epoch (see the module docstring).

    Attributes:
        strategy: the strategy the dataset was built for.
        recipe: the pipeline's recipe, planned with aligned epochs.
        source: the source as the pipeline reads it.
        input_options: the ``tf.distribute.InputOptions`` given to the builder, or None.
        info: the shape of one aligned epoch (steps, examples, the partial last step).
        built_from: the info of the dataset as the builder made it.
        seed_given: whether the recipe's shuffle seed is the caller's ``seed=`` (False: none
            was given, and the builder chose one, as DATA sharding over several workers does).
    """

    strategy: Any
    recipe: Recipe
    source: Any
    input_options: Any
    info: DatasetInfo
    built_from: DatasetInfo | None = None
    seed_given: bool = True

    @property
    def given_seed(self) -> int | None:
        """The caller's ``seed=``, or None when the builder chose the recipe's seed."""
        return self.recipe.seed if self.seed_given else None

    @property
    def steps_per_epoch(self) -> int:
        """Steps of every epoch, on every worker."""
        assert self.info.steps_per_epoch is not None  # made only when known
        return self.info.steps_per_epoch

    @property
    def shuffles(self) -> bool:
        """Whether the epochs are shuffled (then a seed decides their order)."""
        return self.recipe.shuffle_buffer_size is not None

    def facts(self) -> dict[str, Any]:
        """What a checkpoint must match to resume on this dataset exactly (JSON-able)."""
        plan = self.recipe.plan
        return {
            "examples_per_epoch": self.info.examples_per_epoch,
            "steps_per_epoch": self.info.steps_per_epoch,
            "global_batch_size": self.info.global_batch_size,
            "num_replicas_in_sync": self.info.num_replicas_in_sync,
            "num_workers": self.info.num_workers,
            "source_kind": plan.source_kind,
            "policy": plan.policy,
            "files": [list(files) for files in plan.files_per_worker],
            "examples_per_worker": list(plan.examples_per_worker or ()),
            "shuffle_buffer_size": self.recipe.shuffle_buffer_size,
            "drop_remainder": self.recipe.drop_remainder,
        }

    def at(
        self,
        epoch: int,
        step: int,
        seed: int | None,
        *,
        shape_change: str | None = None,
        rest: EpochRest | None = None,
        step_offset: int = 0,
    ) -> Any:
        """The distributed dataset from step ``step`` of epoch ``epoch`` on, epochs on end.

        Args:
            epoch: the epoch to start in (0-based, as Keras' ``initial_epoch``).
            step: the steps of that epoch already trained (0 <= step < steps per epoch).
            seed: the shuffle seed (required when the dataset shuffles).
            shape_change: how the shape changed at this position (an elastic resume), said
                by the stream's position for ``ThroughputLogger``; None when it did not.
            rest: the rest of epoch ``epoch`` laid out from the shape it began on (files
                sharded by file, resumed on another shape): its ``rest.steps`` steps are the
                epoch's last, from ``step`` on. None: the epoch's own steps from ``step``.
            step_offset: steps the job trained before ``epoch * steps_per_epoch + step``
                counts (with ``rest``, when the first shape's epochs had another number of
                steps), said by the stream's position.

        Raises:
            ValueError: a step outside the epoch, or no seed for a shuffled dataset.
        """
        if not 0 <= step < self.steps_per_epoch or epoch < 0:
            raise ValueError(
                f"cannot start at step {step} of epoch {epoch}: an epoch of this dataset has "
                f"{self.steps_per_epoch} steps (0..{self.steps_per_epoch - 1})."
            )
        if self.shuffles and seed is None:
            raise ValueError("a shuffled dataset starts at a step only with its shuffle seed")
        if rest is not None and step + rest.steps != self.steps_per_epoch:
            raise ValueError(
                f"the rest of epoch {epoch} takes {rest.steps} steps, so it starts at step "
                f"{self.steps_per_epoch - rest.steps} of {self.steps_per_epoch}, not {step}."
            )
        return self._stream(
            epoch,
            step,
            seed,
            StreamPosition(
                epoch,
                step,
                built_from=self.built_from,
                shape_change=shape_change,
                step_offset=step_offset,
            ),
            rest,
        )

    def epochs_from(self, epoch: int, seed: int | None) -> Any:
        """The distributed dataset of whole epochs from the start of epoch ``epoch`` on.

        What :meth:`at` gives for step 0, as a dataset of its own rather than a resumed one
        (no ``tfdp.position``): ``fit`` reads it through one iterator for the whole job.

        Raises:
            ValueError: a negative epoch, or no seed for a shuffled dataset.
        """
        if epoch < 0:
            raise ValueError(f"cannot start at epoch {epoch}: epochs count from 0.")
        if self.shuffles and seed is None:
            raise ValueError("a shuffled dataset starts at an epoch only with its shuffle seed")
        return self._stream(epoch, 0, seed)

    def _stream(
        self,
        epoch: int,
        step: int,
        seed: int | None,
        position: StreamPosition | None = None,
        rest: EpochRest | None = None,
    ) -> Any:
        recipe = dataclasses.replace(self.recipe, seed=seed)

        def dataset_fn(context: Any) -> Any:
            return positioned_worker_dataset(recipe, self.source, context, epoch, step, rest)

        from tfdp_utils.data._attach import attach

        dist = self.strategy.distribute_datasets_from_function(
            dataset_fn, options=self.input_options
        )
        indexed = functools.partial(self._example_index, recipe, epoch, step)
        return attach(dist, self.info, recipe.plan, position=position, example_index=indexed)

    def _example_index(self, recipe: Recipe, epoch: int, step: int) -> Any:
        """What names the source indices of the stream's steps (``DivergenceGuard``)."""

        def stream(recipe: Recipe, source: Any, context: Any) -> Any:
            return positioned_worker_dataset(recipe, source, context, epoch, step)

        kind = recipe.plan.source_kind
        return example_index(
            recipe,
            self.source,
            source_kind=kind,
            num_examples=cardinality(self.source) if kind in ("arrays", "dataset") else None,
            worker_index=position_of(self.strategy).index,
            stream=stream,
        )


def resumable(
    strategy: Any,
    recipe: Recipe,
    source: Any,
    input_options: Any,
    aligned: EpochPlan | None,
    shape: StepShape,
    built_from: DatasetInfo | None = None,
    *,
    seed_given: bool = True,
) -> Resumable | None:
    """A :class:`Resumable` for a built dataset, or None where its epochs cannot be aligned.

    Args:
        aligned: the epochs planned with ``repeat="epochs"`` (None when that is impossible).
    """
    if aligned is None or aligned.epoch_steps is None or not aligned.epoch_steps:
        return None
    plan = recipe.plan
    if plan.source_kind == "dataset" and plan.policy in ("file", "hint"):
        return None  # tf.data's own autoshard: no per-worker pipeline to position
    positioned = dataclasses.replace(recipe, epochs=aligned, repeat=True)
    info = dataset_info_for(aligned, shape, repeat="epochs", infinite=False)
    return Resumable(
        strategy, positioned, source, input_options, info, built_from, seed_given=seed_given
    )


def _one_epoch(recipe: Recipe, read_once: Any, index: int, workers: int, epoch: Any) -> Any:
    """Epoch ``epoch`` of worker ``index``: shuffled with the epoch's seed, batched, padded."""
    dataset = epoch_examples(recipe, read_once, index, workers, epoch)
    split = recipe.epochs.split_last_step
    return batch(recipe, dataset, index, split=split, repeat_epochs=False)


def _read_once(recipe: Recipe, source: Any, context: Any, index: int, workers: int) -> Any:
    """What every epoch reads again (in-memory, a function's dataset, or the cache); None
    for files read anew each epoch."""
    if recipe.plan.source_kind == "files" and not recipe.cache:
        return None
    if recipe.plan.source_kind == "files":
        dataset = read_files(
            recipe, index, seed=tf.constant(recipe.seed or 0, tf.int64), in_order=True
        )
    elif recipe.plan.source_kind == "function":
        dataset = call_source(source, context)
    else:
        dataset = source
    return map_and_cache(recipe, dataset, workers, index)


def positioned_worker_dataset(
    recipe: Recipe,
    source: Any,
    context: Any,
    first_epoch: int,
    first_step: int,
    rest: EpochRest | None = None,
) -> Any:
    """This worker's stream of whole epochs from step ``first_step`` of ``first_epoch`` on
    (with ``rest``: its part of the rest of ``first_epoch``, then whole epochs).

    Raises:
        RuntimeError: the strategy has a different number of input pipelines than the plan.
    """
    workers, index = int(context.num_input_pipelines), int(context.input_pipeline_id)
    if workers != recipe.plan.num_workers:
        raise RuntimeError(
            f"the plan was made for {recipe.plan.num_workers} workers but the strategy has "
            f"{workers} input pipelines; build the dataset with the strategy that trains."
        )
    read_once = _read_once(recipe, source, context, index, workers)
    epochs = tf.data.Dataset.range(first_epoch + (rest is not None), _ENDLESS)
    # Traced as written (no AutoGraph rewrite of the pipeline's functions, a resume's largest
    # data-side cost); the user's map_fn and reader inside are converted as anywhere.
    dataset = epochs.flat_map(
        traced_as_written(lambda epoch: _one_epoch(recipe, read_once, index, workers, epoch))
    )
    split = recipe.epochs.split_last_step
    # Whole steps with the split; replica batches (the worker's replicas per step) without.
    unit = 1 if split else recipe.replicas_per_worker
    if rest is not None:
        dataset = rest_batches(recipe, rest, index, workers).concatenate(dataset)
    elif first_step:
        dataset = dataset.skip(first_step * unit)
    if split:
        dataset = split_steps(dataset, recipe.replicas_per_worker)
    off = tf.data.experimental.AutoShardPolicy.OFF
    return with_options(recipe, dataset, off, deterministic=True)
