"""The straggling worker, named: two localhost workers, one of them reading its input slowly.

Worker 1's reader sleeps before every batch (``SLOW_WORKER=1``); the model's step is fast.
Each worker logs its own input-wait share (``worker_<w>`` runs); ``tfdp-utils report`` on the
shared log folder and the chief's ``summary()`` must name worker 1 and "input". Without the
slowdown, nobody is named.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.processes import REPO, free_port, result_line, start_python, tf_config, wait_all

pytestmark = [pytest.mark.slow, pytest.mark.keras]

WORKER = """
import json, os, sys, time
import numpy as np
import tensorflow as tf
if os.environ.get("DETERMINISM"):
    tf.config.experimental.enable_op_determinism()
import tfdp_utils as tdu
from tfdp_utils._tf import keras

strategy = tdu.auto_strategy(verbose=False)
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
slow_worker = int(os.environ.get("SLOW_WORKER", "-1"))
delay = float(os.environ.get("SLOW_SECONDS", "0")) if index == slow_worker else 0.0


def slow(batch):
    def wait(value):
        time.sleep(delay)
        return value

    out = tf.py_function(wait, [batch], tf.float32)
    out.set_shape(batch.shape)
    return out


n = 2 * 30 * 8  # 30 steps of 8 per worker and epoch
source = (
    tf.data.Dataset.from_tensor_slices(np.ones((n, 4), "float32"))
    .batch(8)
    .map(slow)
    .unbatch()
    .apply(tf.data.experimental.assert_cardinality(n))
    .map(lambda x: (x, x[:1]))
)
dist = tdu.build_distributed_dataset(source, strategy=strategy, global_batch_size=16)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
logger = tdu.callbacks.ThroughputLogger(sys.argv[1], log_every_n_steps=10, warmup_steps=5)
model.fit(dist, epochs=2, verbose=0, callbacks=[logger])
print("SUMMARY " + json.dumps(logger.summary()), flush=True)
"""


def run_job(
    log_dir: Path, slow_worker: int | None, *, determinism: bool = False
) -> list[dict[str, Any]]:
    ports = [free_port(), free_port()]
    env: dict[str, str | None] = {"TF_CPP_MIN_LOG_LEVEL": "2", "SLOW_SECONDS": "0.05"}
    if determinism:
        env["DETERMINISM"] = "1"
    if slow_worker is not None:
        env["SLOW_WORKER"] = str(slow_worker)
    processes = [
        start_python(
            WORKER,
            args=[str(log_dir)],
            env={**env, "TF_CONFIG": tf_config(ports, i)},
            preloaded=True,
        )
        for i in range(2)
    ]
    return [result_line(outcome, "SUMMARY") for outcome in wait_all(processes, timeout=240)]


def report(log_dir: Path) -> tuple[str, dict[str, Any]]:
    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "tfdp_utils.cli", "report", str(log_dir), *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=str(REPO),
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    return cli(), json.loads(cli("--json"))


@pytest.mark.timing
def test_the_worker_with_slow_input_is_named_with_input(tmp_path: Path) -> None:
    chief, other = run_job(tmp_path, slow_worker=1)
    shares = chief["worker_input_wait_share"]
    assert shares == other["worker_input_wait_share"]
    assert shares[1] >= shares[0] + 0.1 and shares[0] < 0.2, chief  # load slows the step too
    assert chief["straggler"]["worker"] == 1, chief
    assert "worker 1 is the slowest: it waits for input" in chief["input_wait_verdict"]
    table, data = report(tmp_path)
    assert "input: worker 1 is the slowest: it waits for input" in table, table
    assert data["input"]["straggler"]["worker"] == 1
    assert set(data["workers"]["median_input_wait_share"]) == {"worker_0", "worker_1"}


@pytest.mark.timing
def test_without_a_slow_worker_nobody_is_named(tmp_path: Path) -> None:
    chief, _ = run_job(tmp_path, slow_worker=None)
    assert chief["straggler"] is None, chief
    table, data = report(tmp_path)
    assert "input wait: no worker stands out" in table, table
    assert data["input"]["straggler"] is None


def test_under_op_determinism_the_verdict_names_the_refused_timer(tmp_path: Path) -> None:
    # Op determinism refuses tf.timestamp: no worker's share is timed. The verdict says so, in
    # the summary and the report, rather than blaming the dataset (a builder dataset here).
    chief, other = run_job(tmp_path, slow_worker=1, determinism=True)
    for summary in (chief, other):
        assert summary["worker_input_wait_share"] == [None, None], summary
        assert summary["straggler"] is None
        found = summary["input_wait_verdict"]
        assert found.startswith("input wait: unknown: op determinism is on"), found
        assert "tf.timestamp" in found and "builder dataset" not in found, found
    table, data = report(tmp_path)
    assert "input wait: unknown: op determinism is on" in table, table
    assert "tf.timestamp" in table and "builder dataset" not in table, table
    assert data["input"]["verdict"] == chief["input_wait_verdict"]
    assert data["input"]["measured"] is False and "tf.timestamp" in data["input"]["note"]
