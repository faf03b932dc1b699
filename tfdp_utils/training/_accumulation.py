"""Replica-local gradient accumulators for one optimizer update over several micro-batches.

Each replica adds the gradients of the *sum* of its per-example losses for every micro-batch
to its own accumulators (``ON_READ`` variables: one copy per replica, never synchronised), and
counts the examples of every micro-batch over all replicas. When the update is applied, each
replica divides its sum by the number of examples in all micro-batches of the update, over
all replicas, and the optimizer sums the replicas' gradients: the result is the mean gradient
over the *global* batch of the whole update, exact for a partial last micro-batch too.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

from tfdp_utils import _tf
from tfdp_utils._public import public
from tfdp_utils._tf import IS_KERAS3, keras, optimizer_batch_counter, tf
from tfdp_utils._validate import positive_int
from tfdp_utils.training import _mixed_precision as mixed_precision


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


def in_cross_replica_cond(predicate: Any, branch: Any) -> None:
    """Run ``branch()`` on every replica where ``predicate()`` holds, from a replica context.

    ``predicate`` is evaluated in the cross-replica context. MirroredStrategy and
    MultiWorkerMirroredStrategy forbid a ``tf.cond`` in the replica context whose branch
    synchronises (``apply_gradients`` all-reduces in a ``merge_call``); in the cross-replica
    context it is allowed, as in Keras' ``LossScaleOptimizer`` (keras#20582).
    """

    def cross_replica(distribution: Any) -> None:
        tf.cond(
            predicate(),
            lambda: distribution.extended.call_for_each_replica(branch),
            lambda: None,
        )

    tf.distribute.get_replica_context().merge_call(cross_replica)


def _accumulating_train_step(model: Any, data: Any) -> Any:
    """tf_keras ``train_step`` that applies the mean gradient of every k micro-batches."""
    state: _FitState = model._tfdp_accumulation
    # Runs while fit traces its step, before any update: compile may come after enabling.
    mixed_precision.check_policy(model, model.optimizer)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = model.compute_loss(x, y, y_pred, sample_weight)
        scaled = mixed_precision.scale_loss(model.optimizer, loss)
    gradients = tape.gradient(scaled, model.trainable_variables)
    state.accumulator.add(gradients, 1)

    def apply() -> None:
        sums, _ = state.accumulator.read()
        mean = [total / state.steps for total in sums]
        mean = mixed_precision.gradients_to_apply(model.optimizer, mean)
        model.optimizer.apply_gradients(zip(mean, model.trainable_variables, strict=True))
        state.accumulator.reset()

    # The count is the same on every replica; the first replica's copy decides.
    in_cross_replica_cond(lambda: state.accumulator.examples.read_value() >= state.steps, apply)
    return model.compute_metrics(x, y, y_pred, sample_weight)


class _FitState:
    def __init__(self, model: Any, steps: int) -> None:
        self.steps = steps
        with model.distribute_strategy.scope():
            self.accumulator = GradientAccumulator(model.trainable_variables)

    @property
    def variables(self) -> list[Any]:
        """The accumulators' variables (a step between two updates changes them)."""
        return [*self.accumulator.sums, self.accumulator.examples]

    def batches_trained(self, optimizer: Any) -> int:
        """The updates' batches and the batches pending in the accumulators."""
        pending = round(float(self.accumulator.examples.numpy()))
        return int(optimizer.iterations.numpy()) * self.steps + pending


