"""Repeat crashed jobs many times: every crash must end its processes promptly, with its status.

Each run starts one training job (1 process, or 2 localhost workers with TF_CONFIG), with
``tdu.auto_strategy()`` over 1 or 2 replicas and a builder dataset of one source kind (tensor
slices, text files, a ``from_generator`` reader under a parallel interleave, ``fn(input_context)``,
the tf.data service), and crashes it one way:

``error``     the model raises at its 3rd call (a graph assertion) inside ``fit``, ``evaluate``
              or ``predict`` (rotating), or a plain loop over the dataset raises at batch 3;
``sigint``    Ctrl-C: SIGINT to every worker once 3 steps have run (each worker sets Python's own
              SIGINT handler first: a runner started in the background may pass SIGINT on ignored);
``sigterm``   SIGTERM to every worker once 3 steps have run (no preemption callback);
``watchdog``  2 workers: worker 1 stops inside a callback, worker 0's collective watchdog
              (``collective_timeout=5``) aborts its step.

A run passes when every judged process exits within ``--bound`` seconds of its error with the
error's own status: 1 for an uncaught exception, 130 (or death by SIGINT) for Ctrl-C, 143 (or
death by SIGTERM) for SIGTERM. "Its error" is when the worker reported the uncaught error (its
own ``sys.excepthook`` prints the time, before tfdp-utils' guard runs) or when the signal was
sent. Source kinds, replicas, workers and APIs rotate over the runs of a crash (see
:func:`combo`: 10 runs cover every source with each layout) and each crash gets ``--runs``
runs; CI runs 10, a hunt for a rare failure runs more.

    python scripts/crash_repeat.py --runs 10 --flavour keras3 --jobs 2
    python scripts/crash_repeat.py --runs 40 --flavour tf_keras --crash sigint

Exits 1 when any run failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _ports import free_ports

WORKER = r"""
import faulthandler, json, os, signal, sys, time
faulthandler.enable()  # a crash in native code (SIGSEGV, SIGABRT) prints every thread's stack
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (see the docstring)

def report_error(error_type, error, tb):  # the job's own hook: when the error reaches the top
    print(f"ERROR-AT {time.monotonic():.6f}", flush=True)
    sys.__excepthook__(error_type, error, tb)

sys.excepthook = report_error
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
CRASH, SOURCE, API = os.environ["CRASH"], os.environ["CRASH_SOURCE"], os.environ["CRASH_API"]
REPLICAS = int(os.environ["CRASH_REPLICAS"])
DATA = sys.argv[1]

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
import tfdp_utils as tdu
from tfdp_utils._tf import IS_KERAS3, keras

bound = 5.0 if CRASH == "watchdog" else 600.0
strategy = tdu.auto_strategy(cluster_timeout=60, collective_timeout=bound, verbose=False)
worker = tdu.strategy.explain(strategy).cluster
index = worker.worker_rank if worker is not None else 0
G = 8 * REPLICAS
EXAMPLES = 50_000


def example(i):
    x = tf.stack([tf.cast(i, tf.float32), 1.0, 2.0, 3.0])
    return x, tf.reshape(tf.reduce_sum(x), [1])


def generator_reader(path):
    def generate():
        for i in range(EXAMPLES):
            time.sleep(0.002)  # a latency-bound reader: the pipeline is busy at the crash
            yield np.array([i, 1, 2, 3], "float32"), np.array([i + 6], "float32")

    spec = (tf.TensorSpec([4], tf.float32), tf.TensorSpec([1], tf.float32))
    return tf.data.Dataset.from_generator(generate, output_signature=spec)


def from_context(context):
    ids = tf.data.Dataset.range(EXAMPLES)
    return ids.shard(context.num_input_pipelines, context.input_pipeline_id).map(example)


files = sorted(os.path.join(DATA, name) for name in os.listdir(DATA))
if SOURCE == "tensor_slices":
    kwargs = dict(source=tf.data.Dataset.range(EXAMPLES).map(example))
elif SOURCE == "files":
    kwargs = dict(
        source=files,
        reader=tf.data.TextLineDataset,
        map_fn=lambda line: example(tf.strings.to_number(line, tf.int64)),
    )
elif SOURCE == "generator":
    kwargs = dict(source=files, reader=generator_reader)
elif SOURCE == "input_fn":
    kwargs = dict(source=from_context)
elif SOURCE == "service":
    dispatcher = tf.data.experimental.service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    service_worker = tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(dispatcher_address=address)
    )
    kwargs = dict(source=tf.data.Dataset.range(EXAMPLES).map(example), service=dispatcher.target)
else:
    raise SystemExit(f"unknown source {SOURCE}")
dist = tdu.build_distributed_dataset(strategy=strategy, global_batch_size=G, **kwargs)

with strategy.scope():
    calls = tf.Variable(
        0,
        dtype=tf.int64,
        trainable=False,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )


