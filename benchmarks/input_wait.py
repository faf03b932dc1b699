"""The input-wait share's cost: timing every fetch inside the step, on vs off, side by side.

For each Keras (Keras 3, and tf_keras through ``TF_USE_LEGACY_KERAS=1``) a child process trains
the throughput benchmark's tiny model (Dense 16-16-1, batch 8, one CPU replica, ~1.3 ms per
step) on a builder dataset, alternating (ABBA) the same ``fit`` with the input clock on (what
every builder dataset does) and off (the iterator left as TensorFlow's). It reports:

- the in-graph cost: steps/s with the clock on / off, without a logger (two timestamps and
  three host-variable updates per step), and the process's CPU time per step on and off (CPU
  time, summed over TensorFlow's threads, is less swayed by other jobs than wall time);
- the ``ThroughputLogger`` hook share at its defaults with the clock on and off (the share
  adds one read of three variables per log point).

    .venv/bin/python benchmarks/input_wait.py            # full run (a few minutes)
    .venv/bin/python benchmarks/input_wait.py --quick    # smaller, for a smoke test

Goals: hook share at the defaults within the logger's budget (<= 1 % of the 1.3 ms step; goal
0.5 % for what the share adds), and no resolvable in-graph cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

CHILD = r"""
import json, os, statistics, sys, tempfile, time
import numpy as np
import tensorflow as tf
import tfdp_utils as tdu
from tfdp_utils._tf import keras
from tfdp_utils.callbacks import ThroughputLogger
from tfdp_utils.data import _input_wait

steps, repeats = int(sys.argv[1]), int(sys.argv[2])
timed_iterator = _input_wait.timed_iterator
strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
x = np.random.default_rng(0).normal(size=(1024, 16)).astype("float32")
source = tf.data.Dataset.from_tensor_slices((x, x[:, :1]))
dist = tdu.build_distributed_dataset(source, strategy=strategy, global_batch_size=8, repeat=True)
with strategy.scope():
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")


def clock(on):
    _input_wait.timed_iterator = timed_iterator if on else (lambda iterator, clock: iterator)


class TimedLogger(ThroughputLogger):
    hook_seconds = 0.0

    def _timed(name):
        def hook(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return getattr(ThroughputLogger, name)(self, *args, **kwargs)
            finally:
                TimedLogger.hook_seconds += time.perf_counter() - start
        return hook

    on_train_begin = _timed("on_train_begin")
    _end_epoch_boundary = _timed("_end_epoch_boundary")
    on_train_batch_end = _timed("on_train_batch_end")
    on_epoch_begin = _timed("on_epoch_begin")
    on_epoch_end = _timed("on_epoch_end")
    on_train_end = _timed("on_train_end")


cpu = {True: [], False: []}  # CPU seconds per step of the process (all threads)


def fit(on, callbacks):
    clock(on)
    start, start_cpu = time.perf_counter(), time.process_time()
    model.fit(dist, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
    if not callbacks:
        cpu[on].append((time.process_time() - start_cpu) / steps)
    return steps / (time.perf_counter() - start)


for on in (True, False):
    fit(on, [])  # trace both
cpu = {True: [], False: []}
result = {"keras": f"{tdu.KERAS_FLAVOUR} {tdu.compat.keras_version()}", "steps": steps,
          "repeats": repeats, "ratio": [], "rate_off": [], "share_on": 0.0, "share_off": 0.0}
fit_seconds = {True: 0.0, False: 0.0}
hooks = {True: 0.0, False: 0.0}
with tempfile.TemporaryDirectory() as root:
    for r in range(repeats):
        order = (True, False) if r % 2 == 0 else (False, True)
        rates = {on: fit(on, []) for on in order}
        result["ratio"].append(rates[True] / rates[False])
        result["rate_off"].append(rates[False])
        for on in order:
            TimedLogger.hook_seconds = 0.0
            rate = fit(on, [TimedLogger(os.path.join(root, f"{on}{r}"))])
            hooks[on] += TimedLogger.hook_seconds
            fit_seconds[on] += steps / rate
    logger = ThroughputLogger(os.path.join(root, "check"))
    clock(True)
    model.fit(dist, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[logger])
result["share_on"], result["share_off"] = (hooks[on] / fit_seconds[on] for on in (True, False))
result["input_wait_share"] = logger.summary()["input_wait_share"]
result["cpu_us_on"] = [1e6 * c for c in cpu[True]]
result["cpu_us_off"] = [1e6 * c for c in cpu[False]]
print("RESULT " + json.dumps(result), flush=True)
"""


def run_child(legacy: bool, steps: int, repeats: int) -> dict[str, Any]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_USE_LEGACY_KERAS", None)
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(steps), str(repeats)],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"benchmark child failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| Keras | steps/s, clock off | steps/s on / off (median; range) "
        "| CPU µs per step, on / off (median) "
        "| logger hook share @defaults, clock on | clock off | share logged |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratios = r["ratio"]
        lines.append(
            f"| {r['keras']} | {statistics.median(r['rate_off']):,.0f} "
            f"| {statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f}) "
            f"| {statistics.median(r['cpu_us_on']):,.0f} "
            f"/ {statistics.median(r['cpu_us_off']):,.0f} "
            f"| {r['share_on']:.2%} | {r['share_off']:.2%} | {r['input_wait_share']:.1%} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps per timed fit")
    parser.add_argument("--repeats", type=int, default=6, help="on/off pairs")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke test")
    parser.add_argument("--json", action="store_true", help="print raw JSON too")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = 300, 2
    started = time.time()
    results = [run_child(legacy, args.steps, args.repeats) for legacy in (False, True)]
    if args.json:
        print(json.dumps(results, indent=2))
    print(markdown(results))
    print(f"\n({time.time() - started:.0f} s; 1 CPU replica, Dense 16-16-1, batch 8)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
