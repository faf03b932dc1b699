"""The builder's arguments, checked where they enter: one message form (received, expected, fix).

:func:`validate_call` checks everything that needs no look at the source and returns it as a
:class:`BuilderCall`; the batch size, ``map_fn`` and the strategy in scope have their own
checks here, used once the source is known.
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
from tfdp_utils.data._epochs import Repeat, check_repeat
from tfdp_utils.data._sharding import check_policy
from tfdp_utils.data.service._modes import check_service

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
    """The builder's arguments once checked (everything the later phases read)."""

    strategy: Any
    seed: int | None
    cache: bool | str
    drop_remainder: bool
    prefetch: bool
    count_examples: bool
    service: Any
    shuffle_buffer_size: int | None
    data_options: Any
    input_options: Any
    reader: Callable[[Any], Any]
    repeat: Repeat


def validate_call(arguments: Mapping[str, Any]) -> BuilderCall:
    """Check every argument that needs no look at the source; raise with the fix."""
    strategy = arguments["strategy"]
    if strategy is not None:
        check_strategy(strategy)
    seed = arguments["seed"]
    if seed is not None:
        seed = positive_int(seed, "seed", minimum=0, hint="Pass an integer seed such as 42.")
    shuffle_buffer_size = arguments["shuffle_buffer_size"]
    if shuffle_buffer_size is not None:
        shuffle_buffer_size = positive_int(shuffle_buffer_size, "shuffle_buffer_size")
    service = check_service(
        arguments["service"], arguments["service_mode"], arguments["service_timeout"]
    )
    check_policy(arguments["shard_policy"])
    data_options, input_options = split_options(arguments["options"])
    return BuilderCall(
        strategy=strategy_or_default(strategy),
        seed=seed,
        cache=check_cache(arguments["cache"]),
        drop_remainder=boolean(arguments["drop_remainder"], "drop_remainder"),
        prefetch=boolean(arguments["prefetch"], "prefetch"),
        count_examples=boolean(arguments["count_examples"], "count_examples"),
        service=service,
        shuffle_buffer_size=shuffle_buffer_size,
        data_options=data_options,
        input_options=input_options,
        reader=check_reader(arguments["reader"]),
        repeat=check_repeat(arguments["repeat"]),
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
