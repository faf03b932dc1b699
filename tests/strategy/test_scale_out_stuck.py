"""A stuck 2-worker job names the stuck worker and what it does, on real localhost workers.

Worker 1 stops reaching the next step (a callback that sleeps, or an input pipeline that blocks
from step k on); worker 0's collective watchdog (``collective_timeout``) ends the step, and its
error names worker 1 with its phase, read through TensorFlow's coordination service. Worker 1
is stuck for good (it sleeps in Python, or waits in its own input pipeline): its log says the
same once the others wait for it, and it ends by itself once worker 0 gave up on it (status 1,
its stacks printed). Every wait has a deadline.
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import time

import pytest
from support.processes import Process, free_port, start_python, tf_config

from tfdp_utils.strategy._faults import end_grace

pytestmark = [pytest.mark.slow, pytest.mark.keras]

BOUND = 6.0  # collective_timeout: short, so that the test is

SCRIPT = r"""
import json, os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal: Ctrl-C raises
import numpy as np
import tfdp_utils as tdu
from tfdp_utils._tf import tf, keras

strategy = tdu.auto_strategy(cluster_timeout=60, collective_timeout=float(os.environ["CT"]))
rank = int(strategy.cluster_resolver.task_id)
mode, at = os.environ["MODE"], int(os.environ["AT"])

armed = []

def block_from(ids):
    # Worker 1 keeps every 2nd id (shard_policy='data'), 4 a step: step k holds ids from
    # 8 (k - 1); from there its pipeline never delivers. Armed once training runs: Keras
    # iterates a first iterator it throws away (which would wait for a blocked element as
    # it is freed). The pipeline may have run past id 8 (k - 1) before it was armed: the
    # step that waits is the one of the lowest id that blocked (printed).
    if rank == 1 and armed and int(ids.max()) >= 8 * (at - 1):
        print(f"BLOCKED {int(ids.max())}", flush=True)
        while True:
            time.sleep(1)
    return ids

def map_fn(ids, y):
    if mode == "input":
        ids = tf.numpy_function(block_from, [ids], tf.int64, stateful=False)
        ids.set_shape([])
    return tf.cast(tf.reshape(ids, [1]), tf.float32), y

ids = np.arange(4096, dtype="int64")
y = np.ones((4096, 1), "float32")
dist = tdu.build_distributed_dataset(
    (ids, y), strategy=strategy, global_batch_size=8, shard_policy="data", map_fn=map_fn
)
with strategy.scope():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.0), "mse")

