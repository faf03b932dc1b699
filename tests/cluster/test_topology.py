"""Which worker this process is, from TF_CONFIG or SLURM given as a dict: a table of positions.

Pure. Workers rank as MultiWorkerMirroredStrategy ranks them (the chief first, then the
workers by index); each worker's replicas are its own consecutive block of global replica
ids, checked against the blocks written out for every worker of the job. Positions from a
strategy object need TensorFlow: they are in test_topology_strategies.py.
"""

from __future__ import annotations

import json

import pytest
from support.processes import run_python

from tfdp_utils.cluster._config import validate_cluster
from tfdp_utils.cluster._topology import (
    SINGLE,
    WorkerPosition,
    position_from_cluster,
    position_from_environment,
    position_of,
)

pytestmark = pytest.mark.pure


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> dict[str, str]:
    return {
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})
    }


def srun(procid: int, tasks: int, nodelist: str = "n[1-2]") -> dict[str, str]:
    return {
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_STEP_NODELIST": nodelist,
    }


WORKERS = {"worker": ["w0:1", "w1:1", "w2:1"]}
WITH_CHIEF = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "evaluator": ["e:1"]}
PS = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p0:1", "p1:1"]}


@pytest.mark.parametrize(
    ("environ", "index", "workers", "chief"),
    [
        ({}, 0, 1, True),  # alone
        ({"TF_CONFIG": ""}, 0, 1, True),
        ({"TF_CONFIG": "  "}, 0, 1, True),
        (tf_config(WORKERS, "worker", 0), 0, 3, True),  # no chief: worker 0 is the chief
        (tf_config(WORKERS, "worker", 2), 2, 3, False),
        (tf_config(WITH_CHIEF, "chief", 0), 0, 3, True),
        (tf_config(WITH_CHIEF, "worker", 0), 1, 3, False),  # after the chief
        (tf_config(WITH_CHIEF, "worker", 1), 2, 3, False),
        (tf_config(WITH_CHIEF, "evaluator", 0), 0, 3, False),  # trains nothing: no rank
        (tf_config(PS, "ps", 1), 0, 3, False),
        (tf_config({"chief": ["c:1"]}, "chief", 0), 0, 1, True),
        (srun(0, 4), 0, 4, True),
        (srun(3, 4), 3, 4, False),
        (srun(0, 1), 0, 1, True),  # one srun task: alone
        ({"SLURM_PROCID": "0"}, 0, 1, True),  # not an srun step
        # TF_CONFIG wins over SLURM.
        ({**srun(3, 4), **tf_config(WORKERS, "worker", 1)}, 1, 3, False),
    ],
)
def test_position_from_environment_table(
    environ: dict[str, str], index: int, workers: int, chief: bool
) -> None:
    position = position_from_environment(environ)
    assert (position.index, position.num_workers, position.is_chief) == (index, workers, chief)
    assert position.is_multi_worker is (workers > 1)


def replica_blocks(workers: int, local: int) -> list[list[int]]:
    """Global replica ids of each worker, dealt worker after worker."""
    ids = iter(range(workers * local))
    return [[next(ids) for _ in range(local)] for _ in range(workers)]


@pytest.mark.parametrize("local", [1, 2, 4])
@pytest.mark.parametrize(
    ("cluster", "tasks"),
    [
        (WORKERS, [("worker", 0), ("worker", 1), ("worker", 2)]),
        (WITH_CHIEF, [("chief", 0), ("worker", 0), ("worker", 1)]),
    ],
)
def test_each_worker_runs_its_own_block_of_replicas(
    cluster: dict[str, list[str]], tasks: list[tuple[str, int]], local: int
) -> None:
    blocks = replica_blocks(len(tasks), local)
    for rank, (task_type, index) in enumerate(tasks):
        position = position_from_environment(
            tf_config(cluster, task_type, index), local_replicas=local
        )
        assert position.index == rank
        assert list(position.local_replicas) == blocks[rank]


def test_slurm_ranks_give_replica_blocks_too() -> None:
    blocks = replica_blocks(4, 2)
    for procid in range(4):
        position = position_from_environment(srun(procid, 4, "n[1-4]"), local_replicas=2)
        assert list(position.local_replicas) == blocks[procid]


@pytest.mark.parametrize("local", [1, 3])
def test_alone_every_replica_is_local(local: int) -> None:
    position = position_from_environment({}, local_replicas=local)
    assert position == WorkerPosition(0, 1, True, tuple(range(local)))
    assert position_from_cluster(None, local_replicas=local) == position


def test_an_evaluator_has_no_rank_and_is_not_the_chief() -> None:
    config = validate_cluster(WITH_CHIEF, "evaluator", 0)
    position = position_from_cluster(config, local_replicas=2)
    assert (position.index, position.is_chief, position.num_workers) == (0, False, 3)


def test_the_environment_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TF_CONFIG", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    assert position_from_environment() == SINGLE
    monkeypatch.setenv("TF_CONFIG", tf_config(WORKERS, "worker", 1)["TF_CONFIG"])
    assert position_from_environment().index == 1


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        ({"TF_CONFIG": "{not json"}, "TF_CONFIG is invalid: it is not valid JSON"),
        (tf_config(WORKERS, "worker", 3), "task index 3 is out of range"),
        ({**srun(0, 4), "SLURM_PROCID": "x"}, "SLURM_PROCID must be a whole number"),
    ],
)
def test_a_malformed_cluster_raises_where_it_is_read(environ: dict[str, str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        position_from_environment(environ)


def test_an_environment_that_is_no_mapping_is_named() -> None:
    with pytest.raises(TypeError, match=r"environ must be a mapping such as os\.environ"):
        position_from_environment([("TF_CONFIG", "{}")])  # type: ignore[arg-type]


def test_no_strategy_is_a_single_worker() -> None:
    assert position_of(None) == SINGLE == WorkerPosition()
    assert SINGLE.local_replicas == (0,) and not SINGLE.is_multi_worker


IS_MULTI_WORKER_WITHOUT_TENSORFLOW = """
    import sys

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in {"tensorflow", "keras", "tf_keras"}:
                raise ImportError(f"{name} is blocked")
            return None

    sys.meta_path.insert(0, Refuse())
    from tfdp_utils.cluster._topology import is_multi_worker

    print("RESULT", is_multi_worker(None))
"""


def test_no_strategy_is_not_multi_worker_even_without_tensorflow() -> None:
    done = run_python(IS_MULTI_WORKER_WITHOUT_TENSORFLOW, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "RESULT False"
