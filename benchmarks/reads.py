"""Benchmark of the builder's read stage: latency-bound, CPU-bound, and on the tf.data service.

Three parts, each timed side by side in one process (pipelines alternate, median of rounds):

1. **Latency-bound reads** (the tf.data performance guide's artificial fixture: 8 files that
   take 0.03 s to open and 0.015 s per element, 10 elements each, a 0.01 s step, global
   batch 4, 2 epochs, all sleeps): the builder's read stage (one read per file in flight and
   a private thread pool of reads + cores) against the previous one (interleave
   ``num_parallel_calls=AUTOTUNE`` on tf.data's default pool), and both against the
   physical limit: per epoch the first batch (one open and one element, 0.045 s) then 20
   steps of 0.01 s, since 8 files read in parallel (0.18 s) stay ahead of training; 0.49 s
   for 2 epochs.
2. **CPU-bound** (no sleeps): 8 TFRecord files of 256 records of 96x96 float32, a heavy
   ``map_fn`` (12 chained 96x96 matmuls per example), an empty step; the same two read
   stages. The new stage must not slow CPU-bound parsing (goal: new / previous speed
   >= 0.97).
3. **The tf.data service**: the guide fixture with graph-only sleeps (service workers run
   the graph in another process, where a Python generator cannot run), in-process against
   ``service=`` with 1 dispatcher and 2 service workers started with ``tfdp-utils
   data-service`` on this machine (synchronous mode: reads on the service workers, batching
   on the trainer).
4. **Through fit**: the latency-bound fixture given to ``model.fit(dist, epochs=2)`` as a user
   writes it (a model whose step sleeps 0.01 s and counts its examples), which keeps one
   iterator for the job (compat change ``fit-one-iterator``), against the same ``fit`` with
   that change undone (Keras' own: a new iterator every epoch) and the plain loop, alternating.
   The stream needs the epoch's steps: the fit runs build the fixture with
   ``count_examples=True`` (the count's build time is reported apart), and the fixture as the
   plain loop builds it (unknown size) goes through ``fit`` too (its steps learnt in the first
   epoch).
5. **Unknown size through fit** (run with part 4): the fixture without counts given to
   ``model.fit(dist, epochs=4)`` (the steps learnt in the first epoch, one iterator from the
   second on), the same ``fit`` with the change undone (a new iterator every epoch), and the
   same ``fit`` on the same 80 examples as in-memory arrays, alternating; the goal is
   unknown size / in-memory <= 1.25.

Run: ``.venv/bin/python benchmarks/reads.py`` (about 90 s); ``--json`` prints the raw
figures, ``--rounds N`` changes the rounds (default 7), ``--skip-service`` leaves out part 3,
``--only-fit`` runs parts 4 and 5 alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The guide's fixture, shared with benchmarks/data.py (this folder is on sys.path when a
# benchmark runs as a script).
from data import BATCH, ELEMENT_S, ELEMENTS_PER_FILE, EPOCHS, NUM_FILES, OPEN_S, STEP_S
from data import artificial_reader as python_reader

STEPS_PER_EPOCH = NUM_FILES * ELEMENTS_PER_FILE // BATCH
PHYSICAL_LIMIT_S = EPOCHS * (OPEN_S + ELEMENT_S + STEPS_PER_EPOCH * STEP_S)
FIT_EPOCHS = 4  # the unknown-size rows through fit (part 5)

CPU_RECORDS_PER_FILE = 256
CPU_SIDE = 96
CPU_MATMULS = 12
CPU_BATCH = 32


def graph_reader(path: Any) -> Any:
    """The same fixture as graph ops only, so that a tf.data service worker can run it."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing

    opened = tf.data.Dataset.from_tensors(path).apply(testing.sleep(int(OPEN_S * 1e6)))
    return opened.flat_map(
        lambda _: tf.data.Dataset.range(ELEMENTS_PER_FILE).apply(
            testing.sleep(int(ELEMENT_S * 1e6))
        )
    )


