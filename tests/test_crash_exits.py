"""A crashed job always ends: real processes crash in ``fit`` and end with their own status.

Each trains on a builder dataset read by a ``from_generator`` reader under a parallel
interleave, the pipeline that keeps a crashed process alive without tfdp-utils' exit guard
(``test_without_the_guard_the_same_crash_never_ends`` shows the hang). ``scripts/crash_repeat.py``
repeats every crash path (errors in fit/evaluate/predict/a loop, Ctrl-C, SIGTERM, the watchdog's
abort; every source kind; 1 and 2 workers and replicas) many times in CI, with a 10 s bound from
the error to the exit. The last tests are clean exits of a 2-worker job whose workers end apart
(the exit barrier, ``scripts/exit_repeat.py --skew`` repeats them).
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.processes import (
    Outcome,
    Process,
    free_port,
    result_line,
    run_python,
    start_python,
    tf_config,
    wait_all,
)

from tfdp_utils._exit_barrier import DEFAULT_BOUND

JOB = r"""
import os, signal, sys, time
# As a program started from a terminal: a test runner started in the background may pass
# SIGINT on ignored (bash's asynchronous commands ignore it), and Python keeps it ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tfdp_utils as tdu
from tfdp_utils._tf import keras

CRASH = sys.argv[1]
strategy = tdu.auto_strategy(verbose=False)
folder = sys.argv[2]
files = []
for i in range(8):
    files.append(os.path.join(folder, f"part{i}"))
    open(files[-1], "w").close()


def reader(path):
    def generate():
        for i in range(100_000):
            # Latency-bound, so that the pipeline is still reading when the job crashes and
            # while it exits: the hang needs a reader in Python when the interpreter finalizes.
            # Readers of 0.002 s per example filled the prefetch buffers in the seconds a
            # loaded machine takes to exit (then no reader runs and the process ends: 1 of 6
            # unguarded runs at load 5, 3 of 6 with no sleep at all, 0 of 8 at 0.02 s).
            time.sleep(0.02)
            yield np.array([i, 1, 2, 3], "float32"), np.array([1], "float32")

    spec = (tf.TensorSpec([4], tf.float32), tf.TensorSpec([1], tf.float32))
    return tf.data.Dataset.from_generator(generate, output_signature=spec)


dist = tdu.build_distributed_dataset(files, reader=reader, strategy=strategy, global_batch_size=8)


class Boom(keras.layers.Layer):
    def __init__(self):
        super().__init__()
        with strategy.scope():
            self.calls = [tf.Variable(0, dtype=tf.int64, trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)]

    def call(self, x):
        if CRASH == "error":
            count = self.calls[0].assign_add(1)
            tf.debugging.assert_less(count, tf.constant(3, tf.int64), message="boom at call 3")
        return x


class Ready(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.005)
        if batch == 2:
            print("READY", flush=True)


