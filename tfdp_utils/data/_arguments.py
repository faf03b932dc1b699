"""The builder's arguments, checked where they enter: one message form (received, expected, fix).

:func:`validate_call` checks everything that needs no look at the source and returns the whole
call as one :class:`BuilderCall`, which the later phases receive instead of the arguments; the
batch size, ``map_fn`` and the strategy in scope have their own checks here, used once the
source is known.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, cast

from tfdp_utils import _dataset_info as dataset_info
from tfdp_utils._tf import tf
from tfdp_utils._validate import boolean, positive_int
from tfdp_utils._validate import strategy as check_strategy
from tfdp_utils.batching import split_batch_size
from tfdp_utils.data._elements import check_element
from tfdp_utils.data._epochs import Repeat, check_repeat
from tfdp_utils.data._sharding import check_policy
from tfdp_utils.data.service._modes import ServiceConfig, check_service

logger = logging.getLogger("tfdp_utils")


def strategy_or_default(strategy: Any, caller: str | None = "build_distributed_dataset") -> Any:
    """``strategy``, or the strategy in scope; warns when that is the default one by mistake.

    ``caller`` names the function in the warning; None does not warn.
    """
    if strategy is not None:
        return strategy
    resolved = tf.distribute.get_strategy()
    if caller is None or tf.distribute.has_strategy():
        return resolved
    built = dataset_info.last_strategy()
    replicas = int(getattr(built, "num_replicas_in_sync", 1)) if built is not None else 1
    if replicas > 1:
        logger.warning(
            "tfdp_utils: %s(strategy=None) outside any strategy scope uses TensorFlow's "
            "default strategy (1 replica), but auto_strategy() built %s with %d replicas in "
            "this process: the data will not be split over those replicas. Pass "
            "strategy=strategy, or call %s inside `with strategy.scope():`.",
            caller,
            type(built).__name__,
            replicas,
            caller,
        )
    return resolved


def per_replica_size(
    global_batch_size: int | None, per_replica_batch_size: int | None, replicas: int, strategy: Any
) -> int:
    if (global_batch_size is None) == (per_replica_batch_size is None):
        got = "both" if global_batch_size is not None else "neither"
        raise ValueError(
            f"pass exactly one of global_batch_size and per_replica_batch_size, but received "
            f"{got} (global_batch_size={global_batch_size!r}, "
            f"per_replica_batch_size={per_replica_batch_size!r}). The global size is split "
            f"over the {replicas} replica(s) in sync; e.g. global_batch_size={32 * replicas} or "
            "per_replica_batch_size=32."
        )
    if per_replica_batch_size is not None:
        return positive_int(per_replica_batch_size, "per_replica_batch_size")
    where = f" of {type(strategy).__name__}"
    return split_batch_size(cast(int, global_batch_size), replicas, where=where)


def split_options(options: Any) -> tuple[Any, Any]:
    """``(tf.data.Options or None, tf.distribute.InputOptions or None)`` from ``options``."""
    if options is None:
        return None, None
    if isinstance(options, tf.data.Options):
        return options, None
    if isinstance(options, tf.distribute.InputOptions):
        return None, options
    raise TypeError(
        f"options of type {type(options).__name__} is not supported; pass a tf.data.Options "
        "or a tf.distribute.InputOptions."
    )


def check_map_fn(map_fn: Any, element_spec: Any) -> None:
    if map_fn is None:
        return
    if not callable(map_fn):
        raise TypeError(f"map_fn={map_fn!r} is not callable; pass a function of one element.")
    arity = len(element_spec) if isinstance(element_spec, tuple) else 1
    try:
        signature = inspect.signature(map_fn)
    except (TypeError, ValueError):  # builtins and some C callables have none
        return
    try:
        signature.bind(*([None] * arity))
    except TypeError:
        structure = (
            f"a tuple of {arity} components, which tf.data passes as {arity} arguments"
            if isinstance(element_spec, tuple)
            else f"a single {'dict' if isinstance(element_spec, Mapping) else 'value'}, "
            "passed as one argument"
        )
        raise ValueError(
            f"map_fn{signature} cannot take the dataset's elements: each element is "
            f"{structure}. Change map_fn to accept {arity} positional argument(s)."
        ) from None


@dataclasses.dataclass(frozen=True)
class BuilderCall:
    """One call of :func:`~tfdp_utils.build_distributed_dataset`: every argument, checked
    where it can be without a look at the source (:func:`validate_call`, once at entry), and
    passed down whole.

    Attributes:
        source: the source as given.
        strategy: the strategy that trains (the one in scope for ``strategy=None``).
        global_batch_size: as given; checked once the source's batches are known.
        per_replica_batch_size: as given; checked with ``global_batch_size``.
        shard_policy: as given (a known policy; the planner reads its spelling).
        map_fn: as given; checked against the elements once they are known.
        reader: ``path -> tf.data.Dataset`` (``tf.data.TFRecordDataset`` for None).
        shuffle_buffer_size: a positive buffer size, or None (no shuffle).
        seed: a seed >= 0, or None.
        repeat: ``False``, ``True`` or ``"epochs"``.
        cache: True (in memory), False, or a file prefix.
        drop_remainder: whether to drop the examples that do not fill a step.
        prefetch: whether to prefetch with AUTOTUNE.
        data_options: the ``tf.data.Options`` given as ``options``, or None.
        input_options: the ``tf.distribute.InputOptions`` given as ``options``, or None.
        count_examples: whether to count the examples of file sources.
        service: the tf.data service (from ``service``, ``service_mode`` and
            ``service_timeout``), or None.
        element: ``"example"``, ``"batch"`` or ``"auto"``.
        example_options: the options given that act on single examples, as
            ``(argument name, value as given)``, in the order a source function that batches
            itself refuses them.
    """

    source: Any
    strategy: Any
    global_batch_size: int | None
    per_replica_batch_size: int | None
    shard_policy: str
    map_fn: Callable[..., Any] | None
    reader: Callable[[Any], Any]
    shuffle_buffer_size: int | None
    seed: int | None
    repeat: Repeat
    cache: bool | str
    drop_remainder: bool
    prefetch: bool
    data_options: Any
    input_options: Any
    count_examples: bool
    service: ServiceConfig | None
    element: str
    example_options: tuple[tuple[str, Any], ...] = ()

    @property
    def distributed_epoch(self) -> bool:
        """Whether the tf.data service hands out the epoch's batches dynamically."""
        return self.service is not None and self.service.mode == "distributed_epoch"


