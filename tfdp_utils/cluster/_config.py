"""A cluster spec and this process's place in it, validated; TF_CONFIG, its native form.

Pure Python: nothing here imports TensorFlow. ``ClusterConfig`` is what the rest of the
package works with, whichever environment it came from (:mod:`._environments`);
:mod:`tfdp_utils.cluster._rendezvous` waits for its peers with a bound.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tfdp_utils._public import public

logger = logging.getLogger("tfdp_utils")

TRAINING_TASK_TYPES: tuple[str, ...] = ("chief", "worker")
KNOWN_TASK_TYPES: tuple[str, ...] = ("chief", "worker", "ps", "evaluator")

_TF_CONFIG_EXAMPLE = (
    'TF_CONFIG=\'{"cluster": {"worker": ["host0:12345", "host1:12345"]}, '
    '"task": {"type": "worker", "index": 0}}\''
)


@public("tfdp_utils")
@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """A validated multi-process cluster and this process's place in it.

    Attributes:
        cluster: task type -> addresses (``host:port``), as in TF_CONFIG's ``cluster``.
        task_type: this process's task type (``chief``, ``worker``, ``evaluator`` or ``ps``).
        task_index: this process's index within its task type.
        source: where the spec came from: ``"TF_CONFIG"``, ``"SLURM"`` or ``"cluster_resolver"``.
    """

    cluster: Mapping[str, tuple[str, ...]]
    task_type: str
    task_index: int
    source: str

    @property
    def training_tasks(self) -> tuple[tuple[str, int, str], ...]:
        """``(type, index, address)`` of every task that trains (chief first, then workers)."""
        out: list[tuple[str, int, str]] = []
        for task_type in TRAINING_TASK_TYPES:
            for index, address in enumerate(self.cluster.get(task_type, ())):
                out.append((task_type, index, address))
        return tuple(out)

    @property
    def num_workers(self) -> int:
        """Number of training processes (chief + workers)."""
        return len(self.training_tasks)

    @property
    def worker_rank(self) -> int | None:
        """This process's position among the training tasks, or None for evaluator / ps."""
        for rank, (task_type, index, _) in enumerate(self.training_tasks):
            if task_type == self.task_type and index == self.task_index:
                return rank
        return None

    @property
    def address(self) -> str:
        """This task's own ``host:port``."""
        return self.cluster[self.task_type][self.task_index]

    @property
    def is_chief(self) -> bool:
        """True for the chief, or for worker 0 when the cluster has no chief."""
        if "chief" in self.cluster:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    @property
    def has_parameter_servers(self) -> bool:
        return bool(self.cluster.get("ps"))

    def as_tf_config(self) -> dict[str, Any]:
        """The TF_CONFIG dictionary equivalent to this config."""
        return {
            "cluster": {k: list(v) for k, v in self.cluster.items()},
            "task": {"type": self.task_type, "index": self.task_index},
        }

    def describe(self) -> str:
        sizes = ", ".join(f"{len(v)} {k}" for k, v in self.cluster.items())
        return f"{self.source} cluster ({sizes}); this task is {self.task_type}:{self.task_index}"


def _tf_config_error(problem: str) -> ValueError:
    return ValueError(
        f"TF_CONFIG is invalid: {problem}.\n"
        f"Expected a JSON object with 'cluster' and 'task', for example:\n  {_TF_CONFIG_EXAMPLE}\n"
        "Fix TF_CONFIG, or unset it to train on this machine alone."
    )


def _check_address(address: object, where: str) -> str:
    if not isinstance(address, str) or not address.strip():
        raise _tf_config_error(f"{where} is {address!r}; expected a 'host:port' string")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _tf_config_error(f"{where} is {address!r}; expected 'host:port' with a port 1-65535")
    return address


def _clean_addresses(kind: str, addresses: object, seen: dict[str, str]) -> tuple[str, ...]:
    """One task type's addresses, checked; ``seen`` (address -> where) catches repeats."""
    if isinstance(addresses, Mapping):
        # Sparse form {"0": "host:port", ...} is allowed by TF; keep index order.
        try:
            items = sorted((int(k), v) for k, v in addresses.items())
        except ValueError:
            raise _tf_config_error(
                f"cluster[{kind!r}] has non-integer keys {list(addresses)}"
            ) from None
        addresses = [v for _, v in items]
    if isinstance(addresses, str) or not isinstance(addresses, Sequence) or not addresses:
        raise _tf_config_error(
            f"cluster[{kind!r}] is {addresses!r}; expected a non-empty list of 'host:port'"
        )
    checked = []
    for i, address in enumerate(addresses):
        where = f"cluster[{kind!r}][{i}]"
        address = _check_address(address, where)
        if address in seen:
            raise _tf_config_error(
                f"address {address!r} appears twice ({seen[address]} and {where}); "
                "every task needs its own host:port"
            )
        seen[address] = where
        checked.append(address)
    return tuple(checked)


