"""The saved position: what a checkpoint's ``state.json`` records, and the position's arithmetic.

A position is an epoch (0-based) and the steps of it done; the global step counts every step
since the job's first epoch began. The callback moves it at step boundaries (a step, or a whole
execution of ``steps_per_execution`` steps), saves it with the facts a resume is checked
against, and reads it back. Pure (no TensorFlow): the model is read only for its weights' names
and shapes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def global_step(epoch: int, step: int, steps_per_epoch: int) -> int:
    """Steps trained since the first epoch of the job began."""
    return epoch * steps_per_epoch + step


def after_step(epoch: int, done: int, steps_per_epoch: int) -> tuple[int, int]:
    """The position after the step that made ``done`` steps of ``epoch``: an epoch's last
    step moves it to the next epoch's start."""
    if done >= steps_per_epoch:
        return epoch + 1, 0
    return epoch, done


def after_execution(
    epoch: int, begun: int, steps_per_execution: int, steps_per_epoch: int
) -> tuple[int, int]:
    """The position after the execution begun at step ``begun`` of ``epoch`` ran whole:
    ``steps_per_execution`` steps, at most to the epoch's end."""
    done = min(begun + steps_per_execution, steps_per_epoch)
    return divmod(epoch * steps_per_epoch + done, steps_per_epoch)


def periodic_mark(step: int, every_steps: int, last: int | None) -> int | None:
    """The mark (``step // every_steps``) to record when a periodic save is due at global
    step ``step``: a multiple of ``every_steps`` was passed since the save marked ``last``
    (a batch hook runs every ``steps_per_execution`` steps, not at each multiple). None when
    no save is due."""
    mark = step // every_steps
    if last is not None and mark <= last:
        return None
    return mark


def save_unit(steps_per_execution: int, accumulation: int) -> int:
    """The steps between the boundaries where a save can come: batch hooks run once per
    execution, and a save waits for the accumulated update."""
    return math.lcm(steps_per_execution, accumulation)


def divisors(steps: int) -> list[int]:
    """Every divisor of ``steps``, ascending."""
    return [d for d in range(1, steps + 1) if steps % d == 0]


def model_variables(model: Any) -> list[list[Any]]:
    """``[name, shape]`` of each of the model's weights, in order (as saved and checked)."""
    return [[v.path if hasattr(v, "path") else v.name, list(v.shape)] for v in model.weights]


def record(
    *,
    epoch: int,
    step: int,
    steps_per_epoch: int,
    seed: int | None,
    facts: Mapping[str, Any],
    model: Any,
    optimizer: Any,
    keras: str,
    reason: str,
    saved_at: float,
) -> dict[str, Any]:
    """The contents of a checkpoint's ``state.json``.

    Args:
        epoch: the epoch of the position (0-based).
        step: the steps of that epoch done.
        steps_per_epoch: the dataset's epoch.
        seed: the shuffle seed of the run.
        facts: the dataset's facts a resume is checked against.
        model: the model whose weights are saved (their names and shapes are recorded).
        optimizer: the optimizer whose state is saved (its class is recorded).
        keras: the running Keras: its version for Keras 3, ``"tf_keras"`` for tf_keras.
        reason: why it was saved (``"every_steps"``, the notice).
        saved_at: the wall-clock time of the save.
    """
    return {
        "epoch": epoch,
        "step_in_epoch": step,
        "steps_per_epoch": steps_per_epoch,
        "seed": seed,
        "dataset": facts,
        "optimizer": type(optimizer).__name__,
        "variables": model_variables(model),
        "keras": keras,
        "reason": reason,
        "saved_at": saved_at,
    }


def recorded(state: Mapping[str, Any]) -> tuple[int, int]:
    """The position (epoch, step of it done) a checkpoint's ``state.json`` records."""
    return int(state["epoch"]), int(state["step_in_epoch"])
