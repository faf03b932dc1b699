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

from tfdp_utils._lazy import surface
from tfdp_utils.cluster._config import ClusterConfig as ClusterConfig
from tfdp_utils.cluster._config import parse_tf_config as parse_tf_config
from tfdp_utils.cluster._config import validate_cluster as validate_cluster
from tfdp_utils.cluster._environments import cluster_from_environment as cluster_from_environment
from tfdp_utils.cluster._environments import cluster_task_type as cluster_task_type
from tfdp_utils.cluster._slurm import expand_hostlist as expand_hostlist
from tfdp_utils.cluster._slurm import parse_slurm as parse_slurm
from tfdp_utils.errors import ClusterTimeoutError as ClusterTimeoutError

# __all__ and dir() are the names imported above as `name as name` (see tfdp_utils._lazy).
__all__, __getattr__, __dir__ = surface(globals())
