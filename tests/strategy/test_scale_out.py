"""Scale-out with real localhost processes: SLURM srun variables, TF_CONFIG with chief, worker
and evaluator, a worker that dies or hangs mid-fit, and preemption with BackupAndRestore.

Every launch has a hard deadline (``wait_all``) and kills what is left.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest
from support.processes import Outcome, Process, free_port, start_python, wait_all

pytestmark = [pytest.mark.slow, pytest.mark.keras]

# One user script for every launcher: auto_strategy + the dataset builder + Keras fit.
TRAIN = r"""
import json, os, signal, sys, time
import numpy as np
import tfdp_utils as tdu
from tfdp_utils._tf import tf, keras

from tfdp_utils.strategy._collective_bound import DEFAULT_COLLECTIVE_TIMEOUT

bound = float(os.environ.get("CT", DEFAULT_COLLECTIVE_TIMEOUT))
strategy = tdu.auto_strategy(cluster_timeout=60, collective_timeout=bound)
choice = tdu.strategy.explain(strategy)
if tdu.cluster_task_type() == "evaluator":
    print("RESULT " + json.dumps({"kind": choice.kind, "reason": choice.reason,
                                  "replicas": strategy.num_replicas_in_sync}), flush=True)
    sys.exit(0)
rank = int(strategy.cluster_resolver.task_id) if choice.kind == "multi_worker" else 0
# 32 examples = one pass per 4-step epoch, so a resumed epoch sees what the original saw.
x = np.random.RandomState(0).rand(32, 4).astype("float32")
y = (x @ np.arange(1, 5, dtype="float32"))[:, None]
dist = tdu.build_distributed_dataset((x, y), strategy=strategy, global_batch_size=8, repeat=True)
keras.utils.set_random_seed(1)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")

mode = os.environ.get("MODE", "train")
victim = int(os.environ.get("VICTIM", "1"))
at = int(os.environ.get("AT", "-1"))
losses = []

