"""TF_CONFIG and SLURM parsing, validation errors, and the bounded peer wait."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from support.processes import free_port

from tfdp_utils import ClusterTimeoutError
from tfdp_utils.cluster._config import parse_tf_config, validate_cluster
from tfdp_utils.cluster._rendezvous import wait_for_peers
from tfdp_utils.cluster._slurm import expand_hostlist, expand_tasks_per_node, parse_slurm

pytestmark = pytest.mark.pure

GOOD = {"cluster": {"worker": ["localhost:1111", "localhost:2222"]}, "task": {"type": "worker"}}


def test_good_tf_config():
    config = parse_tf_config(json.dumps({**GOOD, "task": {"type": "worker", "index": 1}}))
    assert config is not None
    assert config.num_workers == 2
    assert config.worker_rank == 1
    assert config.address == "localhost:2222"
    assert not config.is_chief
    assert config.as_tf_config()["task"] == {"type": "worker", "index": 1}


def test_chief_plus_workers_ranks_chief_first():
    spec = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "evaluator": ["e:1"]}
    chief = validate_cluster(spec, "chief", 0)
    assert chief.is_chief and chief.worker_rank == 0 and chief.num_workers == 3
    assert validate_cluster(spec, "worker", 1).worker_rank == 2
    assert validate_cluster(spec, "evaluator", 0).worker_rank is None


@pytest.mark.parametrize("empty", [None, "", "   ", "{}", '{"cluster": {}}'])
def test_no_cluster_means_none(empty):
    assert parse_tf_config(empty) is None


BAD_TF_CONFIGS = [
    ("not-json", "{cluster: [}", "not valid JSON"),
    ("json-list", "[1, 2]", "JSON list, not an object"),
    ("no-task", json.dumps({"cluster": GOOD["cluster"]}), "'task' is None"),
    ("task-not-object", json.dumps({**GOOD, "task": "worker"}), "'task' is 'worker'"),
    (
        "index-out-of-range",
        json.dumps({**GOOD, "task": {"type": "worker", "index": 2}}),
        "task index 2 is out of range",
    ),
    (
        "negative-index",
        json.dumps({**GOOD, "task": {"type": "worker", "index": -1}}),
        "out of range",
    ),
    (
        "unknown-task-type",
        json.dumps({**GOOD, "task": {"type": "master", "index": 0}}),
        "task type is 'master'",
    ),
    (
        "unknown-cluster-type",
        json.dumps({"cluster": {"trainer": ["a:1"]}, "task": {"type": "trainer"}}),
        "unknown task type 'trainer'",
    ),
    (
        "duplicate-address",
        json.dumps({"cluster": {"worker": ["h:1", "h:1"]}, "task": {"type": "worker"}}),
        "appears twice",
    ),
    (
        "duplicate-across-types",
        json.dumps({"cluster": {"chief": ["h:1"], "worker": ["h:1"]}, "task": {"type": "chief"}}),
        "appears twice",
    ),
    (
        "no-port",
        json.dumps({"cluster": {"worker": ["hostonly"]}, "task": {"type": "worker"}}),
        "expected 'host:port'",
    ),
    (
        "bad-port",
        json.dumps({"cluster": {"worker": ["h:99999"]}, "task": {"type": "worker"}}),
        "port 1-65535",
    ),
    (
        "addresses-not-list",
        json.dumps({"cluster": {"worker": "h:1"}, "task": {"type": "worker"}}),
        "expected a non-empty list",
    ),
    (
        "task-type-not-in-cluster",
        json.dumps({**GOOD, "task": {"type": "chief", "index": 0}}),
        "not in the cluster",
    ),
    (
        "two-chiefs",
        json.dumps({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief"}}),
        "2 chiefs",
    ),
    (
        "only-ps",
        json.dumps({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps"}}),
        "nothing would train",
    ),
    (
        "index-not-int",
        json.dumps({**GOOD, "task": {"type": "worker", "index": 0.5}}),
        "expected an integer",
    ),
]


@pytest.mark.parametrize(
    ("text", "words"), [pytest.param(t, w, id=i) for i, t, w in BAD_TF_CONFIGS]
)
def test_bad_tf_config_is_explained(text, words):
    with pytest.raises(ValueError) as info:
        parse_tf_config(text)
    message = str(info.value)
    assert message.startswith("TF_CONFIG is invalid")
    assert words in message
    assert '"task": {"type": "worker", "index": 0}' in message  # a valid example


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu[001-002,010],cpu-a", ["gpu001", "gpu002", "gpu010", "cpu-a"]),
        ("a[1-2]-b[3-4]", ["a1-b3", "a1-b4", "a2-b3", "a2-b4"]),
        ("x[08-10]", ["x08", "x09", "x10"]),
    ],
)
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("bad", ["node[1-3", "node]1[", "node[3-1]", "node[a-b]"])
def test_bad_hostlist(bad):
    with pytest.raises(ValueError, match="SLURM host list"):
        expand_hostlist(bad)


def test_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="bad entry"):
        expand_tasks_per_node("2(3)")


def test_slurm_cluster_from_srun_variables(monkeypatch):
    environ = {
        "SLURM_PROCID": "2",
        "SLURM_STEP_NUM_TASKS": "3",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "2,1",
        "TFDP_SLURM_PORT_BASE": "9000",
    }
    config = parse_slurm(environ)
    assert config is not None
    assert config.cluster["worker"] == ("n1:9000", "n1:9001", "n2:9000")
    assert config.task_index == 2 and config.source == "SLURM"


def test_slurm_single_task_is_no_cluster():
    assert parse_slurm({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}) is None
    assert parse_slurm({"SLURM_JOB_ID": "5"}) is None


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}, "SLURM_STEP_NODELIST"),
        (
            {
                "SLURM_PROCID": "0",
                "SLURM_STEP_NUM_TASKS": "3",
                "SLURM_STEP_NODELIST": "n[1-2]",
                "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
            },
            "adds up to 2",
        ),
        (
            {
                "SLURM_PROCID": "0",
                "SLURM_STEP_NUM_TASKS": "2",
                "SLURM_STEP_NODELIST": "n1",
                "TFDP_SLURM_PORT_BASE": "http",
            },
            "TFDP_SLURM_PORT_BASE",
        ),
    ],
)
def test_bad_slurm_variables(environ, words):
    with pytest.raises(ValueError, match=words):
        parse_slurm(environ)


def test_wait_for_peers_returns_once_peers_listen():
    ports = [free_port(), free_port()]
    spec = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    results: dict[int, object] = {}

    def task(index: int, delay: float) -> None:
        time.sleep(delay)
        try:
            results[index] = wait_for_peers(validate_cluster(spec, "worker", index), timeout=10)
        except Exception as exc:  # pragma: no cover - reported by the assert below
            results[index] = exc

    threads = [threading.Thread(target=task, args=(i, 0.5 * i)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert all(isinstance(results.get(i), float) for i in range(2)), results
    # The listener is closed afterwards, so the port is free again for TensorFlow's server.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[0]))


def test_wait_for_peers_times_out_naming_missing_task():
    ports = [free_port(), free_port()]
    spec = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    start = time.monotonic()
    with pytest.raises(ClusterTimeoutError) as info:
        wait_for_peers(validate_cluster(spec, "chief", 0), timeout=1.5)
    elapsed = time.monotonic() - start
    assert 1.4 <= elapsed < 4
    assert info.value.missing == (("worker", 0, f"127.0.0.1:{ports[1]}"),)
    assert f"worker:0 at 127.0.0.1:{ports[1]}" in str(info.value)
    assert "cluster_timeout" in str(info.value)
    assert isinstance(info.value, TimeoutError)


def test_own_port_taken_is_explained():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        spec = {"worker": [f"127.0.0.1:{port}", f"127.0.0.1:{free_port()}"]}
        with pytest.raises(OSError, match="Another program holds the port"):
            wait_for_peers(validate_cluster(spec, "worker", 0), timeout=1)


def test_a_long_peer_wait_logs_progress_naming_the_peer_the_bound_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tfdp_utils import _waiting as waiting

    monkeypatch.setattr(waiting, "PROGRESS_INTERVAL", 0.3)
    spec = {"worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]}
    with caplog.at_level("WARNING", logger="tfdp_utils"), pytest.raises(ClusterTimeoutError):
        wait_for_peers(validate_cluster(spec, "worker", 0), timeout=1.2)
    lines = [r.getMessage() for r in caplog.records if "still waiting" in r.getMessage()]
    assert len(lines) >= 2, lines
    assert spec["worker"][1] in lines[0]
    assert "bound 1.2 s" in lines[0]
    assert "TFDP_CLUSTER_TIMEOUT" in lines[0]


def test_wait_progress_lines_come_once_per_interval() -> None:
    from tfdp_utils._waiting import WaitProgress

    now = [100.0]
    progress = WaitProgress("x", bound=90, change="Y", interval=30, clock=lambda: now[0])
    for now[0] in (100.0, 110.0, 129.9, 130.0, 135.0, 161.0, 200.0):
        progress.tick()
    assert [line.split(" after ")[1].split(" s")[0] for line in progress.lines] == [
        "30",
        "61",
        "100",
    ]
    assert progress.lines[0].endswith("(bound 90 s; change it with Y)")


@pytest.mark.parametrize("name", ["SLURM_STEP_NUM_TASKS", "SLURM_PROCID"])
def test_a_slurm_variable_that_is_no_number_is_named(name: str) -> None:
    environ = {
        "SLURM_PROCID": "0",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "n[1-2]",
        name: "abc",
    }
    with pytest.raises(
        ValueError, match=rf"{name} must be a whole number, but received {name}='abc'"
    ):
        parse_slurm(environ)


@pytest.mark.parametrize("value", ['{"cluster": {}}', '{"task": {"type": "worker"}}'])
def test_tf_config_without_a_cluster_trains_alone_and_says_so(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    from tfdp_utils.cluster import _config as cluster

    cluster._warn_no_cluster.cache_clear()
    with caplog.at_level("WARNING", logger="tfdp_utils"):
        assert parse_tf_config(value) is None
    assert any("names no cluster" in r.getMessage() for r in caplog.records)


def test_a_slurm_step_of_zero_tasks_is_refused_not_taken_for_no_cluster() -> None:
    # Before: SLURM_STEP_NUM_TASKS=0 was read as "no cluster", and the task trained alone.
    environ = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "0", "SLURM_STEP_NODELIST": "n1"}
    with pytest.raises(ValueError, match=r"SLURM_STEP_NUM_TASKS must be .* at least 1, but "):
        parse_slurm(environ)


@pytest.mark.parametrize(
    ("change", "received", "expected"),
    [
        ({"SLURM_PROCID": "5"}, "SLURM_PROCID=5 is outside 0..1", "this task's rank among"),
        (
            {"SLURM_STEP_NODELIST": "n[1-2"},
            "received SLURM_STEP_NODELIST='n[1-2', which has an unbalanced '['",
            "must be a SLURM host list such as 'node[01-04],gpu-a'",
        ),
    ],
)
def test_slurm_messages_say_what_was_received_expected_and_the_fix(
    change: dict[str, str], received: str, expected: str
) -> None:
    environ = {
        "SLURM_PROCID": "0",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "n[1-2]",
        **change,
    }
    with pytest.raises(ValueError) as info:
        parse_slurm(environ)
    message = str(info.value)
    assert received in message and expected in message
    assert "run the script with srun inside the allocation" in message
