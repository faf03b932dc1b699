"""ThroughputLogger and DivergenceGuard overhead, measured side by side in one process per Keras.

For each Keras (Keras 3, and tf_keras through ``TF_USE_LEGACY_KERAS=1``) a child process
trains a small, fast model on one CPU replica and times ``fit`` over the same number of
steps with and without a ThroughputLogger, alternating (ABBA) so drift in machine load hits
both alike. It reports the median ratio of steps/s (with / without; 1.0 = free) at the
defaults and at ``log_every_n_steps`` 1, 10 and 100, then the growth of the resident set
over a long run with the logger at its defaults. DivergenceGuard (its cost is inside the step)
is timed on two models built alike, one guarded, ABBA: the ratio of steps/s by wall clock and
by the process's CPU time.

    .venv/bin/python benchmarks/callbacks.py            # full run (a few minutes)
    .venv/bin/python benchmarks/callbacks.py --quick    # smaller, for a smoke test

Goals: ratio >= 0.99 at the defaults (logger and guard); RSS growth over 20k steps <= 5 MB.
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
import gc, json, os, statistics, sys, tempfile, time
import numpy as np
import tensorflow as tf
import tfdp_utils as tdu
from tfdp_utils.callbacks import ThroughputLogger

keras = tf.keras
KERAS_FLAVOUR, KERAS_VERSION = tdu.KERAS_FLAVOUR, tdu.compat.keras_version()

steps, repeats, rss_steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
x = np.random.default_rng(0).normal(size=(1024, 16)).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).repeat().batch(8).prefetch(8)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(ds, epochs=1, steps_per_epoch=200, verbose=0)  # trace once


def rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class TimedLogger(ThroughputLogger):
    # Adds up the host time spent inside the logger's own hooks.

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
    _end_epoch_boundary = _timed("_end_epoch_boundary")  # the batch-begin hook, per epoch
    on_train_batch_end = _timed("on_train_batch_end")
    on_epoch_begin = _timed("on_epoch_begin")
    on_epoch_end = _timed("on_epoch_end")
    on_train_end = _timed("on_train_end")


def timed(callbacks, n):
    start = time.perf_counter()
    model.fit(ds, epochs=1, steps_per_epoch=n, verbose=0, callbacks=callbacks)
    return n / (time.perf_counter() - start)


configs = {"defaults": {}, "every_1": {"log_every_n_steps": 1},
           "every_10": {"log_every_n_steps": 10}, "every_100": {"log_every_n_steps": 100}}
result = {"keras": f"{KERAS_FLAVOUR} {KERAS_VERSION}", "steps": steps, "repeats": repeats,
          "ratios": {}, "hook_share": {}, "steps_per_sec_without": []}
with tempfile.TemporaryDirectory() as root:
    for name, kwargs in configs.items():
        ratios = []
        hook_seconds, fit_seconds = 0.0, 0.0
        for r in range(repeats):
            log_dir = os.path.join(root, f"{name}_{r}")
            make = lambda: [TimedLogger(log_dir, global_batch_size=8, **kwargs)]
            TimedLogger.hook_seconds = 0.0
            if r % 2 == 0:
                without = timed([], steps)
                with_logger = timed(make(), steps)
            else:
                with_logger = timed(make(), steps)
                without = timed([], steps)
            ratios.append(with_logger / without)
            hook_seconds += TimedLogger.hook_seconds
            fit_seconds += steps / with_logger
            result["steps_per_sec_without"].append(without)
        result["ratios"][name] = {"median": statistics.median(ratios), "all": ratios}
        # The logger's own share of the fit time: less sensitive to machine load than ratios.
        result["hook_share"][name] = hook_seconds / fit_seconds

    # DivergenceGuard: its cost is inside the step (checks, one cond, variable writes), so it
    # is timed on two models built alike, one guarded; wall and process CPU time per step.
    from tfdp_utils.callbacks import DivergenceGuard

    def fresh():
        m = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16), keras.layers.Dense(1)])
        m.compile(optimizer="sgd", loss="mse")
        return m

    plain, guarded, guard = fresh(), fresh(), DivergenceGuard()
    plain.fit(ds, epochs=1, steps_per_epoch=200, verbose=0)
    guarded.fit(ds, epochs=1, steps_per_epoch=200, verbose=0, callbacks=[guard])

    def timed_guard(m, callbacks, n):
        wall, cpu = time.perf_counter(), time.process_time()
        m.fit(ds, epochs=1, steps_per_epoch=n, verbose=0, callbacks=callbacks)
        return n / (time.perf_counter() - wall), n / (time.process_time() - cpu)

    walls, cpus, base = [], [], []
    for r in range(repeats):
        if r % 2 == 0:  # ABBA
            without = timed_guard(plain, [], steps)
            with_guard = timed_guard(guarded, [guard], steps)
        else:
            with_guard = timed_guard(guarded, [guard], steps)
            without = timed_guard(plain, [], steps)
        walls.append(with_guard[0] / without[0])
        cpus.append(with_guard[1] / without[1])
        base.append(without[0])
    result["guard"] = {"median": statistics.median(walls), "all": walls,
                       "cpu_median": statistics.median(cpus), "cpu_all": cpus,
                       "steps_per_sec_without": statistics.median(base)}

    # Memory: one long fit with the logger at its defaults, after a warm-up fit with it.
    logger = ThroughputLogger(os.path.join(root, "rss"), global_batch_size=8)
    model.fit(ds, epochs=1, steps_per_epoch=2000, verbose=0, callbacks=[logger])
    gc.collect()
    before = rss()
    model.fit(ds, epochs=1, steps_per_epoch=rss_steps, verbose=0, callbacks=[logger])
    gc.collect()
    result["rss_growth_bytes"] = rss() - before
    model.fit(ds, epochs=1, steps_per_epoch=2000, verbose=0)
    gc.collect()
    before = rss()
    model.fit(ds, epochs=1, steps_per_epoch=rss_steps, verbose=0)
    gc.collect()
    result["rss_growth_bytes_without"] = rss() - before
    result["rss_steps"] = rss_steps
print("RESULT " + json.dumps(result), flush=True)
"""


