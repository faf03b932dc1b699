"""Keras 3's ``LossScaleOptimizer`` decides "skip the step?" from the first replica only.

Under MirroredStrategy and MultiWorkerMirroredStrategy, ``LossScaleOptimizer._tf_apply``
checks the gradients for inf/NaN on every replica, then takes the first replica's verdict
("each replica computed the same value, since grads is all-reduced" — but the gradients are
all-reduced later, inside the inner optimizer's update). When another replica's gradients
overflow (its own batch, the float16 loss scale), the step is applied: the all-reduced
gradient is inf or NaN and every weight becomes NaN, while the loss scale is never lowered.
Measured on Keras 3.15.1: ``mixed_float16`` on 2 replicas of a builder dataset of unknown size
(a replica's last batch of the epoch differs) ends with NaN weights after one epoch; 1 replica,
or tf_keras, trains.

The workaround keeps Keras' decision in the cross-replica context and makes it over every
replica of every worker: the count of replicas whose gradients are not finite is summed
(``strategy.reduce``, an all-reduce across workers), and the step is applied only when it is
0, as tf_keras' ``LossScaleOptimizer`` does. It acts only under a Mirrored strategy with two or
more replicas in sync; every other call runs Keras' code unchanged.

Verified on Keras 3.15.1 (TensorFlow 2.21).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from tfdp_utils._tf import tf
from tfdp_utils.compat._registry import (
    Patch,
    Workaround,
    is_mirrored_family,
    replace_method,
    source_shows,
)

ISSUE = "keras-lso-replicas"


def loss_scale_optimizer_class(trainer: ModuleType) -> Any | None:
    """Keras 3's ``LossScaleOptimizer`` (already imported by Keras itself), or None."""
    del trainer
    module = sys.modules.get("keras.src.optimizers.loss_scale_optimizer")
    return getattr(module, "LossScaleOptimizer", None)


def first_replica_decides(source: str) -> bool:
    """True when ``_tf_apply``'s source takes the finiteness of the first local replica."""
    return "experimental_local_results" in source and "[0]" in source and "reduce(" not in source


def probe(trainer: ModuleType) -> bool:
    """True when Keras' ``LossScaleOptimizer._tf_apply`` lets the first replica decide."""
    cls = loss_scale_optimizer_class(trainer)
    return source_shows(getattr(cls, "_tf_apply", None), first_replica_decides)


def affected() -> bool:
    """Whether this call runs in a replica context of a Mirrored strategy of 2+ replicas."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return False
    strategy = tf.distribute.get_strategy()
    return is_mirrored_family(strategy) and int(strategy.num_replicas_in_sync) >= 2


def _apply_if_all_finite(optimizer: Any, grads: list[Any], variables: Any) -> None:
    def not_finite(grads: list[Any]) -> Any:
        return tf.cast(tf.logical_not(optimizer.check_finite(grads)), tf.float32)

    def cross_replica(distribution: Any, grads: list[Any], variables: Any) -> None:
        per_replica = distribution.extended.call_for_each_replica(not_finite, args=(grads,))
        # Every replica of every worker: one non-finite gradient skips the step everywhere.
        failing = distribution.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        def apply_fn() -> None:
            distribution.extended.call_for_each_replica(
                optimizer._stateful_handle_finite_grads, args=(grads, variables)
            )

        # As Keras: the cond in the cross-replica context, where merge_call-using branches
        # (the inner optimizer's update) are allowed.
        tf.cond(tf.equal(failing, 0.0), apply_fn, optimizer._stateful_handle_non_finite_grads)

    tf.distribute.get_replica_context().merge_call(cross_replica, args=(list(grads), variables))


def install(trainer: ModuleType) -> tuple[str, list[Patch]]:
    """Replace ``LossScaleOptimizer._tf_apply`` for calls under a Mirrored strategy."""
    cls = loss_scale_optimizer_class(trainer)
    if cls is None:
        return "fix", []
    original = cls._tf_apply

    def _tf_apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        if not affected():
            return original(self, grads, trainable_variables)
        _apply_if_all_finite(self, list(grads), trainable_variables)
        return None

    return "fix", [replace_method(cls, "_tf_apply", _tf_apply, change=ISSUE)]


WORKAROUND = Workaround(
    issue=ISSUE,
    verified_on=("3.15.1",),
    changes="keras LossScaleOptimizer._tf_apply replaced (the skip decision is made over "
    "every replica and worker under Mirrored strategies)",
    probe=probe,
    install=install,
)
