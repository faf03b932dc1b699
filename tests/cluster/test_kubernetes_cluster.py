"""Real 2-worker jobs on 127.0.0.1 from a simulated Indexed Job pod and JobSet pod.

Each pod's variables are what Kubernetes and the manifests of docs/kubernetes/ give it;
``TFDP_HOSTS_OVERRIDE`` maps the pods' DNS names to local ports. The weights they train must
equal those of the same job run through a hand-written TF_CONFIG.
"""

from __future__ import annotations

import pytest
from support.processes import free_port, result_line, start_python, tf_config, wait_all

pytestmark = pytest.mark.slow

WORKER = r"""
import json
import numpy as np
import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf

strategy = tdu.auto_strategy(cluster_timeout=60, collective_timeout=120)
choice = tdu.strategy.explain(strategy)
rng = np.random.RandomState(0)
x = rng.rand(64, 3).astype("float32")
y = (x @ np.array([[1.0], [2.0], [3.0]], "float32") + 0.5).astype("float32")
init = [rng.randn(3, 1).astype("float32") * 0.1, np.zeros((1,), "float32")]
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).with_options(options)
with strategy.scope():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
model.set_weights(init)
model.fit(data, epochs=2, verbose=0)
print("RESULT " + json.dumps({
    "replicas": int(strategy.num_replicas_in_sync),
    "reason": choice.reason,
    "weights": [float(v) for w in model.get_weights() for v in w.ravel()],
}), flush=True)
"""


def _indexed_job(ports: list[int], index: int) -> dict[str, str | None]:
    override = ",".join(f"train-{i}.train-workers=127.0.0.1:{p}" for i, p in enumerate(ports))
    return {
        "JOB_COMPLETION_INDEX": str(index),
        "HOSTNAME": f"train-{index}",
        "TFDP_NUM_WORKERS": "2",
        "TFDP_PORT": "2222",
        "TFDP_SUBDOMAIN": "train-workers",
        "TFDP_HOSTS_OVERRIDE": override,
    }


def _jobset(ports: list[int], index: int) -> dict[str, str | None]:
    # One replicated job of 2 Jobs, one pod each: the pods' job index is their rank.
    override = ",".join(f"mnist-workers-{i}-0.mnist=127.0.0.1:{p}" for i, p in enumerate(ports))
    return {
        "JOB_COMPLETION_INDEX": "0",
        "HOSTNAME": f"mnist-workers-{index}-0",
        "JOBSET_NAME": "mnist",
        "REPLICATED_JOB_NAME": "workers",
        "REPLICATED_JOB_REPLICAS": "2",
        "JOB_INDEX": str(index),
        "TFDP_NUM_WORKERS": "2",
        "TFDP_PORT": "2222",
        "TFDP_HOSTS_OVERRIDE": override,
    }


def _tf_config(ports: list[int], index: int) -> dict[str, str | None]:
    return {"TF_CONFIG": tf_config(ports, index)}


def test_indexed_job_and_jobset_train_as_tf_config():
    environments = {"tf_config": _tf_config, "indexed": _indexed_job, "jobset": _jobset}
    processes = {}
    for name, environment in environments.items():
        ports = [free_port(), free_port()]
        processes[name] = [
            start_python(WORKER, env={"TF_CONFIG": None, **environment(ports, i)}, preloaded=True)
            for i in range(2)
        ]
    outcomes = {}
    try:
        for name, pair in processes.items():
            outcomes[name] = wait_all(pair, timeout=400)
    finally:  # a failed pair leaves the other pairs' workers waiting for peers
        for pair in processes.values():
            for process in pair:
                process.close()
    results = {name: [result_line(o) for o in pair] for name, pair in outcomes.items()}
    assert results["indexed"][1]["reason"].startswith(
        "Kubernetes Indexed Job 'train', pod 1 of 2 cluster"
    )
    assert results["jobset"][0]["reason"].startswith(
        "Kubernetes JobSet 'mnist' (workers), pod 0 of 2 cluster"
    )
    reference = results["tf_config"][0]
    assert reference["reason"].startswith("TF_CONFIG cluster")
    assert reference["replicas"] == 2
    for name in ("indexed", "jobset"):
        for worker in results[name]:
            assert worker["reason"].endswith("-> multi_worker")
            assert worker["replicas"] == 2
            assert worker["weights"] == pytest.approx(reference["weights"], abs=1e-6)
