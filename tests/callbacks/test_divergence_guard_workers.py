"""DivergenceGuard over 2 real localhost workers (one replica each).

Each worker reads its own arrays (``distribute_datasets_from_function``), so where the planted
inf lies is known by construction: worker 1's batch 3, i.e. replica 1 at step 4. With "skip"
the job ends with the weights of a second 2-worker job (no guard) whose data leaves batch 3
out on both workers, under op determinism. Worker 0 alone changing its weights after the
model is built is named at step 1.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.processes import free_port, result_line, start_python, tf_config, wait_all

pytestmark = [pytest.mark.slow, pytest.mark.keras]

SCRIPT = r"""
import json, os
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
keras.utils.set_random_seed(1)
with strategy.scope():
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, name="d1"), keras.layers.Dense(1, name="d2")]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
if mode == "weights" and rank == 0:
    model.set_weights([w + 0.25 for w in model.get_weights()])
callbacks = []
if mode != "without":
    guard = tdu.callbacks.DivergenceGuard(policy=policy, check_every_n_steps=2)
    callbacks.append(guard)
history = model.fit(dist, epochs=2, steps_per_epoch=steps, callbacks=callbacks, verbose=0)
result = {"epochs": len(history.history["loss"]),
          "weights": [w.tolist() for w in model.get_weights()],
          "finite": all(bool(np.isfinite(w).all()) for w in model.get_weights())}
if callbacks:
    summary = guard.summary()
    found, differ = summary["divergence"], summary["disagreement"]
    result.update(skipped=summary["skipped_steps"], stopped=summary["stopped"])
    if found is not None:
        result["divergence"] = [found.epoch, found.batch, found.step, list(found.replicas),
                                list(found.workers), list(found.loss_replicas)]
    if differ is not None:
        result["disagreement"] = [differ.step, list(differ.replicas), list(differ.workers),
                                  sorted({d.variable for d in differ.differences})]
print("RESULT " + json.dumps(result), flush=True)
"""


def run_job(mode: str, policy: str = "stop") -> list[Any]:
    ports = [free_port(), free_port()]
    env = {"MODE": mode, "POLICY": policy, "TF_CPP_MIN_LOG_LEVEL": "2"}
    processes = [
        start_python(SCRIPT, env={**env, "TF_CONFIG": tf_config(ports, i)}) for i in range(2)
    ]
    return [result_line(outcome) for outcome in wait_all(processes, timeout=240)]


def test_stop_names_worker_one_and_both_workers_stop_with_finite_weights() -> None:
    for result in run_job("inf"):
        assert result["divergence"] == [0, 3, 4, [1], [1], [1]]
        assert result["stopped"] and result["finite"] and result["epochs"] == 1


def test_skip_ends_with_the_weights_of_a_job_without_that_batch() -> None:
    guarded = run_job("inf", policy="skip")
    reference = run_job("without")
    for result in guarded:
        assert result["skipped"] == 2 and not result["stopped"] and result["epochs"] == 2
        assert result["divergence"][2:4] == [4, [1]]
    assert guarded[0]["weights"] == reference[0]["weights"]
    assert guarded[1]["weights"] == guarded[0]["weights"]


def test_weights_set_on_worker_zero_alone_are_named_at_step_one() -> None:
    for result in run_job("weights"):
        step, replicas, workers, variables = result["disagreement"]
        assert (step, replicas, workers) == (1, [1], [1])
        assert len(variables) == 4  # every variable of d1 and d2 differs by 0.25 per value
        assert result["stopped"] and result["epochs"] == 1
