"""Repeat a 2-worker localhost job many times and count the runs whose processes did not exit 0.

Each run starts two workers (TF_CONFIG on 127.0.0.1, MultiWorkerMirroredStrategy from
``tdu.auto_strategy()``) that iterate builder datasets of every source kind in a plain
``for batch in dist:`` loop (tensor slices, text files, ``from_generator``, ``fn(input_context)``,
a partial last batch), then ``fit`` a small model on a builder dataset, print their counts and
exit. A process that aborts at interpreter exit (rc -6, "FATAL: exception not rethrown") or hangs
past the bound counts as a failed run.

    python scripts/exit_repeat.py --runs 30 --flavour keras3
    python scripts/exit_repeat.py --runs 30 --flavour tf_keras

Exits 1 when any run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = r"""
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import tfdp_utils as tdu

keras = tf.keras
data_dir = sys.argv[1]
strategy = tdu.auto_strategy(cluster_timeout=60, verbose=False)


def gen():
    for i in range(19):
        yield {"id": i}


def from_context(context):
    ids = tf.data.Dataset.range(29)
    return ids.shard(context.num_input_pipelines, context.input_pipeline_id).map(
        lambda i: {"id": i}
    )


def parse(line):
    return {"id": tf.strings.to_number(line, tf.int64)}


files = sorted(os.path.join(data_dir, name) for name in os.listdir(data_dir))
signature = {"id": tf.TensorSpec([], tf.int64)}
sources = {
    "tensor_slices": dict(source=tf.data.Dataset.range(23).map(lambda i: {"id": i})),
    "partial_last_batch": dict(source={"id": np.arange(25)}, shuffle_buffer_size=8),
    "text_files": dict(source=files, reader=tf.data.TextLineDataset, map_fn=parse),
    "generator": dict(source=tf.data.Dataset.from_generator(gen, output_signature=signature)),
    "input_fn": dict(source=from_context),
}
steps = {}
for name, kwargs in sources.items():
    dist = tdu.build_distributed_dataset(strategy=strategy, global_batch_size=8, **kwargs)
    steps[name] = sum(1 for _ in dist)
x = np.random.RandomState(0).rand(64, 4).astype("float32")
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
train = tdu.build_distributed_dataset((x, x.sum(1, keepdims=True)), global_batch_size=8)
model.fit(train, epochs=1, verbose=0)
print("RESULT " + json.dumps(steps), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _one_run(script: Path, data_dir: str, flavour: str, timeout: float) -> list[str]:
    """The problems of one run (empty: both workers printed their result and exited 0)."""
    ports = [_free_port(), _free_port()]
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes = []
    for index in range(2):
        env = dict(
            os.environ,
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        )
        if flavour == "tf_keras":
            env["TF_USE_LEGACY_KERAS"] = "1"
        processes.append(
            subprocess.Popen(
                [sys.executable, str(script), data_dir],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    problems = []
    deadline = time.monotonic() + timeout
    for index, process in enumerate(processes):
        try:
            out, err = process.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            return [f"worker {index} did not finish within {timeout:g} s"]
        if process.returncode != 0 or "RESULT " not in out:
            tail = err.strip().splitlines()[-3:]
            problems.append(f"worker {index} exited {process.returncode}: {' | '.join(tail)}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=30, help="runs (default 30)")
    parser.add_argument("--flavour", choices=("keras3", "tf_keras"), default="keras3")
    parser.add_argument("--timeout", type=float, default=180, help="seconds per run (default 180)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "worker.py"
        script.write_text(WORKER)
        data_dir = Path(folder) / "data"
        data_dir.mkdir()
        for index, count in enumerate((5, 9, 3)):
            lines = "\n".join(str(100 * index + j) for j in range(count))
            (data_dir / f"part{index}.txt").write_text(lines + "\n")
        failed = 0
        start = time.monotonic()
        for run in range(args.runs):
            problems = _one_run(script, str(data_dir), args.flavour, args.timeout)
            failed += bool(problems)
            for problem in problems:
                print(f"run {run}: {problem}", flush=True)
        seconds = time.monotonic() - start
    print(f"{args.flavour}: {failed} of {args.runs} runs failed ({seconds:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