class Stall(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if rank == 1 and int(self.model.optimizer.iterations.numpy()) == at:
            print(f"STALL {time.time()}", flush=True)
            while True:
                time.sleep(1)

class Arm(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        armed.append(True)

callbacks = [Stall()] if mode == "callback" else [Arm()]
print(f"FIT {time.time()}", flush=True)
try:
    model.fit(dist, epochs=1, steps_per_epoch=400, callbacks=callbacks, verbose=0)
except Exception as exc:
    if os.environ.get("UNCAUGHT"):
        raise
    print("FAILED " + json.dumps({"time": time.time(), "type": type(exc).__name__,
                                  "message": str(exc)[:4000]}), flush=True)
    sys.exit(3)
print("FINISHED", flush=True)
"""


def _line(out: str, tag: str) -> dict:
    for line in out.splitlines():
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1 :])
    raise AssertionError(f"no {tag} line in output:\n{out[-3000:]}")


def _start(mode: str, at: int, bound: float = BOUND, **extra: str) -> list[Process]:
    ports = [free_port(), free_port()]
    env = {"MODE": mode, "AT": str(at), "CT": str(bound), "TF_CPP_MIN_LOG_LEVEL": "2", **extra}
    return [
        start_python(SCRIPT, env={**env, "TF_CONFIG": tf_config(ports, i)}, preloaded=True)
        for i in range(2)
    ]


@dataclasses.dataclass
class Ended:
    """How one worker ended: status, output, and when (``time.time()``, polled every 0.2 s)."""

    status: int
    out: str
    err: str
    at: float


def _run(mode: str, at: int) -> tuple[Ended, Ended]:
    """Start 2 workers; wait (bounded) for both to end by themselves.

    Worker 1 is stuck for good (it sleeps in Python, or its input never arrives); it must end
    on its own once worker 0 gave up on it. A worker still alive at the deadline fails the test.
    """
    processes = _start(mode, at)
    ended: dict[int, Ended] = {}
    try:
        deadline = time.monotonic() + 150
        while len(ended) < 2 and time.monotonic() < deadline:
            for rank, process in enumerate(processes):
                if rank not in ended and process.poll() is not None:
                    ended[rank] = Ended(
                        process.popen.returncode, process.stdout(), process.stderr(), time.time()
                    )
            time.sleep(0.2)
        alive = [rank for rank in range(2) if rank not in ended]
        assert not alive, "\n".join(
            f"worker {rank} did not end by itself:\n{processes[rank].tail()}" for rank in alive
        )
        return ended[0], ended[1]
    finally:
        for process in processes:
            process.close()


ENDS = (
    r"tfdp-utils: worker 1 \(this one\) ends with status 1: it has been {doing}, and {why}; it "
    r"cannot rejoin the job, so it exits instead of holding its allocation \(every thread's "
    r"stack follows\)\. Restart every task: with PreemptionCheckpoint or BackupAndRestore, "
    r"training resumes\."
)


def _ended_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "ends with status" in line]
    assert len(lines) == 1, stderr[-4000:]
    return lines[0]


def _diagnosis(stderr: str) -> str:
    """The first diagnosis line of a log, without its closing full stop."""
    lines = [line for line in stderr.splitlines() if line.startswith("tfdp-utils: step ")]
    assert lines, stderr[-4000:]
    return lines[0].rstrip(".")


def _named(message: str) -> str:
    """The diagnosis inside an error's message (TensorFlow words the error around it)."""
    found = re.search(r"tfdp-utils: step [^\n]*", message)
    assert found, message
    return found.group(0).rstrip(".")


def test_worker_stuck_in_a_callback_is_named_with_the_callback_and_ends_by_itself():
    at = 3
    w0, w1 = _run("callback", at)
    assert w0.status == 3, w0.err[-4000:]
    failure = _line(w0.out, "FAILED")
    assert failure["type"] == "DeadlineExceededError"
    first = _named(failure["message"])
    assert re.fullmatch(
        rf"tfdp-utils: step {at + 1} stuck: worker 1 is in a callback "
        rf"\(Stall\.on_train_batch_end\) after step {at} \(for \d+ s\); worker 0 \(this one\) "
        r"waits in the step's collective",
        first,
    ), failure["message"]
    # Within the bound: worker 0 waited from about the stall to the bound (+ sampling, reading).
    stalled = float(w1.out.split("STALL ")[1].split()[0])
    waited = failure["time"] - stalled
    assert BOUND - 1.5 <= waited < BOUND + 5
    # The one line comes before the traceback, in worker 0's log.
    assert _diagnosis(w0.err) == first
    # Worker 1 (stuck in Python: no TensorFlow call to abort) says it holds the others up...
    told = _diagnosis(w1.err)
    assert re.fullmatch(
        rf"tfdp-utils: step {at + 1} stuck: worker 1 \(this one\) is in a callback "
        rf"\(Stall\.on_train_batch_end\) after step {at} \(for \d+ s\); worker 0 waits in the "
        r"step's collective",
        told,
    ), told
    # ...and ends by itself once worker 0 gave up (its abort mark, or the service gone with
    # worker 0), with the stack that shows where it was stuck.
    assert w1.status == 1, w1.err[-4000:]
    doing = rf"in a callback \(Stall\.on_train_batch_end\) after step {at} for \d+ s"
    why = (
        rf"(worker 0 gave up on step {at + 1} after waiting \d+ s \(collective_timeout\)"
        r"|the job's coordination service no longer answers \(its leader, worker 0, has ended "
        r"or is unreachable\))"
    )
    assert re.fullmatch(ENDS.format(doing=doing, why=why), _ended_line(w1.err)), w1.err[-3000:]
    stack = w1.err[w1.err.index("ends with status") :]
    assert "on_train_batch_end" in stack and "File " in stack
    # Within the bound and a few seconds (two reads of the marks, the process's end).
    assert w1.at - stalled < BOUND + 10, (w1.at - stalled, w0.at - stalled)


def test_worker_whose_input_blocks_is_named_with_input_and_the_step_and_ends_by_itself():
    w0, w1 = _run("input", 20)
    blocked = [int(line.split()[1]) for line in w1.out.splitlines() if line.startswith("BLOCKED ")]
    assert blocked, w1.out[-3000:]
    at = min(blocked) // 8 + 1  # worker 1's step k holds ids 8 (k - 1) + 1, 3, 5, 7
    assert w0.status == 3, w0.err[-4000:]
    failure = _line(w0.out, "FAILED")
    assert failure["type"] == "DeadlineExceededError"
    first = _named(failure["message"])
    assert re.fullmatch(
        rf"tfdp-utils: step {at} stuck: worker 1 is reading input for step {at} \(for \d+ s\); "
        r"worker 0 \(this one\) waits in the step's collective",
        first,
    ), failure["message"]
    fit_started = float(w0.out.split("FIT ")[1].split()[0])
    assert failure["time"] - fit_started < 60  # trace, 3 steps, the bound
    assert _diagnosis(w0.err) == first
    # Worker 1 waits inside its step, so its own watchdog fires with the same diagnosis...
    told = _diagnosis(w1.err)
    assert re.fullmatch(
        rf"tfdp-utils: step {at} stuck: worker 1 \(this one\) is reading input for step {at} "
        r"\(for \d+ s\); worker 0 waits in the step's collective",
        told,
    ), told
    # ...but its abort cannot end a read that never returns: it ends the process after the
    # grace, within a few seconds of worker 0's error.
    assert w1.status == 1, w1.err[-4000:]
    doing = rf"reading input for step {at} \([^)]*\)"
    why = (
        rf"its collectives were aborted \d+ s ago \(collective_timeout={BOUND:g} s\) but the "
        r"call has not returned: it waits for something the abort cannot end"
    )
    assert re.fullmatch(ENDS.format(doing=doing, why=why), _ended_line(w1.err)), w1.err[-3000:]
    assert w1.at - failure["time"] < end_grace(BOUND) + 8, (w1.at, failure["time"])


def test_a_step_ended_by_the_collectives_own_failure_names_the_stuck_worker_too():
    """Worker 1, stuck in a callback, is killed before worker 0's bound: TensorFlow fails
    worker 0's collective itself (UnavailableError), and the line read at half the bound is
    printed before the uncaught error's traceback."""
    # TensorFlow needs its own seconds to fail a collective whose peer died: the kill comes
    # just after half the bound, so the other half is TensorFlow's (with a 20-s bound, under
    # the suite's load, the watchdog's DeadlineExceededError sometimes came first).
    at, bound = 3, 40.0
    processes = _start("callback", at, bound, UNCAUGHT="1")
    try:
        deadline = time.monotonic() + 150
        # Worker 1 says it holds worker 0 up at half the bound; worker 0 has read it by then.
        while "stuck:" not in processes[1].stderr():
            assert time.monotonic() < deadline, processes[1].tail()
            assert processes[0].poll() is None, processes[0].tail()
            time.sleep(0.2)
        time.sleep(1.5)  # worker 0 samples once a second
        processes[1].kill()
        while processes[0].poll() is None:
            assert time.monotonic() < deadline, processes[0].tail()
            time.sleep(0.2)
        rc0, err0 = processes[0].popen.returncode, processes[0].stderr()
    finally:
        for process in processes:
            process.close()
    assert rc0 == 1, err0[-4000:]
    assert "DeadlineExceededError" not in err0  # the watchdog did not fire: TensorFlow failed it
    told = _diagnosis(err0)
    assert re.fullmatch(
        rf"tfdp-utils: step {at + 1} stuck: worker 1 is in a callback "
        rf"\(Stall\.on_train_batch_end\) after step {at} \(for \d+ s\); worker 0 \(this one\) "
        r"waits in the step's collective",
        told,
    ), err0[-4000:]
    assert err0.index(told) < err0.index("Traceback (most recent call last)")


def test_a_peer_killed_mid_step_is_named_before_the_traceback():
    """Worker 1 is killed before worker 0 has waited long (no diagnosis prepared): TensorFlow
    fails worker 0's collective with a long UnavailableError; the line naming the gone peer
    is printed before the traceback of the uncaught error."""
    processes = _start("callback", 3, 60.0, UNCAUGHT="1")
    try:
        deadline = time.monotonic() + 150
        while "STALL " not in processes[1].stdout():
            assert time.monotonic() < deadline, processes[1].tail()
            time.sleep(0.2)
        processes[1].kill()
        while processes[0].poll() is None:
            assert time.monotonic() < deadline, processes[0].tail()
            time.sleep(0.2)
        rc0, err0 = processes[0].popen.returncode, processes[0].stderr()
    finally:
        for process in processes:
            process.close()
    assert rc0 == 1, err0[-4000:]
    lines = [line for line in err0.splitlines() if "is gone: its connection failed" in line]
    assert lines == [
        "tfdp-utils: the peer task /job:worker/replica:0/task:1 is gone: its connection failed "
        "during a multi-worker call (its process ended: killed, out of memory, preempted or "
        "crashed; its own log says which). Restart every task: with PreemptionCheckpoint or "
        "BackupAndRestore, training resumes."
    ], err0[-4000:]
    assert err0.index(lines[0]) < err0.index("Traceback (most recent call last)")


def test_ctrl_c_ends_a_worker_held_in_a_collective_by_a_peer_that_left_the_step():
    """Ctrl-C reaches worker 0 inside step 4's all-reduce while worker 1 never joins it (it
    sits in a callback: as a peer that Ctrl-C stopped between two steps, or a stuck one).
    Python's KeyboardInterrupt would come only when the call returns (here: the 120 s bound);
    the worker's collectives are aborted instead and it ends by SIGINT within seconds."""
    at, bound = 3, 120.0
    processes = _start("callback", at, bound, UNCAUGHT="1")
    try:
        deadline = time.monotonic() + 150
        while "STALL " not in processes[1].stdout():
            assert time.monotonic() < deadline, processes[1].tail()
            assert processes[0].poll() is None, processes[0].tail()
            time.sleep(0.2)
        time.sleep(2.0)  # worker 0 is in step 4's collective by now, waiting for worker 1
        assert processes[0].poll() is None, processes[0].tail()
        processes[0].popen.send_signal(signal.SIGINT)
        sent = time.monotonic()
        while processes[0].poll() is None and time.monotonic() < sent + 60:
            time.sleep(0.1)
        took = time.monotonic() - sent
        rc0, err0 = processes[0].popen.returncode, processes[0].stderr()
    finally:
        for process in processes:
            process.close()
    assert rc0 == -signal.SIGINT, (rc0, err0[-4000:])
    assert took < 8.0, f"worker 0 ended {took:.1f} s after Ctrl-C"
    lines = [line for line in err0.splitlines() if line.startswith("tfdp-utils: Ctrl-C")]
    assert len(lines) == 1, err0[-4000:]
    assert re.search(
        r"tfdp-utils: Ctrl-C \(SIGINT\) reached this worker while it waited inside a "
        r"multi-worker call \(\w+ in [\w.]+\), which returns only once every worker joins "
        r"it; its collectives were aborted so that it stops now\. The job cannot go on",
        lines[0],
    ), lines[0]
    assert "KeyboardInterrupt" in err0


LOOP = r"""
import os, signal, sys, threading, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal: Ctrl-C raises
import tfdp_utils as tdu
from tfdp_utils._tf import tf

strategy = tdu.auto_strategy(cluster_timeout=60, collective_timeout=float(os.environ["CT"]))
rank = int(strategy.cluster_resolver.task_id)
dist = tdu.build_distributed_dataset(
    tf.data.Dataset.range(4096), strategy=strategy, global_batch_size=8, shard_policy="data"
)


def ctrl_c_in_this_thread():
    # The kernel hands a process's SIGINT to any thread that does not block it. This one
    # takes it: the main thread's wait is not interrupted, and CPython raises
    # KeyboardInterrupt only once that thread runs Python again.
    while not os.path.exists(os.environ["TRIGGER"]):
        time.sleep(0.05)
    print(f"SIGINT {time.time()}", flush=True)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)


if rank == 0:
    threading.Thread(target=ctrl_c_in_this_thread, daemon=True).start()
iterator = iter(dist)
for step in range(1, 400):
    next(iterator)  # its eager cross-worker reduce: pool.map, waiting on TensorFlow's threads
    if rank == 1 and step == 3:
        print(f"STALL {time.time()}", flush=True)
        while True:
            time.sleep(1)
"""


def test_ctrl_c_in_another_thread_ends_a_loop_held_in_the_eager_reduce(tmp_path):
    """A custom loop's ``next(iterator)`` on worker 0 waits in step 4's eager cross-worker
    reduce (``pool.map``, in ``threading``) for worker 1, which never comes; Ctrl-C lands in
    another thread of worker 0. The wait is TensorFlow's as much as a collective's C++ call
    is: its collectives are aborted and it ends by SIGINT, not at the 120-s bound."""
    bound = 120.0
    ports = [free_port(), free_port()]
    trigger = tmp_path / "ctrl-c"
    env = {"CT": str(bound), "TRIGGER": str(trigger), "TF_CPP_MIN_LOG_LEVEL": "2"}
    processes = [
        start_python(LOOP, env={**env, "TF_CONFIG": tf_config(ports, i)}, preloaded=True)
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + 150
        while "STALL " not in processes[1].stdout():
            assert time.monotonic() < deadline, processes[1].tail()
            assert processes[0].poll() is None, processes[0].tail()
            time.sleep(0.2)
        time.sleep(2.0)  # worker 0 waits in step 4's reduce by now
        assert processes[0].poll() is None, processes[0].tail()
        trigger.touch()
        sent = time.monotonic()
        while processes[0].poll() is None and time.monotonic() < sent + bound / 2:
            time.sleep(0.1)
        rc0, err0 = processes[0].poll(), processes[0].stderr()
    finally:
        for process in processes:
            process.close()
    lines = [line for line in err0.splitlines() if line.startswith("tfdp-utils: Ctrl-C")]
    assert len(lines) == 1, err0[-4000:]  # the abort's own account: it fired, once
    assert rc0 == -signal.SIGINT, (rc0, err0[-4000:])
    assert "KeyboardInterrupt" in err0
