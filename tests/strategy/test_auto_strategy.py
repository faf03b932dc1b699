"""auto_strategy() with real TensorFlow: logical CPUs, subprocess clusters, silent TPU metadata."""

from __future__ import annotations

import json
import logging
import socket
import textwrap
import threading
import time

import pytest
from support.processes import (
    NUM_LOGICAL_CPUS,
    free_port,
    run_python,
    start_python,
    tf_config,
    wait_all,
)

import tfdp_utils as tdu
from tfdp_utils import _dataset_info as dataset_info
from tfdp_utils._tf import tf
from tfdp_utils.strategy._choice import explain


def test_four_logical_cpus_give_mirrored(caplog):
    with caplog.at_level(logging.INFO, logger="tfdp_utils"):
        strategy = tdu.auto_strategy()
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == NUM_LOGICAL_CPUS
    lines = [r.getMessage() for r in caplog.records if r.name == "tfdp_utils"]
    assert len(lines) == 1
    assert "MirroredStrategy over 4 replica(s)" in lines[0]
    assert "4 logical CPU devices" in lines[0]
    # The strategy really runs on four replicas.
    result = strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        strategy.run(lambda: tf.constant(1.0)),
        axis=None,
    )
    assert float(result) == NUM_LOGICAL_CPUS


def test_devices_restrict_replicas():
    strategy = tdu.auto_strategy(devices=["/cpu:0", "/cpu:2"])
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == 2
    assert set(strategy.extended.worker_devices) == {
        "/job:localhost/replica:0/task:0/device:CPU:0",
        "/job:localhost/replica:0/task:0/device:CPU:2",
    }
    one = tdu.auto_strategy(devices=["/cpu:3"])
    assert isinstance(one, tf.distribute.OneDeviceStrategy)


def test_environment_variable_forces_choice(monkeypatch):
    monkeypatch.setenv("TFDP_STRATEGY", "one_device")
    strategy = tdu.auto_strategy()
    assert isinstance(strategy, tf.distribute.OneDeviceStrategy)
    assert "TFDP_STRATEGY=one_device" in explain(strategy).reason
    # An explicit argument still wins over the variable.
    assert isinstance(tdu.auto_strategy("mirrored"), tf.distribute.MirroredStrategy)
    monkeypatch.setenv("TFDP_STRATEGY", "warp")
    with pytest.raises(ValueError, match="TFDP_STRATEGY='warp'"):
        tdu.auto_strategy()


def test_calling_again_gives_an_equivalent_working_strategy():
    first = tdu.auto_strategy()
    second = tdu.auto_strategy()
    assert type(first) is type(second)
    assert first.num_replicas_in_sync == second.num_replicas_in_sync
    with second.scope():
        variable = tf.Variable(1.0)
    assert float(second.reduce("SUM", second.run(lambda: variable * 2), axis=None)) == 8.0


@pytest.mark.parametrize(
    "bad",
    [
        "{not json",
        '{"cluster": {"worker": ["127.0.0.1:1"]}}',
        '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 3}}',
        '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:1"]}, "task": {"type": "worker"}}',
    ],
)
def test_bad_tf_config_fails_before_any_wait(monkeypatch, bad):
    monkeypatch.setenv("TF_CONFIG", bad)
    start = time.monotonic()
    with pytest.raises(ValueError, match="TF_CONFIG is invalid"):
        tdu.auto_strategy(cluster_timeout=60)
    assert time.monotonic() - start < 5


def test_bad_arguments():
    with pytest.raises(ValueError, match="probe_timeout=0"):
        tdu.auto_strategy(probe_timeout=0)
    with pytest.raises(ValueError, match="cluster_timeout=-1"):
        tdu.auto_strategy(cluster_timeout=-1)
    with pytest.raises(ValueError, match=r"prefer='gpus'.*'auto'"):
        tdu.auto_strategy("gpus")


