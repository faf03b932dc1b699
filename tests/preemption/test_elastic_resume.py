"""Elastic resume end to end: stopped on one shape, resumed on another, real processes.

Each job trains a small model for 3 epochs on a builder dataset of 48 examples (6 steps of a
global batch of 8), with op determinism and a seeded shuffle; a layer inside the model counts
the example ids each replica trains on. A job stopped by a real notice on one shape (1 process
x 2 replicas, or 2 localhost workers) and run again on another (1 process x 1 replica, 1 x 2,
2 workers) must end within 1e-4 of the uninterrupted run on the original shape (the global
batches are the same; only the order of the floating-point sums differs), train each id of
the interrupted epoch once over the two runs, and go on with Keras' step numbers, the
optimizer's iterations, the learning-rate schedule and ThroughputLogger's job counts.

The epoch has whole steps only: Keras averages the loss per replica, so a partial last step
split 3 + 2 over two replicas weighs its examples differently from 5 on one replica (that is
Keras' arithmetic on any shape, not the data's; docs/preemption.md says so). The job:
``tests/support/elastic_job.py``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.elastic_job import DIED, EPOCHS, PREEMPTED, STEPS, N, run_job

from tfdp_utils._tf import IS_KERAS3
from tfdp_utils.throughput import _tags as tags
from tfdp_utils.throughput._report import read_runs

pytestmark = pytest.mark.keras


def _run(
    tmp: Path,
    tag: str,
    directory: Path,
    shape: tuple[int, int],
    signal_at: list[int] | None = None,
    **extra: str,
) -> list[dict[str, Any]]:
    """The job on ``shape`` (workers, replicas each) on arrays, its ThroughputLogger's folder
    named after ``directory``; the last worker alone gets the notice."""
    tb = str(tmp / f"tb-{directory.name}")
    return run_job(tmp, tag, directory, shape, signal_at, JOB_SOURCE="arrays", JOB_TB=tb, **extra)


_REFERENCES: dict[tuple[int, int], list[dict[str, Any]]] = {}


def _reference(factory: pytest.TempPathFactory, shape: tuple[int, int]) -> list[dict[str, Any]]:
    """The uninterrupted run on ``shape``, once per module."""
    if shape not in _REFERENCES:
        folder = factory.mktemp("reference")
        runs = _run(folder, "reference", folder / "job", shape)
        for log in runs:
            assert log["status"] == 0, log["stderr"][-4000:]
            assert "resuming" not in log["reason"]  # a first run: nothing to resume
        _REFERENCES[shape] = runs
    return _REFERENCES[shape]


def _max_diff(a: list[Any], b: list[Any]) -> float:
    return max(float(np.max(np.abs(np.array(x) - np.array(y)))) for x, y in zip(a, b, strict=True))


def _ids(stopped: list[dict[str, Any]], resumed: list[dict[str, Any]], epoch: int) -> list[float]:
    """How often each id of ``epoch`` (0-based) was trained, over both runs and every worker."""
    parts = [log["partial"] for log in stopped]
    parts += [log["epochs"].get(str(epoch), [0.0] * N) for log in resumed]
    counts: list[float] = np.sum(parts, axis=0).tolist()
    return counts


def _stopped(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for log in runs:
        assert log["status"] == PREEMPTED, log["stderr"][-4000:]
    assert len({tuple(log["batches"][-1]) for log in runs}) == 1  # one agreed step
    return runs


SHAPES = {  # (workers, replicas each) in the words of the logs
    (1, 1): "1 worker x 1 replica (8 examples per replica)",
    (1, 2): "1 worker x 2 replicas (4 examples per replica)",
    (2, 1): "2 workers x 1 replica (4 examples per replica)",
}


def _check_resumed(
    stopped: list[dict[str, Any]],
    resumed: list[dict[str, Any]],
    shapes: tuple[tuple[int, int], tuple[int, int]],
    *,
    status: int = 0,
) -> None:
    """The resumed run went on from the stopped run's step, on another shape."""
    epoch, batch = stopped[0]["batches"][-1]
    following = [epoch, batch + 1] if batch + 1 < STEPS else [epoch + 1, 0]
    for log in resumed:
        assert log["status"] == status, log["stderr"][-4000:]
        assert log["resumed_from"].endswith(f"ckpt-{stopped[0]['iterations']:012d}")
        assert log["batches"][0] == following  # Keras' step numbers go on
        assert "on another shape" in log["stderr"], log["stderr"][-4000:]
        # auto_strategy(resume_from=) read the checkpoint before the callback did.
        (workers, replicas), (now_workers, now_replicas) = (
            (shape[0], shape[0] * shape[1]) for shape in shapes
        )
        head = (
            f"resuming a {workers}-worker job on {now_workers}"
            if workers != now_workers
            else f"resuming a {replicas}-replica job on {now_replicas}"
        )
        assert f"; {head} ({workers} worker" in log["reason"], log["reason"]
        assert log["reason"].endswith(f"ckpt-{stopped[0]['iterations']:012d})")
        if status == 0:  # ThroughputLogger's summary names the step and both shapes
            before, after = (SHAPES[shape] for shape in shapes)
            change = f"at step {stopped[0]['iterations']}: {before} -> {after}"
            assert log["shape_change"] == change
    # The interrupted epoch's ids, counted on every replica of every worker: each once.
    assert _ids(stopped, resumed, epoch) == [1.0] * N