def validate_call(
    source: Any,
    *,
    strategy: Any,
    global_batch_size: Any,
    per_replica_batch_size: Any,
    shard_policy: Any,
    map_fn: Any,
    reader: Any,
    shuffle_buffer_size: Any,
    seed: Any,
    repeat: Any,
    cache: Any,
    drop_remainder: Any,
    prefetch: Any,
    options: Any,
    count_examples: Any,
    service: Any,
    service_mode: Any,
    service_timeout: Any,
    element: Any,
) -> BuilderCall:
    """The builder's arguments as one :class:`BuilderCall`: every argument that needs no look
    at the source is checked here, raising with the fix."""
    if strategy is not None:
        check_strategy(strategy)
    if seed is not None:
        seed = positive_int(seed, "seed", minimum=0, hint="Pass an integer seed such as 42.")
    checked_buffer = shuffle_buffer_size
    if shuffle_buffer_size is not None:
        checked_buffer = positive_int(shuffle_buffer_size, "shuffle_buffer_size")
    config = check_service(service, service_mode, service_timeout)
    check_policy(shard_policy)
    data_options, input_options = split_options(options)
    resolved = strategy_or_default(strategy)
    checked_cache = check_cache(cache)
    checked_drop = boolean(drop_remainder, "drop_remainder")
    checked_prefetch = boolean(prefetch, "prefetch")
    checked_count = boolean(count_examples, "count_examples")
    checked_reader = check_reader(reader)
    checked_repeat = check_repeat(repeat)
    given = (
        ("map_fn", map_fn),
        ("shuffle_buffer_size", shuffle_buffer_size),
        ("cache", cache),
        ("drop_remainder", drop_remainder),
    )
    return BuilderCall(
        source=source,
        strategy=resolved,
        global_batch_size=global_batch_size,
        per_replica_batch_size=per_replica_batch_size,
        shard_policy=shard_policy,
        map_fn=map_fn,
        reader=checked_reader,
        shuffle_buffer_size=checked_buffer,
        seed=seed,
        repeat=checked_repeat,
        cache=checked_cache,
        drop_remainder=checked_drop,
        prefetch=checked_prefetch,
        data_options=data_options,
        input_options=input_options,
        count_examples=checked_count,
        service=config,
        element=check_element(element),
        example_options=tuple(
            (name, value) for name, value in given if value is not None and value is not False
        ),
    )


def check_cache(cache: Any) -> bool | str:
    """``cache`` as True/False (memory or none) or a file prefix; a path-like is a prefix."""
    if isinstance(cache, bool) or type(cache).__name__ == "bool_":
        return bool(cache)
    if isinstance(cache, os.PathLike):
        cache = os.fspath(cache)
    if isinstance(cache, str) and cache:
        return cache
    raise TypeError(
        f"cache must be True (cache in memory), False (no cache) or a file prefix (a non-empty "
        f"str or pathlib.Path), but received {cache!r} of type {type(cache).__name__}. Pass "
        "cache=True to cache in memory, or cache='/path/to/prefix' to cache in files."
    )


def check_reader(reader: Any) -> Callable[[Any], Any]:
    """``reader``, or ``tf.data.TFRecordDataset`` for None; a clear error if not callable."""
    if reader is None:
        return cast(Callable[[Any], Any], tf.data.TFRecordDataset)
    if callable(reader):
        return cast(Callable[[Any], Any], reader)
    raise TypeError(
        f"reader must be a function path -> tf.data.Dataset, but received {reader!r} of type "
        f"{type(reader).__name__}. Pass the class or function itself, e.g. "
        "reader=tf.data.TextLineDataset (not a string), or reader=None for TFRecord files."
    )
