"""Which examples of the source a step of a builder dataset handed to each replica, after the fact.

TensorFlow glue, run only when asked (``DivergenceGuard`` names the examples behind a
non-finite step): nothing is carried beside the batches while training, so a ``fit`` pays
nothing for it. The same pipeline is built again over the examples' *indices* in the source
(``tf.data.Dataset.range(n)`` where the source was), with the same sharding, shuffle seeds,
batching and splitting and without ``map_fn`` (a map keeps the order): its step ``s`` holds
the indices of the examples step ``s`` held. The examples themselves are then read from the
source by index (``map_fn`` applied) to say which of them hold a non-finite value.

The order must be reproducible for this to be right: a stream of whole epochs (the one ``fit``
trains on over two or more epochs, :mod:`tfdp_utils.compat._one_iterator`, or a resumed one)
shuffles each epoch with its own seed; an unshuffled dataset has the same order in every
pass; a shuffled dataset as the builder made it (one ``fit`` epoch, ``repeat=True``, or the
swap turned off) is refused, since its order depends on how many passes were made over it
before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from tfdp_utils._tf import tf
from tfdp_utils.data._pipeline import Recipe, per_worker_dataset
from tfdp_utils.data._sources import dense_only

_MAX_EXAMPLES_READ = 4096  # examples read back to look for non-finite values, at most


@dataclasses.dataclass(frozen=True)
class ExampleIndex:
    """How to find the source indices of a step's examples on this worker.

    Attributes:
        recipe: the pipeline's recipe.
        source: the source as the pipeline reads it (a dataset of examples).
        num_examples: examples in the source.
        worker_index: this worker's input pipeline.
        stream: builds a stream of whole epochs from ``(recipe, source, input_context)``
            (:meth:`~tfdp_utils.data._positioned.Resumable.at`'s pipeline, positioned where
            the stream starts); None for the dataset as the builder made it.
        steps_per_epoch: steps of each epoch (for a dataset iterated anew each epoch).
    """

    recipe: Recipe
    source: Any
    num_examples: int
    worker_index: int
    stream: Callable[[Recipe, Any, Any], Any] | None = None
    steps_per_epoch: int | None = None

    def unknown_reason(self) -> str:
        """Why this dataset's steps cannot be traced back to indices, or "" when they can."""
        if self.stream is None and self.recipe.shuffle_buffer_size is not None:
            return (
                "the dataset shuffles each pass over it anew, so its order depends on the "
                "passes made before (Keras itself may take a batch from a pass of its own); "
                "a fit over two or more epochs trains on a stream whose epochs are reproducible"
            )
        return ""

    def _index_recipe(self) -> Recipe:
        return dataclasses.replace(
            self.recipe, map_fn=None, cache=False, prefetch=False, data_options=None
        )

    def _worker_indices(self) -> Any:
        recipe = self._index_recipe()
        replicas = recipe.shape.num_replicas_in_sync
        context = tf.distribute.InputContext(recipe.plan.num_workers, self.worker_index, replicas)
        source = tf.data.Dataset.range(self.num_examples)
        pipeline = per_worker_dataset if self.stream is None else self.stream
        return pipeline(recipe, source, context)

    def at_step(self, step: int) -> list[tuple[int, ...]]:
        """The source indices each local replica received in step ``step`` (0-based, counted
        from the first step of the ``fit``, as ``DivergenceGuard`` counts).

        Raises:
            ValueError: where :meth:`unknown_reason` says why not.
        """
        reason = self.unknown_reason()
        if reason:
            raise ValueError(f"the examples of a step cannot be named: {reason}.")
        local = self.recipe.replicas_per_worker
        position = step
        if self.stream is None and not self.recipe.repeat and self.steps_per_epoch:
            position = step % self.steps_per_epoch  # every pass has the same order
        batches = self._worker_indices().skip(position * local).take(local)
        found = [tuple(int(i) for i in np.asarray(b).reshape(-1)) for b in batches]
        return found + [()] * (local - len(found))

    def examples(self, indices: tuple[int, ...]) -> list[tuple[int, Any]]:
        """``(index, example)`` for each of ``indices`` (at most the first 4096), read from the
        source in its order with ``map_fn`` applied, as eager tensors."""
        wanted = sorted(set(indices))[:_MAX_EXAMPLES_READ]
        if not wanted:
            return []
        keep = tf.constant(wanted, tf.int64)
        examples = self.source.enumerate().filter(lambda i, _: tf.reduce_any(tf.equal(i, keep)))
        map_fn = self.recipe.map_fn
        found = []
        for index, example in examples.take(len(wanted)):
            value = example
            if map_fn is not None:
                value = map_fn(*example) if isinstance(example, tuple) else map_fn(example)
            found.append((int(index), value))
        return found

    def batch(self, indices: tuple[int, ...]) -> Any:
        """The examples ``indices`` as one batch, in that order (numpy arrays)."""
        by_index = dict(self.examples(indices))
        rows = [by_index[i] for i in indices if i in by_index]
        return tf.nest.map_structure(lambda *parts: np.stack([np.asarray(p) for p in parts]), *rows)

    def non_finite(self, indices: tuple[int, ...]) -> tuple[int, ...]:
        """Those of ``indices`` whose example (after ``map_fn``) holds an inf or NaN."""
        return tuple(i for i, value in self.examples(indices) if _holds_non_finite(value))


def _holds_non_finite(value: Any) -> bool:
    for part in tf.nest.flatten(value):
        tensor = tf.convert_to_tensor(part)
        if tensor.dtype.is_floating and not bool(tf.reduce_all(tf.math.is_finite(tensor))):
            return True
    return False


def example_index(
    recipe: Recipe,
    source: Any,
    *,
    source_kind: str,
    num_examples: int | None,
    worker_index: int,
    stream: Callable[[Recipe, Any, Any], Any] | None = None,
    steps_per_epoch: int | None = None,
) -> ExampleIndex | str:
    """An :class:`ExampleIndex` for a built dataset, or why its examples have no index."""
    if source_kind not in ("arrays", "dataset"):
        return f"a {source_kind} source has no example indices (arrays or a sized dataset do)"
    if recipe.plan.policy in ("file", "hint"):
        return "tf.data's own autoshard decides which worker reads which example"
    if num_examples is None or num_examples < 0:
        return "the source's size is unknown"
    spec = source.element_spec
    if recipe.map_fn is not None:
        spec = source.map(recipe.map_fn).element_spec
    if not dense_only(spec):
        return "sparse or ragged examples are batched in another layout than their indices"
    return ExampleIndex(
        recipe,
        source,
        num_examples,
        worker_index,
        stream=stream,
        steps_per_epoch=steps_per_epoch,
    )
