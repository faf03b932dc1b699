"""``WarmupSchedule``: a linear learning-rate warm-up, then any Keras schedule.

Goyal et al. 2017 ("Accurate, Large Minibatch SGD", arXiv:1706.02677) scale the learning
rate linearly with the global batch and ramp up to it over the first 5 epochs, because the
scaled rate is too large for the first steps of a freshly initialised network. The schedule
is registered for Keras serialization, so a compiled model that uses it survives
``model.save("m.keras")`` / ``keras.models.load_model``, on Keras 3 and on tf_keras.
"""

from __future__ import annotations

import numbers
from typing import Any

from tfdp_utils._tf import KERAS_FLAVOUR, keras, tf
from tfdp_utils._validate import positive_float, positive_int

_LearningRateSchedule: Any = keras.optimizers.schedules.LearningRateSchedule


def _check_after(after: Any) -> Any:
    if after is None or isinstance(after, _LearningRateSchedule):
        return after
    if isinstance(after, dict):
        # A serialized schedule, as found in a saved config.
        return keras.optimizers.schedules.deserialize(after)
    hint = (
        "Pass a schedule such as keras.optimizers.schedules.CosineDecay(...), or None to "
        "hold target_learning_rate after the warm-up."
    )
    if isinstance(after, numbers.Real):
        hint = "A constant rate after the warm-up is the default: pass after=None."
    elif hasattr(after, "get_config") and callable(after):
        hint = (
            "It looks like a schedule of another Keras than the active one "
            f"({KERAS_FLAVOUR}); build it with tf.keras.optimizers.schedules. " + hint
        )
    raise TypeError(
        "after must be a keras.optimizers.schedules.LearningRateSchedule or None, but "
        f"received {after!r} of type {type(after).__name__}. {hint}"
    )


# tf.keras on Keras 3 has no `saving` namespace; `utils` carries the same function on both.
@keras.utils.register_keras_serializable(package="tfdp_utils")
class WarmupSchedule(_LearningRateSchedule):  # type: ignore[misc]
    """Linear warm-up from ``initial_learning_rate`` to ``target_learning_rate``, then ``after``.

    At optimizer step ``s`` (``optimizer.iterations`` before the update):

    - ``s < warmup_steps``: ``initial + (target - initial) * s / warmup_steps``;
    - ``s >= warmup_steps``: ``after(s - warmup_steps)`` (``after`` starts at its own step
      0 when the warm-up ends), or ``target_learning_rate`` when ``after`` is None.

    Give ``after`` the same starting rate as ``target_learning_rate`` for a continuous curve.

    Args:
        target_learning_rate: the rate reached at the end of the warm-up, usually from
            :func:`scale_learning_rate`.
        warmup_steps: optimizer steps the ramp lasts, e.g. ``5 * steps_per_epoch(...)``.
        initial_learning_rate: the rate at step 0. Defaults to `0.0`.
        after: a ``keras.optimizers.schedules.LearningRateSchedule`` to follow the warm-up.
            Defaults to `None` (hold ``target_learning_rate``).
        name: a name for the schedule's ops. Defaults to `None`.

    Raises:
        TypeError: a rate is not a number, ``warmup_steps`` is not an integer, or ``after``
            is not a schedule.
        ValueError: a rate is negative or not finite, or ``warmup_steps`` is not positive.

    Examples:
        >>> import tensorflow as tf
        >>> import tfdp_utils as tdu
        >>> schedule = tdu.WarmupSchedule(0.4, warmup_steps=4)
        >>> [round(float(schedule(step)), 3) for step in range(6)]
        [0.0, 0.1, 0.2, 0.3, 0.4, 0.4]
        >>> optimizer = tf.keras.optimizers.SGD(learning_rate=schedule)
    """

    target_learning_rate: float
    warmup_steps: int
    initial_learning_rate: float
    after: Any
    name: str | None

    def __init__(
        self,
        target_learning_rate: float,
        warmup_steps: int,
        *,
        initial_learning_rate: float = 0.0,
        after: Any = None,
        name: str | None = None,
    ) -> None:
        super().__init__()
        self.target_learning_rate = positive_float(
            target_learning_rate, "target_learning_rate", allow_zero=True
        )
        if isinstance(warmup_steps, numbers.Integral):
            hint = "Without a warm-up, use the target rate (or `after`) directly."
        else:
            hint = (
                "It counts optimizer steps; for a warm-up in epochs pass "
                "epochs * steps_per_epoch(num_examples, global_batch_size)."
            )
        self.warmup_steps = positive_int(warmup_steps, "warmup_steps", hint=hint)
        self.initial_learning_rate = positive_float(
            initial_learning_rate, "initial_learning_rate", allow_zero=True
        )
        self.after = _check_after(after)
        self.name = name

    def __call__(self, step: Any) -> Any:
        with tf.name_scope(self.name or "WarmupSchedule"):
            # Keras 3 passes its iterations variable; convert before casting.
            step = tf.cast(tf.convert_to_tensor(step), tf.float32)
            warmup = tf.constant(float(self.warmup_steps), tf.float32)
            initial = tf.constant(self.initial_learning_rate, tf.float32)
            target = tf.constant(self.target_learning_rate, tf.float32)
            fraction = tf.minimum(step, warmup) / warmup
            ramp = initial + (target - initial) * fraction
            if self.after is None:
                rest = target
            else:
                # Both branches of tf.where are evaluated: never give `after` a negative step.
                rest = tf.cast(self.after(tf.maximum(step - warmup, 0.0)), tf.float32)
            return tf.where(step < warmup, ramp, rest)

    def get_config(self) -> dict[str, Any]:
        after = None
        if self.after is not None:
            after = keras.optimizers.schedules.serialize(self.after)
        return {
            "target_learning_rate": self.target_learning_rate,
            "warmup_steps": self.warmup_steps,
            "initial_learning_rate": self.initial_learning_rate,
            "after": after,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> WarmupSchedule:
        config = dict(config)
        after = config.pop("after", None)
        if isinstance(after, dict):
            after = keras.optimizers.schedules.deserialize(after)
        return cls(after=after, **config)

    def __repr__(self) -> str:
        after = "None" if self.after is None else type(self.after).__name__
        return (
            f"WarmupSchedule(target_learning_rate={self.target_learning_rate!r}, "
            f"warmup_steps={self.warmup_steps}, "
            f"initial_learning_rate={self.initial_learning_rate!r}, after={after})"
        )


__all__ = ["WarmupSchedule"]