def _check_job(tmp: Path, ended: list[dict[str, Any]], reference: list[dict[str, Any]]) -> float:
    """The job's end against the uninterrupted run; returns the largest weight difference."""
    diff = max(_max_diff(log["weights"], reference[0]["weights"]) for log in ended)
    assert diff <= 1e-4
    for log in ended:
        assert log["iterations"] == reference[0]["iterations"] == EPOCHS * STEPS
    # ThroughputLogger over the runs and shapes: one series that ends on the job's total.
    examples = read_runs(str(tmp / "tb-job"))["global"].series[tags.EXAMPLES]
    steps = [step for step, _ in examples]
    assert steps == sorted(set(steps)), steps
    assert examples[-1] == (EPOCHS * STEPS, EPOCHS * N)
    return diff


def test_one_process_of_2_replicas_resumes_on_1_replica(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    reference = _reference(tmp_path_factory, (1, 2))
    stopped = _stopped(_run(tmp_path, "stopped", tmp_path / "job", (1, 2), [1, 2]))
    assert stopped[0]["batches"][-1] == [1, 2]  # 3 steps of epoch 2 done
    resumed = _run(tmp_path, "resumed", tmp_path / "job", (1, 1))
    _check_resumed(stopped, resumed, ((1, 2), (1, 1)))
    diff = _check_job(tmp_path, resumed, reference)
    print(f"1x2 -> 1x1: max weight diff {diff:.2e}")


def test_two_workers_resume_on_one_process_of_2_replicas_and_back(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    reference = _reference(tmp_path_factory, (2, 1))
    # The notice reaches worker 1 only; both stop after the step they agree on.
    stopped = _stopped(_run(tmp_path, "stopped", tmp_path / "job", (2, 1), [1, 1]))
    # One process of 2 replicas goes on, and is itself stopped in epoch 3 ...
    middle = _run(tmp_path, "middle", tmp_path / "job", (1, 2), [2, 3])
    _check_resumed(stopped, middle, ((2, 1), (1, 2)), status=PREEMPTED)
    _stopped(middle)
    # ... and two workers finish the job.
    back = _run(tmp_path, "back", tmp_path / "job", (2, 1))
    _check_resumed(middle, back, ((1, 2), (2, 1)))
    diff = _check_job(tmp_path, back, reference)
    print(f"2 workers -> 1x2 -> 2 workers: max weight diff {diff:.2e}")


def test_a_job_started_on_one_process_without_a_seed_resumes_on_two_workers(
    tmp_path: Path,
) -> None:
    # Without seed=, one process shuffles with a seed PreemptionCheckpoint picks and saves;
    # two workers would shuffle with the builder's shared default: the checkpoint's wins.
    stopped = _stopped(_run(tmp_path, "stopped", tmp_path / "job", (1, 2), [1, 4], JOB_SEED="null"))
    resumed = _run(tmp_path, "resumed", tmp_path / "job", (2, 1), JOB_SEED="null")
    _check_resumed(stopped, resumed, ((1, 2), (2, 1)))
    for log in resumed:
        assert log["iterations"] == EPOCHS * STEPS


def test_per_worker_backups_newer_than_the_checkpoint_on_more_workers_are_refused_on_each(
    tmp_path: Path,
) -> None:
    """Two workers with BackupAndRestore(save_freq=1) in worker_backup_dir() folders beside
    checkpoints every 3 steps, a global batch of 12 (4 steps an epoch), die without notice
    after global step 7: Keras' backups (step 7) are newer than the checkpoint (step 6).

    Keras 3: each old worker has its own folder, the third has none. The workers agree before
    the first step and every one refuses the resume by name, naming the folders, the checkpoint,
    both shapes and the fix; with the folders removed, the same resume goes on from the
    checkpoint. tf_keras: every worker reads the chief's backup, so all follow it."""
    settings = {
        "JOB_SOURCE": "arrays",
        "JOB_BATCH": "12",
        "JOB_BACKUP": "1",
        "JOB_BACKUP_FREQ": "1",
        "JOB_EVERY": "3",
    }
    directory, steps = tmp_path / "job", N // 12
    died = run_job(tmp_path, "died", directory, (2, 1), JOB_DIE_AT="[1, 2]", **settings)
    for log in died:
        assert log["status"] == DIED, log["stderr"][-4000:]
    checkpoint = directory / f"ckpt-{6:012d}"
    assert max(p.name for p in directory.glob("ckpt-*")) == checkpoint.name
    backup = tmp_path / "job-backup"
    from_step = 6
    if IS_KERAS3:
        refused = run_job(tmp_path, "refused", directory, (3, 1), **settings)
        folders = f"{backup}/worker_0, {backup}/worker_1"
        for log in refused:
            said = log["stderr"]
            assert log["status"] == 1 and log["batches"] == [], said[-4000:]
            assert "ResumeMismatchError" in said, said[-4000:]
            assert f"backups {folders} (epoch 2, after step 3" in said, said[-4000:]
            assert f"checkpoint {checkpoint} (saved on 2 workers x 1 replica (6 " in said
            assert "only workers 0, 1 of this run on 3 workers x 1 replica (4 " in said
            assert f"remove the backup folders {folders} (the job goes on from" in said
            assert "or resume on the checkpoint's 2 workers" in said
        print(refused[2]["stderr"].strip().splitlines()[-1])
        shutil.rmtree(backup)  # what the message says to do
        expected = str(checkpoint)
    else:
        from_step, expected = 7, str(backup)
    resumed = run_job(tmp_path, "resumed", directory, (3, 1), **settings)
    for log in resumed:
        assert log["status"] == 0, log["stderr"][-4000:]
        assert log["resumed_from"] == expected
        assert log["batches"][0] == [1, from_step - steps]
        assert log["iterations"] == EPOCHS * steps
    # The interrupted epoch's ids: those counted on both workers up to where the resume goes
    # on (steps after the checkpoint trained again), and the resumed run's: each once.
    parts = [log["counts"][from_step - 1] for log in died]
    parts += [log["epochs"]["1"] for log in resumed]
    assert np.sum(parts, axis=0).tolist() == [1.0] * N
    assert np.sum([log["epochs"]["2"] for log in resumed], axis=0).tolist() == [1.0] * N
