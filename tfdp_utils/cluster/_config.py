"""Cluster specs from the environment (TF_CONFIG, SLURM), parsed and validated.

Pure Python: nothing here imports TensorFlow. ``ClusterConfig`` is what the rest of the
package works with; :mod:`tfdp_utils.cluster._rendezvous` waits for its peers with a bound.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tfdp_utils import _variables
from tfdp_utils._validate import mapping

logger = logging.getLogger("tfdp_utils")

TRAINING_TASK_TYPES: tuple[str, ...] = ("chief", "worker")
KNOWN_TASK_TYPES: tuple[str, ...] = ("chief", "worker", "ps", "evaluator")

DEFAULT_SLURM_PORT_BASE = 8888
SLURM_PORT_BASE_VARIABLE = _variables.SLURM_PORT_BASE

_TF_CONFIG_EXAMPLE = (
    'TF_CONFIG=\'{"cluster": {"worker": ["host0:12345", "host1:12345"]}, '
    '"task": {"type": "worker", "index": 0}}\''
)


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


def validate_cluster(
    cluster: object, task_type: object, task_index: object, *, source: str = "TF_CONFIG"
) -> ClusterConfig:
    """Validate a cluster dictionary and task, returning a :class:`ClusterConfig`.

    Raises:
        ValueError: naming what is wrong and showing a valid example.
    """
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
        clean[kind] = tuple(checked)
    if len(clean.get("chief", ())) > 1:
        raise _tf_config_error(f"cluster has {len(clean['chief'])} chiefs; at most one is allowed")
    if not any(k in clean for k in TRAINING_TASK_TYPES):
        raise _tf_config_error("cluster has no 'chief' or 'worker' tasks, so nothing would train")
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
        return ClusterConfig(cluster=clean, task_type=task_type, task_index=0, source=source)
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
    return ClusterConfig(cluster=clean, task_type=task_type, task_index=task_index, source=source)


@functools.lru_cache(maxsize=2)  # once per process and reason, not at every parse
def _warn_no_cluster(why: str) -> None:
    logger.warning(
        "tfdp_utils: TF_CONFIG is set but names no cluster (%s): this process trains alone. "
        "Add a 'cluster' with the job's tasks to train on several workers, or unset TF_CONFIG.",
        why,
    )


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


# ----------------------------------------------------------------------------------- SLURM


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a SLURM host list such as ``"node[001-003,7],gpu-a"``.

    Raises:
        ValueError: for unbalanced brackets or bad ranges.
    """
    hosts: list[str] = []
    for item in _split_top_level(hostlist):
        hosts.extend(_expand_one(item))
    return hosts


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"SLURM host list {text!r} has an unbalanced ']'")
        if char == "," and depth == 0:
            if current:
                parts.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise ValueError(f"SLURM host list {text!r} has an unbalanced '['")
    if current:
        parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _expand_one(item: str) -> list[str]:
    match = re.search(r"\[([^\[\]]*)\]", item)
    if not match:
        return [item]
    prefix, suffix = item[: match.start()], item[match.end() :]
    expanded: list[str] = []
    for part in match.group(1).split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            if not (lo.isdigit() and hi.isdigit()) or int(lo) > int(hi):
                raise ValueError(f"SLURM host list range {part!r} in {item!r} is not 'lo-hi'")
            width = len(lo)
            values = [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
        elif part.isdigit():
            values = [part]
        else:
            raise ValueError(f"SLURM host list entry {part!r} in {item!r} is not a number")
        for value in values:
            expanded.extend(_expand_one(prefix + value + suffix))
    return expanded


def expand_tasks_per_node(value: str) -> list[int]:
    """Expand SLURM's tasks-per-node notation such as ``"2(x3),1"`` to ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in value.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if not match:
            raise ValueError(f"SLURM tasks-per-node value {value!r} has a bad entry {part!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _slurm_int(environ: Mapping[str, str], *names: str) -> int:
    """The whole number in the first of ``names`` that is set, or an error naming it."""
    name = next(n for n in names if environ.get(n))
    text = environ[name].strip()
    if not text.isdigit():
        raise ValueError(
            f"{name} must be a whole number, but received {name}={environ[name]!r}. srun sets "
            "it; run the script with srun, or unset SLURM_PROCID to train without SLURM."
        )
    return int(text)


def parse_slurm(environ: Mapping[str, str]) -> ClusterConfig | None:
    """Build a cluster from srun's variables, or None when this is not a multi-task srun step.

    Workers are ordered node by node as SLURM's default block distribution places them; task
    ``t`` on a node listens on ``port_base + local_id`` where the port base comes from
    ``TFDP_SLURM_PORT_BASE`` (default 8888). Needs neither ``scontrol`` nor ``nvidia-smi``.

    Raises:
        ValueError: when the SLURM variables contradict each other.
    """
    if "SLURM_PROCID" not in environ:
        return None
    num_tasks_text = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS")
    if not num_tasks_text:
        return None
    num_tasks = _slurm_int(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if num_tasks <= 1:
        return None
    rank = _slurm_int(environ, "SLURM_PROCID")
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise ValueError(
            "SLURM_PROCID and SLURM_STEP_NUM_TASKS are set but neither SLURM_STEP_NODELIST nor "
            "SLURM_JOB_NODELIST is; run the script with srun inside the allocation."
        )
    nodes = expand_hostlist(nodelist)
    per_node_text = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    if per_node_text:
        per_node = expand_tasks_per_node(per_node_text)
    else:
        base, extra = divmod(num_tasks, len(nodes))
        per_node = [base + (1 if i < extra else 0) for i in range(len(nodes))]
    if len(per_node) != len(nodes):
        raise ValueError(
            f"SLURM gives {len(nodes)} node(s) ({nodelist!r}) but tasks-per-node "
            f"{per_node_text!r} lists {len(per_node)}; they must match."
        )
    if sum(per_node) != num_tasks:
        raise ValueError(
            f"SLURM tasks-per-node {per_node_text!r} adds up to {sum(per_node)} tasks, "
            f"but SLURM_STEP_NUM_TASKS is {num_tasks}."
        )
    port_text = environ.get(SLURM_PORT_BASE_VARIABLE, str(DEFAULT_SLURM_PORT_BASE))
    if not port_text.isdigit() or not 0 < int(port_text) < 65536 - max(per_node):
        raise ValueError(
            f"{SLURM_PORT_BASE_VARIABLE}={port_text!r} is not a usable port; set it to a free "
            f"port number such as {DEFAULT_SLURM_PORT_BASE}."
        )
    port_base = int(port_text)
    workers = [
        f"{node}:{port_base + local}"
        for node, count in zip(nodes, per_node, strict=True)
        for local in range(count)
    ]
    if not 0 <= rank < len(workers):
        raise ValueError(f"SLURM_PROCID={rank} is outside 0..{len(workers) - 1}")
    return validate_cluster({"worker": workers}, "worker", rank, source="SLURM")


def cluster_from_environment(environ: Mapping[str, str] | None = None) -> ClusterConfig | None:
    """The cluster this process belongs to: TF_CONFIG first, then SLURM; None when alone."""
    environ = os.environ if environ is None else mapping(environ, "environ")
    config = parse_tf_config(environ.get("TF_CONFIG"))
    if config is not None:
        return config
    return parse_slurm(environ)


def cluster_task_type(environ: Mapping[str, str] | None = None) -> str | None:
    """This task's type (``chief``, ``worker``, ``evaluator``, ``ps``), or None when alone.

    Examples:
        >>> cluster_task_type({})
        >>> cluster_task_type({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
        ...                    "SLURM_STEP_NODELIST": "n[1-2]"})
        'worker'
    """
    config = cluster_from_environment(environ)
    return None if config is None else config.task_type
