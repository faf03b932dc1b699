"""A custom-loop training step that averages the loss over the *global* batch.

Inside ``strategy.run`` each replica sees only its share of the batch, and the gradients
of all replicas are **summed** when applied. ``tf.reduce_mean`` over the replica's examples
therefore makes the applied gradient ``num_replicas_in_sync`` times too large. The step built
here divides the per-example losses by the number of examples in the whole global batch
(``tf.nn.compute_average_loss``), divides regularization losses by the number of replicas
(``tf.nn.scale_regularization_loss``), and reduces the reported loss with SUM, so 1, 2 or 4
replicas train the same model on the same global batches to the same weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tfdp_utils._tf import IS_KERAS3, KERAS_FLAVOUR, distributed_variable, keras, tf
from tfdp_utils._validate import positive_int

_NO_REDUCTION = ("none", None)

_REDUCTION_FIX = (
    "Inside strategy.run a reduced loss is averaged over the replica's share of the batch only; "
    "the gradients of all replicas are then summed, which makes them num_replicas_in_sync "
    "times too large (the reduce_mean bug). make_distributed_train_step needs one loss per "
    "example and averages it over the global batch itself. Fix: construct the loss with "
    "reduction='none', e.g. {example}, or pass the loss function "
    "(e.g. keras.losses.sparse_categorical_crossentropy)."
)


def _is_keras_loss(loss: Any) -> bool:
    return isinstance(loss, keras.losses.Loss)


def _resolve_loss(loss: Any) -> Callable[..., Any]:
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if _is_keras_loss(loss):
        reduction = getattr(loss, "reduction", "none")
        if reduction not in _NO_REDUCTION:
            name = type(loss).__name__
            raise ValueError(
                f"loss={name}(reduction={reduction!r}) reduces over the batch on each replica. "
                + _REDUCTION_FIX.format(example=f"keras.losses.{name}(reduction='none')")
            )
        return loss  # type: ignore[no-any-return]
    if not callable(loss):
        raise TypeError(
            f"loss must be a callable loss(y_true, y_pred) returning one loss per example, or "
            f"a Keras loss with reduction='none', but received {loss!r} of type "
            f"{type(loss).__name__}."
        )
    return loss  # type: ignore[no-any-return]


def _check_in_scope(strategy: Any, variables: Sequence[Any], what: str) -> None:
    outside = []
    for variable in variables:
        tf_variable = distributed_variable(variable)
        if tf_variable is not None and not strategy.extended.variable_created_in_scope(tf_variable):
            outside.append(str(getattr(variable, "name", variable)))
    if outside:
        raise ValueError(
            f"{what} has variables that were not created under the scope of the strategy the "
            f"step runs on ({type(strategy).__name__}), e.g. {', '.join(outside[:3])}, so they are "
            f"not kept in sync across its replicas. Create the {what.split()[0]} under "
            "`with strategy.scope():` (or pass strategy= the strategy it was created under)."
        )


def _resolve_metrics(metrics: Any) -> list[Any]:
    if metrics is None:
        return []
    if isinstance(metrics, keras.metrics.Metric):
        metrics = [metrics]
    if isinstance(metrics, (str, bytes)) or not isinstance(metrics, Sequence):
        raise TypeError(
            "metrics must be a list of keras.metrics.Metric instances created under "
            f"strategy.scope(), but received {metrics!r}. For example: "
            "metrics=[keras.metrics.SparseCategoricalAccuracy()]."
        )
    for metric in metrics:
        if not isinstance(metric, keras.metrics.Metric):
            raise TypeError(
                f"metrics must hold keras.metrics.Metric instances ({KERAS_FLAVOUR}), but "
                f"received {metric!r} of type {type(metric).__name__}. Create the metric "
                "object under strategy.scope(), e.g. keras.metrics.SparseCategoricalAccuracy()."
            )
    return list(metrics)


def _unpack(batch: Any) -> tuple[Any, Any, Any]:
    if isinstance(batch, (tuple, list)) and len(batch) in (2, 3):
        x, y = batch[0], batch[1]
        weight = batch[2] if len(batch) == 3 else None
        return x, y, weight
    raise TypeError(
        "The distributed batch must be a tuple (x, y) or (x, y, sample_weight), as a "
        "dataset of (features, labels) gives, but received "
        f"{type(batch).__name__}: {batch!r}. Map the dataset to (x, y) pairs before "
        "strategy.experimental_distribute_dataset."
    )


def _per_example(values: Any, sample_weight: Any) -> Any:
    """Loss values of shape (batch, ...) -> one weighted value per example, in float32."""
    values = tf.cast(tf.convert_to_tensor(values), tf.float32)
    rank = values.shape.rank
    if rank == 0:
        raise ValueError(
            "The loss returned a scalar, but make_distributed_train_step needs one loss per "
            "example (shape (batch,)). "
            + _REDUCTION_FIX.format(example="keras.losses.MeanSquaredError(reduction='none')")
        )
    if sample_weight is not None:
        weight = tf.cast(tf.convert_to_tensor(sample_weight), tf.float32)
        # Match Keras: a (batch, 1) weight applies to a (batch,) loss and vice versa.
        while weight.shape.rank > rank and weight.shape[-1] == 1:
            weight = tf.squeeze(weight, axis=-1)
        while weight.shape.rank < rank:
            weight = tf.expand_dims(weight, axis=-1)
        values = values * weight
    if rank > 1:
        # As Keras' "sum_over_batch_size": every element of an example counts equally.
        values = tf.reduce_mean(values, axis=list(range(1, rank)))
    return values


def make_distributed_train_step(
    model: Any,
    *,
    loss: Any,
    optimizer: Any,
    strategy: Any = None,
    global_batch_size: int | None = None,
    metrics: Any = None,
) -> Any:
    """Build a ``tf.function`` that trains ``model`` on one distributed batch.

    Per replica the step computes the per-example loss, divides its sum by the number of
    examples in the global batch (``tf.nn.compute_average_loss``), adds the model's
    regularization losses divided by the number of replicas
    (``tf.nn.scale_regularization_loss``), applies the gradients with ``optimizer`` (which
    sums them over replicas), and updates ``metrics`` with ``(y, y_pred, sample_weight)`` as
    ``fit`` does. It returns the loss averaged over the global batch (regularization
    included), the same number on every replica count.

    Build the model, optimizer and metrics under ``strategy.scope()``. On Keras 3 the step
    creates the optimizer's variables under the scope (``optimizer.build``) if they do not
    exist yet, because Keras 3 cannot create them inside the ``tf.function`` on 2+ replicas.

    Args:
        model: a built Keras model whose variables were created under ``strategy.scope()``.
        loss: ``loss(y_true, y_pred)`` returning one value per example (shape ``(batch,)``
            or ``(batch, ...)``, averaged over the trailing axes), e.g.
            ``keras.losses.sparse_categorical_crossentropy`` (or its name as a string), or a
            Keras loss object with ``reduction="none"``. A Keras loss that reduces is rejected.
        optimizer: a Keras optimizer created under ``strategy.scope()``.
        strategy: a ``tf.distribute.Strategy``. Defaults to `None` (the strategy in scope).
        global_batch_size: divide every step's loss by this many examples. Defaults to
            `None`: the number of examples actually in each global batch, counted over all
            replicas, so a partial last batch is averaged correctly.
        metrics: Keras metric objects (created under the scope) to update each step.
            Defaults to `None`.

    Returns:
        A ``tf.function`` ``step(distributed_batch) -> loss``. ``distributed_batch`` is one
        element of ``strategy.experimental_distribute_dataset(...)``: ``(x, y)`` or
        ``(x, y, sample_weight)``. ``loss`` is a scalar tensor.

    Raises:
        ValueError: a Keras loss whose reduction is not ``"none"``, a model that is not
            built, or variables created outside the strategy's scope.
        TypeError: ``loss`` is not callable, ``metrics`` are not Keras metrics, or
            ``global_batch_size`` is not an integer.

    Examples:
        >>> import numpy as np
        >>> import tensorflow as tf
        >>> import tfdp_utils as tdu
        >>> strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
        >>> with strategy.scope():
        ...     model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
        ...     optimizer = tf.keras.optimizers.SGD(0.1)
        >>> step = tdu.make_distributed_train_step(
        ...     model,
        ...     loss=tf.keras.losses.SparseCategoricalCrossentropy(
        ...         from_logits=True, reduction="none"),
        ...     optimizer=optimizer,
        ...     strategy=strategy,
        ... )
        >>> data = tf.data.Dataset.from_tensor_slices(
        ...     (np.ones((10, 4), "float32"), np.zeros(10, "int64"))).batch(4)
        >>> batches = strategy.experimental_distribute_dataset(data)
        >>> losses = [float(step(batch)) for batch in batches]
        >>> len(losses)
        3
    """
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    loss_fn = _resolve_loss(loss)
    metric_list = _resolve_metrics(metrics)
    fixed_size = None
    if global_batch_size is not None:
        fixed_size = positive_int(global_batch_size, "global_batch_size")
    if not getattr(model, "built", False) or not model.trainable_variables:
        raise ValueError(
            f"model {getattr(model, 'name', model)!r} has no trainable variables yet. Build it "
            "under strategy.scope() before making the step, e.g. by giving it a keras.Input "
            "or calling model(example_batch) once."
        )
    _check_in_scope(strategy, model.trainable_variables, "model")
    _check_in_scope(strategy, [optimizer.iterations], "optimizer")
    for metric in metric_list:
        _check_in_scope(strategy, metric.variables, f"metric {metric.name!r}")
    if IS_KERAS3 and not optimizer.built:
        # Keras 3 creates optimizer variables on the first apply_gradients, which fails
        # inside a tf.function on 2+ replicas; create them under the scope now.
        with strategy.scope():
            optimizer.build(model.trainable_variables)
    # tf_keras creates its optimizer variables lazily in a merge_call, which works here.

    def replica_step(x: Any, y: Any, sample_weight: Any) -> Any:
        if fixed_size is None:
            # tf.nn.compute_average_loss(global_batch_size=None) assumes every replica holds
            # a full share, which is wrong for a partial last batch: count the examples of
            # this global batch over all replicas instead.
            context = tf.distribute.get_replica_context()
            local = tf.cast(tf.shape(y)[0], tf.float32)
            examples = tf.cast(context.all_reduce(tf.distribute.ReduceOp.SUM, local), tf.int64)
        else:
            examples = tf.constant(fixed_size, tf.int64)
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            per_example = _per_example(loss_fn(y, y_pred), sample_weight)
            scaled = tf.nn.compute_average_loss(per_example, global_batch_size=examples)
            if model.losses:
                scaled += tf.nn.scale_regularization_loss(
                    tf.add_n([tf.cast(value, tf.float32) for value in model.losses])
                )
        gradients = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        for metric in metric_list:
            metric.update_state(y, y_pred, sample_weight=sample_weight)
        return scaled

    def train_step(distributed_batch: Any) -> Any:
        x, y, sample_weight = _unpack(distributed_batch)
        per_replica_loss = strategy.run(replica_step, args=(x, y, sample_weight))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)

    return tf.function(train_step)


__all__ = ["make_distributed_train_step"]
