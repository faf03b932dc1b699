"""The tf.data pipeline each worker runs: read -> cache/shuffle/shard -> map -> batch -> split.

TensorFlow glue that applies a plan made elsewhere: the builder fills a :class:`Recipe`
once, and :func:`per_worker_dataset` (inside ``distribute_datasets_from_function``) or
:func:`global_dataset` (for tf.data's own FILE/HINT autoshard) build the pipeline from it,
one small stage function at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

from tfdp_utils._tf import tf
from tfdp_utils.data._epochs import EpochPlan, StepShape, splits_last_step
from tfdp_utils.data._sharding import MAX_PARALLEL_FILES, ShardingPlan, parallel_reads
from tfdp_utils.data._sources import dense_only, is_dataset

_SEED_STRIDE = 7919  # a prime: each worker's shuffle seed is seed + stride * worker index
# The graph-level seed TensorFlow uses when none is set (tensorflow/python/framework/random_seed).
_DEFAULT_GRAPH_SEED = 87654321


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything the per-worker pipeline needs; built once, used inside ``dataset_fn``.

    Attributes:
        plan: the sharding plan.
        shape: batch size and replicas.
        epochs: how each worker batches, trims and repeats its share.
        map_fn: applied to each example, or None.
        reader: ``path -> tf.data.Dataset`` for file sources.
        shuffle_buffer_size: shuffle buffer, or None for no shuffle.
        seed: the shuffle seed (shared by every worker under DATA sharding).
        repeat: whether the dataset repeats.
        cache: cache in memory (True) or in files with this prefix.
        drop_remainder: drop what does not fill a step.
        prefetch: prefetch with AUTOTUNE.
        data_options: a ``tf.data.Options`` merged into the pipeline's, or None.
    """

    plan: ShardingPlan
    shape: StepShape
    epochs: EpochPlan
    map_fn: Any = None
    reader: Any = None
    shuffle_buffer_size: int | None = None
    seed: int | None = None
    repeat: bool = False
    cache: bool | str = False
    drop_remainder: bool = False
    prefetch: bool = True
    data_options: Any = None

    @property
    def replicas_per_worker(self) -> int:
        """Replicas each worker feeds."""
        return self.shape.replicas_per_worker

    @property
    def keeps_order(self) -> bool:
        """DATA needs the same element order on every worker; FILE and OFF do not."""
        return self.plan.policy == "data"

    @property
    def aligned(self) -> bool:
        """Whether whole epochs repeat, each padded to the same steps on every worker."""
        return self.repeat and self.epochs.epoch_batches is not None

    @property
    def maps_before_cache(self) -> bool:
        """Whether ``map_fn`` runs before the cache (so mapped examples are cached)."""
        return self.map_fn is not None and bool(self.cache)


def worker_seed(seed: int | None, index: int) -> int | None:
    """Worker ``index``'s own shuffle seed derived from ``seed`` (None stays None)."""
    return None if seed is None else seed + _SEED_STRIDE * index


def worker_seed_tensor(seed: int | None, index: Any) -> Any:
    """:func:`worker_seed` as an int64 tensor (0 for None), for a worker index that may be a
    tensor (one pipeline traced for several workers' streams)."""
    if seed is None:
        return tf.constant(0, tf.int64)
    return tf.constant(seed, tf.int64) + _SEED_STRIDE * tf.cast(index, tf.int64)


@contextlib.contextmanager
def own_graph_seed() -> Iterator[None]:
    """Shuffles given a tensor seed inside it ignore the global seed (in a traced function).

    TensorFlow pairs an op's seed with the global seed (``tf.random.set_seed``,
    ``keras.utils.set_random_seed``) and then compares the pair to ``(0, 0)`` in Python: a
    tensor seed under a global seed of 0 fails in graph mode ("Using a symbolic tf.Tensor as
    a Python bool"). Inside this block the traced graph's seed is TensorFlow's default, the
    one an unseeded program has: a positioned stream's order then depends on its own seed
    only, the same whatever global seed the interrupted and the resumed run set.
    """
    if tf.executing_eagerly():
        yield
        return
    graph = tf.compat.v1.get_default_graph()
    saved = graph.seed
    graph.seed = _DEFAULT_GRAPH_SEED
    try:
        yield
    finally:
        graph.seed = saved


