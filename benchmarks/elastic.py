"""Elastic resume with more than 2 workers, and what it costs as the number of workers grows.

Real localhost worker processes (one CPU replica each) train a tiny model (Dense 4 tanh, Dense 1;
Adam with a decaying learning rate) for 3 epochs of 6 steps of a global batch of 24 (144
examples, whole steps on 1, 2, 3, 4 and 8 workers) from a builder dataset with a seeded shuffle
and op determinism; a layer inside the model counts the example ids each worker trains on.

1. ``--chain``: 4 workers, a notice (SIGTERM) to worker 3 only in epoch 2; resumed on 3 workers,
   stopped again by a notice to its worker 2 in epoch 3; resumed on 4 workers to the end. The
   weights are compared with the uninterrupted 4-worker run (goal: max abs <= 1e-4), and the
   ids of each interrupted epoch are counted over both runs (goal: each exactly once).
2. ``--curve``: jobs on N = 1, 2, 4 and 8 workers stopped by a notice to the last worker at
   step 3 of epoch 2: the time from the notice (the worker's clock just before it signals
   itself) to the last worker's exit (the parent's clock, polling every 20 ms), the slowest
   worker's close of the agreement's channel (a timer around it in each worker), and the keys the
   workers write to the coordination service and the values they read from it (counted by
   wrapping its ``set`` and ``get``). Then every
   checkpoint of N workers is resumed on M = N/2 workers (a new shape) and every checkpoint of
   M workers on M (the same shape): the resume time is, per process, from entering ``fit`` to
   the end of its first step (checkpoint found and checked, weights read, the positioned stream
   built, the first step traced and run), the slowest worker's; new/same compares the same M
   (medians over ``--repeats``, the two kinds alternating).

    python benchmarks/elastic.py             # both, ~15 min on 2 shared cores
    python benchmarks/elastic.py --chain     # the 4 -> 3 -> 4 chain only
    python benchmarks/elastic.py --curve --repeats 3   # the curve, each resume 3 times (ABBA)
    python benchmarks/elastic.py --curve --files --repeats 2   # the curve on files (FILE)
    python benchmarks/elastic.py --read      # lines read but not trained by a FILE rest
    python benchmarks/elastic.py --build --against /tmp/old --runs 6
        # the data side of a resume on 1 process (fresh processes), /tmp/old beside this
    python benchmarks/elastic.py --against /tmp/old --sizes 2,4,8 --runs 2
        # stops only, /tmp/old's tfdp_utils beside this checkout's, alternating (ABBA)
    python benchmarks/elastic.py --curve --files --sizes 1,2 --repeats 4 --against /tmp/old
        # the resumes with /tmp/old's tfdp_utils beside this checkout's, all four alternating

3. ``--files``: the curve's jobs read the ids from 4 text files of 36 lines
   (``count_examples=True``, ``shard_policy='auto'``: FILE on 2 and 4 workers, one process
   reading every file on 1), so a resume of N on N/2 lays out the rest of the interrupted
   epoch anew; N = 1, 2, 4.
4. ``--read``: one process builds, for a job of those files sharded by file over 2 or 4
   workers stopped after step 2 of an epoch, every worker's stream of the rest on 1, 2, 3, 4
   or 8 workers and iterates it to its end, counting each line the reader reads (a variable
   incremented inside the reader); beside it, what the same shape reads (each worker's stream
   whole, its trained steps skipped). Then the data side of a resume alone, in that process:
   the seconds from building a worker's stream to its first batch, the rest laid out on 1
   worker (new shape) beside worker 0's stream of 2 with its trained steps skipped (same
   shape), alternating (ABBA), ``max(10, --repeats)`` times each.
5. ``--build``: the data side of a resume on 1 process, each in a fresh process so that the
   one-time costs a resume pays count (AutoGraph's conversion of the pipeline's functions,
   tracing): building the positioned stream and reading its first batch, for a job of 1
   process (the same shape) or of 2 or 4 workers sharding those files by file (a new shape:
   the rest laid out anew), stopped after 2 steps of epoch 2; wall and CPU seconds, medians of
   ``max(2, --runs)``, ABBA; with ``--against TREE``, TREE's tfdp_utils beside this one's.

Results: benchmarks/README.md, "Elastic resume".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

PREEMPTED = 75
N, STEPS, EPOCHS, BATCH = 144, 6, 3, 24

JOB = r"""
import json, os, signal, sys, time
t_start = time.time()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf

