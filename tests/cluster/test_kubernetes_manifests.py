"""The manifests of docs/kubernetes/ give each pod what the Kubernetes detection reads. Pure.

Each pod's variables are derived from the manifest as Kubernetes and JobSet set them (the
pod's host name and index, the labels the downward API passes) and parsed by
``parse_kubernetes``: every pod must find the same cluster, with itself at its own rank.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tfdp_utils import _variables
from tfdp_utils.cluster._kubernetes import COMPLETION_INDEX, parse_kubernetes

pytestmark = pytest.mark.pure

DOCS = Path(__file__).resolve().parents[2] / "docs"
MANIFESTS = DOCS / "kubernetes"
PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: a preempted worker that saved its checkpoint


def _documents(name: str) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all((MANIFESTS / name).read_text())}


def _container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec["containers"]
    return container


def _env(container: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """The container's variables, the downward API's fieldRefs resolved from ``labels``."""
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            key = re.fullmatch(r"metadata\.(?:labels|annotations)\['(.+)'\]", path)
            assert key, path
            env[item["name"]] = labels[key.group(1)]
    return env


def _check_job_spec(job_spec: dict[str, Any]) -> dict[str, Any]:
    """The checks shared by both manifests; returns the pod spec."""
    assert job_spec["completionMode"] == "Indexed"
    assert job_spec["completions"] == job_spec["parallelism"]
    pod = job_spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it
    assert pod["terminationGracePeriodSeconds"] >= 30
    rules = job_spec["podFailurePolicy"]["rules"]
    exit_rules = [r for r in rules if "onExitCodes" in r]
    assert [r["action"] for r in rules] == ["Ignore", "Ignore"]
    assert exit_rules[0]["onExitCodes"] == {
        "containerName": _container(pod)["name"],
        "operator": "In",
        "values": [PREEMPTED_EXIT_CODE],
    }
    assert any(c["type"] == "DisruptionTarget" for r in rules for c in r.get("onPodConditions", []))
    claims = {v["name"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert {m["name"] for m in _container(pod)["volumeMounts"]} <= claims
    return pod


def _check_network_policy(policy: dict[str, Any], labels: dict[str, str], port: int) -> None:
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= labels.items()
    (rule,) = policy["spec"]["ingress"]
    assert [source["podSelector"]["matchLabels"] for source in rule["from"]] == [selected]
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]


def _check_cluster(environs: list[dict[str, str]], port: int) -> tuple[str, ...]:
    configs = [parse_kubernetes(environ) for environ in environs]
    assert all(config is not None for config in configs)
    clusters = {config.cluster["worker"] for config in configs if config is not None}
    assert len(clusters) == 1  # every pod finds the same cluster
    (workers,) = clusters
    assert len(workers) == len(environs)
    for config, environ in zip(configs, environs, strict=True):
        assert config is not None
        assert config.address.split(".")[0] == environ["HOSTNAME"]  # itself at its own rank
        assert config.address.endswith(f":{port}")
    return workers


def test_indexed_job_manifest():
    documents = _documents("indexed-job.yaml")
    job, service = documents["Job"], documents["Service"]
    pod = _check_job_spec(job["spec"])
    container = _container(pod)
    name = job["metadata"]["name"]
    labels = {"batch.kubernetes.io/job-name": name}  # set by the Job controller
    env = _env(container, labels)
    assert set(env) == {_variables.NUM_WORKERS, _variables.PORT, _variables.SUBDOMAIN}
    port = int(env[_variables.PORT])
    assert container["ports"] == [{"containerPort": port}]
    assert int(env[_variables.NUM_WORKERS]) == job["spec"]["completions"]
    assert pod["subdomain"] == env[_variables.SUBDOMAIN] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= labels.items()
    _check_network_policy(documents["NetworkPolicy"], labels, port)
    environs = [
        {**env, COMPLETION_INDEX: str(i), "HOSTNAME": f"{name}-{i}"}
        for i in range(job["spec"]["completions"])
    ]
    workers = _check_cluster(environs, port)
    assert workers == ("train-0.train-workers:2222", "train-1.train-workers:2222")


def test_jobset_manifest():
    documents = _documents("jobset.yaml")
    jobset = documents["JobSet"]
    name = jobset["metadata"]["name"]
    assert "network" not in jobset["spec"]  # the subdomain is JobSet's default: its name
    (replicated,) = jobset["spec"]["replicatedJobs"]
    job_spec = replicated["template"]["spec"]
    pod = _check_job_spec(job_spec)
    container = _container(pod)
    port = int(next(e["value"] for e in container["env"] if e["name"] == _variables.PORT))
    assert container["ports"] == [{"containerPort": port}]
    environs = []
    for job_index in range(replicated["replicas"]):
        labels = {  # what JobSet sets on every pod
            "jobset.sigs.k8s.io/jobset-name": name,
            "jobset.sigs.k8s.io/replicatedjob-name": replicated["name"],
            "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicated["replicas"]),
            "jobset.sigs.k8s.io/job-index": str(job_index),
        }
        env = _env(container, labels)
        assert set(env) == {
            _variables.NUM_WORKERS,
            _variables.PORT,
            _variables.JOBSET_NAME,
            _variables.REPLICATED_JOB_NAME,
            _variables.REPLICATED_JOB_REPLICAS,
            _variables.JOB_INDEX,
        }
        assert int(env[_variables.NUM_WORKERS]) == replicated["replicas"] * job_spec["completions"]
        environs += [
            {
                **env,
                COMPLETION_INDEX: str(pod_index),
                "HOSTNAME": f"{name}-{replicated['name']}-{job_index}-{pod_index}",
            }
            for pod_index in range(job_spec["completions"])
        ]
        _check_network_policy(documents["NetworkPolicy"], labels, port)
    workers = _check_cluster(environs, port)
    assert workers[2] == "mnist-workers-1-0.mnist:2222"


@pytest.mark.parametrize("manifest", ["indexed-job.yaml", "jobset.yaml"])
def test_docs_page_shows_each_manifest_as_it_is(manifest):
    page = (DOCS / "kubernetes.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```", page, re.S | re.M)
    assert (MANIFESTS / manifest).read_text() in blocks
