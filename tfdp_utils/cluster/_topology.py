"""Which worker this process is: one ``WorkerPosition`` from a strategy or a cluster config.

Every part of tfdp-utils that needs "how many workers, which one am I, am I the chief, which
replicas are mine" asks here. Workers are ranked as MultiWorkerMirroredStrategy ranks its
input pipelines and replicas: the chief first, then the workers in index order; evaluators
and parameter servers have no rank. This module does not import TensorFlow itself: a
strategy object is only inspected through :mod:`tfdp_utils._tf`'s named accessors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tfdp_utils.cluster._config import ClusterConfig
from tfdp_utils.cluster._environments import cluster_from_environment


@dataclasses.dataclass(frozen=True)
class WorkerPosition:
    """This process's place among the training workers.

    Attributes:
        index: rank among the training workers (chief first), 0 when alone.
        num_workers: training workers in the job (chief + workers), 1 when alone.
        is_chief: whether this process writes the job-wide outputs (the chief, or worker 0
            when the cluster has no chief).
        local_replicas: ids of the replicas this worker runs, in the strategy's global replica
            order (``range(index * local, (index + 1) * local)``).
    """

    index: int = 0
    num_workers: int = 1
    is_chief: bool = True
    local_replicas: tuple[int, ...] = (0,)

    @property
    def is_multi_worker(self) -> bool:
        """True when the job has more than one training worker."""
        return self.num_workers > 1


SINGLE = WorkerPosition()
"""The position of a process that trains alone."""


def _replicas(index: int, local: int, total: int) -> tuple[int, ...]:
    first = index * local
    return tuple(range(first, min(first + local, max(total, first + 1))))


def position_from_cluster(
    config: ClusterConfig | None, *, local_replicas: int = 1
) -> WorkerPosition:
    """The position ``config`` gives this task (None: alone). Evaluator / ps: index 0, no chief."""
    if config is None:
        return dataclasses.replace(SINGLE, local_replicas=tuple(range(local_replicas)))
    rank = config.worker_rank
    workers = max(config.num_workers, 1)
    index = 0 if rank is None else rank
    return WorkerPosition(
        index=index,
        num_workers=workers,
        is_chief=config.is_chief,
        local_replicas=_replicas(index, local_replicas, workers * local_replicas),
    )


def position_from_environment(
    environ: Mapping[str, str] | None = None, *, local_replicas: int = 1
) -> WorkerPosition:
    """The position TF_CONFIG or SLURM gives this process (a malformed TF_CONFIG raises)."""
    return position_from_cluster(cluster_from_environment(environ), local_replicas=local_replicas)


def is_multi_worker(strategy: Any) -> bool:
    """True when ``strategy`` spans more than one training worker (False for None)."""
    if strategy is None:
        return False
    from tfdp_utils import _tf

    return bool(_tf.in_multi_worker_mode(strategy))


def position_of(strategy: Any) -> WorkerPosition:
    """This process's position in ``strategy``: MultiWorkerMirroredStrategy, any other, or None.

    A strategy that is not in multi-worker mode (Mirrored, OneDevice, the default, or a
    MultiWorkerMirroredStrategy over one worker) gives index 0 of 1, the chief, with every
    replica local.
    """
    if strategy is None:
        return SINGLE
    replicas = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    if not is_multi_worker(strategy):
        return WorkerPosition(local_replicas=tuple(range(replicas)))
    resolver = strategy.cluster_resolver
    config = ClusterConfig(
        cluster={k: tuple(v) for k, v in resolver.cluster_spec().as_dict().items()},
        task_type=str(resolver.task_type),
        task_index=int(resolver.task_id or 0),
        source=type(resolver).__name__,
    )
    workers = max(config.num_workers, 1)
    return position_from_cluster(config, local_replicas=max(replicas // workers, 1))
