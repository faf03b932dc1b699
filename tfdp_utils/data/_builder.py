"""The builder: ``build_distributed_dataset`` and ``plan_sharding``, the public entry points.

Each call runs the same short sequence: check the arguments into one call record
(:mod:`~tfdp_utils.data._arguments`), examine the source once
(:mod:`~tfdp_utils.data._examine`), plan (:mod:`~tfdp_utils.data._call_plan`, over
:mod:`~tfdp_utils.data._sharding` and :mod:`~tfdp_utils.data._epochs`) and log the diagnosis,
build the pipeline (:mod:`~tfdp_utils.data._pipeline`) inside the strategy, and attach the
dataset's record (:mod:`~tfdp_utils.data._attach`). A function that batches itself goes its own
way after the look (:mod:`~tfdp_utils.data._self_batched`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from tfdp_utils._dataset_info import DatasetInfo
from tfdp_utils._tf import tf
from tfdp_utils._validate import positive_int
from tfdp_utils.cluster._topology import WorkerPosition, position_of
from tfdp_utils.data import _self_batched as self_batched
from tfdp_utils.data._arguments import (
    BuilderCall,
    check_reader,
    per_replica_size,
    strategy_or_default,
    validate_call,
)
from tfdp_utils.data._attach import attach
from tfdp_utils.data._call_plan import CallPlan, check_elements, log_findings, plan_call, step_shape
from tfdp_utils.data._epochs import dataset_info_for, plan_epochs
from tfdp_utils.data._examine import ExaminedSource, examine_source
from tfdp_utils.data._learned_epochs import Learnable, learnable
from tfdp_utils.data._pipeline import Recipe, global_dataset, per_worker_dataset
from tfdp_utils.data._positioned import Resumable, resumable
from tfdp_utils.data._replay import example_index
from tfdp_utils.data._sharding import (
    ShardingPlan,
    check_policy,
    plan_from_facts,
    shuffle_seed,
)
from tfdp_utils.data._single_device import on_one_device
from tfdp_utils.data._sources import gather_facts
from tfdp_utils.data.service._modes import check_service, service_plan
from tfdp_utils.data.service._modes import distribute as distribute_with_service


def plan_sharding(
    source: Any,
    *,
    strategy: Any = None,
    num_workers: int | None = None,
    shard_policy: str = "auto",
    global_batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    drop_remainder: bool = False,
    reader: Callable[[Any], Any] | None = None,
    count_examples: bool = False,
    service: str | None = None,
    service_mode: str = "synchronous",
) -> ShardingPlan:
    """Decide how ``source`` is split between workers, without building anything.

    Args:
        source: what :func:`build_distributed_dataset` accepts.
        strategy: the ``tf.distribute.Strategy`` that will train. Defaults to `None`
            (``tf.distribute.get_strategy()``: the strategy in scope; outside any scope
            TensorFlow's default strategy, which logs a warning when
            :func:`~tfdp_utils.auto_strategy` built one with several replicas).
        num_workers: plan for this many workers instead of the strategy's (with one replica
            per worker if the strategy has fewer replicas than that). Defaults to `None`.
        shard_policy: ``"auto"``, ``"file"``, ``"data"``, ``"hint"`` or ``"off"``.
            Defaults to `"auto"`.
        global_batch_size: with it, the plan includes steps per worker when the example count
            is known. Defaults to `None`.
        per_replica_batch_size: alternative to ``global_batch_size``. Defaults to `None`.
        drop_remainder: as for the builder. Defaults to `False`.
        reader: as for the builder. Defaults to `None` (``tf.data.TFRecordDataset``).
        count_examples: count the examples of file sources (reads every file once), so the
            plan knows examples and steps per worker. Defaults to `False`.

        service: as for the builder: the plan then says what the service reads and
            what it guarantees. Defaults to `None`.
        service_mode: as for the builder. Defaults to `"synchronous"`.

    Returns:
        A :class:`ShardingPlan`.

    Raises:
        ValueError: unknown policy, a policy that cannot apply to the source, files that do
            not exist, a glob that matches nothing.

    Examples:
        >>> import numpy as np
        >>> import tfdp_utils as tdu
        >>> tdu.plan_sharding(np.arange(10), num_workers=2).policy
        'data'
    """
    # With num_workers given, the strategy only sets the replicas: nothing to warn about.
    strategy = strategy_or_default(strategy, "plan_sharding" if num_workers is None else None)
    replicas = int(strategy.num_replicas_in_sync)
    workers = position_of(strategy).num_workers
    if num_workers is not None:
        workers = positive_int(num_workers, "num_workers")
        replicas = max(replicas, workers)
    per_replica = None
    if global_batch_size is not None or per_replica_batch_size is not None:
        per_replica = per_replica_size(
            global_batch_size, per_replica_batch_size, replicas, strategy
        )
    check_policy(shard_policy)
    facts = gather_facts(
        source,
        shard_policy=shard_policy,
        reader=check_reader(reader),
        count_examples=count_examples,
    )
    plan = plan_from_facts(
        facts,
        shard_policy=shard_policy,
        num_workers=workers,
        per_replica_batch_size=per_replica,
        replicas_per_worker=max(1, replicas // workers),
        drop_remainder=drop_remainder,
    )
    config = check_service(service, service_mode, service_timeout=None)
    return plan if config is None else service_plan(plan, config)


def build_distributed_dataset(
    source: Any,
    *,
    strategy: Any = None,
    global_batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    shard_policy: str = "auto",
    map_fn: Callable[..., Any] | None = None,
    reader: Callable[[Any], Any] | None = None,
    shuffle_buffer_size: int | None = None,
    seed: int | None = None,
    repeat: bool | str = False,
    cache: bool | str = False,
    drop_remainder: bool = False,
    prefetch: bool = True,
    options: Any = None,
    count_examples: bool = False,
    service: str | None = None,
    service_mode: str = "synchronous",
    service_timeout: float | None = None,
    element: str = "auto",
) -> Any:
    """Build a distributed dataset in which every example is seen exactly once per epoch.

    The source is sharded between workers by an explicit policy (see
    :func:`plan_sharding`, logged once), shuffled with a seed shared by every worker when
    sharding needs it, mapped with AUTOTUNE parallelism, batched per replica and prefetched.
    With ``drop_remainder=False`` each epoch covers every example exactly once across all
    replicas and every worker runs the same number of steps; replicas that run out first
    receive empty batches in the last steps.

    Args:
        source: a ``tf.data.Dataset`` of examples (or of batches, see ``element``); numpy
            arrays or a tuple/dict of them; a file path, list of paths or glob (read with
            ``reader``); or a function ``fn(input_context) -> tf.data.Dataset`` returning this
            worker's examples, or its per-replica batches as
            ``Strategy.distribute_datasets_from_function`` defines them (batched with
            ``input_context.get_per_replica_batch_size(global_batch_size)``).
        strategy: the ``tf.distribute.Strategy`` that trains. Defaults to `None`
            (``tf.distribute.get_strategy()``: the strategy in scope; outside any scope
            TensorFlow's default strategy, with one replica. A warning is logged when
            :func:`~tfdp_utils.auto_strategy` built a strategy with several replicas in this
            process: pass it, or build inside ``with strategy.scope():``).
        global_batch_size: examples per step over all replicas. Defaults to `None`.
        per_replica_batch_size: examples per replica per step; pass exactly one of the two
            (or neither for a source of batches whose size is known: a dataset's static batch
            size is the global one, a function's per-replica size is what it asked
            ``input_context`` for or its batches' static size). Defaults to `None`.
        shard_policy: ``"auto"``, ``"file"``, ``"data"``, ``"hint"`` or ``"off"``.
            Defaults to `"auto"`.
        map_fn: applied to each example (after sharding, so each worker maps only its share,
            unless ``cache`` is set, when mapped examples are cached). Defaults to `None`.
        reader: ``path -> tf.data.Dataset`` for file sources. Defaults to `None`
            (``tf.data.TFRecordDataset``).
        shuffle_buffer_size: shuffle with this buffer; None does not shuffle. Defaults to
            `None`.
        seed: shuffle seed. With DATA sharding every worker must use the same one; None then
            uses :data:`DEFAULT_SHUFFLE_SEED`. Defaults to `None`.
        repeat: ``False``, ``True`` or ``"epochs"`` (a Python or NumPy bool, or that
            string; numbers such as ``1`` are refused). ``True`` repeats the examples without
            end, every step full (pass ``steps_per_epoch`` to ``fit``). ``"epochs"`` repeats
            whole epochs: each worker's epoch is padded with empty batches to the same
            number of steps, so with ``fit(steps_per_epoch=dist.tfdp_info.steps_per_epoch)``
            every epoch sees every example exactly once. It needs the examples per worker
            (arrays, datasets of known size, files with ``count_examples=True``) and dense
            elements, or a function that batches itself with a known number of batches on
            every worker; otherwise a ``ValueError`` says how to give it one. Defaults to
            `False`.
        cache: cache in memory (True) or in files with this prefix. Defaults to `False`.
        drop_remainder: drop the examples that do not fill a step on every replica; the
            number dropped per epoch is logged. Defaults to `False`.
        prefetch: prefetch with AUTOTUNE. Defaults to `True`.
        options: a ``tf.data.Options`` merged into the pipeline's, or a
            ``tf.distribute.InputOptions`` for the strategy. Defaults to `None`.
        count_examples: for file sources, count the examples of every file before training
            (each worker reads every file once more), so that files are balanced by examples
            and ``tfdp_info`` has exact per-replica counts. Defaults to `False`.
        element: what each element of a ``tf.data.Dataset`` or function source is:
            ``"example"`` (one example, even one with a leading dimension such as a window
            of a sequence: ``ds.batch(11, drop_remainder=True).map(split)``), ``"batch"``
            (a batch of examples: a dataset's batches are unbatched and batched again per
            step; a function's are per-replica batches handed to the replicas as they are,
            and ``map_fn``, shuffling, ``cache`` and ``drop_remainder`` then belong inside
            the function), or ``"auto"``: batches when the pipeline ends in ``.batch()``,
            examples when it does not or a map after the batch changes its leading size,
            and a ``ValueError`` asking which when that cannot be told. Defaults to
            `"auto"`.
        service: the address of a tf.data service dispatcher (``"grpc://host:port"``,
            e.g. from ``tfdp-utils data-service dispatcher``): reading and ``map_fn`` run on
            its service workers instead of this process. Defaults to `None` (no service).
        service_mode: ``"synchronous"``: each worker's planned share is split between the
            service workers and batched here, so every example is seen once per epoch with
            equal steps and exact counts, as without the service; or ``"distributed_epoch"``:
            tf.data's own dynamic split of the whole source, batched on the service (one
            trainer worker only; steps per epoch unknown). See :mod:`tfdp_utils.data.service`.
            Defaults to `"synchronous"`.
        service_timeout: seconds to wait for the service to answer before the dataset is
            returned, and for data during training (then the process ends with the reason).
            Defaults to `None` (``TFDP_SERVICE_TIMEOUT``, else 300).

    Returns:
        A ``tf.distribute.DistributedDataset`` (a ``tf.data.Dataset`` under the default
        strategy) carrying its record ``tfdp``: ``tfdp.info`` (a
        :class:`~tfdp_utils.DatasetInfo`), ``tfdp.plan`` (a :class:`ShardingPlan`), its input
        clock and how to build it again; ``tfdp_info`` and ``tfdp_plan`` are the same two
        objects. Iterating it records the info for the throughput callbacks.

    Raises:
        ValueError: both or neither batch size; a global size not divisible by, or smaller
            than, the replicas; an empty file list, a glob that matches nothing or a missing
            file; an unknown policy; ``"file"`` on a source without files; a batched source
            whose elements cannot be told apart (``element="auto"``); a ``map_fn`` that
            cannot take the elements; ``repeat`` other than False, True or ``"epochs"``, or
            ``"epochs"`` on a source whose epochs cannot be counted.
        TypeError: an unsupported source or reader.

    Examples:
        >>> import numpy as np
        >>> import tfdp_utils as tdu
        >>> dist = tdu.build_distributed_dataset(np.arange(10), global_batch_size=4)
        >>> dist.tfdp_info.steps_per_epoch
        3
    """
    call = validate_call(
        source,
        strategy=strategy,
        global_batch_size=global_batch_size,
        per_replica_batch_size=per_replica_batch_size,
        shard_policy=shard_policy,
        map_fn=map_fn,
        reader=reader,
        shuffle_buffer_size=shuffle_buffer_size,
        seed=seed,
        repeat=repeat,
        cache=cache,
        drop_remainder=drop_remainder,
        prefetch=prefetch,
        options=options,
        count_examples=count_examples,
        service=service,
        service_mode=service_mode,
        service_timeout=service_timeout,
        element=element,
    )
    return build_call(call)


def build_call(call: BuilderCall) -> Any:
    """The dataset of a checked call: examine the source, plan, build, attach the record."""
    position = position_of(call.strategy)
    replicas = int(call.strategy.num_replicas_in_sync)
    context = tf.distribute.InputContext(position.num_workers, position.index, replicas)
    source = examine_source(call, context)
    if source.batches_itself:
        return _function_batches(call, source, position)
    shape = step_shape(call, source, position)
    planned = plan_call(call, source, shape, position.index)
    dist = _distribute(call, planned)
    info = dataset_info_for(
        planned.epochs, shape, repeat=call.repeat, infinite=planned.source.facts.infinite
    )
    if call.distributed_epoch:
        # The service hands out its batches dynamically: how many steps, and what each
        # replica's last one holds, is known only once the epoch has ended.
        info = dataclasses.replace(
            info,
            exact=False,
            inexact_reason="service_mode='distributed_epoch' hands batches out dynamically: "
            "each step is counted as a full global batch, and an epoch's last steps can be "
            "partial or extra",
        )
    positioned = indexed = streamed = None
    if call.service is None:
        # Asked for by PreemptionCheckpoint only: planning aligned epochs can read an element.
        positioned = functools.partial(_resumable, call, planned, info)
        # Asked for by DivergenceGuard only, after a non-finite step.
        indexed = functools.partial(_example_index, call, planned, info)
        if info.steps_per_epoch is None and not info.repeat:
            # Asked for by fit (one iterator from the second epoch on, compat fit-one-iterator).
            streamed = functools.partial(_learnable, call, planned, info)
    one_device = on_one_device(call, info, self_batching=False)
    return attach(
        dist,
        info,
        planned.plan,
        resumable=positioned,
        rebuild_on_one_device=functools.partial(build_call, one_device),
        example_index=indexed,
        learnable=streamed,
    )


def _function_batches(call: BuilderCall, source: ExaminedSource, position: WorkerPosition) -> Any:
    """A ``fn(input_context)`` source that batches itself: its batches go to the replicas."""
    dist, info, plan, findings = self_batched.distribute_function_batches(
        call, source, num_workers=position.num_workers, worker_index=position.index
    )
    log_findings(findings)
    one_device = on_one_device(call, info, self_batching=True)
    return attach(dist, info, plan, rebuild_on_one_device=functools.partial(build_call, one_device))


# ------------------------------------------------------------------------- the pipeline


def _recipe(call: BuilderCall, planned: CallPlan) -> Recipe:
    shuffling = call.shuffle_buffer_size is not None
    return Recipe(
        planned.plan,
        planned.shape,
        planned.epochs,
        map_fn=call.map_fn,
        reader=call.reader,
        shuffle_buffer_size=call.shuffle_buffer_size,
        seed=shuffle_seed(planned.plan, call.seed, shuffling=shuffling),
        repeat=bool(call.repeat),
        cache=call.cache,
        drop_remainder=call.drop_remainder,
        prefetch=call.prefetch,
        data_options=call.data_options,
    )


def _distribute(call: BuilderCall, planned: CallPlan) -> Any:
    """The pipeline, inside the strategy (through the tf.data service when asked)."""
    recipe = _recipe(call, planned)
    readable = planned.source.readable
    if call.service is not None:
        # Arrays stay arrays for the service, which splits each trainer's share itself.
        return distribute_with_service(
            call.strategy, recipe, readable, call.source, call.input_options, call.service
        )
    plan = recipe.plan
    if plan.source_kind == "dataset" and plan.policy in ("file", "hint"):
        # tf.data's own autoshard.
        return call.strategy.experimental_distribute_dataset(
            global_dataset(recipe, readable), options=call.input_options
        )
    return call.strategy.distribute_datasets_from_function(
        lambda context: per_worker_dataset(recipe, readable, context), options=call.input_options
    )


def _example_index(call: BuilderCall, planned: CallPlan, info: DatasetInfo) -> Any:
    """What names the source indices of a step's examples, or why none can be named."""
    return example_index(
        _recipe(call, planned),
        planned.source.readable,
        source_kind=planned.plan.source_kind,
        num_examples=planned.source.facts.num_examples,
        worker_index=planned.worker_index,
        steps_per_epoch=info.steps_per_epoch,
    )


