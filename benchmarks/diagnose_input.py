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

Two more fixtures, the cases issue 32 found wrong (``--cases``; ``--code DIR`` runs them on
another checkout of tfdp-utils, e.g. the code before the change, for a before/after):

- in-memory builder: 512 examples in memory through ``build_distributed_dataset`` (batches of
  64, 8 steps an epoch), the step sleeping 5 ms per replica; the verdict against ``fit``'s own:
  the epochs after the first of ``fit(epochs=10)`` on the builder dataset over the same on the
  batches held in memory (a callback's clock at each epoch's begin and end, best of 2);
- slow generator: a Python generator that sleeps 1 s per example, batches of 4, one replica,
  ``max_seconds=4``: the parent's clock around the call (the promise: <= 1.2x max_seconds).

    .venv/bin/python benchmarks/diagnose_input.py --cases [--code DIR]
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
        "cached": report.cached_examples_per_sec,
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


CASES = r"""
import json, time
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tfdp_utils as tdu
from tfdp_utils._tf import keras

X = np.random.default_rng(0).random((512, 8), dtype=np.float32)
Y = X[:, :1] * 2.0


def sleep_op(seconds):
    def sleep():
        time.sleep(seconds)
        return np.int32(0)
    return tf.numpy_function(sleep, [], tf.int32)


class SlowStepModel(keras.Model):
    step_seconds = 0.0

    def train_step(self, data):
        if self.step_seconds:
            sleep_op(self.step_seconds)
        return super().train_step(data)


def model_on(strategy, step_seconds):
    with strategy.scope():
        inputs = keras.Input((8,))
        outputs = keras.layers.Dense(1)(keras.layers.Dense(16, activation="relu")(inputs))
        model = SlowStepModel(inputs, outputs)
        model.step_seconds = step_seconds
        model.compile(optimizer="adam", loss="mse", jit_compile=False)
    return model


class EpochClock(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.spans = []

    def on_epoch_begin(self, epoch, logs=None):
        self.begin = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.spans.append(time.perf_counter() - self.begin)


def fit_seconds(model, dataset, steps=None):
    best = []
    for _ in range(2):
        clock = EpochClock()
        model.fit(dataset, epochs=10, steps_per_epoch=steps, verbose=0, callbacks=[clock])
        best.append(sum(clock.spans[1:]))
    return min(best)


results = []
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
model = model_on(strategy, 0.005)
dist = tdu.build_distributed_dataset(
    (X, Y), strategy=strategy, global_batch_size=64, shuffle_buffer_size=512, seed=1
)
start = time.perf_counter()
report = tdu.diagnose_input(model, dist)
seconds = time.perf_counter() - start
in_memory = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((X, Y)).batch(64).cache().repeat()
)
ratio = fit_seconds(model, dist) / fit_seconds(model, in_memory, steps=8)
results.append({"fixture": "in-memory builder", "seconds": seconds,
                "input_bound": report.input_bound, "factor": report.factor,
                "fit_ratio": ratio, "bottleneck": report.bottleneck,
                "advice": [a.kind for a in report.advice], "keras": tdu.KERAS_FLAVOUR})


def examples():
    for index in range(len(X)):
        time.sleep(1.0)
        yield X[index], Y[index]


spec = (tf.TensorSpec((8,), tf.float32), tf.TensorSpec((1,), tf.float32))
slow = tf.data.Dataset.from_generator(examples, output_signature=spec).batch(4)
model = model_on(tf.distribute.MirroredStrategy(["/cpu:0"]), 0.0)
start = time.perf_counter()
report = tdu.diagnose_input(model, slow, max_seconds=4)
seconds = time.perf_counter() - start
results.append({"fixture": "slow generator", "seconds": seconds,
                "input_bound": report.input_bound, "factor": report.factor, "fit_ratio": None,
                "bottleneck": report.bottleneck, "advice": [a.kind for a in report.advice],
                "keras": tdu.KERAS_FLAVOUR})
print("RESULT " + json.dumps(results), flush=True)
"""


def run_cases(legacy: bool, code: Path) -> list[dict[str, object]]:
    """The issue's two cases in a fresh process, on the tfdp-utils checkout at ``code``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.pop("TF_USE_LEGACY_KERAS", None)
    env["PYTHONPATH"] = str(code)
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", CASES],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=str(code),
        check=False,
    )
    if done.returncode:
        raise SystemExit(done.stderr[-4000:])
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    results: list[dict[str, object]] = json.loads(line[len("RESULT ") :])
    return results


def main_cases(code: Path) -> None:
    print(f"code: {code}")
    print("| Keras | fixture | call | verdict | factor | fit's own ratio | slow stage | advice |")
    print("|---|---|---|---|---|---|---|---|")
    for legacy in (False, True):
        for r in run_cases(legacy, code):
            verdict = {True: "input-bound", False: "not input-bound", None: "undetermined"}[
                r["input_bound"]  # type: ignore[index]
            ]
            factor = "-" if r["factor"] is None else f"{r['factor']:.2f}"
            ratio = "-" if r["fit_ratio"] is None else f"{r['fit_ratio']:.2f}"
            print(
                f"| {r['keras']} | {r['fixture']} | {r['seconds']:.1f} s | {verdict} | {factor} "
                f"| {ratio} | {r['bottleneck'] or '-'} | {', '.join(r['advice'])} |"  # type: ignore[arg-type]
            )


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
        "| cached | together | steps | slow stage | advice |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        verdict = "input-bound" if r["input_bound"] else "not input-bound"
        print(
            f"| {r['keras']} | {r['fixture']} | {r['first_call_s']:.1f} s | "
            f"{r['second_call_s']:.1f} s | {verdict} | {r['factor']:.2f} | {r['input']:,.0f} | "
            f"{r['model']:,.0f} | {r['cached']:,.0f} | {r['together']:,.0f} | "
            f"{tuple(r['steps'])} | "  # type: ignore[arg-type]
            f"{r['bottleneck'] or '-'} | {', '.join(r['advice'])} |"  # type: ignore[arg-type]
        )


if __name__ == "__main__":
    if "--cases" in sys.argv:
        at = sys.argv.index("--code") + 1 if "--code" in sys.argv else 0
        main_cases(Path(sys.argv[at]).resolve() if at else Path(__file__).resolve().parents[1])
    else:
        main()