# ------------------------------------------------------------------------------- stages


def read_files(recipe: Recipe, index: Any, *, seed: Any = None, in_order: bool = False) -> Any:
    """Worker ``index``'s files, read in parallel, their order shuffled where allowed.

    Args:
        index: the worker; a tensor too (then ``seed`` is required): one traced pipeline
            reads any worker's files, in the order a Python index gives them.
        seed: the file shuffle's seed; None: the worker's own (:func:`worker_seed`).
        in_order: the same file order and element order in every pass (no reshuffle per
            iteration, a deterministic interleave), as a resumed epoch needs.
    """
    if tf.is_tensor(index):
        file_ds, count = _files_of(recipe.plan.files_per_worker, index)
        reads = tf.clip_by_value(count, 1, MAX_PARALLEL_FILES)
        several = True  # shuffling one file changes nothing
    else:
        files = recipe.plan.files_per_worker[index]
        listed = tf.constant(list(files) or [""])
        file_ds = tf.data.Dataset.from_tensor_slices(listed).take(len(files))
        count, reads, several = len(files), parallel_reads(len(files)), len(files) > 1
    if recipe.shuffle_buffer_size is not None and not recipe.keeps_order and several:
        with own_graph_seed():
            file_ds = file_ds.shuffle(
                count,
                seed=worker_seed(recipe.seed, index) if seed is None else seed,
                reshuffle_each_iteration=not in_order,
            )
    # Reads wait on storage latency (cloud storage, network file systems), not on a core:
    # one read in flight per file (up to the cap), where AUTOTUNE would stop at the core
    # count. The private thread pool is raised to match (see reader_threads).
    return file_ds.interleave(
        recipe.reader,
        cycle_length=reads,
        num_parallel_calls=reads,
        deterministic=recipe.keeps_order or in_order,
    )


def _files_of(files_per_worker: Any, index: Any) -> tuple[Any, Any]:
    """The files of worker ``index`` (a tensor) as a dataset, and how many (a tensor)."""
    flat = [path for files in files_per_worker for path in files]
    bounds = [0]
    for files in files_per_worker:
        bounds.append(bounds[-1] + len(files))
    edges = tf.constant(bounds, tf.int64)
    first, end = edges[index], edges[index + 1]
    listed = tf.constant(flat or [""])[first:end]
    return tf.data.Dataset.from_tensor_slices(listed), end - first


def reader_threads(plan: ShardingPlan, cores: int | None = None) -> int | None:
    """tf.data's private thread pool size for ``plan``, or None to keep tf.data's default.

    tf.data's default pool has one thread per core, and every parallel stage of the pipeline
    draws from it: with more reads in flight than cores, the reads would queue for threads
    while waiting on nothing but latency. The pool then holds a thread per read in flight
    plus one per core, so that CPU-bound stages (``map_fn``, the step split) keep a thread
    per core beside the waiting reads. Nothing changes when the reads fit the cores.
    """
    if plan.source_kind != "files" or not plan.files_per_worker:
        return None
    cores = cores or os.cpu_count() or 1
    reads = max(parallel_reads(len(files)) for files in plan.files_per_worker)
    return reads + cores if reads > cores else None


def call_source(source: Callable[[Any], Any], context: Any) -> Any:
    dataset = source(context)
    if not is_dataset(dataset):
        raise TypeError(
            f"the source function returned {type(dataset).__name__}; expected an unbatched "
            "tf.data.Dataset for input pipeline "
            f"{context.input_pipeline_id} of {context.num_input_pipelines}."
        )
    return dataset


def read(recipe: Recipe, source: Any, context: Any) -> Any:
    """This worker's unbatched examples: its files, the function's dataset, or the source."""
    if recipe.plan.source_kind == "files":
        return read_files(recipe, int(context.input_pipeline_id))
    if recipe.plan.source_kind == "function":
        return call_source(source, context)
    return source