def _learnable(call: BuilderCall, planned: CallPlan, info: DatasetInfo) -> Learnable | None:
    """How to stream the epochs of a dataset of unknown size padded to learned steps, or None
    where they cannot be (see :func:`~tfdp_utils.data._learned_epochs.learnable`)."""
    recipe = _recipe(call, planned)
    return learnable(call.strategy, recipe, planned.source.readable, call.input_options, info)


def _resumable(call: BuilderCall, planned: CallPlan, info: DatasetInfo) -> Resumable | None:
    """How to rebuild the dataset from a step of an epoch (``PreemptionCheckpoint``), or None
    where its epochs cannot be aligned (unknown size, sparse or ragged elements)."""
    try:
        dense = check_elements(
            call,
            planned.source,
            planned.plan,
            planned.worker_index,
            planned.shape,
            repeat="epochs",
        )
    except (ValueError, TypeError):
        return None
    if dense is not True:
        return None
    aligned = plan_epochs(
        planned.plan.examples_per_worker,
        planned.shape,
        drop_remainder=call.drop_remainder,
        repeat="epochs",
        dense=True,
    )
    recipe = _recipe(call, planned)
    return resumable(
        call.strategy,
        recipe,
        planned.source.readable,
        call.input_options,
        aligned,
        planned.shape,
        info,
        seed_given=call.seed is not None,
    )


plan_sharding.__module__ = "tfdp_utils"  # public home (tfdp_utils._public)
build_distributed_dataset.__module__ = "tfdp_utils"  # public home (tfdp_utils._public)