class Script(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        losses.append(float(logs["loss"]))
        step = int(self.model.optimizer.iterations.numpy())
        if step == at and (mode == "preempt" or rank == victim):
            print(f"{mode.upper()} {time.time()}", flush=True)
            if mode == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            # "hang": alive, heartbeating, never joins the next step. "preempt": waits here
            # for the scheduler's SIGKILL, which the test sends once every task is here.
            time.sleep(600)

callbacks = [Script()]
if os.environ.get("BACKUP"):
    backup = tdu.worker_backup_dir(os.environ["BACKUP"], strategy)
    callbacks.insert(0, keras.callbacks.BackupAndRestore(backup))
try:
    model.fit(dist, epochs=int(os.environ.get("EPOCHS", "2")),
              steps_per_epoch=int(os.environ.get("STEPS", "4")), callbacks=callbacks, verbose=0)
except Exception as exc:
    print("FAILED " + json.dumps({"time": time.time(), "type": type(exc).__name__,
                                  "message": str(exc)[:3000]}), flush=True)
    sys.exit(3)
weights = [w.tolist() for w in model.get_weights()]
print("RESULT " + json.dumps({"kind": choice.kind, "replicas": strategy.num_replicas_in_sync,
                              "losses": losses, "weights": weights,
                              "iterations": int(model.optimizer.iterations.numpy())}), flush=True)
"""


def _line(out: str, tag: str) -> dict:
    for line in out.splitlines():
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1 :])
    raise AssertionError(f"no {tag} line in output:\n{out[-3000:]}")


def _stamp(out: str, tag: str) -> float:
    for line in out.splitlines():
        if line.startswith(tag + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {tag} line in output:\n{out[-3000:]}")


def _tf_config(cluster: dict, task_type: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def _two_free_ports() -> int:
    """A port p such that p and p + 1 are both free on 127.0.0.1 (a SLURM port base)."""
    for _ in range(50):
        base = free_port()
        try:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", base + 1))
        except OSError:
            continue
        return base
    raise RuntimeError("found no two consecutive free ports")


def _workers(n: int, **env: str) -> list[dict[str, str]]:
    ports = [free_port() for _ in range(n)]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    return [{"TF_CONFIG": _tf_config(cluster, "worker", i), **env} for i in range(n)]


def _kill_when_all_print(processes: list[Process], marker: str, *, timeout: float) -> list[Outcome]:
    """SIGKILL every process once each has printed a line starting with ``marker``.

    Returns what :func:`wait_all` returns. Raises TimeoutError (after killing them all) when
    the deadline passes first, and AssertionError when a process ends without the line.
    """
    deadline = time.monotonic() + timeout
    try:
        waiting = list(processes)
        while waiting:
            for process in list(waiting):
                lines = process.stdout().splitlines()
                if any(line.startswith(marker) for line in lines):
                    waiting.remove(process)
                elif process.poll() is not None:
                    raise AssertionError(
                        f"pid {process.pid} ended before printing {marker!r}:\n{process.tail()}"
                    )
            if waiting and time.monotonic() > deadline:
                raise TimeoutError(
                    f"not every process printed {marker!r} in {timeout} s:\n"
                    + "\n".join(process.tail() for process in processes)
                )
            time.sleep(0.1)
    finally:
        for process in processes:
            process.kill()
    return wait_all(processes, timeout=30, check=False)


def _assert_same_training(results: list[tuple[int, str, str]], steps: int) -> list[dict]:
    data = []
    for rc, out, err in results:
        assert rc == 0, err[-3000:]
        data.append(_line(out, "RESULT"))
    first = data[0]
    assert first["kind"] == "multi_worker" and first["replicas"] == 2
    assert len(first["losses"]) == steps and first["iterations"] == steps
    # Synchronous data parallelism: every worker ends with the very same weights...
    for other in data[1:]:
        assert other["weights"] == first["weights"]
        assert other["iterations"] == first["iterations"]
    # ...and they trained: the loss fell.
    assert first["losses"][-1] < first["losses"][0]
    return data


EPOCHS, STEPS = 3, 4  # the uninterrupted 2-worker job


@pytest.fixture(scope="module")
def srun_job() -> list[Outcome]:
    """The uninterrupted 2-worker job, its tasks started as srun starts them (SLURM variables),
    run once: the SLURM test checks how its tasks found each other and trained, and the
    preemption test compares its resumed job with it (how the workers found each other does not
    enter the weights: the same MultiWorkerMirroredStrategy over 2 workers either way)."""
    base = _two_free_ports()
    common = {
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NODELIST": "127.0.0.1",
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_JOB_ID": "4242",
        "TFDP_SLURM_PORT_BASE": str(base),
        "EPOCHS": str(EPOCHS),
        "STEPS": str(STEPS),
    }
    processes = [
        start_python(
            TRAIN,
            env={**common, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)},
            preloaded=True,
        )
        for i in range(2)
    ]
    return wait_all(processes, timeout=150)


def test_slurm_srun_tasks_train_in_step(srun_job: list[Outcome]) -> None:
    data = _assert_same_training(srun_job, steps=EPOCHS * STEPS)
    # srun's tasks see the same loss sequence: each logged loss is the global one.
    assert data[0]["losses"] == data[1]["losses"]


def test_tf_config_chief_worker_train_and_evaluator_trains_nothing():
    ports = [free_port() for _ in range(3)]
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    evaluator = {"evaluator": [f"127.0.0.1:{ports[2]}"], **cluster}
    envs = [
        {"TF_CONFIG": _tf_config(cluster, "chief", 0)},
        {"TF_CONFIG": _tf_config(cluster, "worker", 0)},
        {"TF_CONFIG": _tf_config(evaluator, "evaluator", 0)},
    ]
    processes = [start_python(TRAIN, env=env, preloaded=True) for env in envs]
    results = wait_all(processes, timeout=150)
    _assert_same_training(results[:2], steps=8)
    rc, out, err = results[2]
    assert rc == 0, err[-3000:]
    report = _line(out, "RESULT")
    assert report["kind"] == "one_device"
    assert "evaluator task trains nothing" in report["reason"]


def test_killed_worker_ends_the_survivor_with_an_error_within_the_bound():
    bound = 20.0
    envs = _workers(2, MODE="die", VICTIM="1", AT="3", CT=str(bound), EPOCHS="1", STEPS="1000")
    processes = [start_python(TRAIN, env=env, preloaded=True) for env in envs]
    results = wait_all(processes, timeout=150, check=False)
    (rc0, out0, err0), (rc1, out1, _) = results
    assert rc1 == -signal.SIGKILL
    died = _stamp(out1, "DIE")
    assert rc0 == 3, err0[-3000:]
    failure = _line(out0, "FAILED")
    # TensorFlow reports the dead peer itself (socket reset / missed heartbeats), well
    # inside the bound.
    assert failure["type"] in ("UnavailableError", "DeadlineExceededError", "AbortedError")
    assert 0 <= failure["time"] - died < bound


def test_hung_worker_ends_the_survivor_with_the_collective_timeout_error():
    bound = 8.0
    envs = _workers(2, MODE="hang", VICTIM="1", AT="3", CT=str(bound), EPOCHS="1", STEPS="1000")
    processes = [start_python(TRAIN, env=env, preloaded=True) for env in envs]
    try:
        [(rc0, out0, err0)] = wait_all(processes[:1], timeout=150, check=False)
    finally:
        victim_out = processes[1].stdout()
        processes[1].close()
    hung = _stamp(victim_out, "HANG")
    assert rc0 == 3, err0[-3000:]
    failure = _line(out0, "FAILED")
    assert failure["type"] == "DeadlineExceededError"
    assert f"collective_timeout={bound:g} s" in failure["message"]
    assert "TFDP_COLLECTIVE_TIMEOUT" in failure["message"]
    waited = failure["time"] - hung
    # The survivor was already inside the next step when the peer stopped; the watchdog
    # samples once a second.
    assert bound - 1.5 <= waited < bound + 5


def test_backup_and_restore_resumes_a_preempted_job_to_the_same_weights(
    tmp_path, srun_job: list[Outcome]
):
    epochs, steps = EPOCHS, STEPS
    expected = _assert_same_training(srun_job, steps=epochs * steps)[0]  # uninterrupted

    backup = str(tmp_path / "backup")
    # The whole job is preempted in epoch 2: both tasks killed from outside after step 6, as
    # a scheduler kills a job (a task that killed itself would let its peer fail first)...
    preempted = _kill_when_all_print(
        [
            start_python(TRAIN, env=env, preloaded=True)
            for env in _workers(
                2, EPOCHS=str(epochs), STEPS=str(steps), BACKUP=backup, MODE="preempt", AT="6"
            )
        ],
        "PREEMPT",
        timeout=150,
    )
    assert [rc for rc, _, _ in preempted] == [-signal.SIGKILL] * 2
    assert os.listdir(backup)
    # ...and restarted with the same command on new ports.
    resumed = wait_all(
        [
            start_python(TRAIN, env=env, preloaded=True)
            for env in _workers(2, EPOCHS=str(epochs), STEPS=str(steps), BACKUP=backup)
        ],
        timeout=150,
    )
    data = []
    for rc, out, err in resumed:
        assert rc == 0, err[-3000:]
        data.append(_line(out, "RESULT"))
    for result in data:
        # Only the unfinished epoch ran again (epoch 1 was backed up at its end).
        assert len(result["losses"]) == (epochs - 1) * steps
        assert result["iterations"] == epochs * steps
        assert result["weights"] == expected["weights"]


PS_SCRIPT = r"""
import json, sys
import numpy as np
import tfdp_utils as tdu
from tfdp_utils._tf import tf, keras

if tdu.cluster_task_type() in ("worker", "ps"):
    tdu.run_server()
try:
    strategy = tdu.auto_strategy(cluster_timeout=60)
except ValueError as exc:
    print("REFUSED " + json.dumps({"message": str(exc)}), flush=True)
    sys.exit(4)
x = np.random.RandomState(0).rand(32, 4).astype("float32")
y = x.sum(axis=1, keepdims=True)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0)
print("RESULT " + json.dumps({"class": type(strategy).__name__,
                              "iterations": int(model.optimizer.iterations.numpy())}), flush=True)
