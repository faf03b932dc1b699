"""Where this process is: the cluster from TF_CONFIG, SLURM or Kubernetes, validated. Pure.

============================  =============================================================
``cluster/_config.py``        ``ClusterConfig``, TF_CONFIG parsing and validation
``cluster/_slurm.py``         a cluster from srun's variables
``cluster/_kubernetes.py``    a cluster from an Indexed Job or JobSet pod
``cluster/_environments.py``  the environments above, in order (TF_CONFIG wins)
``cluster/_topology.py``      one ``WorkerPosition`` from a strategy or a cluster
``cluster/_rendezvous.py``    the bounded peer rendezvous before a multi-worker strategy
============================  =============================================================
"""

from tfdp_utils.cluster._config import ClusterConfig, parse_tf_config, validate_cluster
from tfdp_utils.cluster._environments import cluster_from_environment, cluster_task_type
from tfdp_utils.cluster._slurm import expand_hostlist, parse_slurm
from tfdp_utils.errors import ClusterTimeoutError

__all__ = [
    "ClusterConfig",
    "ClusterTimeoutError",
    "cluster_from_environment",
    "cluster_task_type",
    "expand_hostlist",
    "parse_slurm",
    "parse_tf_config",
    "validate_cluster",
]


def __dir__() -> list[str]:
    return sorted(__all__)  # tab completion shows the API only
