"""Replica-local gradient accumulators for one optimizer update over several micro-batches.

Each replica adds the gradients of the *sum* of its per-example losses for every micro-batch
to its own accumulators (``ON_READ`` variables: one copy per replica, never synchronised), and
counts the examples of every micro-batch over all replicas. When the update is applied, each
replica divides its sum by the number of examples in all micro-batches of the update, over
all replicas, and the optimizer sums the replicas' gradients: the result is the mean gradient
over the *global* batch of the whole update, exact for a partial last micro-batch too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfdp_utils._tf import tf


class GradientAccumulator:
    """Per-replica sums of gradients and the global count of examples they cover.

    Create it under ``strategy.scope()``; call :meth:`add`, :meth:`read` and :meth:`reset`
    inside ``strategy.run`` (replica context), where each replica sees its own copy.

    Args:
        variables: the trainable variables the gradients belong to (Keras or TF variables).
    """

    def __init__(self, variables: Sequence[Any]) -> None:
        self.sums = [
            tf.Variable(
                tf.zeros(tuple(variable.shape), tf.as_dtype(variable.dtype)),
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
                name="gradient_sum",
            )
            for variable in variables
        ]
        self.examples = tf.Variable(
            tf.constant(0.0, tf.float64),
            trainable=False,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            name="accumulated_examples",
        )

    def add(self, gradients: Sequence[Any], examples: Any) -> None:
        """Add one micro-batch's gradient sums and its global example count."""
        for total, gradient in zip(self.sums, gradients, strict=True):
            if gradient is not None:
                total.assign_add(tf.cast(tf.convert_to_tensor(gradient), total.dtype))
        self.examples.assign_add(tf.cast(examples, tf.float64))

    def read(self) -> tuple[list[Any], Any]:
        """This replica's gradient sums and the examples counted so far."""
        return [tf.identity(total) for total in self.sums], tf.identity(self.examples)

    def reset(self) -> None:
        """Start the next update from zero."""
        for total in self.sums:
            total.assign(tf.zeros_like(total))
        self.examples.assign(tf.constant(0.0, tf.float64))


__all__ = ["GradientAccumulator"]