def map_and_cache(recipe: Recipe, dataset: Any, workers: int, index: int) -> Any:
    """Map first when caching (so later epochs reshuffle the cached, mapped examples)."""
    if recipe.maps_before_cache:
        dataset = dataset.map(
            recipe.map_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )
    if recipe.cache:
        name = recipe.cache if isinstance(recipe.cache, str) else ""
        if name and workers > 1:
            name = f"{name}.worker-{index}-of-{workers}"
        dataset = dataset.cache(name)
    return dataset


def cache_and_shuffle(recipe: Recipe, dataset: Any, workers: int, index: int) -> Any:
    """:func:`map_and_cache`, then shuffle (a fresh order each epoch)."""
    dataset = map_and_cache(recipe, dataset, workers, index)
    if recipe.shuffle_buffer_size is not None:
        seed = recipe.seed if recipe.keeps_order else worker_seed(recipe.seed, index)
        dataset = dataset.shuffle(
            recipe.shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True
        )
    return dataset


def shard_and_map(recipe: Recipe, dataset: Any, workers: int, index: int) -> Any:
    """Repeat by example, keep this worker's share (DATA), map, trim (``drop_remainder``)."""
    if recipe.repeat and not recipe.aligned:
        dataset = dataset.repeat()
    if recipe.plan.policy == "data":
        dataset = dataset.shard(workers, index)
    if recipe.map_fn is not None and not recipe.maps_before_cache:
        dataset = dataset.map(
            recipe.map_fn,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=recipe.keeps_order or None,
        )
    if recipe.epochs.take_per_worker is not None and (recipe.aligned or not recipe.repeat):
        dataset = dataset.take(recipe.epochs.take_per_worker)
    return dataset


def batch(
    recipe: Recipe, dataset: Any, index: int, *, split: bool, repeat_epochs: bool = True
) -> Any:
    """Batch whole steps (with ``split``) or replica batches; pad (and, with
    ``repeat_epochs``, repeat) aligned epochs."""
    local = recipe.replicas_per_worker
    # With the split, batch whole steps of the worker (all its replicas) first; each step is
    # cut into one batch per replica afterwards, the last one as evenly as possible.
    batch_size = recipe.shape.per_replica_batch_size * (local if split else 1)
    dataset = dataset.batch(batch_size, drop_remainder=recipe.drop_remainder)
    if not recipe.aligned:
        return dataset
    batches, steps = recipe.epochs.epoch_batches, recipe.epochs.epoch_steps
    assert batches is not None and steps is not None  # aligned
    # Pad in the unit batched above: whole steps with the split, replica batches without.
    held = batches[index]
    pad = steps - held // local if split else steps * local - held
    if pad > 0:
        empty = tf.data.Dataset.from_tensors(empty_batch(dataset.element_spec))
        dataset = dataset.concatenate(empty.repeat(pad))
    return dataset.repeat() if repeat_epochs else dataset


def split_steps(dataset: Any, replicas: int) -> Any:
    """Cut each whole step into ``replicas`` batches, in order (see :func:`step_splitter`).

    In order, since a reordered step would mix the partial step into full ones. The identity
    map after unbatch turns its rows (RaggedTensorSpec of ragged_rank 0) back into dense
    TensorSpecs, which the distributed iterator and tf.function loops expect.
    """
    return (
        dataset.map(
            step_splitter(replicas), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )
        .unbatch()
        .map(_identity)
    )


def with_options(recipe: Recipe, dataset: Any, policy: Any, *, deterministic: bool) -> Any:
    if recipe.prefetch:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    if recipe.data_options is not None:
        options = options.merge(recipe.data_options)
    options.experimental_distribute.auto_shard_policy = policy
    if deterministic:
        options.deterministic = True
    threads = reader_threads(recipe.plan)
    if threads is not None and not options.threading.private_threadpool_size:
        options.threading.private_threadpool_size = threads
    return dataset.with_options(options)


# ------------------------------------------------------------------------- the pipelines


def per_worker_dataset(recipe: Recipe, source: Any, context: Any) -> Any:
    """This worker's pipeline for ``distribute_datasets_from_function``.

    Raises:
        RuntimeError: the strategy has a different number of input pipelines than the plan.
    """
    workers, index = int(context.num_input_pipelines), int(context.input_pipeline_id)
    if workers != recipe.plan.num_workers:
        raise RuntimeError(
            f"the plan was made for {recipe.plan.num_workers} workers but the strategy has "
            f"{workers} input pipelines; build the dataset with the strategy that trains."
        )
    dataset = read(recipe, source, context)
    # DATA keeps every W-th example of a stream that must be in the same order on every
    # worker, including in the source's own parallel transformations.
    return worker_stages(recipe, dataset, workers, index, deterministic=recipe.keeps_order)


