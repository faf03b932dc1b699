"""Cost of bounding multi-worker collectives: tfdp-utils' watchdog vs TensorFlow's own timeout.

Three 2-worker localhost jobs (TF_CONFIG on 127.0.0.1), the same small Keras model and
``model.fit`` of STEPS steps each, one after another in one run:

- ``none``: ``auto_strategy(collective_timeout=None)``, no bound;
- ``watchdog``: ``auto_strategy(collective_timeout=300)``, tfdp-utils' CollectiveWatchdog;
- ``tf_timeout``: MultiWorkerMirroredStrategy built by hand with
  ``CommunicationOptions(timeout_seconds=300)``, TensorFlow's per-collective timeout.

Each worker reports its steps/s after a warm-up and its thread count at the end.

Run:  python benchmarks/scale_out.py [--steps 600]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import textwrap

WORKER = r"""
import json, os, sys, time
import numpy as np
import tfdp_utils as tdu
import tensorflow as tf

keras = tf.keras

mode = os.environ["MODE"]
if mode == "tf_timeout":
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        timeout_seconds=300,
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    tdu.compat.apply_for_strategy(strategy)
else:
    strategy = tdu.auto_strategy(
        cluster_timeout=60, collective_timeout=300 if mode == "watchdog" else None
    )
x = np.random.RandomState(0).rand(4096, 8).astype("float32")
y = x.sum(1, keepdims=True)
dist = tdu.build_distributed_dataset((x, y), strategy=strategy, global_batch_size=16, repeat=True)
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
steps, warmup = int(os.environ["STEPS"]), 50
marks = {}

class Clock(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 in (warmup, steps):
            marks[batch + 1] = time.perf_counter()

model.fit(dist, epochs=1, steps_per_epoch=steps, callbacks=[Clock()], verbose=0)
threads = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("Threads")))
rate = (steps - warmup) / (marks[steps] - marks[warmup])
print("RESULT " + json.dumps({"steps_per_sec": rate, "threads": threads}), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(mode: str, steps: int) -> list[dict[str, float]]:
    ports = [_free_port(), _free_port()]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    processes = []
    for index in range(2):
        env = dict(os.environ, MODE=mode, STEPS=str(steps), TF_CPP_MIN_LOG_LEVEL="2")
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}
        )
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(WORKER)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=600)
            line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
            if process.returncode != 0 or line is None:
                raise RuntimeError(
                    f"{mode} worker failed (rc={process.returncode}):\n{err[-3000:]}"
                )
            results.append(json.loads(line[len("RESULT ") :]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    summary = {}
    for mode in ("none", "watchdog", "tf_timeout"):
        workers = run(mode, args.steps)
        summary[mode] = {
            "steps_per_sec": min(w["steps_per_sec"] for w in workers),
            "threads": max(w["threads"] for w in workers),
        }
        print(mode, json.dumps(summary[mode]), flush=True)
    base = summary["none"]["steps_per_sec"]
    for mode in ("watchdog", "tf_timeout"):
        print(
            f"{mode}/none steps per second: {summary[mode]['steps_per_sec']:.1f} / {base:.1f} = "
            f"{summary[mode]['steps_per_sec'] / base:.3f}; threads at the end: "
            f"{summary[mode]['threads']} (none: {summary['none']['threads']})"
        )


if __name__ == "__main__":
    main()
