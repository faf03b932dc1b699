"""keras#19246 workaround: does ``steps_per_execution`` keep its speed-up, at no cost?

Two ratios, measured side by side in one process over 2 logical CPUs: ``--rounds`` rounds, each
timing one ``fit`` epoch of ``--batches`` batches per model (order alternating, after a warm-up
epoch); the ratio is the median of the per-round ratios:

- ``spe8 / spe1`` on MirroredStrategy over 2 replicas, with the workaround: the time per batch
  with ``steps_per_execution=8`` over that with 1 (Keras 3 cannot run the first at all
  without the workaround; on tf_keras both are tf_keras' own).
- ``ours / keras`` on one replica, where Keras 3's own loop works: the workaround's loop
  (forced on) over Keras' loop, both with ``steps_per_execution=8``. Keras 3 only.

Run: ``python benchmarks/compat.py [--rounds N] [--batches N]``; add ``TF_USE_LEGACY_KERAS=1``
for the tf_keras column.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from tfdp_utils import (  # noqa: E402
    IS_KERAS3,
    KERAS_FLAVOUR,
    compat,
)

keras = tf.keras
from tfdp_utils.compat import _keras_19246 as keras_19246  # noqa: E402


def make_model(strategy: Any, steps_per_execution: int) -> Any:
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss="mse",
            steps_per_execution=steps_per_execution,
        )
    return model


def seconds_per_batch(model: Any, data: Any, batches: int) -> float:
    start = time.perf_counter()
    model.fit(data, epochs=1, verbose=0, shuffle=False)
    return (time.perf_counter() - start) / batches


def compare(models: dict[str, Any], data: Any, batches: int, rounds: int) -> dict[str, Any]:
    """Median time per batch of each model, and the median of the paired per-round ratios."""
    for model in models.values():
        model.fit(data, epochs=1, verbose=0, shuffle=False)  # trace and warm up
    times: dict[str, list[float]] = {name: [] for name in models}
    for index in range(rounds):
        # Alternate the order too, so neither model always runs right after the other.
        names = list(models) if index % 2 == 0 else list(reversed(list(models)))
        for name in names:
            times[name].append(seconds_per_batch(models[name], data, batches))
    first, second = list(models)
    ratios = [b / a for a, b in zip(times[first], times[second], strict=True)]
    result: dict[str, Any] = {name: statistics.median(values) for name, values in times.items()}
    result["ratio"] = statistics.median(ratios)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batches", type=int, default=256)
    args = parser.parse_args()

    rng = np.random.RandomState(0)
    x = rng.rand(args.batches * 64, 32).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).prefetch(2)

    two = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    print(f"flavour={KERAS_FLAVOUR} applied={compat.apply_for_strategy(two)}")
    timed = compare(
        {"spe1": make_model(two, 1), "spe8": make_model(two, 8)}, data, args.batches, args.rounds
    )
    print(
        f"2 replicas: spe8/spe1 = {timed['spe8'] * 1e3:.3f} / {timed['spe1'] * 1e3:.3f} ms "
        f"per batch; paired ratio {timed['ratio']:.3f}"
    )

    if IS_KERAS3:
        one = tf.distribute.MirroredStrategy(["/cpu:0"])
        keras_loop = make_model(one, 8)
        keras_loop.fit(
            data, epochs=1, verbose=0, shuffle=False
        )  # traced with Keras' own loop (1 replica)
        original_affected = keras_19246.affected
        keras_19246.affected = lambda model: int(model.steps_per_execution) > 1
        try:
            our_loop = make_model(one, 8)
            our_loop.fit(
                data, epochs=1, verbose=0, shuffle=False
            )  # traced with the workaround's loop
        finally:
            keras_19246.affected = original_affected
        timed = compare({"keras": keras_loop, "ours": our_loop}, data, args.batches, args.rounds)
        print(
            f"1 replica, spe=8: ours/keras = {timed['ours'] * 1e3:.3f} / "
            f"{timed['keras'] * 1e3:.3f} ms per batch; paired ratio {timed['ratio']:.3f}"
        )


if __name__ == "__main__":
    main()
