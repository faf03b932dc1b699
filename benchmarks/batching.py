"""make_distributed_train_step against a hand-written correct step, on 2 logical CPUs.

Run: python benchmarks/batching.py [--rounds N] [--steps N]

Three steps train the same MLP (784-128-10, the tutorial's) on the same global batches of 64:

- ``hand``: a hand-written ``strategy.run`` step with ``tf.nn.compute_average_loss(...,
  global_batch_size=64)`` and ``tf.nn.scale_regularization_loss`` (the fixed-divisor recipe
  of the TensorFlow guide);
- ``fixed``: ``make_distributed_train_step(..., global_batch_size=64)``;
- ``counted``: ``make_distributed_train_step(...)`` with the default ``global_batch_size=None``,
  which all-reduces the example count of every batch so partial batches average exactly.

They run alternately, ``--steps`` steps per timing, in one process, so machine noise hits all
alike; the figures are ratios of medians.
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

import tfdp_utils as tdu  # noqa: E402

keras = tf.keras

GLOBAL_BATCH = 64


def _model() -> Any:
    return keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Flatten(),
            keras.layers.Dense(
                128, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-4)
            ),
            keras.layers.Dense(10),
        ]
    )


def _hand_step(strategy: Any, model: Any, optimizer: Any) -> Any:
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def replica_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.nn.compute_average_loss(
                loss_object(y, logits), global_batch_size=GLOBAL_BATCH
            )
            loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def step(batch: Any) -> Any:
        per_replica = strategy.run(replica_step, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    images = rng.normal(size=(GLOBAL_BATCH * args.steps, 28, 28)).astype("float32")
    labels = rng.integers(0, 10, size=len(images))
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(GLOBAL_BATCH).cache()
    batches = list(strategy.experimental_distribute_dataset(dataset))

    steps = {}
    for name in ("hand", "fixed", "counted"):
        with strategy.scope():
            model = _model()
            optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        if name == "hand":
            if tdu.IS_KERAS3:
                with strategy.scope():
                    optimizer.build(model.trainable_variables)
            steps[name] = _hand_step(strategy, model, optimizer)
        else:
            steps[name] = tdu.make_distributed_train_step(
                model,
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
                optimizer=optimizer,
                strategy=strategy,
                global_batch_size=GLOBAL_BATCH if name == "fixed" else None,
            )
        for batch in batches[:2]:  # trace and warm up
            steps[name](batch).numpy()

    times: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    for round_index in range(args.rounds):
        for name in order[round_index % 3 :] + order[: round_index % 3]:
            start = time.perf_counter()
            for batch in batches:
                loss = steps[name](batch)
            loss.numpy()
            times[name].append((time.perf_counter() - start) / len(batches))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, value in medians.items():
        print(f"{name:8s} {value * 1e3:7.3f} ms/step")
    print(f"fixed / hand   = {medians['fixed'] / medians['hand']:.3f}")
    print(f"counted / hand = {medians['counted'] / medians['hand']:.3f}")
    print(f"keras = {tdu.KERAS_FLAVOUR}, tensorflow = {tf.__version__}")


if __name__ == "__main__":
    main()
