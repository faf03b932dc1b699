"""DivergenceGuard's cost inside the step, side by side: a plain model against a guarded twin.

Run: python benchmarks/guard_step.py [--widths N ...] [--batch N] [--windows N] [--steps N]
(and again with TF_USE_LEGACY_KERAS=1 for tf_keras).

Twin models built alike (Dense 16-width-1, SGD, one CPU replica: with the default width 16
and batch 8, ``benchmarks/callbacks.py``'s model), one plain and one with ``DivergenceGuard``'s
update at its defaults installed directly (its cost is in the step, not in the callback's
hooks). Each window is a ``fit`` of ``--steps`` steps; the two take turns window by window,
in an order that alternates, so load from other jobs hits both alike. Load only slows a
window, so each figure is the mean of the fastest tenth of a model's windows, in µs per step
by wall clock and by the process's CPU time; the ratio is steps/s guarded / plain.

``--widths 16`` is ``benchmarks/callbacks.py``'s tiny step. A slower step comes from a wider
model (more weights: the guard's per-gradient sums grow with them) or a larger batch (more
work on the same weights: the guard's cost stays put); pick the width or batch whose plain
step takes the time you want (the plain figure is printed).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import tfdp_utils as tdu
from tfdp_utils.training._guarded_update import GuardedUpdate

keras = tf.keras


def build(width: int) -> Any:
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(width), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def guarded(width: int) -> Any:
    model = build(width)
    guard = GuardedUpdate(
        model.optimizer,
        model.trainable_variables,
        strategy=tf.distribute.get_strategy(),
        policy="stop",
        max_skipped_steps=10,
        check_replicas_every=1000,
    )
    guard.install(applied_by="benchmarks/guard_step.py")
    guard.reset()
    return model


def fastest_tenth(values: list[float]) -> float:
    values = sorted(values)
    share = values[: max(1, len(values) // 10)]
    return sum(share) / len(share)


def measure(data: Any, width: int, windows: int, steps: int, batch: int) -> None:
    keras.utils.set_random_seed(0)
    models = {"plain": build(width), "guarded": guarded(width)}
    for model in models.values():  # trace, warm up
        model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    walls: dict[str, list[float]] = {name: [] for name in models}
    cpus: dict[str, list[float]] = {name: [] for name in models}
    for window in range(windows):
        for name in list(models) if window % 2 == 0 else list(models)[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            models[name].fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
            walls[name].append((time.perf_counter() - wall) / steps * 1e6)
            cpus[name].append((time.process_time() - cpu) / steps * 1e6)
    plain = fastest_tenth(walls["plain"]), fastest_tenth(cpus["plain"])
    guard = fastest_tenth(walls["guarded"]), fastest_tenth(cpus["guarded"])
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    print(
        f"| {tdu.KERAS_FLAVOUR} {tdu.compat.keras_version()} | {width} | {batch} "
        f"| {18 * width + 1:,} "
        f"| {plain[0]:.0f} / {plain[1]:.0f} | {guard[0] - plain[0]:+.0f} / "
        f"{guard[1] - plain[1]:+.0f} | **{plain[0] / guard[0]:.3f}** / "
        f"{plain[1] / guard[1]:.3f} | {load} |",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[16], help="hidden widths")
    parser.add_argument("--batch", type=int, default=8, help="batch size")
    parser.add_argument("--windows", type=int, default=40, help="fits per model")
    parser.add_argument("--steps", type=int, default=300, help="steps per fit")
    args = parser.parse_args()
    x = np.random.default_rng(0).normal(size=(1024, 16)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).repeat().batch(args.batch)
    data = data.prefetch(8)
    print(f"{args.windows} windows of {args.steps} steps per model, fastest tenth")
    print(
        "| Keras | width | batch | weights | plain µs per step, wall / CPU "
        "| guard adds, wall / CPU | ratio of steps/s, wall / CPU "
        "| load average (1, 5, 15 min) at the end |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for width in args.widths:
        measure(data, width, args.windows, args.steps, args.batch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