tf.config.experimental.enable_op_determinism()
tf.keras.utils.set_random_seed(1)
import tfdp_utils as tdu
from tfdp_utils._tf import keras
from tfdp_utils.cluster import _coordination

keys, reads = [], []
_set, _get = _coordination.CoordinationStore.set, _coordination.CoordinationStore.get


def counted_set(self, key, value):  # every key a tfdp-utils part writes (or tries to)
    try:
        _set(self, key, value)
    except Exception:
        keys.append([key, len(value), False])
        raise
    keys.append([key, len(value), True])


def counted_get(self, key, timeout_ms):  # every read, and whether it returned a value
    value = _get(self, key, timeout_ms)
    reads.append([key, value is not None])
    return value


_coordination.CoordinationStore.set = counted_set
_coordination.CoordinationStore.get = counted_get
from tfdp_utils.preemption import _agreement

closes, watched = [], []
_close, _watch = _agreement.CoordinationChannel.close, _agreement.CoordinationChannel._watch


def timed_close(self):  # how long closing the agreement's channel holds the stop
    started = time.perf_counter()
    _close(self)
    closes.append([started, time.perf_counter()])


def timed_watch(self):  # when the watcher thread returned
    try:
        _watch(self)
    finally:
        watched.append(time.perf_counter())


_agreement.CoordinationChannel.close = timed_close
_agreement.CoordinationChannel._watch = timed_watch

out, directory = sys.argv[1], sys.argv[2]
signal_at = json.loads(os.environ.get("JOB_SIGNAL_AT", "null"))
N, EPOCHS, BATCH = 144, 3, 24
strategy = tdu.auto_strategy(verbose=False, collective_timeout=120, resume_from=directory)
x = np.stack([np.arange(N), np.linspace(-1, 1, N), np.cos(np.arange(N))], 1).astype("float32")
y = (x[:, 1:2] * 3 + 1).astype("float32")
files_dir = os.environ.get("JOB_FILES")
if files_dir:  # text files of ids, each worker its own files where they suffice (FILE)
    def parse(line):
        i = tf.strings.to_number(line, tf.float32)
        x = tf.stack([i, i / 72.0 - 1.0, tf.cos(i)])
        return x, x[1:2] * 3.0 + 1.0

    files = sorted(os.path.join(files_dir, name) for name in os.listdir(files_dir))
    dist = tdu.build_distributed_dataset(
        files, strategy=strategy, global_batch_size=BATCH, reader=tf.data.TextLineDataset,
        map_fn=parse, count_examples=True, shuffle_buffer_size=N, seed=5,
    )
else:
    dist = tdu.build_distributed_dataset(
        (x, y), strategy=strategy, global_batch_size=BATCH, shuffle_buffer_size=N, seed=5
    )
with strategy.scope():
    seen = tf.Variable(tf.zeros([N]), trainable=False,
                       synchronization=tf.VariableSynchronization.ON_READ,
                       aggregation=tf.VariableAggregation.SUM)


def local_counts():
    return np.sum([v.numpy() for v in strategy.experimental_local_results(seen)], axis=0).tolist()


class Count(keras.layers.Layer):
    def call(self, inputs, training=None):
        if training:
            ids = tf.cast(inputs[:, 0], tf.int32)
            seen.assign_add(tf.math.bincount(ids, minlength=N, maxlength=N, dtype=tf.float32))
        return inputs[:, 1:]


