"""The builder: ``build_distributed_dataset`` and ``plan_sharding``, the public entry points.

Each call runs the same short sequence: validate the arguments, gather facts about the
source (:mod:`~tfdp_utils.data._sources`), plan (:mod:`~tfdp_utils.data._sharding`,
:mod:`~tfdp_utils.data._epochs`), log the diagnosis (:mod:`~tfdp_utils.data._diagnostics`),
build the pipeline (:mod:`~tfdp_utils.data._pipeline`) inside the strategy and attach its
info (:mod:`~tfdp_utils.data._attach`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from tfdp_utils._dataset_info import DatasetInfo
from tfdp_utils._tf import tf
from tfdp_utils._validate import boolean, positive_int
from tfdp_utils.cluster._topology import position_of
from tfdp_utils.data import _elements as element_kinds
from tfdp_utils.data import _self_batched as self_batched
from tfdp_utils.data import _single_device as single_device
from tfdp_utils.data._arguments import (
    BuilderCall,
    check_map_fn,
    check_reader,
    per_replica_size,
    split_options,
    strategy_or_default,
    validate_call,
)
from tfdp_utils.data._attach import attach
from tfdp_utils.data._diagnostics import BuildFacts, Finding, diagnose
from tfdp_utils.data._epochs import (
    Repeat,
    StepShape,
    check_epochs_aligned,
    check_repeat,
    dataset_info_for,
    needs_element_check,
    plan_epochs,
)
from tfdp_utils.data._pipeline import Recipe, global_dataset, per_worker_dataset
from tfdp_utils.data._positioned import Resumable, resumable
from tfdp_utils.data._sharding import (
    ShardingPlan,
    SourceFacts,
    check_policy,
    plan_from_facts,
    shuffle_seed,
)
from tfdp_utils.data._sources import (
    array_length,
    cardinality,
    dense_only,
    gather_facts,
    reader_dataset,
    source_kind,
)
from tfdp_utils.data.service._modes import check_service, service_plan
from tfdp_utils.data.service._modes import distribute as distribute_with_service

logger = logging.getLogger("tfdp_utils")


# ----------------------------------------------------------------------- gathering facts


def _gather(
    source: Any,
    *,
    shard_policy: str,
    reader: Callable[[Any], Any],
    count_examples: bool,
    elements: element_kinds.SourceElements = element_kinds.EXAMPLES,
) -> tuple[Any, SourceFacts]:
    """The source as the pipeline reads it (arrays a Dataset, batches unbatched), its facts."""
    kind = source_kind(source)
    if kind == "arrays":
        array_length(source)
        dataset = tf.data.Dataset.from_tensor_slices(source)
        return dataset, SourceFacts("arrays", num_examples=cardinality(dataset))
    if kind == "dataset":
        source = element_kinds.examples_of(source, elements)
    facts = gather_facts(
        source, shard_policy=shard_policy, reader=reader, count_examples=count_examples
    )
    return source, facts


@dataclasses.dataclass(frozen=True)
class _Elements:
    """The source's elements as the pipeline reads them (arrays already a Dataset)."""

    source: Any
    facts: SourceFacts
    reader: Callable[[Any], Any]
    map_fn: Callable[..., Any] | None

    def spec(self, plan: ShardingPlan, index: int) -> Any:
        """One unbatched element's spec as worker ``index`` reads it; None for a function."""
        if self.facts.kind == "function":
            return None
        if self.facts.kind != "files":
            return self.source.element_spec
        own = plan.files_per_worker[index]
        path = own[0] if own else self.facts.files[0]
        return reader_dataset(self.reader, path).element_spec

    def mapped_dense(self, element_spec: Any) -> bool:
        """Whether the elements as batched (after ``map_fn``) are all dense tensors."""
        if self.map_fn is None:
            return dense_only(element_spec)
        facts = self.facts
        read = reader_dataset(self.reader, facts.files[0]) if facts.kind == "files" else self.source
        return dense_only(read.map(self.map_fn).element_spec)

    def check(
        self, plan: ShardingPlan, index: int, repeat: Repeat, drop_remainder: bool, shape: StepShape
    ) -> bool | None:
        """Check ``map_fn`` against the elements; say whether they batch dense, if it matters.

        Returns:
            Whether the mapped elements are all dense, or None when the epoch plan does not
            depend on it (see :func:`~tfdp_utils.data._epochs.needs_element_check`).
        """
        element_spec = self.spec(plan, index)
        if element_spec is not None:
            check_map_fn(self.map_fn, element_spec)
        needed = needs_element_check(
            plan.examples_per_worker,
            repeat=repeat,
            replicas_per_worker=shape.replicas_per_worker,
            drop_remainder=drop_remainder,
        )
        return self.mapped_dense(element_spec) if needed else None


