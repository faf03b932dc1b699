"""The examples one worker trains in one epoch of a positioned stream, in order.

TensorFlow glue, shared by :mod:`._positioned` (every epoch) and :mod:`._rest_stream` (the
streams of an interrupted epoch rebuilt on another shape). Each epoch shuffles with its own
seed, derived from the shuffle seed, the epoch and (where workers shuffle their own shares)
the worker, and reads its files in an order from the same seed, deterministically: epoch
``e`` of worker ``w`` is the same examples in the same order in every run, on any process.
"""

from __future__ import annotations

from typing import Any

from tfdp_utils._tf import tf
from tfdp_utils.data._pipeline import Recipe, own_graph_seed, read_files, worker_seed_tensor

_EPOCH_STRIDE = 104_729  # a prime: epoch e's seed is the worker's seed + stride * e


def epoch_seed(recipe: Recipe, index: Any, epoch: Any) -> Any:
    """Worker ``index``'s shuffle seed for epoch ``epoch`` (a tensor; ``index`` may be one)."""
    if recipe.keeps_order:
        base = tf.constant(recipe.seed or 0, tf.int64)
    else:
        base = worker_seed_tensor(recipe.seed, index)
    return base + tf.cast(epoch, tf.int64) * _EPOCH_STRIDE


def epoch_examples(recipe: Recipe, read_once: Any, index: Any, workers: int, epoch: Any) -> Any:
    """The examples worker ``index`` of ``workers`` trains in epoch ``epoch``, in order
    (``index`` a tensor too: one traced pipeline for any worker's stream)."""
    dataset = epoch_stream(recipe, read_once, index, workers, epoch, exact=True)
    if recipe.epochs.take_per_worker is not None:
        dataset = dataset.take(recipe.epochs.take_per_worker)
    return dataset


def epoch_stream(
    recipe: Recipe, read_once: Any, index: Any, workers: int, epoch: Any, *, exact: bool
) -> Any:
    """Epoch ``epoch`` of worker ``index``: read, shuffled with the epoch's seed, sharded
    (DATA), mapped. ``exact``: the files read in order and the map deterministic (a position
    in the epoch must name the same examples in every run); else in the recipe's own order."""
    seed = epoch_seed(recipe, index, epoch)
    if read_once is not None:
        dataset = read_once
    elif exact:
        dataset = read_files(recipe, index, seed=seed, in_order=True)
    else:
        dataset = read_files(recipe, index, seed=seed)
    if recipe.shuffle_buffer_size is not None:
        with own_graph_seed():  # a tensor seed: the global seed must not take part
            dataset = dataset.shuffle(
                recipe.shuffle_buffer_size, seed=seed, reshuffle_each_iteration=False
            )
    if recipe.plan.policy == "data":
        dataset = dataset.shard(workers, index)
    if recipe.map_fn is not None and not recipe.maps_before_cache:
        dataset = dataset.map(
            recipe.map_fn,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True if exact else (recipe.keeps_order or None),
        )
    return dataset
