"""DivergenceGuard over 2 real localhost workers (one replica each).

Each worker reads its own arrays (``distribute_datasets_from_function``), so where the planted
inf lies is known by construction: worker 1's batch 3, i.e. replica 1 at step 4. With "skip"
the job ends with the weights of a second 2-worker job (no guard) whose data leaves batch 3
out on both workers, under op determinism. Worker 0 alone changing its weights after the
model is built is named at step 1. Over a builder dataset of arrays both workers share, the
worker whose replica received the planted inf names that example (where it went is found by
iterating the same dataset over example ids on each worker), and the other says why it names
none.

A custom loop (``make_distributed_train_step`` with ``guard.watch``) over the same builder
dataset is guarded the same way: the worker, replica, step and example are named, and "skip"
ends with the weights of an unguarded loop that does not call the step on that batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.processes import free_port, result_line, start_python, tf_config, wait_all

pytestmark = [pytest.mark.slow, pytest.mark.keras]

SCRIPT = r"""
import json, os, sys, threading
import numpy as np
import tfdp_utils as tdu
from tfdp_utils._tf import tf, keras

tf.config.experimental.enable_op_determinism()
strategy = tdu.auto_strategy(cluster_timeout=60)
rank = int(strategy.cluster_resolver.task_id)
mode, policy = os.environ["MODE"], os.environ["POLICY"]
rng = np.random.RandomState(10 + rank)
x = rng.randn(32, 4).astype("float32")  # 8 batches of 4 per worker
y = rng.randn(32, 1).astype("float32")
steps = 8
if mode == "inf" and rank == 1:
    x[3 * 4 + 2, 1] = np.inf  # worker 1, batch 3
if mode == "without":  # the reference: batch 3 left out on both workers
    keep = np.r_[0:12, 16:32]
    x, y, steps = x[keep], y[keep], 7

dist = strategy.distribute_datasets_from_function(
    lambda _: tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat()
)
if mode == "builder":  # the same 64 examples on both workers, sharded by the builder
    x = np.random.RandomState(3).randn(64, 4).astype("float32")
    y = x[:, :1].copy()
    ids = np.arange(64, dtype="float32")[:, None]
    x[45, 1] = np.inf
    dist = tdu.build_distributed_dataset((x, y), strategy=strategy, global_batch_size=8)
    steps = None
if mode in ("lastgood", "resume", "reference"):  # a job stopped, fixed and run again
    x = np.random.RandomState(3).randn(64, 4).astype("float32")
    y = x[:, :1].copy()
    if mode == "lastgood":
        x[45, 1] = np.inf
    dist = tdu.build_distributed_dataset((x, y), strategy=strategy, global_batch_size=8)
    steps = None
keras.utils.set_random_seed(1)
with strategy.scope():
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, name="d1"), keras.layers.Dense(1, name="d2")]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse",
                  steps_per_execution=int(os.environ.get("SPE", "1")))
if mode == "weights" and rank == 0:
    model.set_weights([w + 0.25 for w in model.get_weights()])
callbacks = []
if os.environ.get("DIRECTORY"):  # periodic saves every 2 steps, one after the bad step
    callbacks.append(
        tdu.callbacks.PreemptionCheckpoint(os.environ["DIRECTORY"], exit=False, every_steps=2)
    )
if mode != "without":
    guard = tdu.callbacks.DivergenceGuard(policy=policy, check_every_n_steps=3)
    callbacks.append(guard)


class Probe(keras.callbacks.Callback):
    # What Keras decides: its callback list's async flag in this fit (Keras 3), that of a
    # list without the guard, that of the guard's list were the backend thread safe (Keras 3
    # on TensorFlow says it is not, tensorflow#78338, and then never dispatches async), and
    # on which thread a batch-end hook runs.
    async_safe = True

    def __init__(self):
        super().__init__()
        self.decided, self.on_main = {}, set()

    def on_train_begin(self, logs=None):
        owner = sys._getframe(1).f_locals.get("self")  # Keras' CallbackList
        if not tdu.IS_KERAS3:
            return
        import keras.src.backend as backend

        self.decided = {"fit": owner._async_train, "thread_safe": backend.IS_THREAD_SAFE,
                        "without_guard": keras.callbacks.CallbackList([Probe()])._async_train}
        saved, backend.IS_THREAD_SAFE = backend.IS_THREAD_SAFE, True
        try:
            eligible = keras.callbacks.CallbackList([c for c in owner.callbacks
                                                     if c is not owner._history])
            self.decided["thread_safe_backend"] = eligible._async_train
        finally:
            backend.IS_THREAD_SAFE = saved

    def on_train_batch_end(self, batch, logs=None):
        self.on_main.add(threading.current_thread() is threading.main_thread())


