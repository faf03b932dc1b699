"""A cluster from a Kubernetes pod: Indexed Job + headless Service, and JobSet. Pure."""

from __future__ import annotations

import pytest

from tfdp_utils.cluster import cluster_from_environment
from tfdp_utils.cluster._kubernetes import parse_hosts_override, parse_kubernetes
from tfdp_utils.strategy._environment_check import check_environment

pytestmark = pytest.mark.pure

INDEXED = {
    "JOB_COMPLETION_INDEX": "1",
    "HOSTNAME": "train-1",
    "TFDP_NUM_WORKERS": "2",
    "TFDP_PORT": "2222",
    "TFDP_SUBDOMAIN": "train-workers",
}
JOBSET = {
    "JOB_COMPLETION_INDEX": "1",
    "HOSTNAME": "mnist-workers-1-1",
    "JOBSET_NAME": "mnist",
    "REPLICATED_JOB_NAME": "workers",
    "REPLICATED_JOB_REPLICAS": "2",
    "JOB_INDEX": "1",
    "TFDP_NUM_WORKERS": "4",
    "TFDP_PORT": "2222",
}


def test_indexed_job_pod_gets_its_cluster():
    config = parse_kubernetes(INDEXED)
    assert config is not None
    assert config.cluster == {
        "worker": ("train-0.train-workers:2222", "train-1.train-workers:2222")
    }
    assert (config.task_type, config.task_index) == ("worker", 1)
    assert config.source == "Kubernetes Indexed Job 'train', pod 1 of 2"
    assert not config.is_chief


def test_job_name_with_dashes_and_many_digits():
    environ = {**INDEXED, "JOB_COMPLETION_INDEX": "10", "HOSTNAME": "my-job-2-10"}
    config = parse_kubernetes({**environ, "TFDP_NUM_WORKERS": "12"})
    assert config is not None
    assert config.cluster["worker"][0] == "my-job-2-0.train-workers:2222"
    assert config.address == "my-job-2-10.train-workers:2222"


def test_jobset_pod_ranks_job_by_job_and_defaults_subdomain_to_jobset():
    config = parse_kubernetes(JOBSET)
    assert config is not None
    assert config.cluster["worker"] == (
        "mnist-workers-0-0.mnist:2222",
        "mnist-workers-0-1.mnist:2222",
        "mnist-workers-1-0.mnist:2222",
        "mnist-workers-1-1.mnist:2222",
    )
    assert config.task_index == 3
    assert config.source == "Kubernetes JobSet 'mnist' (workers), pod 3 of 4"


def test_jobset_explicit_subdomain_and_one_replica_default():
    environ = {k: v for k, v in JOBSET.items() if k != "REPLICATED_JOB_REPLICAS"}
    environ.update(JOB_INDEX="0", HOSTNAME="mnist-workers-0-1", TFDP_SUBDOMAIN="net")
    environ["TFDP_NUM_WORKERS"] = "2"
    config = parse_kubernetes(environ)
    assert config is not None
    assert config.cluster["worker"] == ("mnist-workers-0-0.net:2222", "mnist-workers-0-1.net:2222")


def test_completion_index_alone_is_no_cluster():
    # An Indexed Job of independent pods (a sweep) trains each pod alone.
    assert parse_kubernetes({"JOB_COMPLETION_INDEX": "3", "HOSTNAME": "sweep-3"}) is None
    assert cluster_from_environment({"JOB_COMPLETION_INDEX": "3", "HOSTNAME": "sweep-3"}) is None


def test_tf_config_wins_over_kubernetes():
    tf_config = '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}'
    config = cluster_from_environment({**INDEXED, "TF_CONFIG": tf_config})
    assert config is not None
    assert config.source == "TF_CONFIG"


def test_slurm_wins_over_kubernetes():
    slurm = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "n[1-2]"}
    config = cluster_from_environment({**INDEXED, **slurm})
    assert config is not None
    assert config.source == "SLURM"


def test_kubernetes_found_by_cluster_from_environment():
    config = cluster_from_environment(INDEXED)
    assert config is not None
    assert config.source.startswith("Kubernetes Indexed Job")


def test_hosts_override_maps_pod_names_to_local_addresses():
    override = "train-0.train-workers=127.0.0.1:5000, train-1.train-workers=127.0.0.1:5001"
    config = parse_kubernetes({**INDEXED, "TFDP_HOSTS_OVERRIDE": override})
    assert config is not None
    assert config.cluster["worker"] == ("127.0.0.1:5000", "127.0.0.1:5001")
    assert parse_hosts_override("") == {}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"TFDP_NUM_WORKERS": None}, r"TFDP_NUM_WORKERS is not set.*number of worker pods"),
        ({"TFDP_NUM_WORKERS": "0"}, r"TFDP_NUM_WORKERS must be .* >= 1.*received"),
        ({"TFDP_PORT": None}, r"TFDP_PORT is not set.*port every worker listens on"),
        ({"TFDP_PORT": "70000"}, r"TFDP_PORT must be a port number in 1\.\.65535"),
        ({"TFDP_PORT": "http"}, r"TFDP_PORT must be .*received TFDP_PORT='http'"),
        ({"TFDP_SUBDOMAIN": None}, r"TFDP_SUBDOMAIN is not set.*headless Service"),
        ({"JOB_COMPLETION_INDEX": None}, r"JOB_COMPLETION_INDEX is not set.*completionMode"),
        (
            {"JOB_COMPLETION_INDEX": "2", "HOSTNAME": "train-2"},
            r"JOB_COMPLETION_INDEX=2 is outside 0\.\.1",
        ),
        ({"HOSTNAME": "train-0"}, r"HOSTNAME='train-0' does not match .*'<job>-1'"),
        ({"HOSTNAME": "my-laptop"}, r"HOSTNAME='my-laptop' does not match"),
        ({"TFDP_HOSTS_OVERRIDE": "train-0.train-workers"}, r"TFDP_HOSTS_OVERRIDE must be"),
    ],
)
def test_indexed_job_errors(change, match):
    environ = {k: v for k, v in {**INDEXED, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=match):
        parse_kubernetes(environ)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"REPLICATED_JOB_NAME": None}, r"REPLICATED_JOB_NAME is not set.*replicatedjob-name"),
        ({"JOB_INDEX": None}, r"JOB_INDEX is not set.*job index"),
        ({"JOB_INDEX": "2"}, r"JOB_INDEX=2 is outside 0\.\.1"),
        ({"TFDP_NUM_WORKERS": "5"}, r"TFDP_NUM_WORKERS=5 is not a multiple of .*=2"),
        ({"JOB_COMPLETION_INDEX": "2"}, r"JOB_COMPLETION_INDEX=2 is outside 0\.\.1"),
        ({"HOSTNAME": "mnist-workers-0-1"}, r"does not match .*'mnist-workers-1-1'"),
    ],
)
def test_jobset_errors(change, match):
    environ = {k: v for k, v in {**JOBSET, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=match):
        parse_kubernetes(environ)


def test_environment_check_names_the_kubernetes_variable():
    problems = check_environment({**INDEXED, "TFDP_PORT": "0"})
    assert [p.variable for p in problems] == ["TFDP_PORT"]
    assert check_environment(INDEXED) == ()