def _clean_cluster(cluster: object) -> dict[str, tuple[str, ...]]:
    """The cluster's task types and addresses, checked: known types, one chief, someone trains."""
    if not isinstance(cluster, Mapping) or not cluster:
        raise _tf_config_error(
            f"'cluster' is {cluster!r}; expected a non-empty object of "
            "task type -> list of addresses"
        )
    clean: dict[str, tuple[str, ...]] = {}
    seen: dict[str, str] = {}
    for kind, addresses in cluster.items():
        if kind not in KNOWN_TASK_TYPES:
            raise _tf_config_error(
                f"cluster has unknown task type {kind!r}; known types are {list(KNOWN_TASK_TYPES)}"
            )
        clean[kind] = _clean_addresses(kind, addresses, seen)
    if len(clean.get("chief", ())) > 1:
        raise _tf_config_error(f"cluster has {len(clean['chief'])} chiefs; at most one is allowed")
    if not any(k in clean for k in TRAINING_TASK_TYPES):
        raise _tf_config_error("cluster has no 'chief' or 'worker' tasks, so nothing would train")
    return clean


def _check_task(
    clean: Mapping[str, tuple[str, ...]], task_type: object, task_index: object
) -> tuple[str, int]:
    """This process's ``(type, index)``, checked against the clean cluster."""
    if not isinstance(task_type, str) or task_type not in KNOWN_TASK_TYPES:
        raise _tf_config_error(
            f"task type is {task_type!r}; expected one of {list(KNOWN_TASK_TYPES)}"
        )
    if isinstance(task_index, str) and task_index.isdigit():
        task_index = int(task_index)
    if isinstance(task_index, bool) or not isinstance(task_index, int):
        raise _tf_config_error(f"task index is {task_index!r}; expected an integer")
    if task_type == "evaluator" and task_type not in clean:
        # TF allows the evaluator to be absent from 'cluster'.
        if task_index != 0:
            raise _tf_config_error(f"evaluator index is {task_index}; there is only evaluator 0")
        return task_type, 0
    if task_type not in clean:
        raise _tf_config_error(
            f"task type {task_type!r} is not in the cluster, whose types are {sorted(clean)}"
        )
    if not 0 <= task_index < len(clean[task_type]):
        raise _tf_config_error(
            f"task index {task_index} is out of range: cluster[{task_type!r}] has "
            f"{len(clean[task_type])} address(es), so valid indices are "
            f"0..{len(clean[task_type]) - 1}"
        )
    return task_type, task_index


@public("tfdp_utils.cluster")
def validate_cluster(
    cluster: object, task_type: object, task_index: object, *, source: str = "TF_CONFIG"
) -> ClusterConfig:
    """Validate a cluster dictionary and task, returning a :class:`ClusterConfig`.

    Raises:
        ValueError: naming what is wrong and showing a valid example.
    """
    clean = _clean_cluster(cluster)
    task_type, task_index = _check_task(clean, task_type, task_index)
    return ClusterConfig(cluster=clean, task_type=task_type, task_index=task_index, source=source)


@functools.lru_cache(maxsize=2)  # once per process and reason, not at every parse
def _warn_no_cluster(why: str) -> None:
    logger.warning(
        "tfdp_utils: TF_CONFIG is set but names no cluster (%s): this process trains alone. "
        "Add a 'cluster' with the job's tasks to train on several workers, or unset TF_CONFIG.",
        why,
    )


@public("tfdp_utils.cluster")
def parse_tf_config(value: str | None) -> ClusterConfig | None:
    """Parse a TF_CONFIG string. Empty or cluster-less values mean "no cluster" (None).

    Raises:
        ValueError: when TF_CONFIG is set but malformed.
    """
    if value is None or not value.strip():
        return None
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise _tf_config_error(f"it is not valid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(data, dict):
        raise _tf_config_error(f"it is a JSON {type(data).__name__}, not an object")
    cluster = data.get("cluster")
    if not cluster:
        _warn_no_cluster("'cluster' is empty" if "cluster" in data else "no 'cluster' key")
        return None
    task = data.get("task")
    if not isinstance(task, dict) or "type" not in task:
        raise _tf_config_error(
            f"'task' is {task!r}; expected an object like {{'type': 'worker', 'index': 0}}"
        )
    return validate_cluster(cluster, task.get("type"), task.get("index", 0), source="TF_CONFIG")
