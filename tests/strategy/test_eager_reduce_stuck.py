"""An eager cross-worker reduce that a peer never joins is bounded, on real localhost workers.

TensorFlow runs an eager reduce under MultiWorkerMirroredStrategy on a thread pool while the
calling thread waits in ``pool.map`` (Python's ``threading``, not TensorFlow's files): a
Keras metric's ``reset_state()`` outside a step (as ``fit`` does at each epoch's start) is
one. Worker 0 resets a metric while worker 1 never joins (it sleeps in Python); worker 0's
collective watchdog must end the wait within ``collective_timeout`` with its message, and
worker 1 must end by itself once worker 0 gave up. Every wait has a deadline.
"""

from __future__ import annotations

import json
import time

import pytest
from support.processes import free_port, start_python, tf_config

pytestmark = [pytest.mark.slow, pytest.mark.keras]

BOUND = 6.0  # collective_timeout: short, so that the test is

SCRIPT = r"""
import json, os, sys, time
import tfdp_utils as tdu
from tfdp_utils._tf import keras

strategy = tdu.auto_strategy(cluster_timeout=60, collective_timeout=float(os.environ["CT"]))
rank = int(strategy.cluster_resolver.task_id)
with strategy.scope():
    metric = keras.metrics.Mean()
metric.reset_state()  # both workers: an eager reduce each side joins
print(f"JOINED {time.time()}", flush=True)
if rank == 1:
    while True:  # never joins the next reduce
        time.sleep(1)
started = time.time()
try:
    metric.reset_state()  # worker 0 alone: waits for worker 1 in pool.map
except Exception as exc:
    print("FAILED " + json.dumps({"waited": time.time() - started, "type": type(exc).__name__,
                                  "message": str(exc)[:4000]}), flush=True)
    sys.exit(3)
print("FINISHED", flush=True)
"""


def test_a_reduce_outside_a_step_that_a_peer_never_joins_ends_within_the_bound():
    ports = [free_port(), free_port()]
    env = {"CT": str(BOUND), "TF_CPP_MIN_LOG_LEVEL": "2"}
    processes = [
        start_python(SCRIPT, env={**env, "TF_CONFIG": tf_config(ports, i)}, preloaded=True)
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and any(p.poll() is None for p in processes):
            time.sleep(0.2)
        alive = [rank for rank, p in enumerate(processes) if p.poll() is None]
        assert not alive, "\n".join(
            f"worker {rank} did not end by itself:\n{processes[rank].tail()}" for rank in alive
        )
        w0, w1 = processes
        out0 = w0.stdout()
        assert "JOINED" in out0 and "JOINED" in w1.stdout(), w0.tail() + w1.tail()
        assert w0.popen.returncode == 3, w0.tail()
        failure = json.loads(out0.split("FAILED ", 1)[1].splitlines()[0])
        # The watchdog's abort, worded with its bound and how to change it.
        assert failure["type"] == "DeadlineExceededError", failure
        assert "collective_timeout" in failure["message"], failure["message"]
        assert failure["waited"] >= BOUND - 1.5, failure
        # Worker 1 (in Python, no TensorFlow call to abort) ends by itself once worker 0 gave
        # up, saying why.
        assert w1.popen.returncode == 1, w1.tail()
        assert "ends with status 1" in w1.stderr(), w1.stderr()[-4000:]
    finally:
        for process in processes:
            process.close()
