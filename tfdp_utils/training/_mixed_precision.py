"""Loss scaling for custom training steps, on Keras 3 and on tf_keras.

Under ``mixed_float16`` small gradients underflow to zero in float16, so the loss is
multiplied by a large factor before the gradients are computed and the gradients are divided
by it before they are applied; a ``LossScaleOptimizer`` adapts the factor (halves it and
skips the update when a gradient is inf/NaN, doubles it after a run of finite steps). The two
Kerases split the work differently:

- Keras 3: ``optimizer.scale_loss(loss)`` (any optimizer: a ``LossScaleOptimizer``'s dynamic
  scale, or a plain optimizer's ``loss_scale_factor``); the optimizer's own ``apply``
  divides the gradients by the scale, checks them and skips non-finite updates.
- tf_keras: ``optimizer.get_scaled_loss(loss)`` and ``optimizer.get_unscaled_gradients(grads)``
  on a ``LossScaleOptimizer``; its ``apply_gradients`` skips non-finite updates.

A step that forgets either half trains nothing (Keras 3 divides unscaled gradients by
32768) or applies scaled gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfdp_utils._tf import IS_KERAS3, keras, tf


def is_loss_scale_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is the active Keras's ``LossScaleOptimizer``."""
    return isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)


def scale_loss(optimizer: Any, loss: Any) -> Any:
    """``loss`` multiplied by ``optimizer``'s current loss scale (unchanged without one)."""
    if IS_KERAS3:
        return optimizer.scale_loss(loss)
    if is_loss_scale_optimizer(optimizer):
        return optimizer.get_scaled_loss(loss)
    return loss


def gradients_to_apply(optimizer: Any, gradients: Sequence[Any]) -> list[Any]:
    """Gradients of a scaled loss, as ``optimizer.apply_gradients`` expects them.

    Keras 3 optimizers unscale in ``apply`` themselves; tf_keras's ``LossScaleOptimizer``
    expects unscaled gradients.
    """
    if not IS_KERAS3 and is_loss_scale_optimizer(optimizer):
        return list(optimizer.get_unscaled_gradients(list(gradients)))
    return list(gradients)


def current_loss_scale(optimizer: Any) -> float | None:
    """The loss scale ``optimizer`` applies now, or None when it scales nothing."""
    if is_loss_scale_optimizer(optimizer):
        if IS_KERAS3:
            scale = optimizer.dynamic_scale if optimizer.built else optimizer.initial_scale
        else:
            scale = optimizer.loss_scale
        return float(tf.convert_to_tensor(scale).numpy())
    factor = getattr(optimizer, "loss_scale_factor", None)
    return float(factor) if factor is not None else None


def scales_loss(optimizer: Any) -> bool:
    """Whether ``optimizer`` scales the loss (read without a value: works while tracing)."""
    return is_loss_scale_optimizer(optimizer) or (
        getattr(optimizer, "loss_scale_factor", None) is not None
    )


def _layers(model: Any) -> list[Any]:
    """``model`` and every layer inside it (nested models included), on both Kerases."""
    flatten = getattr(model, "_flatten_layers", None)
    if callable(flatten):
        return list(flatten(include_self=True, recursive=True))
    return [model]


def float16_layers(model: Any) -> list[str]:
    """Names of the layers of ``model`` (itself included) that compute in float16.

    A model's own ``compute_dtype`` comes from the global policy when it was built; a layer
    built with ``dtype="mixed_float16"`` computes in float16 under a float32 model, and its
    gradients underflow the same way.
    """
    return [
        str(getattr(layer, "name", layer))
        for layer in _layers(model)
        if str(getattr(layer, "compute_dtype", "float32")) == "float16"
    ]


def check_policy(model: Any, optimizer: Any) -> None:
    """Refuse a model with float16 layers and no loss scaling: small gradients would vanish.

    Raises:
        ValueError: the model, or any layer in it, computes in float16 and ``optimizer``
            scales no loss.
    """
    layers = float16_layers(model)
    if not layers or scales_loss(optimizer):
        return
    name = str(getattr(model, "name", model))
    if name in layers:
        what = f"model {name!r} computes in float16 (the mixed_float16 policy)"
    else:
        shown = ", ".join(repr(layer) for layer in layers[:3])
        more = f" and {len(layers) - 3} more" if len(layers) > 3 else ""
        what = (
            f"model {name!r} has layers that compute in float16 ({shown}{more}: "
            'dtype="mixed_float16")'
        )
    raise ValueError(
        f"{what}, but optimizer {type(optimizer).__name__} scales no loss, so small "
        "gradients underflow to zero. Wrap it: optimizer = "
        "keras.mixed_precision.LossScaleOptimizer(optimizer), under strategy.scope(); or use "
        "the mixed_bfloat16 policy, which needs no loss scaling."
    )
