"""The files ``DivergenceGuard(directory=...)`` saves for a non-finite step, and its replay.

:func:`save_step` writes one folder per non-finite step: ``weights.npz`` (the replica's
trainable weights before the step, in the model's order), ``batch.npz`` (the examples that
replica received, when they could be read back) and ``step.json`` (the report, the variables'
names and the batch's structure). :func:`replay_step` loads them into a model built and
compiled as the trained one and runs that step's forward and backward pass on one device,
without a strategy and without applying anything, to show the same non-finite value.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfdp_utils._public import public

_STEP_FILE = "step.json"
_WEIGHTS_FILE = "weights.npz"
_BATCH_FILE = "batch.npz"


def _skeleton(structure: Any, leaves: list[np.ndarray]) -> Any:
    """A JSON form of a nest of arrays (tuples, lists, dicts), its leaves appended."""
    if isinstance(structure, Mapping):
        return {"dict": {str(k): _skeleton(v, leaves) for k, v in structure.items()}}
    if isinstance(structure, (tuple, list)):
        return {"tuple": [_skeleton(v, leaves) for v in structure]}
    leaves.append(np.asarray(structure))
    return {"leaf": len(leaves) - 1}


def _rebuild(skeleton: Any, leaves: Mapping[str, np.ndarray]) -> Any:
    if "dict" in skeleton:
        return {k: _rebuild(v, leaves) for k, v in skeleton["dict"].items()}
    if "tuple" in skeleton:
        return tuple(_rebuild(v, leaves) for v in skeleton["tuple"])
    return leaves[f"leaf_{skeleton['leaf']}"]


def save_step(
    directory: str,
    *,
    step: int,
    names: Sequence[str],
    weights: Sequence[np.ndarray],
    batch: Any,
    report: Mapping[str, Any],
) -> str:
    """Write the folder ``directory/step-<step>`` for :func:`replay_step`; its path.

    Args:
        step: the step of the ``fit`` (1-based).
        names: the trainable variables' names, in the model's order.
        weights: their values before the step, in the same order.
        batch: the replica's batch (a nest of arrays), or None when it could not be read.
        report: what the guard reported (JSON-able).
    """
    folder = os.path.join(os.fspath(directory), f"step-{step}")
    os.makedirs(folder, exist_ok=True)
    arrays: dict[str, Any] = {f"w_{i}": np.asarray(w) for i, w in enumerate(weights)}
    np.savez(os.path.join(folder, _WEIGHTS_FILE), **arrays)
    skeleton = None
    if batch is not None:
        leaves: list[np.ndarray] = []
        skeleton = _skeleton(batch, leaves)
        parts: dict[str, Any] = {f"leaf_{i}": v for i, v in enumerate(leaves)}
        np.savez(os.path.join(folder, _BATCH_FILE), **parts)
    content = {"step": step, "variables": list(names), "batch": skeleton, "report": report}
    with open(os.path.join(folder, _STEP_FILE), "w", encoding="utf-8") as handle:
        json.dump(content, handle, indent=1, default=str)
    return folder


@public("tfdp_utils")
@dataclasses.dataclass(frozen=True)
class ReplayedStep:
    """What :func:`replay_step` computed on one device.

    Attributes:
        loss: the loss of the saved batch under the saved weights.
        loss_finite: whether it is finite.
        non_finite_gradients: the variables whose gradient holds an inf or NaN, in the
            model's order.
        report: what ``DivergenceGuard`` reported for the step.
    """

    loss: float
    loss_finite: bool
    non_finite_gradients: tuple[str, ...]
    report: dict[str, Any]

    @property
    def reproduced(self) -> bool:
        """Whether the loss or a gradient is non-finite, as in the training step."""
        return not self.loss_finite or bool(self.non_finite_gradients)


@public("tfdp_utils")
def replay_step(directory: str | os.PathLike[str], model: Any) -> ReplayedStep:
    """Replay a non-finite step saved by ``DivergenceGuard(directory=...)`` on one device.

    Loads the replica's weights before the step into ``model`` (built and compiled as the
    model that trained, outside any strategy) and runs the step's forward and backward pass
    on the replica's batch, applying nothing.

    Args:
        directory: the step's folder (``<directory>/step-<n>``, ``guard.summary()["saved_to"]``).
        model: a compiled Keras model with the trained model's trainable variables, in order.

    Returns:
        A :class:`ReplayedStep`: the loss, whether it is finite, the variables whose gradient
        is not.

    Raises:
        FileNotFoundError: the folder holds no saved step, or no batch (the guard could not
            read it back: the data was not a builder dataset over a sized source).
        ValueError: the model's trainable variables differ in number or shape.
    """
    from tfdp_utils._tf import keras, tf

    folder = os.fspath(directory)
    path = os.path.join(folder, _STEP_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{folder!r} holds no step saved by DivergenceGuard (no {_STEP_FILE}); pass the "
            "step's folder, e.g. guard.summary()['saved_to']."
        )
    with open(path, encoding="utf-8") as handle:
        content = json.load(handle)
    if content.get("batch") is None:
        raise FileNotFoundError(
            f"{folder!r} holds the weights but no batch: DivergenceGuard names and saves a "
            "step's examples only for a dataset from build_distributed_dataset() over arrays "
            "or a sized source (see the report's examples_unknown)."
        )
    _load_weights(model, os.path.join(folder, _WEIGHTS_FILE), content["variables"])
    with np.load(os.path.join(folder, _BATCH_FILE)) as leaves:
        batch = tf.nest.map_structure(
            tf.convert_to_tensor, _rebuild(content["batch"], dict(leaves))
        )
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    variables = list(model.trainable_variables)
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = model.compute_loss(x, y, y_pred, sample_weight)
    gradients = tape.gradient(loss, variables)
    bad = tuple(
        str(name)
        for name, gradient in zip(content["variables"], gradients, strict=True)
        if gradient is not None and not bool(tf.reduce_all(tf.math.is_finite(gradient)))
    )
    value = float(loss)
    return ReplayedStep(value, bool(np.isfinite(value)), bad, dict(content.get("report") or {}))


def _load_weights(model: Any, path: str, names: Sequence[str]) -> None:
    variables = list(model.trainable_variables)
    with np.load(path) as saved:
        values = [saved[f"w_{i}"] for i in range(len(saved.files))]
    shapes = [tuple(v.shape) for v in variables]
    if len(values) != len(variables) or shapes != [tuple(v.shape) for v in values]:
        raise ValueError(
            f"the model has {len(variables)} trainable variables of shapes {shapes}, but the "
            f"saved step has {len(values)} ({list(names)}) of shapes "
            f"{[tuple(v.shape) for v in values]}; build and compile the model as the one "
            "that trained."
        )
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)
