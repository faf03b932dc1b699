"""ThroughputLogger in real multi-process runs: two localhost workers, and a real TensorBoard."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.processes import free_port, result_line, start_python, tf_config, wait_all
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tfdp_utils._tf import IS_KERAS3

pytestmark = [pytest.mark.slow, pytest.mark.keras]

WORKER = """
import json, os, sys
import numpy as np
import tensorflow as tf
from tfdp_utils._tf import keras
from tfdp_utils.callbacks import ThroughputLogger

strategy = tf.distribute.MultiWorkerMirroredStrategy()
if os.environ.get("APPLY_COMPAT"):
    import tfdp_utils.compat

    tfdp_utils.compat.apply_for_strategy(strategy)
x = np.random.default_rng(0).normal(size=(4096, 8)).astype("float32")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).repeat().batch(16).with_options(options)
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
logger = ThroughputLogger(sys.argv[1], global_batch_size=16, log_every_n_steps=20, warmup_steps=5)
model.fit(ds, epochs=2, steps_per_epoch=60, verbose=0, callbacks=[logger])
print("SUMMARY " + json.dumps({"pid": os.getpid(), **logger.summary()}), flush=True)
"""


# Each pass of scripts/test runs its own flavour: Keras 3 (with tfdp_utils.compat's keras#20585
# workaround) in the first, tf_keras in the TF_USE_LEGACY_KERAS=1 pass.
FLAVOUR = "keras3_with_compat" if IS_KERAS3 else "tf_keras"


def run_workers(log_dir: Path, flavour: str, timeout: float = 240) -> list[dict[str, Any]]:
    ports = [free_port(), free_port()]
    env: dict[str, str | None] = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    if flavour == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    else:
        # keras#20585: Keras 3 fit under MWMS needs tfdp_utils.compat's workaround.
        env.update(TF_USE_LEGACY_KERAS=None, APPLY_COMPAT="1")
    processes = [
        start_python(
            WORKER,
            args=[str(log_dir)],
            env={**env, "TF_CONFIG": tf_config(ports, index)},
            preloaded=True,
        )
        for index in range(2)
    ]
    return [result_line(outcome, "SUMMARY") for outcome in wait_all(processes, timeout=timeout)]


def event_pids(run_dir: Path) -> set[int]:
    # events.out.tfevents.<time>.<host>.<pid>.<n>[.v2]; the host name may contain dots.
    pattern = re.compile(r"^events\.out\.tfevents\.\d+\..+\.(\d+)\.\d+(\.v2)?$")
    pids = set()
    for path in run_dir.glob("events.out.tfevents.*"):
        match = pattern.match(path.name)
        assert match, path.name
        pids.add(int(match.group(1)))
    return pids


@pytest.mark.parametrize("flavour", [FLAVOUR])
def test_two_workers_chief_writes_global_each_worker_its_own_runs(
    tmp_path: Path, flavour: str
) -> None:
    summaries = run_workers(tmp_path, flavour)
    chief, other = summaries
    assert chief["is_chief"] and not other["is_chief"]
    assert chief["num_workers"] == other["num_workers"] == 2
    assert {p.name for p in tmp_path.iterdir()} == {
        "global",
        "worker_0",
        "worker_1",
        "replica_0",
        "replica_1",
    }
    # global: one events file, written by the chief only.
    assert len(list((tmp_path / "global").glob("events.out.tfevents.*"))) == 1
    assert event_pids(tmp_path / "global") == {chief["pid"]}
    for w, summary in enumerate(summaries):
        assert event_pids(tmp_path / f"worker_{w}") == {summary["pid"]}
        assert event_pids(tmp_path / f"replica_{w}") == {summary["pid"]}
        assert summary["local_replicas"] == [w]
        assert summary["examples"] == 2 * 60 * 16
    acc = EventAccumulator(str(tmp_path / "global"), size_guidance={"tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["tensors"])
    assert {
        "throughput/worker_steps_per_sec_min",
        "throughput/worker_steps_per_sec_max",
        "throughput/worker_skew",
    } <= tags
    lows = [e.step for e in acc.Tensors("throughput/worker_steps_per_sec_min")]
    assert lows == [e.step for e in acc.Tensors("throughput/steps_per_sec")]
    spread = chief["worker_steps_per_sec"]
    assert 0 < spread["min"] <= spread["max"] and 0 <= spread["skew"] < 1
    # Both workers' rates went into the spread: the chief's own rate lies within it.
    assert spread["min"] <= chief["last_window"]["steps_per_sec"] <= spread["max"]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read().decode())


def test_a_real_tensorboard_lists_the_runs_and_serves_the_tags(tmp_path: Path) -> None:
    # Write the logs in this process, over 2 of its logical CPUs.
    from tfdp_utils._tf import keras, tf
    from tfdp_utils.callbacks import ThroughputLogger

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x = np.zeros((640, 4), "float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    logger = ThroughputLogger(str(tmp_path), global_batch_size=8, log_every_n_steps=10)
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[logger])
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(tmp_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        runs: list[str] = []
        tags: dict[str, Any] = {}
        # TensorBoard lists a run once it finds its folder and loads its events after, on its
        # own thread: wait until the last tag written (the goodput, at the fit's end) is served.
        while time.monotonic() < deadline:
            assert server.poll() is None, "tensorboard exited"
            try:
                runs = _get(f"{base}/data/runs")
                tags = _get(f"{base}/data/plugin/scalars/tags")
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                runs, tags = [], {}
            served = {run: set(tags.get(run, {})) for run in ("global", "replica_0")}
            if (
                {"global", "replica_0", "replica_1"} <= set(runs)
                and "goodput/goodput" in served["global"]
                and "throughput/examples" in served["replica_0"]
            ):
                break
            time.sleep(1)
        assert {"global", "replica_0", "replica_1"} <= set(runs), runs
        assert {
            "throughput/examples_per_sec",
            "throughput/steps_per_sec",
            "throughput/examples",
        } <= set(tags["global"])
        assert {"throughput/examples_per_sec", "throughput/examples"} <= set(tags["replica_0"])
        series = _get(
            f"{base}/data/plugin/scalars/scalars?run=global&tag=throughput/examples_per_sec"
        )
        assert len(series) >= 3 and all(point[2] > 0 for point in series)
        layout = _get(f"{base}/data/plugin/custom_scalars/layout")
        # One worker, no FLOPs, CPUs (no memory figures): only the charts that get data.
        assert [c["title"] for c in layout["category"]] == ["throughput", "goodput"]
        charts = [chart["title"] for chart in layout["category"][0]["chart"]]
        assert charts == [
            "examples/s: global, workers and replicas",
            "steps/s: global and workers",
            "examples trained",
            "epoch start (s)",
        ]
        # The job's goodput and its losses, written at the fit's end, served as scalars.
        assert {"goodput/goodput", "goodput/loss_seconds/startup"} <= set(tags["global"])
        goodput = _get(f"{base}/data/plugin/scalars/scalars?run=global&tag=goodput/goodput")
        assert len(goodput) == 1 and 0 < goodput[0][2] < 1
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