def run_child(legacy: bool, steps: int, repeats: int, rss_steps: int) -> dict[str, Any]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_USE_LEGACY_KERAS", None)
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(steps), str(repeats), str(rss_steps)],
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
    keys = ("defaults", "every_1", "every_10", "every_100")
    lines = [
        "| Keras | steps/s without | ratio @defaults | @every 1 | @every 10 | @every 100 "
        "| logger hook share @defaults / 1 / 10 / 100 | RSS growth with | RSS growth without |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        base = statistics.median(r["steps_per_sec_without"])
        ratios = " | ".join(f"{r['ratios'][k]['median']:.3f}" for k in keys)
        shares = " / ".join(f"{r['hook_share'][k]:.2%}" for k in keys)
        grow = r["rss_growth_bytes"] / 2**20
        grow_without = r["rss_growth_bytes_without"] / 2**20
        lines.append(
            f"| {r['keras']} | {base:,.0f} | {ratios} | {shares} "
            f"| {grow:+.2f} MB over {r['rss_steps']:,} steps | {grow_without:+.2f} MB |"
        )
    lines += [
        "",
        "| Keras | steps/s without | DivergenceGuard ratio, wall (median) | ratio, CPU time "
        "(median) | wall ratios | CPU ratios |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        g = r["guard"]
        lines.append(
            f"| {r['keras']} | {g['steps_per_sec_without']:,.0f} | {g['median']:.3f} "
            f"| {g['cpu_median']:.3f} | {' '.join(f'{x:.2f}' for x in g['all'])} "
            f"| {' '.join(f'{x:.2f}' for x in g['cpu_all'])} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000, help="steps per timed fit")
    parser.add_argument("--repeats", type=int, default=4, help="with/without pairs per setting")
    parser.add_argument("--rss-steps", type=int, default=20000, help="steps of the memory run")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke test")
    parser.add_argument("--json", action="store_true", help="print raw JSON too")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats, args.rss_steps = 400, 2, 1000
    started = time.time()
    results = [
        run_child(legacy, args.steps, args.repeats, args.rss_steps) for legacy in (False, True)
    ]
    if args.json:
        print(json.dumps(results, indent=2))
    print(markdown(results))
    print(f"\n({time.time() - started:.0f} s; 1 CPU replica, Dense 16-16-1, batch 8)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
