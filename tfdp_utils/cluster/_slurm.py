"""A cluster from SLURM's ``srun`` variables: host lists, tasks per node, ports. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping

from tfdp_utils import _variables
from tfdp_utils.cluster._config import ClusterConfig, validate_cluster

DEFAULT_SLURM_PORT_BASE = 8888
SLURM_PORT_BASE_VARIABLE = _variables.SLURM_PORT_BASE


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
