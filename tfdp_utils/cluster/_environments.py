"""Where a cluster spec comes from: the environments tfdp-utils reads, in order. Pure.

:data:`ENVIRONMENTS` is the one ordered list of them: :func:`cluster_from_environment` asks each
in turn and the first that describes a cluster wins, and the wording that names them all
(:data:`NAMES`, e.g. "TF_CONFIG / SLURM") is derived from it, so adding an environment (a
scheduler's variables) touches this module only.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping

from tfdp_utils._public import public
from tfdp_utils._validate import mapping
from tfdp_utils.cluster._config import ClusterConfig, parse_tf_config
from tfdp_utils.cluster._kubernetes import parse_kubernetes
from tfdp_utils.cluster._slurm import parse_slurm


@dataclasses.dataclass(frozen=True)
class ClusterEnvironment:
    """One environment a cluster spec can come from.

    Attributes:
        name: how messages name it, e.g. ``"TF_CONFIG"``.
        parse: ``parse(environ) -> ClusterConfig | None``; None when this environment
            describes no cluster; raises ``ValueError`` when it is set but malformed.
    """

    name: str
    parse: Callable[[Mapping[str, str]], ClusterConfig | None]


ENVIRONMENTS: tuple[ClusterEnvironment, ...] = (
    ClusterEnvironment("TF_CONFIG", lambda environ: parse_tf_config(environ.get("TF_CONFIG"))),
    ClusterEnvironment("SLURM", parse_slurm),
    # After SLURM: a pod's variables reach every process in it, srun's describe one task.
    ClusterEnvironment("Kubernetes", parse_kubernetes),
)
"""The environments a cluster spec comes from, the first that describes one winning."""

NAMES = " / ".join(environment.name for environment in ENVIRONMENTS)
"""All of them in words, for messages: ``"TF_CONFIG / SLURM"``."""


@public("tfdp_utils.cluster")
def cluster_from_environment(environ: Mapping[str, str] | None = None) -> ClusterConfig | None:
    """The cluster this process belongs to, from the first of :data:`ENVIRONMENTS` that
    describes one (TF_CONFIG first, then SLURM, then Kubernetes); None when alone."""
    environ = os.environ if environ is None else mapping(environ, "environ")
    for environment in ENVIRONMENTS:
        config = environment.parse(environ)
        if config is not None:
            return config
    return None


@public("tfdp_utils")
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