probe = Probe()
history = model.fit(dist, epochs=2, steps_per_epoch=steps, callbacks=[*callbacks, probe],
                    verbose=0)
result = {"epochs": len(history.history["loss"]),
          "weights": [w.tolist() for w in model.get_weights()],
          "finite": all(bool(np.isfinite(w).all()) for w in model.get_weights()),
          "decided": probe.decided, "batch_end_on_main": sorted(probe.on_main)}
if mode != "without":
    summary = guard.summary()
    found, differ = summary["divergence"], summary["disagreement"]
    result.update(skipped=summary["skipped_steps"], stopped=summary["stopped"],
                  checkpoint=summary["checkpoint"], steps=summary["steps"])
    if found is not None:
        result["divergence"] = [found.epoch, found.batch, found.step, list(found.replicas),
                                list(found.workers), list(found.loss_replicas)]
        result["examples"] = [[e.replica, list(e.indices), list(e.non_finite)]
                              for e in found.examples]
        result["examples_unknown"] = found.examples_unknown
    if differ is not None:
        result["disagreement"] = [differ.step, list(differ.replicas), list(differ.workers),
                                  sorted({d.variable for d in differ.differences})]
if os.environ.get("DIRECTORY"):
    names = os.listdir(os.environ["DIRECTORY"])
    result["saved"] = sorted(n for n in names if n.startswith("ckpt-"))
if mode == "builder":  # where example 45 went: the same dataset over ids, iterated here
    seen = tdu.build_distributed_dataset((ids, ids), strategy=strategy, global_batch_size=8)
    local = len(strategy.experimental_local_results(model.weights[0]))
    for step, (_, labels) in enumerate(seen):
        for i, part in enumerate(strategy.experimental_local_results(labels)):
            held = [int(v) for v in part.numpy().reshape(-1)]
            if 45 in held:
                result["where"] = [step, rank * local + i, held]
        if step == 7:
            break
print("RESULT " + json.dumps(result), flush=True)
"""


LOOP_SCRIPT = r"""
import json, os
import numpy as np
import tfdp_utils as tdu
from tfdp_utils._tf import tf, keras

tf.config.experimental.enable_op_determinism()
strategy = tdu.auto_strategy(cluster_timeout=60)
rank = int(strategy.cluster_resolver.task_id)
mode, policy = os.environ["MODE"], os.environ["POLICY"]
x = np.random.RandomState(3).randn(64, 4).astype("float32")
y = x[:, :1].copy()
x[45, 1] = np.inf  # one example of one worker's batch (which step: counted below)
ids = np.arange(64, dtype="float32")[:, None]
local = strategy.num_replicas_in_sync // 2
result = {}
# Where example 45 goes, counted independently of the guard: the same builder dataset over
# the examples' ids, iterated through the strategy on each worker.
seen = tdu.build_distributed_dataset((ids, ids), strategy=strategy, global_batch_size=8)
for number, (_, labels) in enumerate(seen):
    for i, part in enumerate(strategy.experimental_local_results(labels)):
        held = [int(v) for v in part.numpy().reshape(-1)]
        if 45 in held:
            result["where"] = [number, rank * local + i, held]
# Every worker learns the step (the reference skips it on both): a sum over the workers.
found = result["where"][0] + 1 if "where" in result else 0
def mine(context):
    return tf.constant(found if context.replica_id_in_sync_group % local == 0 else 0)


values = strategy.experimental_distribute_values_from_function(mine)
bad_step = int(strategy.reduce("SUM", values, axis=None)) - 1
keras.utils.set_random_seed(1)
with strategy.scope():
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, name="d1"), keras.layers.Dense(1, name="d2")]
    )
    optimizer = keras.optimizers.Adam(0.01)
step = tdu.make_distributed_train_step(
    model,
    loss=keras.losses.MeanSquaredError(reduction="none"),
    optimizer=optimizer,
    strategy=strategy,
)
dist = tdu.build_distributed_dataset((x, y), strategy=strategy, global_batch_size=8)
guard = None
if mode == "guarded":
    guard = tdu.callbacks.DivergenceGuard(policy=policy)
    guard.watch(model, optimizer=optimizer, dataset=dist)
    guard.on_epoch_begin(0)
