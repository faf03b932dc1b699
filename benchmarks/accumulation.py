"""Gradient accumulation overhead and XLA in the custom step, on 2 logical CPUs.

Run: python benchmarks/accumulation.py [--rounds N] [--steps N]
(and again with TF_USE_LEGACY_KERAS=1 for tf_keras).

Side by side in one process, alternating, medians of ``--rounds`` timings of ``--steps``
micro-steps each (global micro-batch 64, MirroredStrategy over 2 logical CPUs):

- ``step k=4`` / ``step k=1``: ``make_distributed_train_step(..., accumulation_steps=4)``
  against the plain step, time per micro-step, on the tutorial's MLP;
- ``fit k=4`` / ``fit k=1``: ``fit`` with accumulation (Keras 3:
  ``SGD(gradient_accumulation_steps=4)`` with the keras#20582 workaround; tf_keras:
  ``tdu.enable_gradient_accumulation(model, 4)``) against plain ``fit``, time per micro-step
  from the end of the epoch's first 4 batches to the end of the epoch (fit's set-up and the
  iterator's start left out of both);
- ``xla`` / ``no xla``: the custom step with ``jit_compile=True`` against without, on the
  tutorial's CNN (``tfdp_utils.demo.build_model("cnn")``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import tfdp_utils as tdu  # noqa: E402
from tfdp_utils.demo import build_model  # noqa: E402

keras = tf.keras
MICRO_BATCH = 64
FIT_SKIP = 4  # fit's first batches (one k=4 cycle) are left out of its timing
LOSS = "sparse_categorical_crossentropy"


def _step_runner(strategy: Any, batches: list[Any], kind: str, **kwargs: Any) -> Callable[[], Any]:
    with strategy.scope():
        model = build_model(kind)
        optimizer = keras.optimizers.SGD(0.01)
    step = tdu.make_distributed_train_step(
        model,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
        optimizer=optimizer,
        strategy=strategy,
        **kwargs,
    )

    def run() -> Any:
        for batch in batches:
            loss = step(batch)
        return loss.numpy()

    return run


def _fit_runner(strategy: Any, dataset: Any, accumulation: int) -> Callable[[], Any]:
    with strategy.scope():
        model = build_model("mlp")
        if tdu.IS_KERAS3 and accumulation > 1:
            optimizer = keras.optimizers.SGD(0.01, gradient_accumulation_steps=accumulation)
        else:
            optimizer = keras.optimizers.SGD(0.01)
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(True))
    if not tdu.IS_KERAS3 and accumulation > 1:
        tdu.enable_gradient_accumulation(model, accumulation)
    timer = _EpochTimer(skip=FIT_SKIP)

    def run() -> float:
        model.fit(dataset, epochs=1, verbose=0, shuffle=False, callbacks=[timer])
        return timer.seconds

    return run


class _EpochTimer(keras.callbacks.Callback):  # type: ignore[misc]
    """Seconds per batch after the epoch's first ``skip`` batches, to the end of the epoch.

    Leaves out fit's set-up and the epoch's first batches (iterator creation, prefetch fill),
    which would dilute the ratio; ``skip`` is one whole accumulation cycle, so the timed
    batches hold whole updates. The clock starts once the skipped batches have finished
    (reading a variable waits for them) and stops when the epoch's logs have been read.
    """

    def __init__(self, skip: int) -> None:
        super().__init__()
        self.skip = skip

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.batches = 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batches += 1
        if self.batches == self.skip:
            self.model.optimizer.iterations.numpy()  # wait for the skipped batches
            self.start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.seconds = (time.perf_counter() - self.start) / (self.batches - self.skip)


def _measure(runners: dict[str, Callable[[], Any]], rounds: int, steps: int) -> dict[str, float]:
    for run in runners.values():
        run()  # trace and warm up
    times: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    for index in range(rounds):
        for name in order[index % len(order) :] + order[: index % len(order)]:
            start = time.perf_counter()
            inner = runners[name]()
            elapsed = time.perf_counter() - start
            # fit runners time their batches themselves (seconds per batch, a float); steps
            # return a loss array.
            times[name].append(inner if isinstance(inner, float) else elapsed / steps)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    if args.steps % 4 or args.steps <= FIT_SKIP:
        parser.error(f"--steps must be a multiple of 4 above {FIT_SKIP} (whole k=4 updates)")

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    tdu.compat.apply_for_strategy(strategy)
    rng = np.random.default_rng(0)
    images = rng.normal(size=(MICRO_BATCH * args.steps, 28, 28)).astype("float32")
    labels = rng.integers(0, 10, size=len(images))
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(MICRO_BATCH).cache()
    batches = list(strategy.experimental_distribute_dataset(dataset))

    runners = {
        "step k=1": _step_runner(strategy, batches, "mlp"),
        "step k=4": _step_runner(strategy, batches, "mlp", accumulation_steps=4),
        "fit k=1": _fit_runner(strategy, dataset, 1),
        "fit k=4": _fit_runner(strategy, dataset, 4),
        "no xla": _step_runner(strategy, batches, "cnn"),
        "xla": _step_runner(strategy, batches, "cnn", jit_compile=True),
    }
    medians = _measure(runners, args.rounds, args.steps)
    for name, value in medians.items():
        print(f"{name:9s} {value * 1e3:7.3f} ms/micro-step")
    for new, old in (("step k=4", "step k=1"), ("fit k=4", "fit k=1"), ("xla", "no xla")):
        print(f"{new} / {old} = {medians[new] / medians[old]:.3f}")
    print(f"keras = {tdu.KERAS_FLAVOUR}, tensorflow = {tf.__version__}")


if __name__ == "__main__":
    main()
