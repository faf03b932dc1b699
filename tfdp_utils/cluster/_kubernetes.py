"""A cluster from a Kubernetes pod: an Indexed Job with a headless Service, or a JobSet. Pure.

Kubernetes gives each pod of an Indexed Job ``JOB_COMPLETION_INDEX`` and the stable host name
``<job>-<index>`` (``HOSTNAME``), reachable as ``<job>-<index>.<service>`` when the pod
template sets ``subdomain: <service>`` of a headless Service. A JobSet pod is named
``<jobset>-<replicated job>-<job index>-<pod index>``, its subdomain defaulting to the
JobSet's name; the manifest passes the JobSet's labels as variables through the downward
API. The manifest also passes what Kubernetes does not expose: the number of workers and the
port (``TFDP_NUM_WORKERS``, ``TFDP_PORT``). See ``docs/kubernetes.md``.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from tfdp_utils import _variables
from tfdp_utils.cluster._config import ClusterConfig, validate_cluster

COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
"""Set by Kubernetes in every pod of an Indexed Job (JobSet pods included)."""

_MANIFEST_FIX = "Set it in the container's env (see docs/kubernetes.md for a complete manifest)"


def _whole(environ: Mapping[str, str], name: str, *, what: str, minimum: int = 0) -> int:
    text = environ.get(name, "").strip()
    if not text:
        raise ValueError(
            f"{name} is not set, but this pod of a Kubernetes Indexed Job ({COMPLETION_INDEX}="
            f"{environ.get(COMPLETION_INDEX)!r}) trains with tfdp-utils' Kubernetes variables: "
            f"{name} must be {what}. {_MANIFEST_FIX}, or unset {_variables.NUM_WORKERS}, "
            f"{_variables.PORT} and {_variables.SUBDOMAIN} to train without a cluster."
        )
    if not text.isdigit() or int(text) < minimum:
        raise ValueError(
            f"{name} must be {what} (a whole number >= {minimum}), but received "
            f"{name}={environ[name]!r}. {_MANIFEST_FIX}."
        )
    return int(text)


def _port(environ: Mapping[str, str]) -> int:
    port = _whole(
        environ, _variables.PORT, what="the port every worker listens on, e.g. 2222", minimum=1
    )
    if port > 65535:
        raise ValueError(
            f"{_variables.PORT} must be a port number in 1..65535, but received "
            f"{_variables.PORT}={environ[_variables.PORT]!r}. {_MANIFEST_FIX}, e.g. 2222."
        )
    return port


def parse_hosts_override(text: str) -> dict[str, str]:
    """``TFDP_HOSTS_OVERRIDE``: ``"name=host:port,..."`` -> ``{name: "host:port"}``.

    A testing and debugging aid: it replaces the pods' DNS names (``train-0.train``) by
    addresses, so that a job can be rehearsed on one machine (``127.0.0.1:PORT``).

    Raises:
        ValueError: for an entry that is not ``name=host:port``.
    """
    hosts: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, sep, address = entry.partition("=")
        host, colon, port = address.strip().rpartition(":")
        if not sep or not name.strip() or not colon or not host or not port.isdigit():
            raise ValueError(
                f"{_variables.HOSTS_OVERRIDE} must be a comma-separated list of "
                f"'name=host:port' entries, such as 'train-0.train=127.0.0.1:2222', but "
                f"received the entry {entry!r}. Fix it, or unset {_variables.HOSTS_OVERRIDE} "
                "(a testing aid) to use the pods' DNS names."
            )
        hosts[name.strip()] = address.strip()
    return hosts


def _hostname(environ: Mapping[str, str]) -> str:
    # Container runtimes set HOSTNAME to the pod's host name; the system's is the same name.
    return (environ.get("HOSTNAME", "").strip() or socket.gethostname()).split(".")[0]


def _pattern_error(hostname: str, expected: str, why: str) -> ValueError:
    return ValueError(
        f"HOSTNAME={hostname!r} does not match the pod host name {expected!r} that {why}, so "
        "the other pods' names cannot be derived from it. Run the script in the pod "
        "Kubernetes created (not in a pod with its own 'hostname:'), or fix the variables "
        "the manifest passes (docs/kubernetes.md)."
    )


def parse_kubernetes(environ: Mapping[str, str]) -> ClusterConfig | None:
    """Build a cluster from a pod of an Indexed Job or a JobSet, or None when not such a pod.

    The pod opts in by passing ``TFDP_NUM_WORKERS``, ``TFDP_PORT`` or ``TFDP_SUBDOMAIN``:
    ``JOB_COMPLETION_INDEX`` alone (an Indexed Job of independent pods) is not a cluster.
    A JobSet pod is recognised by ``JOBSET_NAME``; its rank is
    ``JOB_INDEX * pods_per_job + JOB_COMPLETION_INDEX`` with
    ``pods_per_job = TFDP_NUM_WORKERS / REPLICATED_JOB_REPLICAS`` (default 1 replica).

    Raises:
        ValueError: for a missing count, port or subdomain, an index out of range, or a
            host name that does not match the pattern Kubernetes gives the pod.
    """
    ours = (_variables.NUM_WORKERS, _variables.PORT, _variables.SUBDOMAIN)
    if not any(environ.get(name, "").strip() for name in ours):
        return None
    if not environ.get(COMPLETION_INDEX, "").strip():
        raise ValueError(
            f"{COMPLETION_INDEX} is not set, but {' / '.join(ours)} are: Kubernetes sets it in "
            "the pods of an Indexed Job or a JobSet only. Use 'completionMode: Indexed' in "
            "the Job spec, or unset those variables when not running in such a pod."
        )
    num_workers = _whole(
        environ,
        _variables.NUM_WORKERS,
        what="the number of worker pods (the Job's completions and parallelism)",
        minimum=1,
    )
    port = _port(environ)
    pod_index = _whole(environ, COMPLETION_INDEX, what="this pod's index in its Job")
    hostname = _hostname(environ)
    jobset = environ.get(_variables.JOBSET_NAME, "").strip()
    if jobset:
        names, rank, kind = _jobset_hosts(environ, jobset, num_workers, pod_index, hostname)
        subdomain = environ.get(_variables.SUBDOMAIN, "").strip() or jobset
    else:
        subdomain = environ.get(_variables.SUBDOMAIN, "").strip()
        if not subdomain:
            raise ValueError(
                f"{_variables.SUBDOMAIN} is not set, but this pod of a Kubernetes Indexed Job "
                f"({COMPLETION_INDEX}={pod_index}) needs it: it must be the name of the "
                "headless Service that the pod template's 'subdomain:' names, so that the "
                f"pods reach each other as <job>-<index>.<service>. {_MANIFEST_FIX}."
            )
        if pod_index >= num_workers:
            raise _index_error(COMPLETION_INDEX, pod_index, num_workers)
        suffix = f"-{pod_index}"
        if not hostname.endswith(suffix) or len(hostname) == len(suffix):
            raise _pattern_error(
                hostname, f"<job>{suffix}", f"Kubernetes gives pod {pod_index} of an Indexed Job"
            )
        job = hostname[: -len(suffix)]
        names = [f"{job}-{i}" for i in range(num_workers)]
        rank, kind = pod_index, f"Indexed Job {job!r}"
    override = parse_hosts_override(environ.get(_variables.HOSTS_OVERRIDE, ""))
    workers = [override.get(f"{n}.{subdomain}", f"{n}.{subdomain}:{port}") for n in names]
    source = f"Kubernetes {kind}, pod {rank} of {num_workers}"
    return validate_cluster({"worker": workers}, "worker", rank, source=source)


def _index_error(name: str, index: int, count: int) -> ValueError:
    return ValueError(
        f"{name}={index} is outside 0..{count - 1}: {_variables.NUM_WORKERS} says the job has "
        f"{count} worker pod(s). Set {_variables.NUM_WORKERS} to the Job's completions "
        "(times the JobSet's replicas), which must equal its parallelism."
    )


def _jobset_hosts(
    environ: Mapping[str, str], jobset: str, num_workers: int, pod_index: int, hostname: str
) -> tuple[list[str], int, str]:
    """Every pod's host name, this pod's rank and how the source names it, for a JobSet."""
    replicated = environ.get(_variables.REPLICATED_JOB_NAME, "").strip()
    if not replicated:
        raise ValueError(
            f"{_variables.REPLICATED_JOB_NAME} is not set, but {_variables.JOBSET_NAME}="
            f"{jobset!r} is: a JobSet pod's host name is <jobset>-<replicated job>-<job "
            f"index>-<pod index>. Pass the label jobset.sigs.k8s.io/replicatedjob-name as "
            f"{_variables.REPLICATED_JOB_NAME} through the downward API (docs/kubernetes.md)."
        )
    replicas = (
        _whole(
            environ,
            _variables.REPLICATED_JOB_REPLICAS,
            what="the replicas of the replicated job",
            minimum=1,
        )
        if environ.get(_variables.REPLICATED_JOB_REPLICAS, "").strip()
        else 1
    )
    job_index = _whole(
        environ, _variables.JOB_INDEX, what="this pod's job index (jobset.sigs.k8s.io/job-index)"
    )
    if num_workers % replicas:
        raise ValueError(
            f"{_variables.NUM_WORKERS}={num_workers} is not a multiple of "
            f"{_variables.REPLICATED_JOB_REPLICAS}={replicas}: every Job of the JobSet runs "
            f"the same number of pods. Set {_variables.NUM_WORKERS} to replicas x parallelism."
        )
    per_job = num_workers // replicas
    if job_index >= replicas:
        raise ValueError(
            f"{_variables.JOB_INDEX}={job_index} is outside 0..{replicas - 1}: "
            f"{_variables.REPLICATED_JOB_REPLICAS}={replicas}. Pass the JobSet's "
            "replicatedjob-replicas label as it is (docs/kubernetes.md)."
        )
    if pod_index >= per_job:
        raise _index_error(COMPLETION_INDEX, pod_index, per_job)
    expected = f"{jobset}-{replicated}-{job_index}-{pod_index}"
    if hostname != expected:
        raise _pattern_error(hostname, expected, "JobSet gives this pod")
    names = [f"{jobset}-{replicated}-{j}-{p}" for j in range(replicas) for p in range(per_job)]
    rank = job_index * per_job + pod_index
    return names, rank, f"JobSet {jobset!r} ({replicated})"
