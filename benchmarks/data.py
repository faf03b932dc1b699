"""Benchmark of build_distributed_dataset against a naive and a hand-tuned tf.data pipeline.

Uses the artificial fixture of the tf.data performance guide
(https://www.tensorflow.org/guide/data_performance): opening a file takes 0.03 s, reading
each element 0.015 s, and each training step 0.01 s, all as sleeps, so the figures measure
overlap and parallelism rather than this machine's CPU. All pipelines read the same files and
yield the same examples; they are timed side by side in one run and reported as ratios.

A second part starts 2 localhost workers (TF_CONFIG + MultiWorkerMirroredStrategy) and
counts the bytes each worker's reader actually reads with shard_policy "file" and "data".

A third part times one epoch over 2 logical CPUs (MirroredStrategy), 5980 examples of 28x28
(93 full steps of 64 and 28 left), the builder (each step cut into replica batches, the last
split 14 + 14) against tf.data's own per-replica batching (28 + 0), with no step and with a
0.01 s step.

Run: ``.venv/bin/python benchmarks/data.py`` (about 4 minutes; ``--only-split`` runs the third
part alone). ``--json`` prints raw figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

OPEN_S = 0.03
ELEMENT_S = 0.015
STEP_S = 0.01
NUM_FILES = 8
ELEMENTS_PER_FILE = 10
BATCH = 4
EPOCHS = 2
REPEATS = 5


def artificial_reader(path: Any) -> Any:
    """The guide's ArtificialDataset: a file that is slow to open and slow to read."""
    import tensorflow as tf

    def generate(name: bytes) -> Any:
        time.sleep(OPEN_S)  # opening the file
        for index in range(ELEMENTS_PER_FILE):
            time.sleep(ELEMENT_S)  # reading one record
            yield index

    return tf.data.Dataset.from_generator(
        generate, output_signature=tf.TensorSpec([], tf.int64), args=(path,)
    )


def train(dataset: Any) -> int:
    """The guide's training loop: 0.01 s per step. Returns the examples seen."""
    seen = 0
    for _ in range(EPOCHS):
        for batch in dataset:
            values = batch.values if hasattr(batch, "values") else (batch,)
            seen += sum(int(v.shape[0]) for v in values)
            time.sleep(STEP_S)
    return seen


def pipelines(paths: list[str]) -> dict[str, Any]:
    import tensorflow as tf

    import tfdp_utils as tdu

    # autograph cannot convert the generator inside; it needs no conversion.
    reader = tf.autograph.experimental.do_not_convert(artificial_reader)

    def naive() -> Any:
        files = tf.data.Dataset.from_tensor_slices(paths)
        return files.flat_map(reader).batch(BATCH)

    def hand_tuned() -> Any:
        files = tf.data.Dataset.from_tensor_slices(paths)
        dataset = files.interleave(
            reader,
            cycle_length=len(paths),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=False,
        )
        return dataset.batch(BATCH).prefetch(tf.data.AUTOTUNE)

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")

    def builder() -> Any:
        return tdu.build_distributed_dataset(
            paths, strategy=strategy, global_batch_size=BATCH, reader=reader
        )

    # The comparison that matters: the same strategy distributes every pipeline. The plain
    # tf.data rows show what the distribution layer itself costs.
    return {
        "naive": lambda: strategy.experimental_distribute_dataset(naive()),
        "hand_tuned": lambda: strategy.experimental_distribute_dataset(hand_tuned()),
        "builder": builder,
        "naive_plain_tf_data": naive,
        "hand_tuned_plain_tf_data": hand_tuned,
    }


def time_pipelines(paths: list[str]) -> dict[str, dict[str, Any]]:
    makers = pipelines(paths)
    expected = EPOCHS * NUM_FILES * ELEMENTS_PER_FILE
    times: dict[str, list[float]] = {name: [] for name in makers}
    for _ in range(REPEATS):
        for name, make in makers.items():  # interleaved, so drift hits all alike
            dataset = make()
            start = time.perf_counter()
            seen = train(dataset)
            times[name].append(time.perf_counter() - start)
            if seen != expected:
                raise RuntimeError(f"{name} yielded {seen} examples, expected {expected}")
    return {
        name: {"median_s": statistics.median(values), "runs_s": values}
        for name, values in times.items()
    }


