"""Global <-> per-replica batch sizes, learning-rate scaling and steps per epoch.

In data-parallel training every step consumes one *global* batch, split evenly over the
``num_replicas_in_sync`` replicas of the strategy (over all workers). A dataset handed to
``strategy.experimental_distribute_dataset`` is batched with the global size; the loss is
averaged over the global batch; the learning rate scales with the global batch.

The arithmetic here is plain Python; ``strategy=None`` means the strategy in scope
(``tf.distribute.get_strategy()``), so the helpers work inside ``strategy.scope()``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from tfdp_utils._tf import tf
from tfdp_utils._validate import boolean, positive_float, positive_int
from tfdp_utils._validate import strategy as check_strategy

ScalingRule = Literal["linear", "sqrt", "none"]
SCALING_RULES: tuple[str, ...] = ("linear", "sqrt", "none")


def _strategy_name(strategy: Any) -> str:
    name = type(strategy).__name__
    if name.startswith("_Default"):
        return "the default strategy (no strategy in scope)"
    return name


def check_size(value: Any, name: str, *, minimum: int = 1) -> int:
    """``value`` as an ``int`` >= ``minimum``, else a clear error (``_validate.positive_int``)."""
    return positive_int(value, name, minimum=minimum)


def num_replicas_in_sync(strategy: Any = None) -> int:
    """The number of replicas that share each global batch, over all workers.

    Args:
        strategy: a ``tf.distribute.Strategy``. Defaults to `None` (the strategy in scope,
            ``tf.distribute.get_strategy()``; 1 outside any scope).

    Returns:
        ``strategy.num_replicas_in_sync``.

    Examples:
        >>> import tfdp_utils as tdu
        >>> tdu.num_replicas_in_sync()  # no strategy in scope
        1
    """
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    return int(check_strategy(strategy).num_replicas_in_sync)


def global_batch_size(per_replica_batch_size: int, *, strategy: Any = None) -> int:
    """The global batch size for ``per_replica_batch_size`` examples on each replica.

    Batch the dataset you give ``strategy.experimental_distribute_dataset`` (or Keras
    ``fit``) with this size: each replica then receives ``per_replica_batch_size`` examples.

    Args:
        per_replica_batch_size: examples each replica processes per step.
        strategy: a ``tf.distribute.Strategy``. Defaults to `None` (the strategy in scope).

    Returns:
        ``per_replica_batch_size * strategy.num_replicas_in_sync``.

    Raises:
        TypeError: ``per_replica_batch_size`` is not an integer.
        ValueError: ``per_replica_batch_size`` is not positive.

    Examples:
        >>> import tensorflow as tf
        >>> import tfdp_utils as tdu
        >>> strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        >>> tdu.global_batch_size(32, strategy=strategy)
        32
    """
    size = check_size(per_replica_batch_size, "per_replica_batch_size")
    return size * num_replicas_in_sync(strategy)


def split_batch_size(global_batch_size: int, num_replicas: int, *, where: str = "") -> int:
    """The per-replica share of ``global_batch_size`` over ``num_replicas`` replicas. Pure.

    Args:
        global_batch_size: examples per step over all replicas.
        num_replicas: replicas in sync.
        where: who the replicas belong to, for the error message (e.g. ``" of
            MirroredStrategy"``). Defaults to `""`.

    Returns:
        ``global_batch_size // num_replicas``.

    Raises:
        TypeError: a size is not an integer.
        ValueError: a size is not positive, ``global_batch_size`` is smaller than
            ``num_replicas``, or not divisible by it. The message names the nearest valid sizes.
    """
    size = check_size(global_batch_size, "global_batch_size")
    replicas = check_size(num_replicas, "num_replicas")
    if size < replicas:
        raise ValueError(
            f"global_batch_size={size} is smaller than the {replicas} replicas in sync{where}: "
            f"every replica needs at least one example per step. Use a multiple of {replicas} "
            f"(e.g. {replicas} or {2 * replicas}), or compute it with "
            "global_batch_size(per_replica_batch_size)."
        )
    share, remainder = divmod(size, replicas)
    if remainder:
        lower, upper = share * replicas, (share + 1) * replicas
        raise ValueError(
            f"global_batch_size={size} is not divisible by the {replicas} replicas in sync"
            f"{where}. Use a multiple of {replicas} (e.g. {lower} or {upper}), or compute it "
            f"from the per-replica size: global_batch_size(per_replica_batch_size={share}) "
            f"gives {lower}."
        )
    return share


def per_replica_batch_size(global_batch_size: int, *, strategy: Any = None) -> int:
    """The examples each replica receives from a global batch of ``global_batch_size``.

    Args:
        global_batch_size: examples per step over all replicas (and all workers).
        strategy: a ``tf.distribute.Strategy``. Defaults to `None` (the strategy in scope).

    Returns:
        ``global_batch_size // strategy.num_replicas_in_sync``.

    Raises:
        TypeError: ``global_batch_size`` is not an integer.
        ValueError: ``global_batch_size`` is not positive, is smaller than the number of
            replicas, or is not divisible by it; the message names the nearest valid sizes.

    Examples:
        >>> import tensorflow as tf
        >>> import tfdp_utils as tdu
        >>> strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        >>> tdu.per_replica_batch_size(64, strategy=strategy)
        64
    """
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    where = f" of {_strategy_name(strategy)}"
    return split_batch_size(global_batch_size, num_replicas_in_sync(strategy), where=where)


def scale_learning_rate(
    base_learning_rate: float,
    *,
    base_batch_size: int,
    global_batch_size: int,
    rule: ScalingRule = "linear",
) -> float:
    """Scale a learning rate tuned at ``base_batch_size`` to ``global_batch_size``.

    ``"linear"`` is the linear scaling rule of Goyal et al. 2017 ("Accurate, Large Minibatch
    SGD", arXiv:1706.02677): multiply the batch by k, multiply the learning rate by k. Pair
    it with a gradual warm-up (:class:`WarmupSchedule`) for large k. ``"sqrt"`` multiplies
    by sqrt(k), the rule often used with Adam-type optimizers; ``"none"`` keeps the rate.

    Args:
        base_learning_rate: the learning rate that works at ``base_batch_size``.
        base_batch_size: the (global) batch size ``base_learning_rate`` was tuned for.
        global_batch_size: the global batch size you train with now.
        rule: ``"linear"``, ``"sqrt"`` or ``"none"``. Defaults to `"linear"`.

    Returns:
        The scaled learning rate, a Python float.

    Raises:
        TypeError: a size is not an integer or the rate is not a number.
        ValueError: a size or the rate is not positive, or ``rule`` is unknown.

    Examples:
        >>> import tfdp_utils as tdu
        >>> tdu.scale_learning_rate(0.1, base_batch_size=256, global_batch_size=1024)
        0.4
    """
    rate = positive_float(base_learning_rate, "base_learning_rate")
    base = check_size(base_batch_size, "base_batch_size")
    size = check_size(global_batch_size, "global_batch_size")
    if rule == "linear":
        return rate * size / base
    if rule == "sqrt":
        return rate * math.sqrt(size / base)
    if rule == "none":
        return rate
    raise ValueError(
        f"rule={rule!r} is not a learning-rate scaling rule; expected one of "
        f"{', '.join(repr(r) for r in SCALING_RULES)}."
    )


def steps_per_epoch(
    num_examples: int, global_batch_size: int, *, drop_remainder: bool = False
) -> int:
    """Steps in one pass over ``num_examples`` examples batched by ``global_batch_size``.

    This is the number of batches ``dataset.batch(global_batch_size, drop_remainder=...)``
    yields, i.e. the ``steps_per_epoch`` to pass to ``fit`` for a repeated dataset.

    Args:
        num_examples: examples in one epoch, over all workers (may be 0).
        global_batch_size: examples per step over all replicas.
        drop_remainder: whether the last partial batch is dropped. Defaults to `False`.

    Returns:
        ``ceil(num_examples / global_batch_size)``, or the floor with ``drop_remainder=True``.

    Raises:
        TypeError: a size is not an integer.
        ValueError: ``num_examples`` is negative or ``global_batch_size`` is not positive.

    Examples:
        >>> import tfdp_utils as tdu
        >>> tdu.steps_per_epoch(1000, 64), tdu.steps_per_epoch(1000, 64, drop_remainder=True)
        (16, 15)
    """
    examples = check_size(num_examples, "num_examples", minimum=0)
    size = check_size(global_batch_size, "global_batch_size")
    drop_remainder = boolean(drop_remainder, "drop_remainder")
    if drop_remainder:
        return examples // size
    return -(-examples // size)


__all__ = [
    "SCALING_RULES",
    "ScalingRule",
    "check_size",
    "global_batch_size",
    "num_replicas_in_sync",
    "per_replica_batch_size",
    "scale_learning_rate",
    "split_batch_size",
    "steps_per_epoch",
]