"""


def test_parameter_server_cluster_trains_on_tf_keras_and_is_refused_clearly_on_keras3():
    from tfdp_utils._tf import IS_KERAS3

    ports = [free_port() for _ in range(3)]
    cluster = {
        "chief": [f"127.0.0.1:{ports[0]}"],
        "worker": [f"127.0.0.1:{ports[1]}"],
        "ps": [f"127.0.0.1:{ports[2]}"],
    }
    chief = {"TF_CONFIG": _tf_config(cluster, "chief", 0)}
    if IS_KERAS3:
        # Refused at once (15 s from launch at load 8), bounded as the tf_keras job is: a
        # 60-s bound ran out beside 12 busy processes (TensorFlow's import alone took 30 s).
        refused = start_python(PS_SCRIPT, env=chief, preloaded=True)
        [(rc, out, err)] = wait_all([refused], timeout=150, check=False)
        assert rc == 4, err[-3000:]
        message = _line(out, "REFUSED")["message"]
        assert "cannot train with ParameterServerStrategy" in message
        assert "TF_USE_LEGACY_KERAS=1" in message
        return
    servers = [
        start_python(PS_SCRIPT, env={"TF_CONFIG": _tf_config(cluster, kind, 0)}, preloaded=True)
        for kind in ("worker", "ps")
    ]
    try:
        trained = start_python(PS_SCRIPT, env=chief, preloaded=True)
        [(rc, out, err)] = wait_all([trained], timeout=150)
    finally:
        for server in servers:
            server.close()
    assert rc == 0, err[-3000:]
    result = _line(out, "RESULT")
    assert result["class"] == "ParameterServerStrategyV2"
    assert result["iterations"] == 3