class _SilentServer:
    """Accepts TCP connections on 127.0.0.1 and never answers (a hung metadata server)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.accepted.append(conn)
            except OSError:
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        for conn in self.accepted:
            conn.close()
        self.sock.close()


def test_silent_tpu_metadata_server_falls_back_within_probe_timeout(monkeypatch, caplog):
    server = _SilentServer()
    try:
        monkeypatch.setenv("TPU_NAME", "my-tpu")
        monkeypatch.setenv("GCE_METADATA_IP", f"127.0.0.1:{server.port}")
        monkeypatch.delenv("GCE_METADATA_HOST", raising=False)
        start = time.monotonic()
        with caplog.at_level(logging.INFO, logger="tfdp_utils"):
            strategy = tdu.auto_strategy(probe_timeout=2.0)
        elapsed = time.monotonic() - start
        assert server.accepted, "the probe never reached the metadata server"
    finally:
        server.close()
    assert elapsed < 2.0 + 1.0
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    reason = explain(strategy).reason
    assert "TPU_NAME='my-tpu'" in reason and "probe_timeout=2" in reason
    assert any("falling back" in r.getMessage() for r in caplog.records)


def test_silent_tpu_worker_falls_back_within_probe_timeout(monkeypatch, caplog):
    # A grpc:// TPU address that accepts connections and never answers: TensorFlow's own
    # experimental_connect_to_cluster would wait for it forever (docs/upstream-auto-strategy.md).
    server = _SilentServer()
    try:
        monkeypatch.setenv("TPU_NAME", f"grpc://127.0.0.1:{server.port}")
        start = time.monotonic()
        with caplog.at_level(logging.INFO, logger="tfdp_utils"):
            strategy = tdu.auto_strategy(probe_timeout=2.0)
        elapsed = time.monotonic() - start
        assert server.accepted, "the probe never reached the TPU worker"
    finally:
        server.close()
    assert elapsed < 2.0 + 1.0
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    reason = explain(strategy).reason
    assert "accepted a connection but did not answer as a gRPC server" in reason
    assert "probe_timeout=2" in reason


def test_a_tensorflow_server_answers_the_grpc_probe():
    from tfdp_utils.cluster._grpc_probe import grpc_answer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spec = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{port}"]})
    server = tf.distribute.Server(spec, job_name="worker", task_index=0, start=True)
    assert server.target == f"grpc://127.0.0.1:{port}"
    assert grpc_answer(f"127.0.0.1:{port}", timeout=5.0) == "grpc"


def test_explicit_tpu_without_tpu_raises(monkeypatch):
    monkeypatch.delenv("TPU_NAME", raising=False)
    with pytest.raises(tdu.TPUProbeError, match="prefer='auto' to fall back") as raised:
        tdu.auto_strategy("tpu", probe_timeout=2.0)
    # No TPU here: the message must not claim evidence of one.
    assert "TPU evidence" not in str(raised.value)
    assert "this process sees no TPU" in str(raised.value)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"cluster_timeout": "abc"}, TypeError, "cluster_timeout must be a number of seconds"),
        ({"probe_timeout": "5"}, TypeError, "probe_timeout must be a number of seconds"),
        ({"probe_timeout": float("nan")}, ValueError, "probe_timeout=nan"),
    ],
)
def test_timeouts_of_the_wrong_type_are_explained(kwargs, error, match):
    with pytest.raises(error, match=match):
        tdu.auto_strategy(**kwargs)


def test_cluster_timeout_variable_that_is_no_number_is_named(monkeypatch):
    monkeypatch.setenv("TFDP_CLUSTER_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="TFDP_CLUSTER_TIMEOUT must be a number of seconds"):
        tdu.auto_strategy()


def test_multi_worker_without_a_cluster_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        strategy = tdu.auto_strategy("multi_worker")
    assert isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("no cluster is configured" in w and "TF_CONFIG" in w for w in warnings), warnings


@pytest.mark.slow
def test_one_cpu_and_two_logical_cpus_in_fresh_processes():
    two = run_python(
        """
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        config = [tf.config.LogicalDeviceConfiguration()] * 2
        tf.config.set_logical_device_configuration(cpu, config)
        import tfdp_utils as tdu
        s = tdu.auto_strategy()
        print("RESULT", type(s).__name__, s.num_replicas_in_sync)
        """,
        preloaded=True,
    )
    one = run_python(
        """
        import tfdp_utils as tdu
        s = tdu.auto_strategy()
        print("RESULT", type(s).__name__, s.num_replicas_in_sync)
        """,
        preloaded=True,
    )
    assert "RESULT MirroredStrategy 2" in two.stdout, two.stderr[-3000:]
    assert "RESULT OneDeviceStrategy 1" in one.stdout, one.stderr[-3000:]


WORKER = """
import json, os, sys, time
import tfdp_utils as tdu
import tensorflow as tf
start = time.monotonic()
try:
    strategy = tdu.auto_strategy(cluster_timeout=float(os.environ["TIMEOUT"]))
