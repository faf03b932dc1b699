"""PreemptionCheckpoint: its cost per step, and the time from a notice to every worker's exit.

1. Overhead, side by side in one process per Keras (Keras 3, and tf_keras through
   ``TF_USE_LEGACY_KERAS=1``): a small, fast model (Dense 16-16-1, batch 8, one CPU replica,
   about 1.3 ms per step, so any per-step cost shows) trains on a builder dataset for the same
   epochs with and without ``PreemptionCheckpoint`` (no signal, no periodic save), alternating
   (ABBA). The callback trains on its positioned stream (whole epochs from one iterator), so a
   third setting, that stream without the callback, tells the callback's own cost from the
   stream's. Ratios of steps/s, median over the pairs (1.0 = free).
2. Notice to exit: 2 localhost workers train a 10M-parameter MLP (Adam: 3 copies of every
   weight are saved); SIGTERM goes to worker 1 only, after its warm-up. The parent times from
   sending the signal to both processes' exit (an independent clock), and reads the checkpoint's
   size on disk.

    .venv/bin/python benchmarks/preemption.py            # a few minutes
    .venv/bin/python benchmarks/preemption.py --quick    # smaller, for a smoke test

Goals: ratio >= 0.99 at the logger benchmark's 1.3 ms step; notice to exit within Kubernetes'
default 30 s grace period, with room.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OVERHEAD = r"""
import json, os, statistics, sys, tempfile, time
import numpy as np
import tensorflow as tf
import tfdp_utils as tdu

keras = tf.keras
epochs, repeats = int(sys.argv[1]), int(sys.argv[2])
x = np.random.default_rng(0).normal(size=(2048, 16)).astype("float32")
dist = tdu.build_distributed_dataset(
    (x, x[:, :1]), global_batch_size=8, shuffle_buffer_size=2048, seed=1
)
steps = dist.tfdp_info.steps_per_epoch
stream = dist.tfdp.resumable().at(0, 0, 1)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(dist, epochs=1, verbose=0)  # trace once


def timed(setting, root, r):
    start = time.perf_counter()
    if setting == "with":
        callback = tdu.callbacks.PreemptionCheckpoint(os.path.join(root, f"ck{r}"))
        model.fit(dist, epochs=epochs, verbose=0, callbacks=[callback])
    elif setting == "stream":
        model.fit(stream, epochs=epochs, steps_per_epoch=steps, verbose=0)
    else:
        model.fit(dist, epochs=epochs, verbose=0)
    return epochs * steps / (time.perf_counter() - start)


rates = {"without": [], "with": [], "stream": []}
with tempfile.TemporaryDirectory() as root:
    for r in range(repeats):
        order = ["without", "with", "stream"] if r % 2 == 0 else ["stream", "with", "without"]
        for setting in order:
            rates[setting].append(timed(setting, root, r))
result = {
    "keras": f"{tdu.KERAS_FLAVOUR} {tdu.compat.keras_version()}",
    "steps": epochs * steps,
    "rates": rates,
    "with_over_without": statistics.median(
        a / b for a, b in zip(rates["with"], rates["without"])
    ),
    "with_over_stream": statistics.median(a / b for a, b in zip(rates["with"], rates["stream"])),
}
print("RESULT " + json.dumps(result), flush=True)
"""

BIG = r"""
import os, sys, time
import numpy as np
import tensorflow as tf
import tfdp_utils as tdu

keras = tf.keras
directory = sys.argv[1]
strategy = tdu.auto_strategy(verbose=False)
x = np.random.default_rng(0).normal(size=(4096, 1000)).astype("float32")
dist = tdu.build_distributed_dataset(
    (x, x[:, :1]), strategy=strategy, global_batch_size=32, shuffle_buffer_size=512, seed=1
)
with strategy.scope():
    model = keras.Sequential(
        [keras.Input((1000,)), keras.layers.Dense(3300), keras.layers.Dense(2000),
         keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.Adam(1e-4), "mse")
print("PARAMS", model.count_params(), flush=True)


class Ready(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 5:
            print("READY", flush=True)


checkpoint = tdu.callbacks.PreemptionCheckpoint(directory)
model.fit(dist, epochs=50, verbose=0, callbacks=[Ready(), checkpoint])
"""


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(legacy: bool) -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_USE_LEGACY_KERAS", None)
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


def overhead(legacy: bool, epochs: int, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run(
            [sys.executable, "-c", OVERHEAD, str(epochs), str(repeats)],
            env=_env(legacy),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"benchmark child failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


def notice_to_exit(legacy: bool) -> dict[str, Any]:
    """One 2-worker run: SIGTERM to worker 1 once both trained 6 steps; seconds to both exits."""
    ports = [_port(), _port()]
    with tempfile.TemporaryDirectory() as root:
        directory = Path(root) / "checkpoints"
        processes, outs = [], []
        for index in range(2):
            env = _env(legacy)
            env["TF_CONFIG"] = json.dumps(
                {
                    "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                    "task": {"type": "worker", "index": index},
                }
            )
            out = Path(root) / f"{index}.out"
            outs.append(out)
            with out.open("w") as handle:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-c", BIG, str(directory)],
                        env=env,
                        stdout=handle,
                        stderr=subprocess.STDOUT,
                    )
                )
        deadline = time.monotonic() + 600
        while not all("READY" in out.read_text() for out in outs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                for p in processes:
                    p.kill()
                raise RuntimeError("the 2-worker job did not start:\n" + outs[0].read_text())
            time.sleep(0.05)
        sent = time.monotonic()
        processes[1].send_signal(signal.SIGTERM)
        ends = []
        for p in processes:
            p.wait(timeout=300)
            ends.append(time.monotonic() - sent)
        size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
        params = next(
            int(line.split()[1])
            for line in outs[0].read_text().splitlines()
            if line.startswith("PARAMS")
        )
        return {
            "status": [p.returncode for p in processes],
            "seconds": max(ends),
            "bytes": size,
            "params": params,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12, help="epochs (256 steps) per timing")
    parser.add_argument("--repeats", type=int, default=6, help="rounds of the three settings")
    parser.add_argument("--exits", type=int, default=3, help="2-worker notice runs per Keras")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.repeats, args.exits = 2, 2, 1
    started = time.time()
    print("| Keras | steps/s without | with | stream alone | with / without | with / stream |")
    print("|---|---|---|---|---|---|")
    for legacy in (False, True):
        r = overhead(legacy, args.epochs, args.repeats)
        med = {k: statistics.median(v) for k, v in r["rates"].items()}
        print(
            f"| {r['keras']} | {med['without']:,.0f} | {med['with']:,.0f} | "
            f"{med['stream']:,.0f} | **{r['with_over_without']:.3f}** | "
            f"**{r['with_over_stream']:.3f}** |",
            flush=True,
        )
    print()
    print("| Keras | parameters | checkpoint on disk | notice to both exits (runs) | status |")
    print("|---|---|---|---|---|")
    for legacy in (False, True):
        runs = [notice_to_exit(legacy) for _ in range(args.exits)]
        seconds = ", ".join(f"{run['seconds']:.1f} s" for run in runs)
        print(
            f"| {'tf_keras' if legacy else 'keras3'} | {runs[0]['params']:,} | "
            f"{runs[0]['bytes'] / 2**20:.0f} MB | {seconds} | "
            f"{sorted({s for run in runs for s in run['status']})} |",
            flush=True,
        )
    print(f"\n({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
