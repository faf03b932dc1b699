"""Ray Train: examples/ray_train.py trains with 2 TensorflowTrainer workers on a local Ray."""

from __future__ import annotations

import json

import pytest
from support.processes import REPO, start_python, wait_all

pytest.importorskip("ray.train.tensorflow", reason="Ray Train is the 'ray' extra")

pytestmark = pytest.mark.slow


def test_ray_train_example_trains_with_two_workers(tmp_path):
    logdir = tmp_path / "logs"
    # Run as a script, as a user would: Ray pickles __main__'s train loop by value.
    script = str(REPO / "examples" / "ray_train.py")
    argv = [script, "--workers", "2", "--steps", "6", "--logdir", str(logdir)]
    process = start_python(
        f"import runpy, sys; sys.argv = {argv!r}; runpy.run_path({script!r}, run_name='__main__')"
    )
    [(rc, out, err)] = wait_all([process], timeout=420)
    assert rc == 0, err[-5000:]
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert result["replicas"] == 2  # one replica in each of Ray's two worker processes
    assert result["iterations"] == 6
    assert result["keras"] in ("keras3", "tf_keras")
    # Ray wrote TF_CONFIG; the example keeps TensorFlow's servers on the loopback interface.
    assert result["hosts"] == ["127.0.0.1"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # ThroughputLogger ran in both workers: each wrote its own run, the chief the global one.
    for run in ("global", "worker_0", "worker_1"):
        events = EventAccumulator(str(logdir / run), size_guidance={"tensors": 0})
        events.Reload()
        assert "throughput/examples_per_sec" in events.Tags()["tensors"], run
        assert events.Tensors("throughput/examples_per_sec"), run