except tdu.ClusterTimeoutError as exc:
    print("TIMEOUT", json.dumps({"elapsed": time.monotonic() - start, "message": str(exc),
                                 "missing": [list(m) for m in exc.missing]}))
    sys.exit(3)
rank = strategy.cluster_resolver.task_id
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(float(rank + 1))), axis=None)
again = tdu.auto_strategy()
print("RESULT", json.dumps({"mwms": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
                            "replicas": strategy.num_replicas_in_sync,
                            "sum": float(total), "same": again is strategy}))
"""


@pytest.mark.slow
def test_real_two_worker_localhost_cluster():
    ports = [free_port(), free_port()]
    processes = [
        start_python(
            WORKER, env={"TF_CONFIG": tf_config(ports, i), "TIMEOUT": "60"}, preloaded=True
        )
        for i in range(2)
    ]
    results = wait_all(processes, timeout=150)
    for rc, out, err in results:
        assert rc == 0, err[-3000:]
        line = next(x for x in out.splitlines() if x.startswith("RESULT "))
        data = json.loads(line[len("RESULT ") :])
        assert data == {
            "mwms": True,
            "replicas": 2,
            "sum": 3.0,  # 1 + 2: a real all-reduce across both processes
            "same": True,
        }


@pytest.mark.slow
def test_worker_that_never_starts_gives_a_clear_error_in_time():
    ports = [free_port(), free_port()]
    timeout = 4.0
    process = start_python(
        WORKER, env={"TF_CONFIG": tf_config(ports, 0), "TIMEOUT": str(timeout)}, preloaded=True
    )
    [(rc, out, err)] = wait_all([process], timeout=120, check=False)
    assert rc == 3, err[-3000:]
    data = json.loads(next(x for x in out.splitlines() if x.startswith("TIMEOUT "))[8:])
    assert timeout <= data["elapsed"] < timeout + 3
    assert data["missing"] == [["worker", 1, f"127.0.0.1:{ports[1]}"]]
    assert f"worker:1 at 127.0.0.1:{ports[1]}" in data["message"]
    assert "cluster_timeout=SECONDS" in data["message"]


CALLED_COLD = """
import json, sys, time
start = time.monotonic()  # before TensorFlow's import, which auto_strategy() does itself
import tfdp_utils as tdu
try:
    tdu.auto_strategy()
except tdu.ClusterTimeoutError as exc:
    print("TIMEOUT", json.dumps({"elapsed": time.monotonic() - start, "message": str(exc)}))
    sys.exit(3)