@public("tfdp_utils")
def enable_gradient_accumulation(model: Any, accumulation_steps: int) -> Any:
    """Make tf_keras ``fit`` apply the optimizer once per ``accumulation_steps`` batches.

    tf_keras optimizers cannot accumulate gradients (Keras 3's take
    ``gradient_accumulation_steps=k``; tfdp-utils fixes them under tf.distribute, keras#20582).
    This replaces ``model.train_step`` on this model: each batch's gradients are added to
    replica-local accumulators and every k-th batch the optimizer applies their mean, as
    Keras 3 does, so k batches of b examples give the update of one batch of k x b. Works
    under any strategy and with a ``LossScaleOptimizer``; ``optimizer.iterations`` counts
    updates, so learning-rate schedules count updates.

    Args:
        model: a built tf_keras model (created under the strategy's scope, if any).
        accumulation_steps: batches per optimizer update (>= 1).

    Returns:
        ``model``, for chaining.

    Raises:
        RuntimeError: on Keras 3, whose optimizers accumulate themselves.
        ValueError: the model is not built, ``accumulation_steps`` is not positive, or the
            model (or a layer in it) computes in float16 and its optimizer scales no loss
            (checked here when the model is compiled, else when ``fit`` starts).
        TypeError: ``model`` is not a Keras model, or ``accumulation_steps`` is not an
            integer.

    Examples:
        >>> model = tdu.enable_gradient_accumulation(model, 4)  # doctest: +SKIP
        >>> model.fit(dataset_of_micro_batches, epochs=3)  # doctest: +SKIP
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"model must be a {'tf_keras' if not IS_KERAS3 else 'Keras'} model "
            f"(keras.Model), but received {model!r} of type {type(model).__name__}. Build the "
            "model first (under strategy.scope()) and pass the object: "
            "tdu.enable_gradient_accumulation(model, 4)."
        )
    steps = positive_int(accumulation_steps, "accumulation_steps")
    if IS_KERAS3:
        raise RuntimeError(
            "enable_gradient_accumulation is for tf_keras; Keras 3 optimizers accumulate "
            f"themselves: compile with e.g. keras.optimizers.SGD(0.1, "
            f"gradient_accumulation_steps={steps}) (tfdp_utils.compat fixes keras#20582 "
            "under MirroredStrategy)."
        )
    if not getattr(model, "built", False) or not model.trainable_variables:
        raise ValueError(
            f"model {getattr(model, 'name', model)!r} is not built, so its gradients have no "
            "shapes yet. Build it first (give it a keras.Input, under strategy.scope())."
        )
    if getattr(model, "optimizer", None) is not None:
        mixed_precision.check_policy(model, model.optimizer)
    model._tfdp_accumulation = _FitState(model, steps)
    from tfdp_utils.compat import _changes as compat_changes  # listed by tdu.compat.status()

    compat_changes.replace_train_step(
        model,
        types.MethodType(_accumulating_train_step, model),
        applied_by="enable_gradient_accumulation()",
    )
    model.train_function = None  # retrace with the new step
    return model


def accumulation_steps(model: Any) -> int:
    """Batches per optimizer update in ``fit``: Keras 3's ``gradient_accumulation_steps``,
    :func:`enable_gradient_accumulation`'s k on tf_keras, else 1."""
    state = getattr(model, "_tfdp_accumulation", None)
    if isinstance(state, _FitState):
        return state.steps
    optimizer = getattr(model, "optimizer", None)
    if IS_KERAS3:  # a LossScaleOptimizer's inner optimizer is the one that accumulates
        optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    return int(getattr(optimizer, "gradient_accumulation_steps", None) or 1)


def batches_trained(model: Any) -> int:
    """Batches (micro-batches under accumulation) ``fit`` has trained the model on.

    ``optimizer.iterations`` counts updates; under accumulation every update covers k
    batches, and batches since the last update are pending in the accumulators.
    """
    return _tf.batches_trained(model)


def pending_batches(model: Any) -> int:
    """Batches whose gradients wait in the accumulators for the next update (0 without
    accumulation, and right after an update).

    Keras 3 updates when its batch counter reaches a multiple of k (a step its loss-scale
    optimizer skips does not count, and adds nothing to the accumulators either).
    """
    steps = accumulation_steps(model)
    if steps <= 1:
        return 0
    state = getattr(model, "_tfdp_accumulation", None)
    if isinstance(state, _FitState):
        return round(float(state.accumulator.examples.numpy())) % steps
    return int(optimizer_batch_counter(model.optimizer).numpy()) % steps