def heavy_map(record: Any) -> Any:
    """CPU-bound parsing: decode a record and run chained matmuls on it."""
    import tensorflow as tf

    matrix = tf.reshape(tf.io.decode_raw(record, tf.float32), [CPU_SIDE, CPU_SIDE])
    value = matrix
    for _ in range(CPU_MATMULS):
        value = tf.tanh(tf.linalg.matmul(value, matrix))
    return tf.reduce_sum(value)


@contextlib.contextmanager
def previous_read_stage() -> Iterator[None]:
    """The read stage before latency sizing: AUTOTUNE parallelism on the default pool."""
    import tensorflow as tf

    from tfdp_utils.data import _pipeline as pipeline
    from tfdp_utils.data._sharding import MAX_PARALLEL_FILES

    def read_files(recipe: Any, index: int) -> Any:
        files = recipe.plan.files_per_worker[index]
        names = tf.data.Dataset.from_tensor_slices(tf.constant(list(files) or [""]))
        names = names.take(len(files))
        if recipe.shuffle_buffer_size is not None and not recipe.keeps_order and len(files) > 1:
            names = names.shuffle(len(files), seed=pipeline.worker_seed(recipe.seed, index))
        return names.interleave(
            recipe.reader,
            cycle_length=max(1, min(len(files), MAX_PARALLEL_FILES)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=recipe.keeps_order,
        )

    saved = pipeline._read_files, pipeline.reader_threads
    pipeline._read_files = read_files
    pipeline.reader_threads = lambda plan, cores=None: None
    try:
        yield
    finally:
        pipeline._read_files, pipeline.reader_threads = saved


def run_epochs(dataset: Any, step_s: float) -> tuple[float, int]:
    """Iterate ``EPOCHS`` epochs with a step of ``step_s``; returns (seconds, examples)."""
    seen = 0
    start = time.perf_counter()
    for _ in range(EPOCHS):
        for batch in dataset:
            values = batch.values if hasattr(batch, "values") else (batch,)
            seen += sum(int(v.shape[0]) for v in values)
            if step_s:
                time.sleep(step_s)
    return time.perf_counter() - start, seen


def run_epochs_one_iterator(dataset: Any, step_s: float) -> tuple[float, int]:
    """``EPOCHS`` epochs of the fixture's steps from one iterator of a ``repeat="epochs"``
    builder dataset, as ``fit(steps_per_epoch=...)`` reads it."""
    steps = STEPS_PER_EPOCH
    seen = 0
    start = time.perf_counter()
    iterator = iter(dataset)
    for _ in range(EPOCHS * steps):
        batch = next(iterator)
        values = batch.values if hasattr(batch, "values") else (batch,)
        seen += sum(int(v.shape[0]) for v in values)
        time.sleep(step_s)
    return time.perf_counter() - start, seen


def alternate(
    makers: dict[str, Callable[[], Any]], *, rounds: int, step_s: float, expected: int
) -> dict[str, dict[str, Any]]:
    """Median time of each maker's dataset over ``rounds``, in alternating order."""
    for name, make in makers.items():  # warm up: graph tracing, thread pools
        (run_epochs_one_iterator if name.endswith("one_iterator") else run_epochs)(make(), step_s)
    times: dict[str, list[float]] = {name: [] for name in makers}
    names = list(makers)
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            dataset = makers[name]()
            run = run_epochs_one_iterator if name.endswith("one_iterator") else run_epochs
            seconds, seen = run(dataset, step_s)
            if seen != expected:
                raise RuntimeError(f"{name} yielded {seen} examples, expected {expected}")
            times[name].append(seconds)
    return {
        name: {"median_s": statistics.median(values), "runs_s": values}
        for name, values in times.items()
    }


def latency_part(paths: list[str], rounds: int) -> dict[str, Any]:
    import tensorflow as tf

    import tfdp_utils as tdu

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    reader = tf.autograph.experimental.do_not_convert(python_reader)

    def new() -> Any:
        return tdu.build_distributed_dataset(
            paths, strategy=strategy, global_batch_size=BATCH, reader=reader
        )

    def previous() -> Any:
        with previous_read_stage():
            return new()

    def new_one_iterator() -> Any:
        return tdu.build_distributed_dataset(
            paths,
            strategy=strategy,
            global_batch_size=BATCH,
            reader=reader,
            repeat="epochs",
            count_examples=True,  # aligned epochs need the files' counts
        )

    expected = EPOCHS * NUM_FILES * ELEMENTS_PER_FILE
    makers = {"new": new, "previous": previous, "new_one_iterator": new_one_iterator}
    timing = alternate(makers, rounds=rounds, step_s=STEP_S, expected=expected)
    return {
        "timing": timing,
        "physical_limit_s": PHYSICAL_LIMIT_S,
        "new_over_limit": timing["new"]["median_s"] / PHYSICAL_LIMIT_S,
        "one_iterator_over_limit": timing["new_one_iterator"]["median_s"] / PHYSICAL_LIMIT_S,
        "new_speed_vs_previous": timing["previous"]["median_s"] / timing["new"]["median_s"],
    }


def sleeping_model(strategy: Any) -> Any:
    """A model whose training step takes ``STEP_S`` (a sleep, as the fixture's loop) and
    counts the examples it receives; built and compiled under ``strategy``."""
    import numpy as np
    import tensorflow as tf

    from tfdp_utils._tf import keras

    def sleep(examples: Any) -> Any:
        time.sleep(STEP_S)
        return np.int64(examples)

    class SleepingStep(keras.Model):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.examples = self.add_weight(
                name="examples", shape=(), initializer="zeros", dtype="int64", trainable=False
            )

        def call(self, x: Any) -> Any:
            return x

        def train_step(self, data: Any) -> Any:
            size = tf.shape(data, out_type=tf.int64)[0]
            slept = tf.reshape(tf.py_function(sleep, [size], tf.int64), [])
            self.examples.assign_add(slept)
            return {"examples": self.examples}

    with strategy.scope():
        model = SleepingStep()
        model.compile(optimizer="sgd")
    return model


def fit_part(paths: list[str], rounds: int) -> dict[str, Any]:
    """The fixture through ``model.fit(dist, epochs=EPOCHS)`` with user code unchanged (one
    iterator for the job, compat change fit-one-iterator), through Keras' own fit (the change
    undone: a new iterator every epoch), and the plain loop, alternating in one process.

    The one-iterator stream needs the epoch's steps, so the fit runs build the fixture with
    ``count_examples=True`` (each build reads the files once more; its time is reported
    apart); ``fit_unknown_size`` is the fixture as the plain loop builds it (no counts), whose
    steps ``fit`` learns in the first epoch, reading the second through one more iterator
    (part 5 times it over 4 epochs).
    """
    import tensorflow as tf

    import tfdp_utils as tdu
    from tfdp_utils import compat
    from tfdp_utils.compat import _one_iterator as one_iterator

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    reader = tf.autograph.experimental.do_not_convert(python_reader)
    expected = EPOCHS * NUM_FILES * ELEMENTS_PER_FILE
    model = sleeping_model(strategy)

    def dataset(*, counted: bool = False) -> Any:
        return tdu.build_distributed_dataset(
            paths,
            strategy=strategy,
            global_batch_size=BATCH,
            reader=reader,
            count_examples=counted,
        )

    builds: list[float] = []

    def counted_dataset() -> Any:
        start = time.perf_counter()
        dist = dataset(counted=True)
        builds.append(time.perf_counter() - start)
        return dist

    def fit(*, keras_own: bool = False, counted: bool = True) -> tuple[float, int]:
        dist = counted_dataset() if counted else dataset()
        if keras_own:
            compat.undo("fit-one-iterator")
        try:
            before = int(model.examples.numpy())
            start = time.perf_counter()
            model.fit(dist, epochs=EPOCHS, verbose=0)
            seconds = time.perf_counter() - start
        finally:
            one_iterator.install(applied_by="benchmarks/reads.py")
        return seconds, int(model.examples.numpy()) - before

    runs: dict[str, Callable[[], tuple[float, int]]] = {
        "plain_loop": lambda: run_epochs(dataset(), STEP_S),
        "fit": lambda: fit(),
        "fit_keras_own": lambda: fit(keras_own=True),
        "fit_unknown_size": lambda: fit(counted=False),
    }
    for run in runs.values():  # warm up: tracing, thread pools
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            seconds, seen = runs[name]()
            if seen != expected:
                raise RuntimeError(f"{name} trained {seen} examples, expected {expected}")
            times[name].append(seconds)
    timing = {
        name: {"median_s": statistics.median(values), "runs_s": values}
        for name, values in times.items()
    }
    return {
        "timing": timing,
        "physical_limit_s": PHYSICAL_LIMIT_S,
        "fit_over_limit": timing["fit"]["median_s"] / PHYSICAL_LIMIT_S,
        "fit_keras_own_over_limit": timing["fit_keras_own"]["median_s"] / PHYSICAL_LIMIT_S,
        "plain_loop_over_limit": timing["plain_loop"]["median_s"] / PHYSICAL_LIMIT_S,
        "fit_unknown_size_over_limit": (timing["fit_unknown_size"]["median_s"] / PHYSICAL_LIMIT_S),
        "count_examples_build_s": statistics.median(builds),
    }


def unknown_size_part(paths: list[str], rounds: int) -> dict[str, Any]:
    """The fixture of unknown size (no counts) through ``model.fit(dist, epochs=4)``, user
    code unchanged (compat change fit-one-iterator: the steps learnt in the first epoch, one
    iterator from the second on), against the same ``fit`` with that change undone (a new
    iterator every epoch) and the same ``fit`` on the same 80 examples in memory (arrays:
    known size, one iterator for the job), alternating in one process. The in-memory run
    has no reads at all, so its time is the 4 epochs' steps and Keras' own overheads: the
    ratio is what reading files of unknown size costs ``fit``.
    """
    import numpy as np
    import tensorflow as tf

    import tfdp_utils as tdu
    from tfdp_utils import compat
    from tfdp_utils.compat import _one_iterator as one_iterator

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    reader = tf.autograph.experimental.do_not_convert(python_reader)
    expected = FIT_EPOCHS * NUM_FILES * ELEMENTS_PER_FILE
    model = sleeping_model(strategy)
    in_memory = np.tile(np.arange(ELEMENTS_PER_FILE, dtype="int64"), NUM_FILES)

    def fit(*, keras_own: bool = False, memory: bool = False) -> tuple[float, int]:
        source = in_memory if memory else paths
        dist = tdu.build_distributed_dataset(
            source, strategy=strategy, global_batch_size=BATCH, reader=reader
        )
        if keras_own:
            compat.undo("fit-one-iterator")
        try:
            before = int(model.examples.numpy())
            start = time.perf_counter()
            model.fit(dist, epochs=FIT_EPOCHS, verbose=0)
            seconds = time.perf_counter() - start
        finally:
            one_iterator.install(applied_by="benchmarks/reads.py")
        return seconds, int(model.examples.numpy()) - before

    runs: dict[str, Callable[[], tuple[float, int]]] = {
        "unknown_size": lambda: fit(),
        "unknown_size_keras_own": lambda: fit(keras_own=True),
        "in_memory": lambda: fit(memory=True),
    }
    for run in runs.values():  # warm up: tracing, thread pools
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            seconds, seen = runs[name]()
            if seen != expected:
                raise RuntimeError(f"{name} trained {seen} examples, expected {expected}")
            times[name].append(seconds)
    timing = {
        name: {"median_s": statistics.median(values), "runs_s": values}
        for name, values in times.items()
    }
    memory_s = timing["in_memory"]["median_s"]
    per_round = [
        unknown / memory
        for unknown, memory in zip(times["unknown_size"], times["in_memory"], strict=True)
    ]
    return {
        "timing": timing,
        "epochs": FIT_EPOCHS,
        "unknown_size_over_in_memory": timing["unknown_size"]["median_s"] / memory_s,
        "per_round_ratio_median": statistics.median(per_round),
        "keras_own_over_in_memory": timing["unknown_size_keras_own"]["median_s"] / memory_s,
    }


def cpu_part(folder: Path, rounds: int) -> dict[str, Any]:
    import numpy as np
    import tensorflow as tf

    import tfdp_utils as tdu

    rng = np.random.default_rng(0)
    paths = []
    for index in range(NUM_FILES):
        path = folder / f"cpu-{index}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for _ in range(CPU_RECORDS_PER_FILE):
                matrix = rng.standard_normal((CPU_SIDE, CPU_SIDE), dtype=np.float32) * 0.1
                writer.write(matrix.tobytes())
        paths.append(str(path))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")

    def new() -> Any:
        return tdu.build_distributed_dataset(
            paths, strategy=strategy, global_batch_size=CPU_BATCH, map_fn=heavy_map
        )

    def previous() -> Any:
        with previous_read_stage():
            return new()

    expected = EPOCHS * NUM_FILES * CPU_RECORDS_PER_FILE
    timing = alternate(
        {"new": new, "previous": previous}, rounds=rounds, step_s=0.0, expected=expected
    )
    return {
        "timing": timing,
        "examples_per_epoch": expected // EPOCHS,
        "new_speed_vs_previous": timing["previous"]["median_s"] / timing["new"]["median_s"],
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(*args: str, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "tfdp_utils.cli", "data-service", *args]
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _wait_for(log: Path, text: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"no {text!r} from the server:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def service_part(paths: list[str], folder: Path, rounds: int) -> dict[str, Any]:
    import tensorflow as tf

    import tfdp_utils as tdu

    port = _free_port()
    logs = [folder / name for name in ("dispatcher.log", "worker-0.log", "worker-1.log")]
    servers = [_start("dispatcher", "--port", str(port), log=logs[0])]
    servers += [_start("worker", "--dispatcher", f"127.0.0.1:{port}", log=log) for log in logs[1:]]
    try:
        for server, log in zip(servers[1:], logs[1:], strict=True):
            _wait_for(log, "registered with the dispatcher", server, 120)
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        address = f"grpc://127.0.0.1:{port}"

        def in_process() -> Any:
            return tdu.build_distributed_dataset(
                paths, strategy=strategy, global_batch_size=BATCH, reader=graph_reader
            )

        def service() -> Any:
            return tdu.build_distributed_dataset(
                paths,
                strategy=strategy,
                global_batch_size=BATCH,
                reader=graph_reader,
                service=address,
            )

        expected = EPOCHS * NUM_FILES * ELEMENTS_PER_FILE
        timing = alternate(
            {"in_process": in_process, "service": service},
            rounds=rounds,
            step_s=STEP_S,
            expected=expected,
        )
    finally:
        for server in servers:
            server.kill()
            server.wait(timeout=30)
    return {
        "timing": timing,
        "service_workers": 2,
        "service_speed_vs_in_process": (
            timing["in_process"]["median_s"] / timing["service"]["median_s"]
        ),
        "service_over_limit": timing["service"]["median_s"] / PHYSICAL_LIMIT_S,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per part (default 7)")
    parser.add_argument("--skip-service", action="store_true", help="leave out part 3")
    parser.add_argument(
        "--only-fit", action="store_true", help="only parts 4 and 5 (the fixture through fit)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = []
        for index in range(NUM_FILES):
            path = folder / f"file-{index}"
            path.write_bytes(b"")  # the artificial readers only need a name
            paths.append(str(path))
        figures: dict[str, Any] = {"cores": os.cpu_count()}
        if not args.only_fit:
            figures["latency"] = latency_part(paths, args.rounds)
            figures["cpu_bound"] = cpu_part(folder, args.rounds)
            if not args.skip_service:
                figures["service"] = service_part(paths, folder, args.rounds)
        figures["fit"] = fit_part(paths, args.rounds)
        figures["unknown_size"] = unknown_size_part(paths, args.rounds)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"cores: {figures['cores']}, rounds: {args.rounds}")
    fit = figures["fit"]
    print(
        f"latency-bound through fit(epochs={EPOCHS}), user code unchanged: "
        f"{fit['timing']['fit']['median_s']:.3f} s, / limit {fit['fit_over_limit']:.2f} (goal "
        f"<= 1.5); Keras' own fit (a new iterator every epoch) "
        f"{fit['timing']['fit_keras_own']['median_s']:.3f} s, / limit "
        f"{fit['fit_keras_own_over_limit']:.2f}; the plain loop "
        f"{fit['timing']['plain_loop']['median_s']:.3f} s, / limit "
        f"{fit['plain_loop_over_limit']:.2f}; fit on the fixture without counts (unknown size: "
        f"steps learnt in the first epoch) {fit['timing']['fit_unknown_size']['median_s']:.3f} s, "
        f"/ limit {fit['fit_unknown_size_over_limit']:.2f}; building with count_examples=True "
        f"{fit['count_examples_build_s']:.3f} s (once, before fit)"
    )
    unknown = figures["unknown_size"]
    print(
        f"unknown size through fit(epochs={FIT_EPOCHS}), user code unchanged: "
        f"{unknown['timing']['unknown_size']['median_s']:.3f} s, / in-memory "
        f"{unknown['unknown_size_over_in_memory']:.2f} (goal <= 1.25; median of the per-round "
        f"ratios {unknown['per_round_ratio_median']:.2f}); Keras' own fit (a new "
        f"iterator every epoch) {unknown['timing']['unknown_size_keras_own']['median_s']:.3f} "
        f"s, / in-memory {unknown['keras_own_over_in_memory']:.2f}; in memory "
        f"{unknown['timing']['in_memory']['median_s']:.3f} s"
    )
    if args.only_fit:
        return
    latency, cpu = figures["latency"], figures["cpu_bound"]
    print(
        f"latency-bound: new {latency['timing']['new']['median_s']:.3f} s, previous "
        f"{latency['timing']['previous']['median_s']:.3f} s, limit {PHYSICAL_LIMIT_S:.2f} s; "
        f"new / limit {latency['new_over_limit']:.2f} (goal <= 1.5), new / previous speed "
        f"{latency['new_speed_vs_previous']:.2f}; one iterator for both epochs "
        f"(repeat='epochs') {latency['timing']['new_one_iterator']['median_s']:.3f} s, / limit "
        f"{latency['one_iterator_over_limit']:.2f}"
    )
    print(
        f"CPU-bound: new {cpu['timing']['new']['median_s']:.3f} s, previous "
        f"{cpu['timing']['previous']['median_s']:.3f} s; new / previous speed "
        f"{cpu['new_speed_vs_previous']:.3f} (goal >= 0.97)"
    )
    if "service" in figures:
        service = figures["service"]
        print(
            f"service (2 workers): {service['timing']['service']['median_s']:.3f} s, "
            f"in-process {service['timing']['in_process']['median_s']:.3f} s; service / "
            f"in-process speed {service['service_speed_vs_in_process']:.2f}, service / limit "
            f"{service['service_over_limit']:.2f}"
        )


if __name__ == "__main__":
    main()
