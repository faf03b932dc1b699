"""A cluster from SLURM's ``srun`` variables: host lists, tasks per node, ports. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping

from tfdp_utils import _variables
from tfdp_utils._public import public
from tfdp_utils.cluster._config import ClusterConfig, validate_cluster

DEFAULT_SLURM_PORT_BASE = 8888
SLURM_PORT_BASE_VARIABLE = _variables.SLURM_PORT_BASE


_HOSTLIST_EXAMPLE = "'node[01-04],gpu-a'"
_SRUN_FIX = (
    "srun sets it for each task: run the script with srun inside the allocation, or unset "
    "SLURM_PROCID to train without SLURM."
)


@public("tfdp_utils.cluster")
def expand_hostlist(hostlist: str, *, name: str = "hostlist") -> list[str]:
    """Expand a SLURM host list such as ``"node[001-003,7],gpu-a"``.

    Args:
        hostlist: the host list, as in ``SLURM_STEP_NODELIST``.
        name: what messages call it, e.g. ``"SLURM_STEP_NODELIST"``. Defaults to
            `"hostlist"`.

    Raises:
        ValueError: for unbalanced brackets or bad ranges, naming what was received, what a
            host list looks like and how to fix it.
    """
    hosts: list[str] = []
    for item in _split_top_level(hostlist, name):
        hosts.extend(_expand_one(item, hostlist, name))
    return hosts


def _hostlist_error(name: str, hostlist: str, problem: str) -> ValueError:
    shown = f"{name}={hostlist!r}" if name.isupper() else f"{hostlist!r}"
    return ValueError(
        f"{name} must be a SLURM host list such as {_HOSTLIST_EXAMPLE}, but received {shown}, "
        f"which {problem}. {_SRUN_FIX if name.isupper() else 'Fix the host list.'}"
    )


def _split_top_level(text: str, name: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise _hostlist_error(name, text, "has an unbalanced ']' (a ']' without its '[')")
        if char == "," and depth == 0:
            if current:
                parts.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise _hostlist_error(name, text, "has an unbalanced '[' (a '[' that is never closed)")
    if current:
        parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _expand_one(item: str, hostlist: str, name: str) -> list[str]:
    match = re.search(r"\[([^\[\]]*)\]", item)
    if not match:
        return [item]
    prefix, suffix = item[: match.start()], item[match.end() :]
    expanded: list[str] = []
    for part in match.group(1).split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            if not (lo.isdigit() and hi.isdigit()) or int(lo) > int(hi):
                raise _hostlist_error(
                    name,
                    hostlist,
                    f"has the range {part!r} in {item!r}: expected 'lo-hi', lo <= hi",
                )
            width = len(lo)
            values = [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
        elif part.isdigit():
            values = [part]
        else:
            raise _hostlist_error(
                name, hostlist, f"has the entry {part!r} in {item!r}: expected a number"
            )
        for value in values:
            expanded.extend(_expand_one(prefix + value + suffix, hostlist, name))
    return expanded


def expand_tasks_per_node(value: str, *, name: str = "value") -> list[int]:
    """Expand SLURM's tasks-per-node notation such as ``"2(x3),1"`` to ``[2, 2, 2, 1]``.

    Args:
        value: the notation, as in ``SLURM_STEP_TASKS_PER_NODE``.
        name: what messages call it. Defaults to `"value"`.
    """
    counts: list[int] = []
    for part in value.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if not match:
            shown = f"{name}={value!r}" if name.isupper() else repr(value)
            raise ValueError(
                f"{name} must be SLURM's tasks-per-node notation such as '2(x3),1', but "
                f"received {shown}, which has a bad entry {part!r}. "
                f"{_SRUN_FIX if name.isupper() else 'Fix the value.'}"
            )
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


def slurm_port_base(environ: Mapping[str, str], *, tasks_per_node: int = 1) -> int:
    """The first port of a SLURM job's cluster: ``TFDP_SLURM_PORT_BASE``, else 8888.

    Task ``t`` of a node listens on ``port_base + t``, so every port up to
    ``port_base + tasks_per_node - 1`` must be a port number.

    Raises:
        ValueError: naming the value received, the range expected and a usable value.
    """
    text = environ.get(SLURM_PORT_BASE_VARIABLE, "").strip() or str(DEFAULT_SLURM_PORT_BASE)
    highest = 65535 - (tasks_per_node - 1)
    if not text.isdigit() or not 0 < int(text) <= highest:
        raise ValueError(
            f"{SLURM_PORT_BASE_VARIABLE}={text!r} is not a usable port: it must be a port "
            f"number in 1..{highest} (the tasks of a node listen on it and the "
            f"{tasks_per_node - 1} port(s) after it). Set it to a port that is free on every "
            f"node, such as {DEFAULT_SLURM_PORT_BASE}, or unset it."
        )
    return int(text)


@public("tfdp_utils.cluster")
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
    tasks_name = next((n for n in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") if environ.get(n)), None)
    if tasks_name is None:
        return None
    num_tasks = _slurm_int(environ, tasks_name)
    if num_tasks == 0:
        raise ValueError(
            f"{tasks_name} must be the number of tasks in this srun step, at least 1, but "
            f"received {tasks_name}={environ[tasks_name]!r}: no step has 0 tasks, and this "
            f"process is one of them. {_SRUN_FIX}"
        )
    if num_tasks == 1:
        return None
    rank = _slurm_int(environ, "SLURM_PROCID")
    nodelist_name = next(
        (n for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST") if environ.get(n)), None
    )
    if nodelist_name is None:
        raise ValueError(
            f"SLURM_PROCID and {tasks_name} are set but neither SLURM_STEP_NODELIST nor "
            "SLURM_JOB_NODELIST is; run the script with srun inside the allocation."
        )
    nodelist = environ[nodelist_name]
    nodes = expand_hostlist(nodelist, name=nodelist_name)
    per_node_name = next(
        (n for n in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if environ.get(n)), None
    )
    per_node_text = ""
    if per_node_name is not None:
        per_node_text = environ[per_node_name]
        per_node = expand_tasks_per_node(per_node_text, name=per_node_name)
    else:
        base, extra = divmod(num_tasks, len(nodes))
        per_node = [base + (1 if i < extra else 0) for i in range(len(nodes))]
    if len(per_node) != len(nodes):
        raise ValueError(
            f"{per_node_name} must list one task count per node of {nodelist_name}="
            f"{nodelist!r} ({len(nodes)} node(s)), but received {per_node_name}="
            f"{per_node_text!r}, which lists {len(per_node)}. {_SRUN_FIX}"
        )
    if sum(per_node) != num_tasks:
        raise ValueError(
            f"{per_node_name} must add up to {tasks_name}={num_tasks}, but received "
            f"{per_node_name}={per_node_text!r}, which adds up to {sum(per_node)} tasks. "
            f"{_SRUN_FIX}"
        )
    port_base = slurm_port_base(environ, tasks_per_node=max(per_node))
    workers = [
        f"{node}:{port_base + local}"
        for node, count in zip(nodes, per_node, strict=True)
        for local in range(count)
    ]
    if not 0 <= rank < len(workers):
        raise ValueError(
            f"SLURM_PROCID={rank} is outside 0..{len(workers) - 1}: SLURM_PROCID must be this "
            f"task's rank among the step's {len(workers)} tasks ({tasks_name}={num_tasks}). "
            f"{_SRUN_FIX}"
        )
    return validate_cluster({"worker": workers}, "worker", rank, source="SLURM")