# -------------------------------------------------------------------------- the builders


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
        strategy) with attributes ``tfdp_info`` (a :class:`~tfdp_utils.DatasetInfo`) and
        ``tfdp_plan`` (a :class:`ShardingPlan`). Iterating it records the info for the
        throughput callbacks.

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
    arguments = dict(locals())  # the call, kept for single_device_dataset()
    call = validate_call(arguments)
    position = position_of(call.strategy)
    replicas = int(call.strategy.num_replicas_in_sync)
    # What the source's elements are: examples, or batches (self_batched).
    batches, source = self_batched.inspect_source(
        source,
        element_kinds.check_element(element),
        kind=source_kind(source),
        context=tf.distribute.InputContext(position.num_workers, position.index, replicas),
    )
    if batches.kind == "batch" and source_kind(source) == "function":
        return _function_batches(call.strategy, source, batches, arguments)
    global_batch_size = element_kinds.batch_size_of_batches(
        batches, global_batch_size, per_replica_batch_size
    )
    per_replica = per_replica_size(
        global_batch_size, per_replica_batch_size, replicas, call.strategy
    )
    _log(element_kinds.element_findings(batches, per_replica * replicas))
    shape = StepShape(per_replica, replicas, position.num_workers)
    planned = _plan_call(call, source, batches, shape, position.index, shard_policy, map_fn)
    dist = _build_call(call, planned, raw_source=source, map_fn=map_fn)
    info = dataset_info_for(
        planned.epochs, shape, repeat=call.repeat, infinite=planned.facts.infinite
    )
    if call.service is not None and call.service.mode == "distributed_epoch":
        # The service hands out its batches dynamically: how many steps, and what each
        # replica's last one holds, is known only once the epoch has ended.
        info = dataclasses.replace(
            info,
            exact=False,
            inexact_reason="service_mode='distributed_epoch' hands batches out dynamically: "
            "each step is counted as a full global batch, and an epoch's last steps can be "
            "partial or extra",
        )
    dist = single_device.remember(
        attach(dist, info, planned.plan),
        arguments,
        self_batching=False,
        rebuild=build_distributed_dataset,
    )
    if call.service is None:
        # Asked for by PreemptionCheckpoint only: planning aligned epochs can read an element.
        dist.tfdp_resumable = functools.partial(_resumable, call, planned, map_fn, info)
    return dist


@dataclasses.dataclass(frozen=True)
class _Planned:
    """What the planning phase decided: the source as read, its facts, the plan, the epochs."""

    source: Any
    facts: SourceFacts
    plan: ShardingPlan
    epochs: Any
    shape: StepShape
    elements: Any = None
    worker_index: int = 0


def _plan_call(
    call: BuilderCall,
    source: Any,
    batches: element_kinds.SourceElements,
    shape: StepShape,
    worker_index: int,
    shard_policy: str,
    map_fn: Callable[..., Any] | None,
) -> _Planned:
    """Gather facts about the source, plan sharding and epochs, and log the diagnosis."""
    source, facts = _gather(
        source,
        shard_policy=shard_policy,
        reader=call.reader,
        count_examples=call.count_examples,
        elements=batches,
    )
    plan = plan_from_facts(
        facts,
        shard_policy=shard_policy,
        num_workers=shape.num_workers,
        per_replica_batch_size=shape.per_replica_batch_size,
        replicas_per_worker=shape.replicas_per_worker,
        drop_remainder=call.drop_remainder,
    )
    if call.service is not None:
        plan = service_plan(plan, call.service, cache=call.cache)
    elements = _Elements(source, facts, call.reader, map_fn)
    dense = elements.check(plan, worker_index, call.repeat, call.drop_remainder, shape)
    epochs = plan_epochs(
        plan.examples_per_worker,
        shape,
        drop_remainder=call.drop_remainder,
        repeat=call.repeat,
        dense=dense,
    )
    if not call.repeat:
        _check_not_empty_by_dropping(epochs, shape, drop_remainder=call.drop_remainder)
    check_epochs_aligned(
        epochs,
        repeat=call.repeat,
        source_kind=facts.kind,
        infinite=facts.infinite,
        distributed_epoch=call.service is not None and call.service.mode == "distributed_epoch",
    )
    diagnosis = BuildFacts(
        plan,
        facts,
        epochs,
        shape,
        shuffling=call.shuffle_buffer_size is not None,
        seed=call.seed,
        repeat=call.repeat,
        drop_remainder=call.drop_remainder,
    )
    _log(diagnose(diagnosis))
    return _Planned(source, facts, plan, epochs, shape, elements, worker_index)


