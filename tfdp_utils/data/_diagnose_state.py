"""The model's state around :func:`~tfdp_utils.diagnose_input`: every variable its train steps
may change (weights, optimizer state, metrics, a loss scale) read before the first step and
written back after the last. TensorFlow glue.
"""

from __future__ import annotations

from typing import Any


def _state_variables(model: Any) -> list[Any]:
    """Every variable a train step may change: weights, optimizer state, metrics, a loss
    scale, gradient accumulators."""
    optimizer_variables = getattr(model.optimizer, "variables", [])
    if callable(optimizer_variables):  # legacy optimizers: a method
        optimizer_variables = optimizer_variables()
    metric_variables = [v for metric in getattr(model, "metrics", []) for v in metric.variables]
    # tf_keras' LossScaleOptimizer keeps its loss scale and good-step count out of its
    # variables: the diagnosis's steps move them, and the fit after it would start elsewhere.
    loss_scale = getattr(model.optimizer, "_loss_scale", None)
    scale_variables = list((getattr(loss_scale, "_weights", None) or {}).values())
    # enable_gradient_accumulation's accumulators (tf_keras) are no Keras variables either: an
    # odd number of diagnosis steps would leave a micro-batch pending for the fit after it.
    accumulation = getattr(model, "_tfdp_accumulation", None)
    scale_variables += list(getattr(accumulation, "variables", None) or [])
    seen: dict[int, Any] = {}
    for variable in [*model.variables, *optimizer_variables, *metric_variables, *scale_variables]:
        seen.setdefault(id(variable), variable)
    return list(seen.values())


def snapshot(model: Any) -> list[tuple[Any, Any]]:
    """Each variable a train step may change, with its value now."""
    return [(variable, variable.numpy()) for variable in _state_variables(model)]


def restore(model: Any, saved: list[tuple[Any, Any]]) -> None:
    """The values of :func:`snapshot` written back; metrics the steps made, reset."""
    for variable, value in saved:
        variable.assign(value)
    known = {id(variable) for variable, _ in saved}
    for metric in getattr(model, "metrics", []):
        if any(id(v) not in known for v in metric.variables):
            metric.reset_state()  # made by the steps (tf_keras builds metrics in the first)