def worker_stages(
    recipe: Recipe, dataset: Any, workers: int, index: int, *, deterministic: bool
) -> Any:
    """Cache/shuffle -> shard/map -> batch -> split, and the options: a worker's read data on."""
    dataset = cache_and_shuffle(recipe, dataset, workers, index)
    dataset = shard_and_map(recipe, dataset, workers, index)
    # The builder asked the same question with the same (mapped) elements for its counts.
    split = splits_last_step(
        recipe.replicas_per_worker,
        drop_remainder=recipe.drop_remainder,
        repeat_by_example=recipe.repeat and not recipe.aligned,
        dense=dense_only(dataset.element_spec),
    )
    dataset = batch(recipe, dataset, index, split=split)
    if split:
        dataset = split_steps(dataset, recipe.replicas_per_worker)
    # The builder shards above; say so, so that tf.data neither rewrites nor warns.
    off = tf.data.experimental.AutoShardPolicy.OFF
    return with_options(recipe, dataset, off, deterministic=deterministic)


def global_dataset(recipe: Recipe, source: Any) -> Any:
    """A globally batched dataset for tf.data's own autoshard (FILE/HINT on a Dataset)."""
    autotune = tf.data.AUTOTUNE
    dataset = source
    if recipe.maps_before_cache:
        dataset = dataset.map(recipe.map_fn, num_parallel_calls=autotune)
    if recipe.cache:
        dataset = dataset.cache(recipe.cache if isinstance(recipe.cache, str) else "")
    if recipe.shuffle_buffer_size is not None:
        dataset = dataset.shuffle(recipe.shuffle_buffer_size, seed=recipe.seed)
    if recipe.repeat:
        dataset = dataset.repeat()
    if recipe.map_fn is not None and not recipe.cache:
        dataset = dataset.map(recipe.map_fn, num_parallel_calls=autotune)
    dataset = dataset.batch(recipe.shape.global_batch_size, drop_remainder=recipe.drop_remainder)
    policy = tf.data.experimental.AutoShardPolicy
    shard = policy.FILE if recipe.plan.policy == "file" else policy.HINT
    return with_options(recipe, dataset, shard, deterministic=False)


# ------------------------------------------------------------------------------ helpers


def step_splitter(replicas: int) -> Callable[..., Any]:
    """``step -> ragged [replicas, None, ...]`` cut as evenly as possible, larger parts first.

    A full step becomes ``replicas`` batches of ``per_replica_batch_size``; a partial one of
    ``n`` examples becomes ``n // replicas`` or one more each (28 -> 14 + 14), where tf.data's
    own rebatching would give 28 + 0. Empty per-replica batches crash some kernels, e.g.
    Conv2D on CPU with oneDNN ("input depth must be evenly divisible by filter depth").
    """

    def split(*parts: Any) -> Any:
        # tf.data passes the components of a tuple element as separate arguments.
        step = parts[0] if len(parts) == 1 else parts
        size = tf.shape(tf.nest.flatten(step)[0], out_type=tf.int64)[0]
        replica = tf.range(replicas, dtype=tf.int64)
        lengths = size // replicas + tf.cast(replica < size % replicas, tf.int64)
        return tf.nest.map_structure(
            lambda t: tf.RaggedTensor.from_row_lengths(t, lengths, validate=False), step
        )

    return split


def _identity(*element: Any) -> Any:
    return element[0] if len(element) == 1 else element


def empty_batch(batch_spec: Any) -> Any:
    """A batch of 0 examples with the structure, dtypes and inner shapes of ``batch_spec``."""

    def empty(spec: Any) -> Any:
        inner = [d if d is not None else 0 for d in spec.shape.as_list()[1:]]
        return tf.zeros([0, *inner], spec.dtype)

    return tf.nest.map_structure(empty, batch_spec)