def _build_call(
    call: BuilderCall, planned: _Planned, *, raw_source: Any, map_fn: Callable[..., Any] | None
) -> Any:
    """The pipeline, inside the strategy (through the tf.data service when asked)."""
    recipe = _recipe(call, planned, map_fn)
    if call.service is None:
        return _distribute(call.strategy, recipe, planned.source, call.input_options)
    # Arrays stay arrays for the service, which splits each trainer's share itself.
    return distribute_with_service(
        call.strategy, recipe, planned.source, raw_source, call.input_options, call.service
    )


def _recipe(call: BuilderCall, planned: _Planned, map_fn: Callable[..., Any] | None) -> Recipe:
    shuffling = call.shuffle_buffer_size is not None
    return Recipe(
        planned.plan,
        planned.shape,
        planned.epochs,
        map_fn=map_fn,
        reader=call.reader,
        shuffle_buffer_size=call.shuffle_buffer_size,
        seed=shuffle_seed(planned.plan, call.seed, shuffling=shuffling),
        repeat=bool(call.repeat),
        cache=call.cache,
        drop_remainder=call.drop_remainder,
        prefetch=call.prefetch,
        data_options=call.data_options,
    )


def _resumable(
    call: BuilderCall, planned: _Planned, map_fn: Callable[..., Any] | None, info: DatasetInfo
) -> Resumable | None:
    """How to rebuild the dataset from a step of an epoch (``PreemptionCheckpoint``), or None
    where its epochs cannot be aligned (unknown size, sparse or ragged elements)."""
    try:
        dense = planned.elements.check(
            planned.plan, planned.worker_index, "epochs", call.drop_remainder, planned.shape
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
    recipe = _recipe(call, planned, map_fn)
    return resumable(
        call.strategy, recipe, planned.source, call.input_options, aligned, planned.shape, info
    )


def _function_batches(
    strategy: Any,
    source: Callable[[Any], Any],
    elements: element_kinds.SourceElements,
    arguments: dict[str, Any],
) -> Any:
    """A ``fn(input_context)`` source that batches itself: its batches go to the replicas."""
    self_batched.check_function_options(arguments)
    replicas = int(strategy.num_replicas_in_sync)
    per_replica = self_batched.function_batch_size(
        elements,
        global_batch_size=arguments["global_batch_size"],
        per_replica_batch_size=arguments["per_replica_batch_size"],
        replicas=replicas,
    )
    data_options, input_options = split_options(arguments["options"])
    position = position_of(strategy)
    dist, info, plan, findings = self_batched.distribute_function_batches(
        strategy,
        source,
        elements,
        per_replica=per_replica,
        num_workers=position.num_workers,
        worker_index=position.index,
        shard_policy=arguments["shard_policy"],
        repeat=check_repeat(arguments["repeat"]),
        prefetch=boolean(arguments["prefetch"], "prefetch"),
        data_options=data_options,
        input_options=input_options,
    )
    _log(findings)
    return single_device.remember(
        attach(dist, info, plan), arguments, self_batching=True, rebuild=build_distributed_dataset
    )


def _check_not_empty_by_dropping(epochs: Any, shape: StepShape, *, drop_remainder: bool) -> None:
    """A clear error when drop_remainder leaves no step at all (fit would see no data)."""
    layout = epochs.layout
    if not drop_remainder or layout is None or layout.steps > 0 or layout.dropped == 0:
        return
    raise ValueError(
        f"drop_remainder=True drops every example: {layout.dropped} examples per epoch do not "
        f"fill one step of {shape.global_batch_size} examples "
        f"({shape.per_replica_batch_size} on each of {shape.num_replicas_in_sync} replicas), "
        "so the dataset would yield no step and fit would stop at once. Pass "
        "drop_remainder=False (the last step is partial), or a smaller global_batch_size."
    )


def _log(findings: Sequence[Finding]) -> None:
    for finding in findings:
        logger.log(finding.level, "tfdp_utils: %s", finding.message)


def _distribute(strategy: Any, recipe: Recipe, source: Any, input_options: Any) -> Any:
    """The distributed dataset: tf.data's own autoshard for FILE/HINT on a Dataset."""
    plan = recipe.plan
    if plan.source_kind == "dataset" and plan.policy in ("file", "hint"):
        return strategy.experimental_distribute_dataset(
            global_dataset(recipe, source), options=input_options
        )
    return strategy.distribute_datasets_from_function(
        lambda context: per_worker_dataset(recipe, source, context), options=input_options
    )


plan_sharding.__module__ = "tfdp_utils"  # public home (tfdp_utils._public)
build_distributed_dataset.__module__ = "tfdp_utils"  # public home (tfdp_utils._public)