WORKER = r"""
import json, os, sys, threading
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
import tfdp_utils as tdu

paths = json.loads(sys.argv[1])
options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=120)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
lock = threading.Lock()
read = {"bytes": 0}

def count(size):
    with lock:
        read["bytes"] += int(size)
    return size

def counting_reader(path):
    records = tf.data.TFRecordDataset(path)
    return records.map(lambda r: tf.py_function(count, [tf.strings.length(r)], tf.int32))

out = {}
for policy in ("file", "data"):
    read["bytes"] = 0
    dist = tdu.build_distributed_dataset(
        paths, strategy=strategy, global_batch_size=8, reader=counting_reader,
        shard_policy=policy)
    trained = 0
    for batch in dist:
        trained += sum(int(v.shape[0]) for v in strategy.experimental_local_results(batch))
    out[policy] = {"bytes_read": read["bytes"], "examples_trained": trained}
print("RESULT " + json.dumps(out), flush=True)
"""


SPLIT = r"""
import json, os, statistics, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tfdp_utils as tdu

n, batch, rounds, step_s = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                            float(sys.argv[4]))
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
x = np.random.default_rng(0).random((n, 28, 28, 1), dtype=np.float32)
y = np.arange(n, dtype=np.int64)
per_replica = batch // 2

def by_hand():
    # tf.data's per-replica batching: replicas take whole batches in order (last: 28 + 0).
    def fn(context):
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        return ds.batch(per_replica).prefetch(tf.data.AUTOTUNE)
    return strategy.distribute_datasets_from_function(fn)

def builder():
    return tdu.build_distributed_dataset((x, y), strategy=strategy, global_batch_size=batch)

def epoch(dist):
    start = time.perf_counter()
    last = None
    for images, ids in dist:
        last = [int(v.shape[0]) for v in strategy.experimental_local_results(ids)]
        if step_s:
            time.sleep(step_s)
    return time.perf_counter() - start, last

makers = {"by_hand": by_hand, "builder": builder}
for make in makers.values():
    epoch(make())  # warm up
times = {name: [] for name in makers}
last = {}
ratios = []
for index in range(rounds):
    # Alternate the order: on a shared machine, load drifts between runs.
    for name in (("by_hand", "builder") if index % 2 == 0 else ("builder", "by_hand")):
        seconds, last[name] = epoch(makers[name]())
        times[name].append(seconds)
    ratios.append(times["by_hand"][-1] / times["builder"][-1])
out = {name: {"median_s": statistics.median(v), "last_step": last[name]}
       for name, v in times.items()}
out["builder_speed_vs_by_hand"] = statistics.median(ratios)
print("RESULT " + json.dumps(out), flush=True)
"""