"""


@pytest.mark.slow
def test_the_cluster_timeout_error_says_what_it_measured_from_the_users_call():
    # Before: TFDP_CLUSTER_TIMEOUT=8 gave "did not join ... within 8 s" 50 s after the call
    # (TensorFlow's import and set-up run inside it, before the wait).
    ports = [free_port(), free_port()]
    env = {"TF_CONFIG": tf_config(ports, 0), "TFDP_CLUSTER_TIMEOUT": "2"}
    [(rc, out, err)] = wait_all([start_python(CALLED_COLD, env=env)], timeout=180, check=False)
    assert rc == 3, err[-3000:]
    data = json.loads(next(x for x in out.splitlines() if x.startswith("TIMEOUT "))[8:])
    message = data["message"]
    assert "did not join the TF_CONFIG cluster within 2 s of waiting (the wait began " in message
    began = float(message.split("the wait began ")[1].split(" s after auto_strategy()")[0])
    in_all = float(message.split("; ")[1].split(" s in all")[0])
    # The figures agree with a second timer around the whole call (whole seconds, rounded).
    assert abs(in_all - data["elapsed"]) <= 1.5, (in_all, data["elapsed"])
    assert abs(began + 2 - in_all) <= 1.5


@pytest.mark.slow
def test_env_command_reports_versions_and_choice():
    # One process runs both forms (TensorFlow imported once): `env --json` with TFDP_STRATEGY
    # empty, then `env` without it; each status is checked, the outputs split at a marker.
    result = run_python(
        """
        import os
        from tfdp_utils.cli import main

        os.environ["TFDP_STRATEGY"] = ""
        assert main(["env", "--json"]) == 0
        del os.environ["TFDP_STRATEGY"]
        print("=== env ===", flush=True)
        raise SystemExit(main(["env"]))
        """,
        preloaded=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    as_json, plain = result.stdout.split("=== env ===\n")
    report = json.loads(as_json[as_json.index("{") :])
    assert report["strategy"] == "OneDeviceStrategy"
    assert "CPU only" in report["reason"]
    assert report["tensorflow"] == tf.__version__
    assert report["keras_flavour"] in ("keras3", "tf_keras")
    # Whether Keras fit will compile with XLA under that strategy (here: CPU, no XLA).
    assert report["keras_xla"].startswith("Keras fit: no XLA")
    assert "Strategy auto_strategy() would build: OneDeviceStrategy" in plain
    assert "TensorFlow distribution: tensorflow-cpu" in plain
    assert "- Keras fit: no XLA" in plain


def test_auto_strategy_is_what_the_builder_falls_back_on():
    strategy = tdu.auto_strategy(devices=["/cpu:0", "/cpu:1"])
    assert dataset_info.last_strategy() is strategy


@pytest.mark.slow
@pytest.mark.keras
def test_strategies_over_different_device_sets_in_one_process():
    # A notebook that trains on 2 devices, then on 4: TensorFlow aborts the second fit
    # ("joining a group with size 4, but that group has size 2") when both strategies draw
    # the same collective group keys. The first script shows that failure with strategies
    # built by hand, so the second one's success is auto_strategy's doing.
    script = """
        import sys
        import numpy as np
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 4
        )
        import tfdp_utils as tdu
        from tfdp_utils._tf import keras

        def train(strategy):
            x = np.ones((64, 4), "float32")
            dist = tdu.build_distributed_dataset(
                (x, x[:, 0]), strategy=strategy, global_batch_size=16
            )
            with strategy.scope():
                model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
                model.compile("sgd", "mse")
            model.fit(dist, epochs=1, verbose=0)
            print("TRAINED", strategy.num_replicas_in_sync, flush=True)

        make = {
            "by_hand": lambda devices: tf.distribute.MirroredStrategy(devices),
            "auto": lambda devices: tdu.auto_strategy(devices=devices),
        }[sys.argv[1]]
        train(make(["/cpu:0", "/cpu:1"]))
        train(make(["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"]))
    """
    by_hand = run_python(
        f"import sys; sys.argv[1:] = ['by_hand']\n{textwrap.dedent(script)}", preloaded=True
    )
    assert "TRAINED 2" in by_hand.stdout
    assert "TRAINED 4" not in by_hand.stdout, "TensorFlow no longer reuses group keys"
    assert "group has size 2" in by_hand.stderr, by_hand.stderr[-3000:]
    auto = run_python(
        f"import sys; sys.argv[1:] = ['auto']\n{textwrap.dedent(script)}", preloaded=True
    )
    assert auto.returncode == 0, auto.stderr[-3000:]
    assert auto.stdout.split() == ["TRAINED", "2", "TRAINED", "4"]


@pytest.mark.slow
def test_the_explanation_is_visible_by_default_once_and_can_be_silenced():
    # A fresh process, as a user's script: no logging configured by anyone.
    result = run_python(
        """
        import contextlib, io, json, logging
        import tfdp_utils as tdu

        def shown(**kwargs):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                tdu.auto_strategy(**kwargs)
            return err.getvalue().count("tfdp_utils: OneDeviceStrategy over 1 replica(s)")

        out = {"default": shown(), "verbose_false": shown(verbose=False)}
        logging.getLogger("tfdp_utils").setLevel(logging.WARNING)
        out["logger_at_warning"] = shown()
        logging.getLogger("tfdp_utils").setLevel(logging.NOTSET)
        stream = io.StringIO()
        logging.basicConfig(level=logging.INFO, stream=stream, format="%(message)s")
        out["configured_stderr"] = shown()
        out["configured_log"] = stream.getvalue().count("OneDeviceStrategy over 1 replica(s)")
        print(json.dumps(out))
        """,
        env={"TFDP_STRATEGY": "one_device"},
        preloaded=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out == {
        "default": 1,
        "verbose_false": 0,
        "logger_at_warning": 0,
        "configured_stderr": 0,
        "configured_log": 1,
    }
