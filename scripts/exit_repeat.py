"""Repeat a 2-worker localhost job many times and count the runs whose processes did not exit 0.

Each run starts two workers (TF_CONFIG on 127.0.0.1, MultiWorkerMirroredStrategy from
``tdu.auto_strategy()``) that iterate builder datasets of every source kind in a plain
``for batch in dist:`` loop (tensor slices, text files, ``from_generator``, ``fn(input_context)``,
a partial last batch), then ``fit`` a small model on a builder dataset, print their counts and
exit. A process that aborts at interpreter exit (rc -6, "FATAL: exception not rethrown") or hangs
past the bound counts as a failed run.

``--skew`` makes one worker (``--late``: worker 0, worker 1, or each in turn) sleep after its
result line before it exits, so the two workers end that far apart: a comma list of seconds
cycles over the runs (``0,2,4,8``), ``A-B`` draws each run's skew uniformly from [A, B]
(``--seed``). With a skew, every run gets a line (skew, late worker, each worker's status and
seconds from start to exit) and ``--record`` writes one JSON object per run with the last
stderr lines of each worker.

    python scripts/exit_repeat.py --runs 30 --flavour keras3
    python scripts/exit_repeat.py --runs 30 --flavour tf_keras
    python scripts/exit_repeat.py --runs 100 --skew 0-8 --jobs 2 --record runs.jsonl

Exits 1 when any run failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _ports import free_ports

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
skew = float(os.environ.get("EXIT_SKEW", "0"))
if skew:
    import time
    time.sleep(skew)  # the other worker has long exited when this one does
"""


@dataclasses.dataclass
class Run:
    """One run's outcome: its skew, each worker's status, seconds to exit and last stderr lines."""

    run: int
    skew: float
    late: int
    statuses: list[int | None]
    seconds: list[float | None]
    tails: list[list[str]]
    problems: list[str]


def _one_run(
    script: Path, data_dir: str, flavour: str, timeout: float, run: int, skew: float, late: int
) -> Run:
    """Run one 2-worker job; worker ``late`` sleeps ``skew`` seconds after its result line."""
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes = []
    start = time.monotonic()
    for index in range(2):
        env = dict(
            os.environ,
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        )
        if flavour == "tf_keras":
            env["TF_USE_LEGACY_KERAS"] = "1"
        if skew and index == late:
            env["EXIT_SKEW"] = f"{skew:.3f}"
        processes.append(
            subprocess.Popen(
                [sys.executable, str(script), data_dir],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs: list[tuple[str, str] | None] = [None, None]
    seconds: list[float | None] = [None, None]

    def wait(index: int) -> None:
        try:
            outputs[index] = processes[index].communicate(timeout=timeout)
            seconds[index] = time.monotonic() - start
        except subprocess.TimeoutExpired:
            pass

    waiters = [threading.Thread(target=wait, args=(index,)) for index in range(2)]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join()
    problems = []
    tails: list[list[str]] = [[], []]
    for index, process in enumerate(processes):
        output = outputs[index]
        if output is None:
            for other in processes:
                other.kill()
            for other in processes:
                other.communicate()
            problems.append(f"worker {index} did not finish within {timeout:g} s")
            continue
        out, err = output
        tails[index] = [line for line in err.strip().splitlines() if line.strip()][-6:]
        if process.returncode != 0 or "RESULT " not in out:
            tail = tails[index][-3:]
            problems.append(f"worker {index} exited {process.returncode}: {' | '.join(tail)}")
    statuses = [process.returncode for process in processes]
    return Run(run, skew, late, statuses, seconds, tails, problems)


def skews(spec: str, runs: int, seed: int) -> list[float]:
    """Each run's skew from ``spec``: ``"0,2,4,8"`` cycles, ``"0-8"`` draws from [0, 8].

    Raises:
        ValueError: a spec that is neither, or a negative number of seconds.
    """
    text = spec.strip()
    if "-" in text.lstrip("-"):
        low_text, high_text = text.split("-", 1)
        low, high = float(low_text), float(high_text)
        if low < 0 or high < low:
            raise ValueError(f"--skew {spec!r}: want A-B with 0 <= A <= B")
        draw = random.Random(seed)
        return [round(draw.uniform(low, high), 2) for _ in range(runs)]
    values = [float(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 0:
        raise ValueError(f"--skew {spec!r}: want seconds >= 0, e.g. 0,2,4,8 or 0-8")
    return [values[run % len(values)] for run in range(runs)]


def _describe(run: Run) -> str:
    parts = []
    for index in range(2):
        status, seconds = run.statuses[index], run.seconds[index]
        timing = f" at {seconds:.1f} s" if seconds is not None else ""
        parts.append(f"worker {index} {status}{timing}")
    return f"run {run.run}: skew {run.skew:.2f} s (worker {run.late} late): " + ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=30, help="runs (default 30)")
    parser.add_argument("--flavour", choices=("keras3", "tf_keras"), default="keras3")
    parser.add_argument("--timeout", type=float, default=180, help="seconds per run (default 180)")
    parser.add_argument(
        "--skew",
        default="0",
        help="seconds one worker exits after the other: 0,2,4,8 cycles, 0-8 draws (default 0)",
    )
    parser.add_argument(
        "--late",
        choices=("0", "1", "alternate"),
        default="alternate",
        help="the worker that exits late (default: worker 1, then 0, in turn)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of drawn skews (default 0)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument("--record", type=Path, help="write one JSON line per run to this file")
    args = parser.parse_args(argv)
    try:
        run_skews = skews(args.skew, args.runs, args.seed)
    except ValueError as error:
        parser.error(str(error))
    skewed = any(run_skews)
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "worker.py"
        script.write_text(WORKER)
        data_dir = Path(folder) / "data"
        data_dir.mkdir()
        for index, count in enumerate((5, 9, 3)):
            lines = "\n".join(str(100 * index + j) for j in range(count))
            (data_dir / f"part{index}.txt").write_text(lines + "\n")
        failed = 0
        tally: dict[str, int] = {}
        start = time.monotonic()
        record = args.record.open("w") if args.record else None

        def one(run: int) -> Run:
            late = (run + 1) % 2 if args.late == "alternate" else int(args.late)
            skew = run_skews[run]
            return _one_run(script, str(data_dir), args.flavour, args.timeout, run, skew, late)

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
            for result in pool.map(one, range(args.runs)):
                failed += bool(result.problems)
                key = "(" + ", ".join(str(status) for status in result.statuses) + ")"
                tally[key] = tally.get(key, 0) + 1
                if skewed:
                    print(_describe(result), flush=True)
                for problem in result.problems:
                    print(f"run {result.run}: {problem}", flush=True)
                if record is not None:
                    record.write(json.dumps(dataclasses.asdict(result)) + "\n")
                    record.flush()
        if record is not None:
            record.close()
        seconds = time.monotonic() - start
    print(f"{args.flavour}: {failed} of {args.runs} runs failed ({seconds:.0f} s)")
    if skewed:
        counts = ", ".join(f"{count} x {key}" for key, count in sorted(tally.items()))
        print(f"skews {args.skew} (min {min(run_skews):.2f} s, max {max(run_skews):.2f} s)")
        print(f"statuses (worker 0, worker 1): {counts}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