with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), Boom(), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
model.fit(dist, epochs=1, steps_per_epoch=5000, verbose=0, callbacks=[Ready()])
print("NO CRASH", flush=True)
"""

# Every test but the registry's runs again on tf_keras: their jobs crash, stop or exit inside
# Keras' fit, whose threads and teardown differ between Keras 3 and tf_keras. The registry test's
# child never touches Keras (the exit guard is installed by auto_strategy the same way on both).
pytestmark = pytest.mark.slow


@pytest.mark.keras
def test_an_error_in_fit_ends_the_process_with_status_1(tmp_path) -> None:
    done = run_python(JOB, timeout=120, args=("error", str(tmp_path)))
    assert done.returncode == 1, done.stderr[-3000:]
    assert "boom at call 3" in done.stderr
    assert "NO CRASH" not in done.stdout


STILL_ALIVE = 20.0
"""Seconds a crashed process without the guard must outlive its traceback: twice the 10 s
bound within which every guarded crash ends (scripts/crash_repeat.py)."""


@pytest.mark.keras
def test_without_the_guard_the_same_crash_never_ends(tmp_path) -> None:
    # The reproduction: the process printed its traceback and stays alive until killed.
    process = start_python(JOB, env={"TFDP_EXIT_GUARD": "0"}, args=("error", str(tmp_path)))
    try:
        deadline = time.monotonic() + 120
        while "boom at call 3" not in process.stderr():
            assert process.popen.poll() is None, process.tail()
            assert time.monotonic() < deadline, process.tail()
            time.sleep(0.2)
        seen = time.monotonic()
        try:
            status = process.popen.wait(timeout=STILL_ALIVE)
        except subprocess.TimeoutExpired:
            return  # still alive STILL_ALIVE s after its traceback: the hang
        raise AssertionError(
            f"the unguarded crash ended {time.monotonic() - seen:.1f} s after its traceback "
            f"with status {status}: no hang reproduced\n{process.tail()}"
        )
    finally:
        if process.popen.poll() is None:
            process.popen.kill()
            process.popen.wait()
        process.close()


@pytest.mark.keras
def test_ctrl_c_in_fit_ends_the_process_by_sigint(tmp_path) -> None:
    process = start_python(JOB, args=("interrupt", str(tmp_path)))
    try:
        deadline = time.monotonic() + 120
        while "READY" not in process.stdout() and time.monotonic() < deadline:
            assert process.popen.poll() is None, process.tail()
            time.sleep(0.1)
        process.popen.send_signal(signal.SIGINT)
        status = process.popen.wait(timeout=60)
        tail, stderr = process.tail(), process.stderr()
    finally:
        if process.popen.poll() is None:
            process.popen.kill()
            process.popen.wait()
        process.close()
    assert status == -signal.SIGINT, tail
    assert "KeyboardInterrupt" in stderr


def test_the_guard_is_listed_and_undone_by_the_registry(tmp_path) -> None:
    done = run_python(
        """
        import sys
        import tfdp_utils as tdu
        from tfdp_utils import compat
        before = sys.excepthook
        tdu.auto_strategy(verbose=False)
        entry = [s for s in compat.status() if s.issue == "exit-guard"][0]
        print(entry.applied, entry.applied_by, entry.undoable, sys.excepthook is before)
        compat.undo("exit-guard")
        print(sys.excepthook is before)
        """,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = done.stdout.strip().splitlines()[-2:]
    assert first.split()[-3:] == ["auto_strategy()", "True", "False"]
    assert second == "True"


TWO_WORKERS = r"""
import atexit, json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def report():  # registered first, so it runs last: after the exit barrier
    from tfdp_utils.compat._registry import REGISTRY

    applied = REGISTRY.get("exit-barrier")
    barrier = applied.patches[0] if applied else None
    outcome = barrier.outcome if barrier else None
    times = barrier.times if barrier else {}
    print("BARRIER " + json.dumps({"outcome": outcome, "times": times}), flush=True)
    ctrl_c = REGISTRY.get("ctrl-c-abort")
    print("CTRL-C " + json.dumps(bool(ctrl_c and ctrl_c.patches[0].installed())), flush=True)


atexit.register(report)
import numpy as np
import tensorflow as tf
import tfdp_utils as tdu
from tfdp_utils._tf import keras

