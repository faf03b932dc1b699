"""The pure strategy decision over a table of environments no test machine has."""

from __future__ import annotations

import pytest

from tfdp_utils import ClusterConfig, Environment, choose_strategy
from tfdp_utils.cluster._config import validate_cluster
from tfdp_utils.cluster._slurm import parse_slurm

pytestmark = pytest.mark.pure

GPU8 = tuple(f"/device:GPU:{i}" for i in range(8))
GPU2 = GPU8[:2]
CPU1 = ("/device:CPU:0",)
CPU4 = tuple(f"/device:CPU:{i}" for i in range(4))


def _cluster(n: int, index: int = 0, kind: str = "worker", **extra: list[str]) -> ClusterConfig:
    spec: dict[str, list[str]] = {"worker": [f"10.0.0.{i}:2222" for i in range(n)], **extra}
    return validate_cluster(spec, kind, index)


SLURM_ONE = parse_slurm(
    {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_NODELIST": "n1"}
)
SLURM_FOUR = parse_slurm(
    {
        "SLURM_PROCID": "3",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NODELIST": "gpu[01-02]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    }
)

# (id, environment, prefer, devices, expected kind, expected devices, words in the reason)
TABLE = [
    ("cpu-only", Environment(), "auto", None, "one_device", CPU1, ["no GPU"]),
    ("one-gpu", Environment(gpus=GPU8[:1]), "auto", None, "one_device", GPU8[:1], ["1 GPU"]),
    ("two-gpus", Environment(gpus=GPU2), "auto", None, "mirrored", GPU2, ["2 GPUs"]),
    ("eight-gpus", Environment(gpus=GPU8), "auto", None, "mirrored", GPU8, ["8 GPUs"]),
    ("logical-cpus", Environment(cpus=CPU4), "auto", None, "mirrored", CPU4, ["logical CPU"]),
    (
        "8-gpus+tf-config",
        Environment(gpus=GPU8, cluster=_cluster(2)),
        "auto",
        None,
        "multi_worker",
        GPU8,
        ["TF_CONFIG", "2 worker"],
    ),
    (
        "cpu+tf-config",
        Environment(cluster=_cluster(3, 2)),
        "auto",
        None,
        "multi_worker",
        CPU1,
        ["worker:2"],
    ),
    (
        "tf-config-single-task",
        Environment(gpus=GPU2, cluster=_cluster(1)),
        "auto",
        None,
        "mirrored",
        GPU2,
        ["single training task"],
    ),
    (
        "evaluator",
        Environment(
            gpus=GPU8[:1],
            cluster=validate_cluster(
                {"worker": ["a:1", "b:1"], "evaluator": ["c:1"]}, "evaluator", 0
            ),
        ),
        "auto",
        None,
        "one_device",
        GPU8[:1],
        ["evaluator task trains nothing"],
    ),
    (
        "tpu-name-hint",
        Environment(tpu_hint="TPU_NAME='v4-8'", tpu_address="v4-8"),
        "auto",
        None,
        "tpu",
        (),
        ["TPU_NAME"],
    ),
    (
        "local-tpu-devices",
        Environment(tpus=("/device:TPU:0", "/device:TPU:1")),
        "auto",
        None,
        "tpu",
        ("/device:TPU:0", "/device:TPU:1"),
        ["local TPU"],
    ),
    (
        "tpu-beats-cluster-and-gpus",
        Environment(gpus=GPU8, cluster=_cluster(2), tpu_hint="tpu='grpc://1.2.3.4:8470'"),
        "auto",
        None,
        "tpu",
        (),
        ["grpc://1.2.3.4"],
    ),
    (
        "slurm-one-task",
        Environment(gpus=GPU2, cluster=SLURM_ONE),
        "auto",
        None,
        "mirrored",
        GPU2,
        ["2 GPUs"],
    ),
    (
        "slurm-four-tasks",
        Environment(gpus=GPU2, cluster=SLURM_FOUR),
        "auto",
        None,
        "multi_worker",
        GPU2,
        ["SLURM", "worker:3"],
    ),
    (
        "forced-one-device",
        Environment(gpus=GPU8, forced_strategy="one_device"),
        "auto",
        None,
        "one_device",
        GPU8[:1],
        ["TFDP_STRATEGY=one_device"],
    ),
    (
        "forced-mirrored-over-cluster",
        Environment(cpus=CPU4, cluster=_cluster(2), forced_strategy="mirrored"),
        "auto",
        None,
        "mirrored",
        CPU4,
        ["TFDP_STRATEGY=mirrored"],
    ),
    (
        "explicit-prefer-beats-variable",
        Environment(cpus=CPU4, forced_strategy="one_device"),
        "mirrored",
        None,
        "mirrored",
        CPU4,
        ["prefer='mirrored'"],
    ),
    (
        "devices-restrict-to-two",
        Environment(cpus=CPU4),
        "auto",
        ["/cpu:1", "cpu:3"],
        "mirrored",
        ("/device:CPU:1", "/device:CPU:3"),
        ["devices="],
    ),
    (
        "devices-restrict-to-one",
        Environment(gpus=GPU8),
        "auto",
        ["/job:localhost/replica:0/task:0/device:GPU:5"],
        "one_device",
        ("/device:GPU:5",),
        ["devices="],
    ),
    (
        "multi-worker-without-cluster",
        Environment(gpus=GPU2),
        "multi_worker",
        None,
        "multi_worker",
        GPU2,
        ["single worker"],
    ),
    (
        "gpus-beat-logical-cpus",
        Environment(gpus=GPU8[:1], cpus=CPU4),
        "auto",
        None,
        "one_device",
        GPU8[:1],
        ["1 GPU"],
    ),
]


@pytest.mark.parametrize(
    ("env", "prefer", "devices", "kind", "expected_devices", "words"),
    [pytest.param(*row[1:], id=row[0]) for row in TABLE],
)
def test_decision_table(env, prefer, devices, kind, expected_devices, words):
    choice = choose_strategy(env, prefer=prefer, devices=devices)
    assert choice.kind == kind
    assert choice.devices == expected_devices
    for word in words:
        assert word in choice.reason, choice.reason
    assert choice.reason.endswith(f"-> {kind}"), choice.reason


def test_table_is_large_enough():
    assert len(TABLE) >= 15


def test_failed_tpu_probe_falls_back_with_reason():
    env = Environment(gpus=GPU2, tpu_hint="TPU_NAME='x'", tpu_address="x")
    choice = choose_strategy(env, tpu_failure="TPU probe failed: metadata silent")
    assert choice.kind == "mirrored"
    assert "metadata silent" in choice.reason


@pytest.mark.parametrize("bad", ["fastest", "MirroredStrategy", "", "gpu"])
def test_unknown_prefer_lists_valid_choices(bad):
    with pytest.raises(
        ValueError, match=r"'auto', 'tpu', 'multi_worker', 'mirrored', 'one_device'"
    ):
        choose_strategy(Environment(), prefer=bad)


def test_unknown_forced_strategy_names_the_variable():
    with pytest.raises(ValueError, match="TFDP_STRATEGY='turbo'"):
        choose_strategy(Environment(forced_strategy="turbo"))


def test_unknown_device_lists_visible_ones():
    with pytest.raises(ValueError, match=r"not visible.*/device:CPU:0"):
        choose_strategy(Environment(), devices=["/gpu:0"])


def test_device_string_instead_of_list():
    with pytest.raises(TypeError, match="pass a list"):
        choose_strategy(Environment(), devices="/cpu:0")  # type: ignore[arg-type]


def test_parameter_server_cluster_without_chief_is_refused_clearly():
    env = Environment(cluster=_cluster(2, ps=["10.0.1.1:2222"]))
    with pytest.raises(ValueError, match=r"no 'chief'.*MultiWorkerMirroredStrategy"):
        choose_strategy(env)


PS_SPEC = {
    "chief": ["10.0.2.1:2222"],
    "worker": ["10.0.0.0:2222", "10.0.0.1:2222"],
    "ps": ["10.0.1.1:2222"],
}


def test_parameter_server_chief_gets_parameter_server_strategy():
    choice = choose_strategy(Environment(cluster=validate_cluster(PS_SPEC, "chief", 0)))
    assert choice.kind == "parameter_server"
    assert choice.class_name == "ParameterServerStrategy"
    assert choice.cluster is not None and choice.cluster.has_parameter_servers
    assert "1 ps" in choice.reason
    explicit = choose_strategy(
        Environment(cluster=validate_cluster(PS_SPEC, "chief", 0)), prefer="parameter_server"
    )
    assert explicit.kind == "parameter_server"


@pytest.mark.parametrize(("kind", "index"), [("worker", 1), ("ps", 0)])
def test_parameter_server_worker_and_ps_tasks_are_told_to_serve(kind, index):
    env = Environment(cluster=validate_cluster(PS_SPEC, kind, index))
    with pytest.raises(ValueError, match=rf"this task is {kind}:{index}.*run_server\(\)"):
        choose_strategy(env)


def test_parameter_server_evaluator_runs_alone():
    env = Environment(cluster=validate_cluster(PS_SPEC, "evaluator", 0))
    choice = choose_strategy(env)
    assert choice.kind == "one_device"
    assert "evaluator task trains nothing" in choice.reason


def test_parameter_server_needs_ps_tasks_and_fits_no_other_preference():
    with pytest.raises(ValueError, match="needs a cluster with 'ps' tasks"):
        choose_strategy(Environment(cluster=_cluster(2)), prefer="parameter_server")
    with pytest.raises(ValueError, match="prefer='mirrored' cannot train a cluster with 'ps'"):
        choose_strategy(
            Environment(cluster=validate_cluster(PS_SPEC, "chief", 0)), prefer="mirrored"
        )