with strategy.scope():
    model = keras.Sequential([keras.Input((3,)), Count(), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=4, decay_rate=0.8)
    model.compile(keras.optimizers.Adam(schedule), "mse")
reason = tdu.strategy.explain(strategy).reason
log = {"epochs": {}, "batches": [], "t_start": t_start, "reason": reason,
       "policy": dist.tfdp.plan.policy}


class Record(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        seen.assign(tf.zeros([N]))

    def on_epoch_end(self, epoch, logs=None):
        log["epochs"][str(epoch)] = local_counts()

    def on_train_batch_end(self, batch, logs=None):
        if not log["batches"]:
            log["t_first_step"] = time.time()
            if profiler is not None:  # --profile: fit's main thread up to its first step
                profiler.disable()
                profiler.dump_stats(os.path.join(profile_dir, os.path.basename(out) + ".prof"))
        log["batches"].append([self.epoch, batch])
        if signal_at and [self.epoch, batch] == signal_at:
            log["t_signal"] = time.time()
            os.kill(os.getpid(), signal.SIGTERM)


checkpoint = tdu.callbacks.PreemptionCheckpoint(directory)
profiler, profile_dir = None, os.environ.get("JOB_PROFILE")
if profile_dir:
    import cProfile

    profiler = cProfile.Profile()
try:
    log["t_fit"] = time.time()
    if profiler is not None:
        profiler.enable()
    model.fit(dist, epochs=EPOCHS, verbose=0, callbacks=[Record(), checkpoint])
    log["weights"] = [w.tolist() for w in model.get_weights()]
finally:
    log["iterations"] = int(model.optimizer.iterations.numpy())
    log["partial"] = local_counts()
    log["resumed_from"] = checkpoint.resumed_from
    log["keys"], log["reads"], log["closes"], log["watched"] = keys, reads, closes, watched
    with open(out, "w") as handle:
        json.dump(log, handle)
"""


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


FILES: Path | None = None  # --files: the text files the jobs read (set in main)
FILE_LINES = (36, 36, 36, 36)  # 144 ids: FILE on 2 and 4 workers, whole steps on 1, 2, 4


def write_files(folder: Path) -> Path:
    """The ids 0..143 in text files of :data:`FILE_LINES` lines."""
    folder.mkdir()
    first = 0
    for index, size in enumerate(FILE_LINES):
        (folder / f"part-{index}.txt").write_text(
            "".join(f"{i}\n" for i in range(first, first + size))
        )
        first += size
    return folder


def _job_env(tree: str | None) -> dict[str, str]:
    """The workers' environment: the files they read (``--files``), the tree they import."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    if FILES is not None:
        env["JOB_FILES"] = str(FILES)
    if tree is not None:
        env["PYTHONPATH"] = tree
    return env


def run_job(
    root: Path,
    tag: str,
    directory: Path,
    workers: int,
    signal_at: list[int] | None = None,
    tree: str | None = None,
) -> list[dict[str, Any]]:
    """The job on ``workers`` localhost workers; the last one alone gets the notice.
    ``tree``: the checkout whose tfdp_utils the workers import (default: as the environment)."""
    ports = [_port() for _ in range(workers)]
    env = _job_env(tree)
    processes = []
    launched = time.time()
    for index in range(workers):
        child = dict(env)
        child.pop("JOB_SIGNAL_AT", None)
        if workers > 1:
            cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
            child["TF_CONFIG"] = json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": index}}
            )
        if signal_at is not None and index == workers - 1:
            child["JOB_SIGNAL_AT"] = json.dumps(signal_at)
        err = open(root / f"{tag}-{index}.err", "w")  # noqa: SIM115 - closed below
        command = [sys.executable, "-c", JOB, str(root / f"{tag}-{index}.json"), str(directory)]
        # In the tree's folder: `python -c` puts the working directory first on sys.path.
        process = subprocess.Popen(command, env=child, stdout=err, stderr=err, cwd=tree)
        processes.append((process, err))
    ended: dict[int, float] = {}
    deadline = time.monotonic() + 1200
    while len(ended) < workers:
        for index, (process, _) in enumerate(processes):
            if index not in ended and process.poll() is not None:
                ended[index] = time.time()
        if time.monotonic() > deadline:
            for process, _ in processes:
                process.kill()
            raise RuntimeError(f"{tag}: the job did not end within 1200 s")
        time.sleep(0.02)
    logs = []
    for index, (process, err) in enumerate(processes):
        err.close()
        path = root / f"{tag}-{index}.json"
        log: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        log.update(status=process.returncode, ended=ended[index], launched=launched)
        if not path.exists():
            log["stderr"] = (root / f"{tag}-{index}.err").read_text()[-3000:]
        logs.append(log)
    return logs


def _statuses(logs: list[dict[str, Any]], expected: int, tag: str) -> None:
    for log in logs:
        if log["status"] != expected:
            raise RuntimeError(f"{tag}: status {log['status']}, expected {expected}: {log}")


def _ids_once(stopped: list[dict[str, Any]], resumed: list[dict[str, Any]]) -> bool:
    epoch = stopped[0]["batches"][-1][0]
    parts = [log["partial"] for log in stopped]
    parts += [log["epochs"].get(str(epoch), [0.0] * N) for log in resumed]
    return bool(np.sum(parts, axis=0).tolist() == [1.0] * N)


def _diff(a: list[Any], b: list[Any]) -> float:
    return max(float(np.max(np.abs(np.array(x) - np.array(y)))) for x, y in zip(a, b, strict=True))


def chain(root: Path) -> dict[str, Any]:
    """4 workers -> 3 -> 4, against the uninterrupted 4-worker run."""
    reference = run_job(root, "reference", root / "reference", 4)
    _statuses(reference, 0, "reference")
    job = root / "chain"
    first = run_job(root, "chain-4", job, 4, [1, 2])
    _statuses(first, PREEMPTED, "chain-4")
    middle = run_job(root, "chain-3", job, 3, [2, 1])
    _statuses(middle, PREEMPTED, "chain-3")
    last = run_job(root, "chain-4b", job, 4)
    _statuses(last, 0, "chain-4b")
    return {
        "stops": [first[0]["batches"][-1], middle[0]["batches"][-1]],
        "reasons": [middle[0]["reason"].split("; ", 1)[-1], last[0]["reason"].split("; ", 1)[-1]],
        "ids_once": [_ids_once(first, middle), _ids_once(middle, last)],
        "iterations": [log["iterations"] for log in last] + [reference[0]["iterations"]],
        "max_weight_diff": max(_diff(log["weights"], reference[0]["weights"]) for log in last),
    }


def _part(key: str) -> str:
    """What a key of the agreement is for: ``tfdp/preemption/<fit>/<part>/...``."""
    return key.split("/")[3]


def _stop_figures(logs: list[dict[str, Any]]) -> dict[str, Any]:
    signalled = next(log["t_signal"] for log in logs if "t_signal" in log)
    preemption = [
        k for log in logs for k in log["keys"] if k[0].startswith("tfdp/preemption") and k[2]
    ]
    reads = [r for log in logs for r in log["reads"] if r[0].startswith("tfdp/preemption")]
    parts = ("request", "ack", "saved")
    return {
        "notice_to_exit_s": round(max(log["ended"] for log in logs) - signalled, 3),
        "slowest_close_s": round(
            max((end - start for log in logs for start, end in log["closes"]), default=0.0), 3
        ),
        # from a close's start to its watcher's return (0: it had returned before)
        "slowest_wake_s": round(
            max(
                max(0.0, log["watched"][0] - log["closes"][0][0])
                if log["watched"] and log["closes"]
                else 0.0
                for log in logs
            ),
            3,
        ),
        "all_keys": sum(len(log["keys"]) for log in logs),
        "preemption_keys": len(preemption),
        "preemption_key_bytes": sum(k[1] for k in preemption),
        # keys written (set calls that succeeded) and values read (gets that returned one)
        "written": {p: sum(_part(k[0]) == p for k in preemption) for p in parts},
        "refused_writes": sum(
            not k[2] for log in logs for k in log["keys"] if k[0].startswith("tfdp/preemption")
        ),
        "read": {p: sum(_part(r[0]) == p and r[1] for r in reads) for p in parts},
        "empty_reads": {p: sum(_part(r[0]) == p and not r[1] for r in reads) for p in parts},
        "other_key_prefixes": sorted(
            {
                k[0].rsplit("/", 1)[0]
                for log in logs
                for k in log["keys"]
                if not k[0].startswith("tfdp/preemption")
            }
        ),
        "stopped_at": logs[0]["batches"][-1],
    }


def _resume_figures(logs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "fit_to_first_step_s": round(max(log["t_first_step"] - log["t_fit"] for log in logs), 3),
        "launch_to_first_step_s": round(
            max(log["t_first_step"] - log["launched"] for log in logs), 3
        ),
    }


def against(root: Path, before: str, sizes: tuple[int, ...], runs: int) -> dict[str, Any]:
    """Stops on each N, with ``before``'s tfdp_utils and this checkout's, alternating (ABBA)."""
    after = str(Path(__file__).resolve().parents[1])
    figures: dict[str, list[Any]] = {}
    for run in range(runs):
        for workers in sizes:
            trees = [("before", before), ("after", after)]
            for label, tree in trees if (run + workers) % 2 == 0 else trees[::-1]:
                tag = f"{label}-{workers}-{run}"
                logs = run_job(root, tag, root / tag, workers, [1, 2], tree=tree)
                _statuses(logs, PREEMPTED, tag)
                stop = _stop_figures(logs)
                figures.setdefault(f"{label} {workers}", []).append(stop)
                print(f"{label} on {workers}: {json.dumps(stop)}", flush=True)
    medians = {
        name: statistics.median(f["notice_to_exit_s"] for f in stops)
        for name, stops in figures.items()
    }
    ratios = {n: round(medians[f"after {n}"] / medians[f"before {n}"], 3) for n in sizes}
    closes = {
        name: statistics.median(f["slowest_close_s"] for f in stops)
        for name, stops in figures.items()
    }
    return {
        "stops": figures,
        "median_notice_to_exit_s": medians,
        "after_over_before": ratios,
        "median_slowest_close_s": closes,
    }


def curve(
    root: Path, sizes: tuple[int, ...], repeats: int, before: str | None = None
) -> dict[str, Any]:
    """Stops on each N, resumes of N on N/2 (new shape) and of N/2 on N/2 (same shape);
    with ``before`` (a tree), each resume also with that tree's tfdp_utils, all alternating."""
    stops: dict[int, Any] = {}
    for workers in sizes:
        logs = run_job(root, f"stop-{workers}", root / f"stop-{workers}", workers, [1, 2])
        _statuses(logs, PREEMPTED, f"stop-{workers}")
        stops[workers] = {"figures": _stop_figures(logs), "logs": logs}
        print(f"stop on {workers}: {stops[workers]['figures']}", flush=True)
    resumes: dict[str, list[Any]] = {}
    for repeat in range(repeats):
        for workers in sizes:
            half = workers // 2
            if half not in stops:
                continue
            trees = [("", None)] + ([("before ", before)] if before else [])
            kinds = [(t, k, s) for t in trees for k, s in (("same", half), ("new", workers))]
            for (label, tree), kind, source in kinds if repeat % 2 == 0 else kinds[::-1]:  # ABBA
                tag = f"resume-{label.strip() or 'this'}-{kind}-{half}-{repeat}"
                shutil.copytree(root / f"stop-{source}", root / tag)
                logs = run_job(root, tag, root / tag, half, tree=tree)
                _statuses(logs, 0, tag)
                figures = _resume_figures(logs)
                figures["ids_once"] = _ids_once(stops[source]["logs"], logs)
                resumes.setdefault(f"{label}{kind} {half}", []).append(figures)
                print(f"resume {label}{kind} on {half} (from {source}): {figures}", flush=True)
    return {"stops": {n: s["figures"] for n, s in stops.items()}, "resumes": resumes}


READ = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
import tfdp_utils as tdu
from tfdp_utils.data._epoch_examples import epoch_examples
from tfdp_utils.data._epoch_rest import EpochRest
from tfdp_utils.data._rest_stream import _old_recipe, rest_batches, rest_examples
from tfdp_utils.data._sharding import assign_files

folder, batch, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
reads = tf.Variable(0, dtype=tf.int64)


def counted(path):  # every line read from storage, counted where it is read
    def count(line):
        reads.assign_add(1)
        return line
    return tf.data.TextLineDataset(path).map(count)


files = sorted(os.path.join(folder, name) for name in os.listdir(folder))
counts = [sum(1 for _ in open(f)) for f in files]
dist = tdu.build_distributed_dataset(
    files, strategy=tf.distribute.get_strategy(), global_batch_size=batch, reader=counted,
    count_examples=True, shuffle_buffer_size=64, seed=5,
)
recipe = dist.tfdp.resumable().recipe
out = {}
for old in (2, 4):
    per_file = dict(zip(files, counts))
    assigned = assign_files(files, old, counts)
    facts = {"num_workers": old, "global_batch_size": batch, "policy": "file",
             "files": [list(f) for f in assigned], "drop_remainder": False,
             "examples_per_worker": [sum(per_file[f] for f in fs) for fs in assigned]}
    rest = EpochRest.interrupted(facts, 1, step)
    # The same shape: each worker reads its whole stream and skips the steps trained.
    reads.assign(0)
    kept_after_skip = 0
    for w in range(old):
        stream = epoch_examples(_old_recipe(recipe, rest), None, w, old, 1)
        kept_after_skip += sum(1 for _ in stream.skip(step * (batch // old)))
    same = {"read": int(reads.numpy()), "trained": kept_after_skip}
    for new in (1, 2, 3, 4, 8):
        if batch % new or new == old:
            continue
        reads.assign(0)
        trained = sum(sum(1 for _ in rest_examples(recipe, rest, i, new)) for i in range(new))
        out[f"{old}->{new}"] = {"read": int(reads.numpy()), "trained": trained,
                                "left": rest.remaining}
    out[f"{old}->{old}"] = same


def first_batch(build):  # seconds from building a worker's stream to its first batch
    start = time.perf_counter()
    next(iter(build()))
    return time.perf_counter() - start


# The data side of a resume, new shape beside the same one: 2 workers' epoch stopped after
# `step` steps, resumed on 1 worker (the rest laid out anew) or on 2 (worker 0's stream, its
# trained steps skipped); ABBA, medians.
facts2 = {"num_workers": 2, "global_batch_size": batch, "policy": "file",
          "files": [list(f) for f in assign_files(files, 2, counts)], "drop_remainder": False,
          "examples_per_worker": [72, 72]}
rest2 = EpochRest.interrupted(facts2, 1, step)
kinds = {
    "new": lambda: rest_batches(recipe, rest2, 0, 1),
    "same": lambda: epoch_examples(_old_recipe(recipe, rest2), None, 0, 2, 1)
    .skip(step * (batch // 2)).batch(batch // 2),
}
times = {"new": [], "same": []}
for repeat in range(int(sys.argv[4])):
    for kind in ("new", "same") if repeat % 2 == 0 else ("same", "new"):
        times[kind].append(first_batch(kinds[kind]))
out["first_batch_s"] = {k: sorted(v) for k, v in times.items()}
print("READ " + json.dumps(out))
"""


def read_cost(root: Path, batch: int = 24, step: int = 2, repeats: int = 10) -> dict[str, Any]:
    """Lines read from storage and examples trained by the rest of an epoch of 4 files
    sharded by file, stopped after ``step`` steps on 2 or 4 workers and laid out on others
    (one process builds every worker's stream in turn)."""
    folder = write_files(root / "read-files")
    command = [sys.executable, "-c", READ, str(folder), str(batch), str(step), str(repeats)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=True)
    line = next(x for x in done.stdout.splitlines() if x.startswith("READ "))
    return dict(json.loads(line[5:]))


BUILD = r"""
import json, os, sys, time
from types import SimpleNamespace
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
import tfdp_utils as tdu
from tfdp_utils.data._epoch_rest import EpochRest
from tfdp_utils.data._positioned import positioned_worker_dataset
from tfdp_utils.data._sharding import assign_files

folder, kind, batch, step = sys.argv[1], sys.argv[2], 24, 2
files = sorted(os.path.join(folder, name) for name in os.listdir(folder))
counts = [sum(1 for _ in open(f)) for f in files]


def parse(line):
    i = tf.strings.to_number(line, tf.float32)
    x = tf.stack([i, i / 72.0 - 1.0, tf.cos(i)])
    return x, x[1:2] * 3.0 + 1.0


dist = tdu.build_distributed_dataset(
    files, strategy=tf.distribute.get_strategy(), global_batch_size=batch,
    reader=tf.data.TextLineDataset, map_fn=parse, count_examples=True,
    shuffle_buffer_size=144, seed=5,
)
recipe = dist.tfdp.resumable().recipe
rest = None
if kind != "same":  # "new W": a job of W workers stopped after `step` steps of epoch 2
    old = int(kind.split()[1])
    assigned = assign_files(files, old, counts)
    size = dict(zip(files, counts))
    facts = {"num_workers": old, "global_batch_size": batch, "policy": "file",
             "files": [list(f) for f in assigned], "drop_remainder": False,
             "examples_per_worker": [sum(size[f] for f in fs) for fs in assigned]}
    rest = EpochRest.interrupted(facts, 1, step)
context = SimpleNamespace(num_input_pipelines=1, input_pipeline_id=0)
wall, cpu = time.perf_counter(), time.process_time()
dataset = positioned_worker_dataset(recipe, None, context, 1, step, rest)
built = time.perf_counter() - wall
next(iter(dataset))
print("BUILD " + json.dumps({"built_s": built, "first_batch_s": time.perf_counter() - wall,
                             "cpu_s": time.process_time() - cpu}))
"""


def build_cost(root: Path, trees: dict[str, str | None], runs: int) -> dict[str, Any]:
    """The data side of a resume on 1 process, each in a fresh process (AutoGraph's one-time
    conversions and tracing counted, as a resume pays them): its stream built and its first
    batch read, for a job of 1 process (same shape) or of 2 or 4 workers sharding by file
    (new shape: the rest laid out anew), stopped after 2 steps of epoch 2; the kinds and the
    ``trees`` (name -> checkout whose tfdp_utils is imported; None: this one) alternate (ABBA)."""
    folder = write_files(root / "build-files")
    kinds = ["same", "new 2", "new 4"]
    pairs = [(name, kind) for name in trees for kind in kinds]
    out: dict[str, list[dict[str, float]]] = {}
    for run in range(runs):
        for name, kind in pairs if run % 2 == 0 else pairs[::-1]:
            tree = trees[name]
            env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
            if tree is not None:
                env["PYTHONPATH"] = tree
            command = [sys.executable, "-c", BUILD, str(folder), kind]
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=600, check=True, env=env, cwd=tree
            )
            line = next(x for x in done.stdout.splitlines() if x.startswith("BUILD "))
            out.setdefault(f"{name}: {kind}", []).append(json.loads(line[6:]))
    return {
        key: {
            measure: round(statistics.median(r[measure] for r in runs_), 3)
            for measure in ("built_s", "first_batch_s", "cpu_s")
        }
        | {"runs": len(runs_)}
        for key, runs_ in out.items()
    }


def main() -> None:
    global FILES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chain", action="store_true", help="the 4 -> 3 -> 4 chain only")
    parser.add_argument("--curve", action="store_true", help="the curve only")
    parser.add_argument("--repeats", type=int, default=1, help="resumes of each kind, ABBA")
    parser.add_argument(
        "--files", action="store_true", help="the curve's jobs read text files (FILE on 2, 4)"
    )
    parser.add_argument(
        "--read", action="store_true", help="lines read but not trained by a FILE rest"
    )
    parser.add_argument(
        "--against",
        metavar="TREE",
        help="only stops, each N with TREE's tfdp_utils and this checkout's, alternating "
        "(with --curve: the resumes, with both trees)",
    )
    parser.add_argument(
        "--sizes", default=None, help="numbers of workers (default 1,2,4,8; 1,2,4 with --files)"
    )
    parser.add_argument("--runs", type=int, default=1, help="stops per N and tree (--against)")
    parser.add_argument(
        "--build",
        action="store_true",
        help="the data side of a resume, fresh processes (with --against: both trees)",
    )
    args = parser.parse_args()
    default_sizes = "1,2,4" if args.files else "1,2,4,8"
    sizes = tuple(int(n) for n in (args.sizes or default_sizes).split(","))
    if args.build:
        trees: dict[str, str | None] = {"this": None}
        if args.against:
            trees = {"before": args.against, "this": str(Path(__file__).resolve().parents[1])}
        with tempfile.TemporaryDirectory() as folder:
            built = build_cost(Path(folder), trees, max(2, args.runs))
        print("RESULT " + json.dumps({"build": built}), flush=True)
        return
    if args.against and not args.curve:
        with tempfile.TemporaryDirectory() as folder:
            result = against(Path(folder), args.against, sizes, args.runs)
        result["keras"] = "tf_keras" if os.environ.get("TF_USE_LEGACY_KERAS") else "keras3"
        print("RESULT " + json.dumps(result), flush=True)
        return
    both = not (args.chain or args.curve or args.read)
    result: dict[str, Any] = {
        "keras": "tf_keras" if os.environ.get("TF_USE_LEGACY_KERAS") else "keras3"
    }
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        if args.files:
            FILES = write_files(root / "files")
            result["files"] = list(FILE_LINES)
        if args.read:
            result["read"] = read_cost(root, repeats=max(10, args.repeats))
            print("read:", json.dumps(result["read"]), flush=True)
        if args.chain or both:
            result["chain"] = chain(root)
            print("chain:", json.dumps(result["chain"]), flush=True)
        if args.curve or both:
            result["curve"] = curve(root, sizes, args.repeats, args.against)
    pairs = result.get("curve", {}).get("resumes", {})
    ratios = {}
    for label in ("", "before "):
        for half in (1, 2, 4):
            if f"{label}new {half}" in pairs and f"{label}same {half}" in pairs:
                new, same = (
                    statistics.median(
                        f["fit_to_first_step_s"] for f in pairs[f"{label}{kind} {half}"]
                    )
                    for kind in ("new", "same")
                )
                ratios[f"{label}{half}"] = round(new / same, 3)
    if ratios:
        result["new_over_same"] = ratios
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
