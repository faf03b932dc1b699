"""Which worker this process is, read from a strategy object: ``position_of``, ``is_multi_worker``.

Needs TensorFlow (``is_multi_worker`` asks the strategy through ``tfdp_utils._tf``), so this
module is not pure; the positions from TF_CONFIG and SLURM are in test_topology.py. A real
MirroredStrategy over the logical CPUs, and a strategy in multi-worker mode described by a
real cluster resolver (a real one needs a cluster of processes: test_*_multiworker.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import tensorflow as tf

from tfdp_utils.cluster._topology import WorkerPosition, is_multi_worker, position_of


class Extended:
    def __init__(self, multi_worker: bool) -> None:
        self.multi_worker = multi_worker

    def _in_multi_worker_mode(self) -> bool:
        return self.multi_worker


class MultiWorkerLike:
    """What position_of reads of a MultiWorkerMirroredStrategy: replicas, mode, resolver."""

    def __init__(self, cluster: dict[str, list[str]], task_type: str, task_id: int, replicas: int):
        self.num_replicas_in_sync = replicas
        self.extended = Extended(multi_worker=True)
        self.cluster_resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type=task_type, task_id=task_id
        )


WORKERS = {"worker": ["w0:1", "w1:1", "w2:1"]}
WITH_CHIEF = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"]}


def test_a_mirrored_strategy_is_one_worker_with_every_replica(logical_cpus: int) -> None:
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(logical_cpus)])
    assert not is_multi_worker(strategy)
    assert position_of(strategy) == WorkerPosition(0, 1, True, tuple(range(logical_cpus)))


def test_the_default_strategy_is_one_worker_with_one_replica() -> None:
    strategy = tf.distribute.get_strategy()
    assert not is_multi_worker(strategy)
    assert position_of(strategy) == WorkerPosition(0, 1, True, (0,))


def test_none_is_not_multi_worker() -> None:
    assert is_multi_worker(None) is False


@pytest.mark.parametrize(
    ("cluster", "task_type", "task_id", "replicas", "expected"),
    [
        # 3 workers of 2 replicas: worker 1 runs global replicas 2 and 3.
        (WORKERS, "worker", 0, 6, WorkerPosition(0, 3, True, (0, 1))),
        (WORKERS, "worker", 1, 6, WorkerPosition(1, 3, False, (2, 3))),
        (WORKERS, "worker", 2, 6, WorkerPosition(2, 3, False, (4, 5))),
        # The chief ranks first; worker 0 comes after it.
        (WITH_CHIEF, "chief", 0, 3, WorkerPosition(0, 3, True, (0,))),
        (WITH_CHIEF, "worker", 0, 3, WorkerPosition(1, 3, False, (1,))),
        (WITH_CHIEF, "worker", 1, 3, WorkerPosition(2, 3, False, (2,))),
    ],
)
def test_a_multi_worker_strategy_gives_the_resolvers_position(
    cluster: dict[str, list[str]],
    task_type: str,
    task_id: int,
    replicas: int,
    expected: WorkerPosition,
) -> None:
    strategy: Any = MultiWorkerLike(cluster, task_type, task_id, replicas)
    assert is_multi_worker(strategy)
    assert position_of(strategy) == expected


def test_a_strategy_not_in_multi_worker_mode_ignores_its_resolver() -> None:
    strategy = MultiWorkerLike(WORKERS, "worker", 2, 4)
    strategy.extended = Extended(multi_worker=False)  # e.g. MultiWorkerMirrored on one worker
    assert not is_multi_worker(strategy)
    assert position_of(strategy) == WorkerPosition(0, 1, True, (0, 1, 2, 3))