strategy = tdu.auto_strategy(cluster_timeout=60, verbose=False)
x = np.random.RandomState(0).rand(64, 4).astype("float32")
train = tdu.build_distributed_dataset(
    (x, x.sum(1, keepdims=True)), strategy=strategy, global_batch_size=8
)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
model.fit(train, epochs=1, verbose=0)
print("RESULT " + json.dumps({"at": time.time()}), flush=True)
time.sleep(float(os.environ.get("EXIT_SKEW", "0")))  # this worker exits that much later
"""


def _two_workers(skews: tuple[float, float]) -> list[Process]:
    ports = [free_port(), free_port()]
    return [
        start_python(
            TWO_WORKERS,
            env={"TF_CONFIG": tf_config(ports, index), "EXIT_SKEW": str(skews[index])},
        )
        for index in range(2)
    ]


@pytest.mark.keras
def test_workers_that_end_6_s_apart_both_exit_0_together() -> None:
    # Workers that ended far apart were reported to die by SIGABRT after their last output
    # line (-6, "FATAL: exception not rethrown"); the exit barrier makes them leave together.
    outcomes = wait_all(_two_workers((0.0, 6.0)), timeout=240)
    assert [outcome.returncode for outcome in outcomes] == [0, 0], _tails_of(outcomes)
    early, late = (result_line(outcome, "BARRIER") for outcome in outcomes)
    assert early["outcome"] == ["all", []] and late["outcome"] == ["all", []]
    # Ctrl-C is heard from a helper thread on every worker (tests/strategy/test_ctrl_c.py).
    assert [result_line(outcome, "CTRL-C") for outcome in outcomes] == [True, True]
    # The early worker waited for the late one's arrival, and left within a moment of it.
    assert early["times"]["left"] >= late["times"]["waits"] - 0.05
    assert abs(early["times"]["left"] - late["times"]["left"]) < 2.0


@pytest.mark.keras
def test_a_worker_whose_peer_was_killed_still_exits_0_within_seconds() -> None:
    processes = _two_workers((0.0, 600.0))
    try:
        deadline = time.monotonic() + 240
        while not all("RESULT " in process.stdout() for process in processes):
            assert time.monotonic() < deadline, _tails_now(processes)
            assert all(process.poll() in (None, 0) for process in processes), _tails_now(processes)
            time.sleep(0.2)
        time.sleep(1.0)  # worker 0 waits at its exit barrier for worker 1
        assert processes[0].poll() is None, _tails_now(processes)
        processes[1].popen.kill()
        killed = time.monotonic()
        status = processes[0].popen.wait(timeout=60)
        seconds = time.monotonic() - killed
        out = processes[0].stdout()
    finally:
        for process in processes:
            process.close()
    assert status == 0, out
    # The barrier's own account says the probe found the peer gone; the clock only has to
    # tell that from waiting out the 60-s bound (its teardown after the barrier took 9.9 s
    # beside 12 busy processes, 2-4 s alone).
    assert result_line(Outcome(status, out, ""), "BARRIER")["outcome"] == ["gone", [1]]
    assert seconds < 0.5 * DEFAULT_BOUND, f"exited {seconds:.1f} s after its peer was killed"


def _tails_now(processes: list[Process]) -> str:
    return "\n".join(process.tail() for process in processes)


def _tails_of(outcomes: list[Outcome]) -> str:
    return "\n".join(f"rc={o.returncode}\n{o.stdout[-2000:]}\n{o.stderr[-3000:]}" for o in outcomes)


# A helper thread of tfdp-utils inside a TensorFlow call (a tf.io.gfile read of a pipe written
# 1 s after the main thread's end) when the main thread ends, with a sys.stdout whose flush
# (Python flushes it after it began finalizing) keeps the interpreter finalizing for 4 s.
# Unmarked, the read returns while Python finalizes and the process dies by SIGABRT after its
# last line, as finished 2-worker jobs were seen to (CPython ends such a thread with
# pthread_exit inside TensorFlow's C++ frames); marked (tfdp_utils._helper_calls), the exit
# waits for the read and the process exits 0.
PIPE_READ = r"""
import os, subprocess, sys, threading, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
from tfdp_utils import _helper_calls

pipe, marked = sys.argv[1], sys.argv[2] == "marked"
os.mkfifo(pipe)
reading = threading.Event()


def read():  # a TensorFlow call with the GIL released: it opens the pipe and waits for a line
    reading.set()
    if marked:
        with _helper_calls.call("a read of the test's pipe"):
            tf.io.gfile.GFile(pipe).read()
    else:
        tf.io.gfile.GFile(pipe).read()


class SlowFlush:  # Python flushes sys.stdout once finalizing: the read returns meanwhile
    def __init__(self, out):
        self.out = out

    def write(self, text):
        return self.out.write(text)

    def flush(self, sleep=time.sleep, finalizing=sys.is_finalizing):
        self.out.flush()
        if finalizing():
            sleep(4)


sys.stdout = SlowFlush(sys.stdout)
threading.Thread(target=read, daemon=True).start()
reading.wait(60)
time.sleep(1)  # the thread is inside TensorFlow's open of the pipe (it waits for a writer)
# The line comes 1 s after the main thread's end (never holding this process's output open).
writer = f"sleep 1; echo written > {pipe}"
subprocess.Popen(["timeout", "30", "sh", "-c", writer], stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
print("result: main thread done", flush=True)
"""


@pytest.mark.parametrize("marked", [True, False], ids=["marked", "unmarked"])
def test_a_helper_threads_call_returning_at_exit_cannot_abort_the_process(
    tmp_path: Path, marked: bool
) -> None:
    done = run_python(
        PIPE_READ, args=(str(tmp_path / "pipe"), "marked" if marked else "unmarked"), timeout=120
    )
    assert "result: main thread done" in done.stdout, done.stderr[-3000:]
    if marked:
        assert done.returncode == 0, done.stderr[-3000:]
    else:  # the hazard the marks remove: the call's return during finalization aborts
        assert done.returncode == -signal.SIGABRT, (done.returncode, done.stderr[-3000:])
        assert "exception not rethrown" in done.stderr