class Boom(keras.layers.Layer):
    # Every replica of every worker counts its own calls: all fail at the same step.
    def __init__(self):
        super().__init__()
        self._calls = [calls]

    def call(self, x):
        if CRASH != "error":
            return x
        count = self._calls[0].assign_add(1)
        tf.debugging.assert_less(count, tf.constant(3, tf.int64), message="boom at call 3")
        return x


class Steps(keras.callbacks.Callback):
    def _step(self, batch):
        time.sleep(0.005)  # every job lasts longer than the wait for its signal
        if batch == 2:
            print("READY", flush=True)
            if CRASH == "watchdog" and index == 1:
                time.sleep(10_000)  # stuck inside a callback: worker 0's collective waits

    def on_train_batch_end(self, batch, logs=None):
        self._step(batch)

    def on_test_batch_end(self, batch, logs=None):
        self._step(batch)

    def on_predict_batch_end(self, batch, logs=None):
        self._step(batch)


with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), Boom(), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
steps = dict(steps=EXAMPLES // G // 2)
if API == "loop":
    iterator = iter(dist)  # kept in a local, as a training loop does
    for step in range(EXAMPLES):
        batch = next(iterator)
        if step == 2:
            print("READY", flush=True)
            if CRASH == "error":
                raise RuntimeError("boom in the loop at batch 3")
        time.sleep(0.01)
elif API == "fit":
    model.fit(dist, epochs=1, steps_per_epoch=steps["steps"], verbose=0, callbacks=[Steps()])
elif API == "evaluate":
    model.evaluate(dist, verbose=0, callbacks=[Steps()], **steps)
else:
    model.predict(dist, verbose=0, callbacks=[Steps()], **steps)
print(f"NO CRASH {time.monotonic():.6f}", flush=True)  # when its work ended
"""

SOURCES = ("generator", "tensor_slices", "files", "input_fn", "service")
CRASHES = ("error", "sigint", "sigterm", "watchdog")


@dataclass(frozen=True)
class Combo:
    """What one run trains on and how it crashes."""

    crash: str
    source: str
    replicas: int
    workers: int
    api: str

    def describe(self) -> str:
        return (
            f"{self.crash} in {self.api}, {self.source}, {self.workers} worker(s) x "
            f"{self.replicas} replica(s)"
        )


def combo(crash: str, run: int) -> Combo:
    """What run ``run`` of ``crash`` trains on. Sources change every run (5), workers every run
    (2), replicas every 5 runs and APIs every 2 runs (4), so that every 10 runs cover each
    source with 1 and 2 workers and with 1 and 2 replicas, each workers x replicas layout, and
    each API with 1 and 2 workers (the tf.data service runs in-process, with one trainer; the
    watchdog needs 2 workers)."""
    apis = ("fit", "evaluate", "predict", "loop") if crash in ("error", "sigint") else ("fit",)
    sources = SOURCES[:4] if crash == "watchdog" else SOURCES  # watchdog: 2 workers
    source = sources[run % len(sources)]
    workers = 2 if crash == "watchdog" else (1, 2)[run % 2]
    if source == "service":
        workers = 1
    return Combo(crash, source, (2, 1)[(run // 5) % 2], workers, apis[(run // 2) % len(apis)])


def _expected(crash: str, status: int) -> bool:
    if crash in ("error", "watchdog"):
        return status == 1
    if crash == "sigint":
        return status in (130, -signal.SIGINT)
    return status in (143, -signal.SIGTERM)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _error_at(out: Path) -> float | None:
    """When the worker reported its uncaught error (its ``ERROR-AT`` line), if it did."""
    for line in _read(out).splitlines():
        if line.startswith("ERROR-AT "):
            return float(line.split()[1])
    return None


def _when(out: str, sent: float | None) -> str:
    """When a worker that did not crash ended its work, against when the signal was sent (one
    clock: CLOCK_MONOTONIC is the machine's): a signal sent after the work ended came late; one
    sent before it was lost."""
    if sent is None:
        return ""
    for line in out.splitlines():
        if line.startswith("NO CRASH "):
            ended = float(line.split()[2])
            if ended < sent:
                return f"; its work ended {sent - ended:.2f} s before the signal was sent"
            return f"; the signal was sent {ended - sent:.2f} s before its work ended"
    return ""


def _native_crash(lines: list[str]) -> list[str]:
    """What a native crash printed: the lines before faulthandler's ``Fatal Python error``
    (TensorFlow's own last words, glibc's heap message) and the crashed thread's innermost
    frames."""
    fatal = next((i for i, line in enumerate(lines) if "Fatal Python error" in line), None)
    if fatal is None:
        return lines[-30:]
    current = next(
        (i for i in range(fatal, len(lines)) if lines[i].startswith("Current thread")), None
    )
    crashed = [] if current is None else lines[current : current + 12]
    return [*lines[max(0, fatal - 8) : fatal + 1], *crashed]


def one_run(combo: Combo, script: Path, data: Path, flavour: str, bound: float) -> list[str]:
    """The problems of one run (empty: every judged worker ended in time with its status)."""
    ports = free_ports(combo.workers)
    folder = Path(tempfile.mkdtemp(prefix="crash-"))
    processes = []
    for index in range(combo.workers):
        env = dict(
            os.environ,
            CRASH=combo.crash,
            CRASH_SOURCE=combo.source,
            CRASH_API=combo.api,
            CRASH_REPLICAS=str(combo.replicas),
        )
        env.pop("TF_CONFIG", None)
        if combo.workers > 1:
            cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
            env["TF_CONFIG"] = json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": index}}
            )
        if flavour == "tf_keras":
            env["TF_USE_LEGACY_KERAS"] = "1"
        out, err = folder / f"{index}.out", folder / f"{index}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            processes.append(
                subprocess.Popen(
                    [sys.executable, str(script), str(data)],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=stderr,
                )
            )
    judged = [0] if combo.crash == "watchdog" else list(range(combo.workers))
    start = time.monotonic()
    sent: float | None = None
    problems: list[str] = []
    ends: dict[int, float] = {}
    while time.monotonic() - start < 300:
        for index, process in enumerate(processes):
            if index not in ends and process.poll() is not None:
                ends[index] = time.monotonic()
        if all(index in ends for index in judged):
            break
        errors = [_error_at(folder / f"{i}.out") for i in judged]
        crashed = [e for e in [sent, *errors] if e is not None]
        if crashed and time.monotonic() > min(crashed) + 2 * bound + 10:
            break  # well past the bound: a hang, no need to wait for the 300 s limit
        signalled = combo.crash in ("sigint", "sigterm")
        if (
            signalled
            and sent is None
            and all("READY" in _read(folder / f"{i}.out") for i in range(combo.workers))
        ):
            sent = time.monotonic()
            number = signal.SIGINT if combo.crash == "sigint" else signal.SIGTERM
            for process in processes:
                process.send_signal(number)
        time.sleep(0.05)
    for index in judged:
        process = processes[index]
        out = _read(folder / f"{index}.out")
        lines = _read(folder / f"{index}.err").strip().splitlines()
        crashed = process.poll() is not None and process.returncode in (-6, -11)
        tail = " | ".join(_native_crash(lines) if crashed else lines[-3:])
        if index not in ends:
            problems.append(
                f"worker {index} still alive {time.monotonic() - start:.0f} s in: {tail}"
            )
            continue
        status = process.returncode
        if "NO CRASH" in out:
            problems.append(
                f"worker {index} did not crash (status {status}{_when(out, sent)}): {tail}"
            )
            continue
        errors = [
            float(line.split()[1]) for line in out.splitlines() if line.startswith("ERROR-AT")
        ]
        error_at = sent if sent is not None else (errors[0] if errors else None)
        if error_at is None:
            problems.append(f"worker {index} exited {status} before its crash: {tail}")
            continue
        took = ends[index] - error_at
        if not _expected(combo.crash, status):
            problems.append(f"worker {index} exited {status} ({took:.1f} s after): {tail}")
        elif took > bound:
            problems.append(f"worker {index} took {took:.1f} s to exit (bound {bound:g} s)")
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()
    if problems:
        problems.append(f"outputs kept in {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per crash (default 10)")
    parser.add_argument("--flavour", choices=("keras3", "tf_keras"), default="keras3")
    parser.add_argument("--crash", choices=CRASHES, action="append", help="default: all")
    parser.add_argument("--bound", type=float, default=10.0, help="seconds (default 10)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    args = parser.parse_args(argv)
    failed = 0
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "worker.py"
        script.write_text(WORKER)
        data = Path(folder) / "data"
        data.mkdir()
        for index in range(8):
            first = index * 6000
            (data / f"part{index}.txt").write_text(
                "".join(f"{i}\n" for i in range(first, first + 6000))
            )
        for crash in args.crash or CRASHES:
            start, crash_failed = time.monotonic(), 0
            runs = [combo(crash, run) for run in range(args.runs)]
            with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
                outcomes = pool.map(
                    lambda this: one_run(this, script, data, args.flavour, args.bound), runs
                )
                for run, (this, problems) in enumerate(zip(runs, outcomes, strict=True)):
                    crash_failed += bool(problems)
                    for problem in problems:
                        print(f"{crash} run {run} ({this.describe()}): {problem}", flush=True)
            seconds = time.monotonic() - start
            print(
                f"{args.flavour} {crash}: {crash_failed} of {args.runs} runs failed "
                f"({seconds:.0f} s)",
                flush=True,
            )
            failed += crash_failed
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
