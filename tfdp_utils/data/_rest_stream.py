"""One worker's part of the rest of an interrupted epoch, as batches (an elastic resume).

TensorFlow glue for :class:`~tfdp_utils.data._epoch_rest.EpochRest` (which examples, pure):
the streams of the shape the epoch began on are rebuilt on this worker (their files, their
seeds, their order: :func:`~tfdp_utils.data._epoch_examples.epoch_examples`), each read once
up to the last example this worker needs, and this worker's examples are taken from them in
the rest's order. They are batched as the epoch's own steps are, and padded with empty batches
to the rest's steps, so that every worker runs the same number.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, cast

import numpy as np

from tfdp_utils._tf import tf, traced_as_written
from tfdp_utils.data._epoch_examples import epoch_examples
from tfdp_utils.data._epoch_rest import EpochRest
from tfdp_utils.data._pipeline import Recipe, empty_batch, read_files
from tfdp_utils.data._sharding import ShardPolicy


def _old_recipe(recipe: Recipe, rest: EpochRest) -> Recipe:
    """``recipe`` as the shape the epoch began on planned it (its workers, files, policy)."""
    plan = dataclasses.replace(
        recipe.plan,
        policy=cast(ShardPolicy, rest.policy),
        files_per_worker=rest.files,
        num_workers=rest.num_workers,
    )
    epochs = dataclasses.replace(recipe.epochs, take_per_worker=None)
    return dataclasses.replace(recipe, plan=plan, epochs=epochs)


def _wanted(rest: EpochRest, index: int, workers: int) -> tuple[list[int], Any]:
    """The old streams worker ``index`` of ``workers`` takes examples from (ascending), and
    which positions of each it takes (a row per stream, up to the last one taken)."""
    runs = rest.runs_for(index, workers)
    streams = sorted({stream for stream, _, _ in runs}) or [0]
    wanted = np.zeros((len(streams), max((end for _, _, end in runs), default=0)), bool)
    for stream, start, end in runs:
        wanted[streams.index(stream), start:end] = True
    return streams, wanted


def rest_examples(recipe: Recipe, rest: EpochRest, index: int, workers: int) -> Any:
    """The examples worker ``index`` of ``workers`` trains in the rest, in order.

    One pipeline traced once for every old stream this worker takes examples from (the old
    worker's index an element of the interleave's input), not one per stream. The rest's order
    is step by step of the first shape, stream by stream within a step, and this worker's part
    of it is a set of positions; each stream is read once up to the last position wanted, cut
    into its steps (``S`` examples each), each step's block keeping the wanted positions only
    (where a stream's wanted positions are all of it from the rest's start, as on fewer workers
    whose number divides the first shape's, the blocks are kept whole, without a mask), and
    padded with empty blocks to the same number of steps: a round-robin interleave of the
    streams, one block at a time, then gives the examples in the rest's order.
    """
    old = _old_recipe(recipe, rest)
    streams, wanted = _wanted(rest, index, workers)
    size = rest.step_examples
    first = rest.from_step * size
    ends = [int(np.flatnonzero(row)[-1]) + 1 if row.any() else first for row in wanted]
    steps = max(-(-(end - first) // size) for end in ends)
    # Every stream wanted from the rest's start to its last position: no mask to trace.
    whole = all(bool(row[first:end].all()) for row, end in zip(wanted, ends, strict=True))
    columns = [tf.constant(streams, tf.int64), tf.constant(ends, tf.int64)]
    if not whole:
        columns.append(tf.constant(wanted))  # a row of positions kept per stream

    def blocks(stream: Any, read: Any, *more: Any) -> Any:
        keep = None if whole else more[0]
        read_once = more[-1] if old.cache else None
        examples = epoch_examples(old, read_once, stream, rest.num_workers, rest.epoch)
        # Read up to the last position wanted; the trained steps are read, not kept.
        if keep is None:
            picked = examples.take(read).skip(first).batch(size)
        else:

            def kept(positions: Any, block: Any) -> Any:
                mask = tf.gather(keep, positions)
                return tf.nest.map_structure(lambda t: tf.boolean_mask(t, mask), block)

            positioned = examples.take(read).enumerate().skip(first).batch(size)
            picked = positioned.map(traced_as_written(kept))
        empty = tf.data.Dataset.from_tensors(empty_batch(picked.element_spec))
        return picked.concatenate(empty.repeat()).take(steps)

    rows = [tf.data.Dataset.from_tensor_slices(column) for column in columns]
    if old.cache:
        # What each old worker's epochs read again, built where a positioned stream builds
        # it (outside any traced function: its file shuffle pairs with the global seed as
        # that stream's does), one dataset per stream, handed to the interleave as elements.
        sources = [tf.data.Dataset.from_tensors(_read_once(old, s)) for s in streams]
        rows.append(functools.reduce(tf.data.Dataset.concatenate, sources))
    # The epoch's own reads inside the interleave's traced function, as every epoch of a
    # positioned stream is built inside flat_map's: its shuffles' seeds are then paired with
    # the traced graph's seed, not the program's global seed. Traced as written, as those
    # epochs are (no AutoGraph rewrite; the user's map_fn and reader converted as anywhere).
    chosen = tf.data.Dataset.zip(tuple(rows)).interleave(
        traced_as_written(blocks), cycle_length=len(streams), block_length=1
    )
    return chosen.unbatch()


def _read_once(old: Recipe, stream: int) -> Any:
    """What the epochs of old worker ``stream`` read again: its cache's order (its files in
    the run seed's order, mapped before the cache where the recipe maps there)."""
    read_once = read_files(old, stream, seed=tf.constant(old.seed or 0, tf.int64), in_order=True)
    if old.maps_before_cache:
        read_once = read_once.map(
            old.map_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )
    return read_once


def rest_batches(recipe: Recipe, rest: EpochRest, index: int, workers: int) -> Any:
    """This worker's part of the rest in the epoch's unit of batches (whole steps with the
    split, replica batches without), padded with empty batches to ``rest.steps`` steps."""
    split = recipe.epochs.split_last_step
    local = recipe.replicas_per_worker
    size = recipe.shape.per_replica_batch_size * (local if split else 1)
    dataset = rest_examples(recipe, rest, index, workers).batch(size)
    sizes = rest.part_sizes(index, workers)
    held = sum(-(-n // size) for n in sizes)
    pad = rest.steps * (1 if split else local) - held
    if pad > 0:
        empty = tf.data.Dataset.from_tensors(empty_batch(dataset.element_spec))
        dataset = dataset.concatenate(empty.repeat(pad))
    return dataset
