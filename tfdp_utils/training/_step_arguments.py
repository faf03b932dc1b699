"""What :func:`make_distributed_train_step` is given, checked before the step is built.

The loss (one value per example: a Keras loss that reduces over the replica's batch is the
reduce_mean bug), the metrics, the model and optimizer (Keras objects whose variables live
under the strategy's scope, the optimizer's created there on Keras 3) and ``jit_compile``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from tfdp_utils._tf import IS_KERAS3, KERAS_FLAVOUR, distributed_variable, keras
from tfdp_utils.training import _mixed_precision as mixed_precision

_NO_REDUCTION = ("none", None)

REDUCTION_FIX = (
    "Inside strategy.run a reduced loss is averaged over the replica's share of the batch only; "
    "the gradients of all replicas are then summed, which makes them num_replicas_in_sync "
    "times too large (the reduce_mean bug). make_distributed_train_step needs one loss per "
    "example and averages it over the global batch itself. Fix: construct the loss with "
    "reduction='none', e.g. {example}, or pass the loss function "
    "(e.g. keras.losses.sparse_categorical_crossentropy)."
)


def _is_keras_loss(loss: Any) -> bool:
    return isinstance(loss, keras.losses.Loss)


def resolve_loss(loss: Any) -> Callable[..., Any]:
    """``loss`` as a callable that returns one value per example (a name looked up)."""
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if _is_keras_loss(loss):
        reduction = getattr(loss, "reduction", "none")
        if reduction not in _NO_REDUCTION:
            name = type(loss).__name__
            raise ValueError(
                f"loss={name}(reduction={reduction!r}) reduces over the batch on each replica. "
                + REDUCTION_FIX.format(example=f"keras.losses.{name}(reduction='none')")
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


def resolve_metrics(metrics: Any) -> list[Any]:
    """``metrics`` as a list of Keras metric objects (one alone, or None, accepted)."""
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


JitCompile = bool | Literal["auto"]


def resolve_jit_compile(jit_compile: Any, strategy: Any) -> bool:
    """``jit_compile`` as a bool: ``"auto"`` means XLA when the replicas are GPUs or TPUs.

    XLA rarely pays on CPU (and compiles once per batch shape), so ``"auto"`` leaves it off
    there, as Keras 3's ``jit_compile="auto"`` does under tf.distribute.
    """
    if isinstance(jit_compile, bool):
        return jit_compile
    if jit_compile == "auto":
        devices = [str(device).upper() for device in strategy.extended.worker_devices]
        return any(":GPU:" in device or ":TPU:" in device for device in devices)
    raise TypeError(
        f"jit_compile must be True, False or 'auto', but received {jit_compile!r} of type "
        f"{type(jit_compile).__name__}. Pass jit_compile=True to compile each replica's "
        "forward and backward pass with XLA."
    )


def check_objects(model: Any, optimizer: Any) -> None:
    """Clear errors for a model or optimizer given by name (fit takes names; a step cannot)."""
    # Looked up on the class: tf_keras raises from the property on a model not built yet.
    if not hasattr(type(model), "trainable_variables") or not callable(model):
        raise TypeError(
            f"model must be a Keras model, but received {model!r} of type "
            f"{type(model).__name__}. Build the model under strategy.scope() and pass it."
        )
    if not hasattr(optimizer, "apply_gradients") or not hasattr(optimizer, "iterations"):
        raise TypeError(
            f"optimizer must be a Keras optimizer object, but received {optimizer!r} of type "
            f"{type(optimizer).__name__}. compile() accepts a name, but the step needs the "
            "optimizer whose variables live under the strategy: create it under "
            "strategy.scope(), e.g. optimizer = keras.optimizers.Adam(1e-3), and pass it."
        )


def check_setup(model: Any, optimizer: Any, strategy: Any, metrics: list[Any]) -> None:
    """A built model, every variable under ``strategy``'s scope, no float16 without loss
    scaling; on Keras 3 the optimizer's variables are created under the scope now."""
    if not getattr(model, "built", False) or not model.trainable_variables:
        raise ValueError(
            f"model {getattr(model, 'name', model)!r} has no trainable variables yet. Build it "
            "under strategy.scope() before making the step, e.g. by giving it a keras.Input "
            "or calling model(example_batch) once."
        )
    _check_in_scope(strategy, model.trainable_variables, "model")
    _check_in_scope(strategy, [optimizer.iterations], "optimizer")
    for metric in metrics:
        _check_in_scope(strategy, metric.variables, f"metric {metric.name!r}")
    mixed_precision.check_policy(model, optimizer)
    if IS_KERAS3 and not optimizer.built:
        # Keras 3 creates optimizer variables on the first apply_gradients, which fails
        # inside a tf.function on 2+ replicas; create them under the scope now.
        with strategy.scope():
            optimizer.build(model.trainable_variables)
    # tf_keras creates its optimizer variables lazily in a merge_call, which works here.