def split_cost(n: int = 5980, batch: int = 64, rounds: int = 9) -> dict[str, Any]:
    """One epoch over 2 logical CPUs: the builder (whole steps cut into replica batches, the
    last split evenly) against tf.data's per-replica batching, without and with a 0.01 s step.
    """
    summary: dict[str, Any] = {"examples": n, "global_batch": batch, "rounds": rounds}
    for label, step_s in (("no_step", 0.0), ("step_0.01s", STEP_S)):
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                textwrap.dedent(SPLIT),
                str(n),
                str(batch),
                str(rounds),
                str(step_s),
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise RuntimeError(
                f"split benchmark failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
            )
        summary[label] = json.loads(lines[-1][len("RESULT ") :])
    return summary


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bytes_per_worker(folder: Path, num_workers: int = 2) -> dict[str, Any]:
    import tensorflow as tf

    paths = []
    for index in range(8):
        path = folder / f"part-{index}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for _ in range(50):
                writer.write(b"x" * 1000)
        paths.append(str(path))
    total = 8 * 50 * 1000
    addresses = [f"127.0.0.1:{_free_port()}" for _ in range(num_workers)]
    procs = []
    for index in range(num_workers):
        tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CONFIG": json.dumps(tf_config)}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(WORKER), json.dumps(paths)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=300)
            lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode or not lines:
                raise RuntimeError(f"worker failed ({proc.returncode}):\n{stderr[-4000:]}")
            results.append(json.loads(lines[-1][len("RESULT ") :]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    summary: dict[str, Any] = {"total_bytes": total, "workers": num_workers}
    for policy in ("file", "data"):
        read = [r[policy]["bytes_read"] for r in results]
        summary[policy] = {
            "bytes_read_per_worker": read,
            "fraction_of_all_bytes": [b / total for b in read],
            "examples_trained": sum(r[policy]["examples_trained"] for r in results),
        }
    summary["file_over_data"] = statistics.mean(summary["file"]["bytes_read_per_worker"]) / (
        statistics.mean(summary["data"]["bytes_read_per_worker"])
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    parser.add_argument("--skip-workers", action="store_true", help="skip the 2-worker part")
    parser.add_argument(
        "--only-split", action="store_true", help="only the last-step split part (2 replicas)"
    )
    args = parser.parse_args()
    split = split_cost()
    if args.only_split:
        _print_split(split, as_json=args.json)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = []
        for index in range(NUM_FILES):
            path = folder / f"file-{index}"
            path.write_bytes(b"")  # the artificial reader only needs the name to exist
            paths.append(str(path))
        timing = time_pipelines(paths)
        sharding = None if args.skip_workers else bytes_per_worker(folder)
    builder = timing["builder"]["median_s"]
    figures = {
        "fixture": {
            "open_s": OPEN_S,
            "element_s": ELEMENT_S,
            "step_s": STEP_S,
            "files": NUM_FILES,
            "elements_per_file": ELEMENTS_PER_FILE,
            "batch": BATCH,
            "epochs": EPOCHS,
            "repeats": REPEATS,
        },
        "timing": timing,
        "builder_speedup_over_naive": timing["naive"]["median_s"] / builder,
        "builder_speed_vs_hand_tuned": timing["hand_tuned"]["median_s"] / builder,
        "sharding": sharding,
        "split": split,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print("| pipeline | median time (s) | speed vs naive |")
    print("|---|---|---|")
    for name, value in timing.items():
        ratio = timing["naive"]["median_s"] / value["median_s"]
        print(f"| {name} | {value['median_s']:.3f} | {ratio:.2f}x |")
    print()
    print(f"builder / naive speed: {figures['builder_speedup_over_naive']:.2f} (goal >= 1.5)")
    print(
        f"builder / hand-tuned speed: {figures['builder_speed_vs_hand_tuned']:.2f} (goal >= 0.95)"
    )
    if sharding:
        for policy in ("file", "data"):
            fractions = ", ".join(f"{f:.2f}" for f in sharding[policy]["fraction_of_all_bytes"])
            print(
                f"{policy}: fraction of all bytes read per worker [{fractions}], "
                f"examples trained {sharding[policy]['examples_trained']}"
            )
        print(f"bytes per worker, file / data: {sharding['file_over_data']:.2f} (goal ~ 0.5)")
    _print_split(split, as_json=False)


def _print_split(split: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(split, indent=2))
        return
    print()
    print(f"last-step split, {split['examples']} examples, global batch {split['global_batch']}:")
    for label in ("no_step", "step_0.01s"):
        result = split[label]
        print(
            f"  {label}: builder {result['builder']['median_s']:.3f} s (last step "
            f"{result['builder']['last_step']}), by hand {result['by_hand']['median_s']:.3f} s "
            f"(last step {result['by_hand']['last_step']}); builder / by-hand speed "
            f"{result['builder_speed_vs_by_hand']:.2f} (median of per-round ratios)"
        )


if __name__ == "__main__":
    main()
