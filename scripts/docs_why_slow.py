"""Regenerate the images of docs/why-slow.md: a real two-worker job with one slow reader.

Two localhost workers (MultiWorkerMirroredStrategy through ``tdu.auto_strategy()``) train with a
ThroughputLogger; worker 1's reader sleeps ``--slow-ms`` before every batch of its share. Then:
``tfdp-utils report LOGDIR`` (printed, for the page) and ``--plot`` into
docs/img/why-slow-report.png, and a TensorBoard server on 127.0.0.1 screenshotted by headless
Chromium (Debian's ``chromium`` package) into docs/img/why-slow-tensorboard.png.

    .venv/bin/python scripts/docs_why_slow.py [--steps 300] [--slow-ms 30]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "docs" / "img"

WORKER = """
import json, os, sys, time
import numpy as np
import tensorflow as tf
import tfdp_utils as tdu
from tfdp_utils._tf import keras

log_dir, steps, slow = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
strategy = tdu.auto_strategy(verbose=False)
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
delay = slow if index == 1 else 0.0


def read(batch):  # stands for a reader: worker 1's storage is slow
    def wait(value):
        time.sleep(delay)
        return value

    out = tf.py_function(wait, [batch], tf.float32)
    out.set_shape(batch.shape)
    return out


n = steps * 64
x = np.random.default_rng(0).normal(size=(n, 32)).astype("float32")
source = (
    tf.data.Dataset.from_tensor_slices(x).batch(32).map(read).unbatch()
    .apply(tf.data.experimental.assert_cardinality(n))
    .map(lambda v: (v, v[:1]))
)
dist = tdu.build_distributed_dataset(source, strategy=strategy, global_batch_size=64)
with strategy.scope():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile("adam", "mse")
logger = tdu.callbacks.ThroughputLogger(log_dir, log_every_n_steps=20)
model.fit(dist, epochs=2, verbose=0, callbacks=[logger])
print("SUMMARY " + json.dumps(logger.summary()), flush=True)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_job(log_dir: str, steps: int, slow: float) -> None:
    ports = [free_port(), free_port()]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    processes = []
    for index in range(2):
        env = dict(
            os.environ,
            TF_CPP_MIN_LOG_LEVEL="2",
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        )
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, log_dir, str(steps), str(slow)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    for process in processes:
        out, _ = process.communicate(timeout=900)
        if process.returncode != 0:
            raise SystemExit(f"a worker failed ({process.returncode}):\n{out[-3000:]}")


def screenshot(log_dir: str, path: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        print("no chromium: skipping the TensorBoard screenshot", file=sys.stderr)
        return
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            log_dir,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(60):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=2)
                break
            except OSError:
                time.sleep(1)
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run(
                [
                    chromium,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    f"--user-data-dir={profile}",
                    "--window-size=1400,1000",
                    "--virtual-time-budget=15000",
                    f"--screenshot={path}",
                    f"http://127.0.0.1:{port}/?darkMode=false#scalars&tagFilter=input%7Csteps_per_sec",
                ],
                check=True,
                timeout=180,
                capture_output=True,
            )
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="steps per epoch")
    parser.add_argument("--slow-ms", type=float, default=30.0, help="worker 1's reader delay")
    args = parser.parse_args()
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as log_dir:
        run_job(log_dir, args.steps, args.slow_ms / 1000)
        cli = [sys.executable, "-m", "tfdp_utils.cli", "report", log_dir]
        subprocess.run([*cli, "--plot", str(IMAGES / "why-slow-report.png")], check=True)
        screenshot(log_dir, IMAGES / "why-slow-tensorboard.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
