"""Global <-> per-replica batch sizes, learning-rate scaling and steps per epoch.

In data-parallel training every step consumes one *global* batch, split evenly over the
``num_replicas_in_sync`` replicas of the strategy (over all workers). A dataset handed to
``strategy.experimental_distribute_dataset`` is batched with the global size; the loss is
averaged over the global batch; the learning rate scales with the global batch.

The arithmetic here is plain Python; ``strategy=None`` means the strategy in scope
(``tf.distribute.get_strategy()``), so the helpers work inside ``strategy.scope()``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Literal

from tfdp_utils._tf import tf
from tfdp_utils._validate import boolean, positive_float, positive_int
from tfdp_utils._validate import strategy as check_strategy

if TYPE_CHECKING:
    from tfdp_utils.schedules import WarmupSchedule

ScalingRule = Literal["linear", "sqrt", "none"]
SCALING_RULES: tuple[str, ...] = ("linear", "sqrt", "none")


def _strategy_name(strategy: Any) -> str:
    name = type(strategy).__name__
    if name.startswith("_Default"):
        return "the default strategy (no strategy in scope)"
    return name


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
    size = positive_int(per_replica_batch_size, "per_replica_batch_size")
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
    size = positive_int(global_batch_size, "global_batch_size")
    replicas = positive_int(num_replicas, "num_replicas")
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
    base = positive_int(base_batch_size, "base_batch_size")
    size = positive_int(global_batch_size, "global_batch_size")
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
    examples = positive_int(num_examples, "num_examples", minimum=0)
    size = positive_int(global_batch_size, "global_batch_size")
    drop_remainder = boolean(drop_remainder, "drop_remainder")
    if drop_remainder:
        return examples // size
    return -(-examples // size)


# --- reaching a large global batch ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GlobalBatchPlan:
    """How to reach a global batch: per-replica batch x replicas x accumulation steps.

    Attributes:
        target_global_batch_size: the global batch asked for (examples per optimizer update).
        num_replicas: replicas in sync of the strategy the plan is for.
        per_replica_batch_size: examples each replica processes per micro-step.
        accumulation_steps: micro-steps whose gradients make one optimizer update (1: none).
        global_batch_size: examples per micro-step over all replicas; batch the dataset with
            this (``per_replica_batch_size * num_replicas``).
        effective_global_batch_size: examples per optimizer update
            (``global_batch_size * accumulation_steps``), equal to the target.
        learning_rate: the learning rate scaled to ``effective_global_batch_size``, or None
            when no ``base_learning_rate`` was given.
        rule: the learning-rate scaling rule used.
        warmup_steps: optimizer updates the warm-up lasts, or None without a warm-up.
        warmup_schedule: a :class:`WarmupSchedule` from ``base_learning_rate`` to
            ``learning_rate`` over ``warmup_steps``, or None. It counts optimizer updates, as
            the custom step's optimizer and tf_keras with
            :func:`tfdp_utils.enable_gradient_accumulation` do. A Keras 3 optimizer with
            ``gradient_accumulation_steps`` gives its schedule micro-steps: build it with
            ``warmup_steps * accumulation_steps`` there (docs/batching.md).
    """

    target_global_batch_size: int
    num_replicas: int
    per_replica_batch_size: int
    accumulation_steps: int
    global_batch_size: int
    effective_global_batch_size: int
    learning_rate: float | None = None
    rule: ScalingRule = "linear"
    warmup_steps: int | None = None
    warmup_schedule: WarmupSchedule | None = None


def split_with_accumulation(target: int, num_replicas: int, max_per_replica: int) -> int | None:
    """The fewest accumulation steps k with ``target == p * num_replicas * k``, ``p <= max``.

    Pure. Fewest steps means the largest per-replica batch that fits, so the fewest
    micro-steps per update. None when ``target`` is not a multiple of ``num_replicas``.
    """
    per_replica_total, remainder = divmod(target, num_replicas)
    if remainder or per_replica_total == 0:
        return None
    for steps in range(-(-per_replica_total // max_per_replica), per_replica_total + 1):
        if per_replica_total % steps == 0:
            return steps
    return None  # pragma: no cover - steps == per_replica_total always divides


def _describe(size: int, num_replicas: int, max_per_replica: int) -> str:
    steps = split_with_accumulation(size, num_replicas, max_per_replica)
    assert steps is not None  # only called with multiples of num_replicas
    per_replica = size // (num_replicas * steps)
    return f"{size} ({per_replica} per replica x {num_replicas} replicas x {steps} steps)"


def _unreachable(target: int, num_replicas: int, max_per_replica: int, where: str) -> ValueError:
    lower = (target // num_replicas) * num_replicas
    upper = lower + num_replicas
    options = [s for s in (lower, upper) if s > 0]
    nearest = " or ".join(_describe(s, num_replicas, max_per_replica) for s in options)
    filled = num_replicas * max_per_replica
    return ValueError(
        f"target_global_batch_size={target} cannot be reached exactly with the "
        f"{num_replicas} replicas in sync{where}: every optimizer update sums the same number "
        f"of examples on each replica, so it must be a multiple of {num_replicas}. The nearest "
        f"reachable sizes are {nearest}; a multiple of {filled} (e.g. "
        f"{max(1, round(target / filled)) * filled}) fills every replica's "
        f"max_per_replica_batch_size={max_per_replica}."
    )


def _warmup(
    learning_rate: float | None,
    base_learning_rate: float | None,
    warmup_epochs: Any,
    updates_per_epoch: Any,
) -> tuple[int | None, WarmupSchedule | None]:
    if warmup_epochs is None:
        if updates_per_epoch is not None:
            positive_int(updates_per_epoch, "steps_per_epoch")
        return None, None
    epochs = positive_float(warmup_epochs, "warmup_epochs", unit="number of epochs")
    if learning_rate is None or base_learning_rate is None:
        raise ValueError(
            f"warmup_epochs={warmup_epochs!r} needs the learning rate to warm up to, but "
            "received base_learning_rate=None. Pass base_learning_rate= (the rate tuned at "
            "base_batch_size), e.g. base_learning_rate=0.1, base_batch_size=256."
        )
    if updates_per_epoch is None:
        raise ValueError(
            f"warmup_epochs={warmup_epochs!r} needs the optimizer updates per epoch, but "
            "received steps_per_epoch=None. Pass steps_per_epoch=tdu.steps_per_epoch("
            "num_examples, plan.effective_global_batch_size) (one step is one update)."
        )
    updates = positive_int(updates_per_epoch, "steps_per_epoch")
    from tfdp_utils.schedules import WarmupSchedule

    steps = max(1, round(epochs * updates))
    schedule = WarmupSchedule(learning_rate, steps, initial_learning_rate=base_learning_rate)
    return steps, schedule


def plan_global_batch(
    target_global_batch_size: int,
    *,
    strategy: Any = None,
    max_per_replica_batch_size: int,
    base_learning_rate: float | None = None,
    base_batch_size: int = 256,
    rule: ScalingRule = "linear",
    warmup_epochs: float | None = None,
    steps_per_epoch: int | None = None,
) -> GlobalBatchPlan:
    """Plan how to reach ``target_global_batch_size`` with the replicas you have.

    Each optimizer update sums the gradients of ``accumulation_steps`` micro-steps, each of
    ``per_replica_batch_size`` examples on every replica. The plan takes the fewest
    accumulation steps whose per-replica batch fits ``max_per_replica_batch_size`` and
    reaches the target exactly, scales the learning rate to it and, when asked, builds the
    warm-up (Goyal et al. 2017: linear scaling, 5 epochs of linear warm-up from the base rate).

    Args:
        target_global_batch_size: examples per optimizer update, over all replicas.
        strategy: a ``tf.distribute.Strategy``. Defaults to `None` (the strategy in scope).
        max_per_replica_batch_size: the most examples one replica fits in memory per step.
        base_learning_rate: the learning rate tuned at ``base_batch_size``. Defaults to
            `None` (no learning rate in the plan).
        base_batch_size: the global batch ``base_learning_rate`` was tuned at. Defaults to
            `256`.
        rule: ``"linear"``, ``"sqrt"`` or ``"none"`` (:func:`scale_learning_rate`). Defaults
            to `"linear"`.
        warmup_epochs: epochs of linear warm-up from ``base_learning_rate`` to the scaled
            rate. Defaults to `None` (no warm-up).
        steps_per_epoch: optimizer updates per epoch, needed with ``warmup_epochs``
            (``tdu.steps_per_epoch(num_examples, target_global_batch_size)``). Defaults to
            `None`.

    Returns:
        A frozen :class:`GlobalBatchPlan`.

    Raises:
        TypeError: a size is not an integer or a rate is not a number.
        ValueError: the target cannot be reached exactly (not a multiple of the replicas in
            sync; the message names the nearest sizes that can), a size or rate is not
            positive, or a warm-up lacks ``base_learning_rate`` or ``steps_per_epoch``.

    Examples:
        >>> import tensorflow as tf
        >>> import tfdp_utils as tdu
        >>> strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        >>> plan = tdu.plan_global_batch(
        ...     8192, strategy=strategy, max_per_replica_batch_size=512, base_learning_rate=0.1)
        >>> plan.per_replica_batch_size, plan.accumulation_steps, plan.learning_rate
        (512, 16, 3.2)
    """
    target = positive_int(target_global_batch_size, "target_global_batch_size")
    max_per_replica = positive_int(max_per_replica_batch_size, "max_per_replica_batch_size")
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    replicas = num_replicas_in_sync(strategy)
    steps = split_with_accumulation(target, replicas, max_per_replica)
    if steps is None:
        raise _unreachable(target, replicas, max_per_replica, f" of {_strategy_name(strategy)}")
    per_replica = target // (replicas * steps)
    learning_rate = None
    if base_learning_rate is not None:
        learning_rate = scale_learning_rate(
            base_learning_rate, base_batch_size=base_batch_size, global_batch_size=target, rule=rule
        )
    elif rule not in SCALING_RULES:
        scale_learning_rate(1.0, base_batch_size=1, global_batch_size=1, rule=rule)  # its error
    warmup_steps, schedule = _warmup(
        learning_rate, base_learning_rate, warmup_epochs, steps_per_epoch
    )
    return GlobalBatchPlan(
        target_global_batch_size=target,
        num_replicas=replicas,
        per_replica_batch_size=per_replica,
        accumulation_steps=steps,
        global_batch_size=per_replica * replicas,
        effective_global_batch_size=per_replica * replicas * steps,
        learning_rate=learning_rate,
        rule=rule,
        warmup_steps=warmup_steps,
        warmup_schedule=schedule,
    )


__all__ = [
    "SCALING_RULES",
    "GlobalBatchPlan",
    "ScalingRule",
    "global_batch_size",
    "num_replicas_in_sync",
    "per_replica_batch_size",
    "plan_global_batch",
    "scale_learning_rate",
    "split_batch_size",
    "split_with_accumulation",
    "steps_per_epoch",
]