trained = 0
for number, batch in enumerate(dist):
    if mode == "reference" and number == bad_step:
        result["before"] = [w.tolist() for w in model.get_weights()]
        continue  # the reference's update at that step is skipped: the step is not called
    step(batch)
    trained += 1
    if guard is not None and guard.check():
        break
result.update(bad_step=bad_step, trained=trained,
              weights=[w.tolist() for w in model.get_weights()],
              finite=all(bool(np.isfinite(w).all()) for w in model.get_weights()))
if guard is not None:
    summary = guard.summary()
    found = summary["divergence"]
    result.update(skipped=summary["skipped_steps"], stopped=summary["stopped"])
    if found is not None:
        result["divergence"] = [found.epoch, found.batch, found.step, list(found.replicas),
                                list(found.workers)]
        result["examples"] = [[e.replica, list(e.indices), list(e.non_finite)]
                              for e in found.examples]
        result["examples_unknown"] = found.examples_unknown
        result["report"] = found.describe()
print("RESULT " + json.dumps(result), flush=True)
"""


def run_job(
    mode: str,
    policy: str = "stop",
    directory: Path | None = None,
    *,
    script: str = SCRIPT,
    steps_per_execution: int = 1,
) -> list[Any]:
    ports = [free_port(), free_port()]
    env = {"MODE": mode, "POLICY": policy, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["SPE"] = str(steps_per_execution)
    if directory is not None:
        env["DIRECTORY"] = str(directory)
    processes = [
        start_python(script, env={**env, "TF_CONFIG": tf_config(ports, i)}, preloaded=True)
        for i in range(2)
    ]
    return [result_line(outcome) for outcome in wait_all(processes, timeout=240)]


def assert_the_guard_leaves_keras_async_as_it_was(result: dict[str, Any]) -> None:
    """On 2 workers, Keras 3 decides on async batch-end hooks with the guard as without it,
    and would dispatch them async with the guard on a thread-safe backend; the batch-end
    hooks ran where that decision says."""
    decided = result["decided"]
    if not decided:  # tf_keras: no async dispatch to decide
        return
    assert decided["fit"] == decided["without_guard"] == decided["thread_safe"]
    assert decided["thread_safe_backend"] is True
    assert result["batch_end_on_main"] == [not decided["fit"]]


def test_stop_names_worker_one_and_both_workers_stop_with_finite_weights() -> None:
    for result in run_job("inf"):
        assert result["divergence"] == [0, 3, 4, [1], [1], [1]]
        assert result["stopped"] and result["finite"] and result["epochs"] == 1
        assert_the_guard_leaves_keras_async_as_it_was(result)


@pytest.fixture(scope="module")
def without_that_batch() -> list[Any]:
    """The unguarded job whose data leaves batch 3 out on both workers (one per module)."""
    return run_job("without")


def test_skip_ends_with_the_weights_of_a_job_without_that_batch(
    without_that_batch: list[Any],
) -> None:
    guarded = run_job("inf", policy="skip")
    reference = without_that_batch
    for result in guarded:
        assert result["skipped"] == 2 and not result["stopped"] and result["epochs"] == 2
        assert result["divergence"][2:4] == [4, [1]]
        assert_the_guard_leaves_keras_async_as_it_was(result)
    assert guarded[0]["weights"] == reference[0]["weights"]
    assert guarded[1]["weights"] == guarded[0]["weights"]


def test_steps_per_execution_over_two_workers_names_the_step_and_skips_it(
    without_that_batch: list[Any],
) -> None:
    """Batch 3 lies inside an execution of 2 steps: the step itself is named, and the job
    ends with the weights of a job without that batch (no guard, one step per execution: its
    7-step epochs could not keep the guarded job's executions of 2)."""
    guarded = run_job("inf", policy="skip", steps_per_execution=2)
    reference = without_that_batch
    for result in guarded:
        assert result["divergence"] == [0, 3, 4, [1], [1], [1]]
        assert result["skipped"] == 2 and not result["stopped"] and result["epochs"] == 2
    assert guarded[0]["weights"] == reference[0]["weights"]
    assert guarded[1]["weights"] == guarded[0]["weights"]


def test_weights_set_on_worker_zero_alone_are_named_at_step_one() -> None:
    for result in run_job("weights"):
        step, replicas, workers, variables = result["disagreement"]
        assert (step, replicas, workers) == (1, [1], [1])
        assert len(variables) == 4  # every variable of d1 and d2 differs by 0.25 per value
        assert result["stopped"] and result["epochs"] == 1


def test_a_builder_dataset_names_the_example_on_the_worker_that_received_it() -> None:
    results = run_job("builder", policy="skip")
    where = [r["where"] for r in results if "where" in r]
    assert len(where) == 1  # example 45 reaches one replica of one worker
    step, replica, held = where[0]
    for result in results:
        assert result["divergence"][2:4] == [step + 1, [replica]]
        assert result["skipped"] == 2 and result["finite"]
    named = [r for r in results if r["examples"]]
    assert [r["examples"] for r in named] == [[[replica, held, [45]]]]
    other = [r for r in results if not r["examples"]]
    assert len(other) == 1 and "other workers" in other[0]["examples_unknown"]


def test_stop_leaves_the_last_good_step_saved_and_a_resume_continues_from_it(
    tmp_path: Path,
) -> None:
    stopped = run_job("lastgood", directory=tmp_path / "job")
    step = stopped[0]["divergence"][2]  # the non-finite step, agreed by both workers
    last_good = f"ckpt-{step - 1:012d}"
    for result in stopped:
        assert result["divergence"][2] == step and result["stopped"] and result["finite"]
        assert result["checkpoint"] == str(tmp_path / "job" / last_good)
    # The guard reads every 3 batches and the saves come every 2: the save taken after the
    # non-finite step (an even step past it) is deleted, the last good step is the newest.
    saved = stopped[0]["saved"]
    assert saved[-1] == last_good and all(int(n[5:]) <= step - 1 for n in saved)
    # The job run again on the fixed data resumes there and ends with the weights of a job
    # that trained on the fixed data from the start.
    resumed = run_job("resume", directory=tmp_path / "job")
    reference = run_job("reference", directory=tmp_path / "reference")
    assert resumed[0]["weights"] == reference[0]["weights"]
    assert resumed[1]["weights"] == resumed[0]["weights"]
    # It resumed (2 epochs of 8 steps: the steps before the non-finite one are not run again).
    assert [r["steps"] for r in reference] == [16, 16]
    assert [r["steps"] for r in resumed] == [16 - (step - 1)] * 2


@pytest.fixture(scope="module")
def loop_reference() -> list[Any]:
    """The unguarded custom loop that does not call the step on the bad batch."""
    return run_job("reference", script=LOOP_SCRIPT)


def assert_names_the_planted_example(results: list[Any]) -> tuple[int, int]:
    """Both workers name the step and replica where example 45 went; the worker that
    received it names the example. Returns the (0-based) step and the replica."""
    where = [r["where"] for r in results if "where" in r]
    assert len(where) == 1  # example 45 reaches one replica of one worker
    step, replica, held = where[0]
    worker = replica  # one replica per worker
    for result in results:
        assert result["bad_step"] == step
        assert result["divergence"] == [0, step, step + 1, [replica], [worker]]
        assert result["finite"]
        assert f"replica {replica} on worker {worker}" in result["report"]
    named = [r for r in results if r["examples"]]
    assert [r["examples"] for r in named] == [[[replica, held, [45]]]]
    assert "where" in named[0]  # by the worker that received it
    other = [r for r in results if not r["examples"]]
    assert len(other) == 1 and "other workers" in other[0]["examples_unknown"]
    return step, replica


def test_a_custom_loop_under_stop_names_worker_replica_step_and_example(
    loop_reference: list[Any],
) -> None:
    results = run_job("guarded", script=LOOP_SCRIPT)
    step, _ = assert_names_the_planted_example(results)
    for result in results:
        assert result["stopped"] and result["trained"] == step + 1  # check() said stop
        # No update from the bad step on: the weights of the steps before it.
        assert result["weights"] == loop_reference[0]["before"]


def test_a_custom_loop_under_skip_equals_a_loop_that_skips_that_update(
    loop_reference: list[Any],
) -> None:
    results = run_job("guarded", policy="skip", script=LOOP_SCRIPT)
    assert_names_the_planted_example(results)
    for result in results:
        assert result["skipped"] == 1 and not result["stopped"] and result["trained"] == 8
    assert loop_reference[1]["weights"] == loop_reference[0]["weights"]
    assert results[0]["weights"] == loop_reference[0]["weights"]
    assert results[1]["weights"] == results[0]["weights"]
