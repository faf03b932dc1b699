"""diagnose_input: its own run time at the defaults, and its verdict, on known fixtures.

Two fixtures on 2 replicas (MirroredStrategy over 2 logical CPUs), each a Dense 8-16-1 model
whose train step sleeps (a numpy_function) and a pipeline of global batches of 64 whose map
sleeps per batch:

- input-bound: 100 ms per batch, 10 ms per step (per replica);
- compute-bound: 10 ms per batch, 50 ms per step (per replica).

``tdu.diagnose_input(model, dataset)`` runs at its defaults (steps=20, max_seconds=10) in a fresh
process per Keras (Keras 3, and tf_keras through ``TF_USE_LEGACY_KERAS=1``); the parent's clock
around the call is its run time, tracing included (the first call on a fresh model, as a user
would meet it), then a second call on the same model (traced already).

    .venv/bin/python benchmarks/diagnose_input.py

Goal: <= 15 s per call at the defaults; input-bound said on the first fixture only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, time
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tfdp_utils as tdu
from tfdp_utils._tf import keras

X = np.random.default_rng(0).random((4096, 8), dtype=np.float32)


def sleep_op(seconds):
    def sleep():
        time.sleep(seconds)
        return np.int32(0)
    return tf.numpy_function(sleep, [], tf.int32)


def slow(seconds):
    def identity(x, y):
        with tf.control_dependencies([sleep_op(seconds)]):
            return tf.identity(x), tf.identity(y)
    return identity


class SlowStepModel(keras.Model):
    step_seconds = 0.0

    def train_step(self, data):
        sleep_op(self.step_seconds)
        return super().train_step(data)


strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
results = []
fixtures = [("input-bound", 0.1, 0.01), ("compute-bound", 0.01, 0.05)]
for name, batch_seconds, step_seconds in fixtures:
    with strategy.scope():
        inputs = keras.Input((8,))
        outputs = keras.layers.Dense(1)(keras.layers.Dense(16, activation="relu")(inputs))
        model = SlowStepModel(inputs, outputs)
        model.step_seconds = step_seconds
        model.compile(optimizer="adam", loss="mse", jit_compile=False)
    dataset = (
        tf.data.Dataset.from_tensor_slices((X, X[:, :1])).repeat().batch(64)
        .map(slow(batch_seconds)).prefetch(tf.data.AUTOTUNE)
    )
    times = []
    for _ in range(2):
        start = time.perf_counter()
        report = tdu.diagnose_input(model, dataset)
        times.append(time.perf_counter() - start)
    results.append({
        "fixture": name,
        "first_call_s": times[0],
        "second_call_s": times[1],
        "input_bound": report.input_bound,
        "factor": report.factor,
        "input": report.input_examples_per_sec,
        "model": report.model_examples_per_sec,
        "together": report.training_examples_per_sec,
        "steps": report.steps,
        "bottleneck": report.bottleneck,
        "advice": [a.kind for a in report.advice],
        "keras": tdu.KERAS_FLAVOUR,
    })
    if name == "input-bound":
        print("SUMMARY_BEGIN\n" + report.summary() + "\nSUMMARY_END", flush=True)
print("RESULT " + json.dumps(results), flush=True)
"""


def run(legacy: bool) -> tuple[list[dict[str, object]], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.pop("TF_USE_LEGACY_KERAS", None)
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(Path(__file__).resolve().parents[1]),
        check=False,
    )
    if done.returncode:
        raise SystemExit(done.stderr[-4000:])
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    summary = done.stdout.split("SUMMARY_BEGIN\n", 1)[1].split("\nSUMMARY_END", 1)[0]
    return json.loads(line[len("RESULT ") :]), summary


def main() -> None:
    rows = []
    for legacy in (False, True):
        results, summary = run(legacy)
        rows.extend(results)
        print(summary, end="\n\n")
    print(
        "| Keras | fixture | first call | second call | verdict | factor | input | model "
        "| together | steps | slow stage | advice |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        verdict = "input-bound" if r["input_bound"] else "not input-bound"
        print(
            f"| {r['keras']} | {r['fixture']} | {r['first_call_s']:.1f} s | "
            f"{r['second_call_s']:.1f} s | {verdict} | {r['factor']:.2f} | {r['input']:,.0f} | "
            f"{r['model']:,.0f} | {r['together']:,.0f} | {tuple(r['steps'])} | "  # type: ignore[arg-type]
            f"{r['bottleneck'] or '-'} | {', '.join(r['advice'])} |"  # type: ignore[arg-type]
        )


if __name__ == "__main__":
    main()
