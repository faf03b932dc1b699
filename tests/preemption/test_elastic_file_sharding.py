"""Elastic resume of files sharded by file (FILE), real processes and notices.

Three text files hold the ids 0..47 (24, 12 and 12 lines); the builder reads them with
``shard_policy='auto'`` and ``count_examples=True``: FILE on 2 workers (worker 0 reads the
24-line file, worker 1 the two others), one process reading every file on 1 worker; 6 steps
of a global batch of 8 per epoch on both shapes, 3 epochs, op determinism, a seeded shuffle.
A layer inside the model counts the ids each replica trains on.

Under FILE the examples of a global step depend on the number of workers, so a resume on
another shape trains the rest of the interrupted epoch as the first shape's remaining global
steps, redistributed over the new workers, and the epochs after it in the new shape's own
order. What must hold: every id of the interrupted epoch trained once over the runs, the next
epoch whole; the weights at the end of the interrupted epoch within 1e-4 of the uninterrupted
run on the first shape (the same global batches); the job's steps the same in total. The
later epochs read the files in the new shape's order, so the final weights are not compared.
The job: ``tests/support/elastic_job.py``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.elastic_job import DIED, EPOCHS, PREEMPTED, STEPS, N, run_job, write_files

from tfdp_utils._tf import IS_KERAS3
from tfdp_utils.throughput import _tags as tags
from tfdp_utils.throughput._report import read_runs

pytestmark = pytest.mark.keras

SIZES = (24, 12, 12)


def _run(
    tmp: Path, tag: str, workers: int, signal_at: list[int] | None = None, **extra: str
) -> list[dict[str, Any]]:
    """The job on ``workers`` workers of one replica, FILE where there are files enough; the
    last worker alone gets the notice. ``extra``: more settings (``JOB_TB``, ``JOB_BACKUP``,
    ``JOB_MIXED``, ``JOB_REPLICAS`` for more replicas)."""
    directory = tmp / ("reference" if tag == "reference" else "job")
    files = str(tmp / "files")
    return run_job(
        tmp, tag, directory, (workers, 1), signal_at, JOB_SOURCE="files", JOB_FILES=files, **extra
    )


def _stopped(logs: list[dict[str, Any]]) -> int:
    """The steps of epoch 2 the stopped workers trained (one agreed step on every worker)."""
    for log in logs:
        assert log["status"] == PREEMPTED, log["stderr"][-4000:]
    epoch, batch = logs[0]["batches"][-1]
    assert all(log["batches"][-1] == [epoch, batch] for log in logs)
    assert epoch == 1 and batch < STEPS - 1, (epoch, batch)
    return int(batch) + 1


def _max_diff(a: list[Any], b: list[Any]) -> float:
    pairs = zip(a, b, strict=True)
    return max(float(np.max(np.abs(np.array(x) - np.array(y)))) for x, y in pairs)


def _check_done(resumed: dict[str, Any], reference: dict[str, Any], parts: list[Any]) -> float:
    assert resumed["status"] == 0, resumed["stderr"][-4000:]
    assert "is redistributed over this run's" in resumed["stderr"], resumed["stderr"][-4000:]
    # The interrupted epoch's ids, counted on every replica of every run: each once.
    assert np.sum(parts, axis=0).tolist() == [1.0] * N
    assert resumed["epochs"]["2"] == [1.0] * N  # the next epoch whole, on the new shape
    assert resumed["iterations"] == reference["iterations"] == EPOCHS * STEPS
    diff = _max_diff(resumed["weights_at"]["1"], reference["weights_at"]["1"])
    assert diff <= 1e-4, diff
    return diff


def test_two_workers_sharding_files_by_file_resume_on_one_process(tmp_path: Path) -> None:
    write_files(tmp_path / "files", SIZES)
    reference = _run(tmp_path, "reference", 2)
    for log in reference:
        assert log["status"] == 0, log["stderr"][-4000:]
        assert log["policy"] == "file"
    stopped = _run(tmp_path, "stopped", 2, [1, 2])
    done = _stopped(stopped)
    (resumed,) = _run(tmp_path, "resumed", 1)
    assert resumed["policy"] == "off", resumed["policy"]  # one process reads every file
    assert resumed["resumed_from"].endswith(f"ckpt-{STEPS + done:012d}")
    # The rest takes the first shape's remaining steps: Keras' steps go on from there.
    assert resumed["batches"][0] == [1, done]
    diff = _check_done(
        resumed, reference[0], [log["partial"] for log in stopped] + [resumed["epochs"]["1"]]
    )
    print(f"FILE, 2 workers -> 1 process: weights after the interrupted epoch {diff:.2e}")


def test_one_process_to_two_workers_stopped_again_then_one(tmp_path: Path) -> None:
    """1 process -> 2 workers sharding by file, stopped again during the rest -> 1 process."""
    write_files(tmp_path / "files", SIZES)
    (reference,) = _run(tmp_path, "reference", 1)
    assert reference["status"] == 0, reference["stderr"][-4000:]
    stopped = _run(tmp_path, "stopped", 1, [1, 1])
    first = _stopped(stopped)
    second_logs = _run(tmp_path, "again", 2, [1, first + 1])
    second = _stopped(second_logs)
    assert second_logs[0]["policy"] == "file"
    assert second_logs[0]["batches"][0] == [1, first]
    assert second > first
    (resumed,) = _run(tmp_path, "resumed", 1)
    assert resumed["batches"][0] == [1, second]
    parts = [log["partial"] for log in stopped + second_logs]
    diff = _check_done(resumed, reference, [*parts, resumed["epochs"]["1"]])
    print(
        f"FILE, 1 process -> 2 workers -> 1 process: weights after the interrupted epoch {diff:.2e}"
    )


OFFSET_SIZES = (20, 14, 14)
"""Files whose epochs have another number of steps per shape: FILE on 2 workers gives one
worker 20 lines and the other 28 (7 steps of 4), one process every line (6 steps of 8)."""


@pytest.mark.parametrize("mixed", [False, True] if IS_KERAS3 else [False])
def test_keras_backups_and_the_logger_go_on_from_the_saved_step_on_another_shape(
    tmp_path: Path, mixed: bool
) -> None:
    """A FILE rest whose global step is offset from Keras' (its epochs had 7 steps, the new
    shape's 6), beside BackupAndRestore and ThroughputLogger (and, on Keras 3, a
    LossScaleOptimizer): Keras' epochs and steps, the optimizer's iterations and the logger's
    step axis go on from the saved global step; the logger says the shape changed there."""
    write_files(tmp_path / "files", OFFSET_SIZES)
    tb = tmp_path / "tb"
    settings = {"JOB_TB": str(tb), "JOB_BACKUP": "1", **({"JOB_MIXED": "1"} if mixed else {})}
    stopped = _run(tmp_path, "stopped", 2, [1, 2], **settings)
    _stopped(stopped)
    assert stopped[0]["policy"] == "file"
    assert sum(1 for epoch, _ in stopped[0]["batches"] if epoch == 0) == 7
    # The job's global step at the stop: the batches trained (the optimizer's iterations leave
    # out the steps a loss scale skipped).
    saved = len(stopped[0]["batches"])
    assert mixed or stopped[0]["iterations"] == saved
    trained = int(np.sum([log["partial"] for log in stopped]))  # ids counted in the model
    rest_steps = -(-(N - trained) // 8)
    # tf_keras' BackupAndRestore refuses OneDeviceStrategy (NotImplementedError), what one
    # process of one replica gets: there the new shape is one process of 2 replicas.
    replicas = 1 if IS_KERAS3 else 2
    (resumed,) = _run(tmp_path, "resumed", 1, JOB_REPLICAS=str(replicas), **settings)
    assert resumed["status"] == 0, resumed["stderr"][-4000:]
    if mixed:
        assert resumed["optimizer"] == "LossScaleOptimizer", resumed["optimizer"]
    assert resumed["resumed_from"].endswith(f"ckpt-{saved:012d}")
    # The checkpoint's position governs: Keras' backup is not taken over (it saves at an
    # epoch's end, older than the checkpoint, and removes its backup when a fit ends).
    said = resumed["stderr"]
    assert "follows BackupAndRestore's backup" not in said, said[-4000:]
    # Keras shows epochs 2 and 3; the rest is epoch 2's last steps on the new shape.
    assert resumed["begun"] == [1, 2]
    rest = [batch for epoch, batch in resumed["batches"] if epoch == 1]
    assert rest == list(range(STEPS - rest_steps, STEPS))
    assert [batch for epoch, batch in resumed["batches"] if epoch == 2] == list(range(STEPS))
    final = saved + rest_steps + STEPS
    assert len(resumed["batches"]) == rest_steps + STEPS
    assert resumed["iterations"] == final or (mixed and resumed["iterations"] < final)
    parts = [log["partial"] for log in stopped] + [resumed["epochs"]["1"]]
    assert np.sum(parts, axis=0).tolist() == [1.0] * N
    assert resumed["epochs"]["2"] == [1.0] * N
    # ThroughputLogger: the shape change in its summary and its log, at the saved step.
    now = "1 replica (8" if replicas == 1 else "2 replicas (4"
    change = (
        f"at step {saved}: 2 workers x 1 replica (4 examples per replica) -> "
        f"1 worker x {now} examples per replica)"
    )
    assert resumed["shape_change"] == change
    assert f"the job's shape changed {change}" in said, said[-4000:]
    # Its step axis, read back from the event files of both runs: the resumed run's points
    # lie after the saved step, each with the examples trained up to it (full steps of 8
    # after the N + trained examples of the stopped run).
    examples = read_runs(str(tb))["global"].series[tags.EXAMPLES]
    steps = [step for step, _ in examples]
    assert steps == sorted(set(steps)), steps
    after = [(step, count) for step, count in examples if step > saved]
    assert after, examples
    assert all(count == N + trained + 8 * (step - saved) for step, count in after), after
    assert examples[-1] == (final, EPOCHS * N)
    print(f"FILE 2 -> 1 beside BackupAndRestore (mixed={mixed}): saved {saved}, final {final}")


EVERY = 4
"""``every_steps`` of the job that dies: its last checkpoint is at step 8, 2 steps before."""


def test_a_newer_mid_epoch_keras_backup_on_another_shape_is_refused_by_name(
    tmp_path: Path,
) -> None:
    """BackupAndRestore(save_freq=1) beside periodic checkpoints (every 4 steps) on 2 workers
    sharding by file; the job dies without notice after step 4 of epoch 2 (global step 10), so
    Keras' backup (step 10) is newer than the last checkpoint (step 8), and on one process its
    step names other examples. tf_keras' backup (the chief's folder) is found there: the resume
    is refused before the first step, naming both and the fix; with the backup removed, as the
    message says, the job resumes exactly from the checkpoint. Keras 3 gives each worker of a
    multi-worker job its own folder (``worker_backup_dir``), which one process does not read:
    the checkpoint governs at once, and the resume is exact."""
    write_files(tmp_path / "files", SIZES)
    settings = {"JOB_BACKUP": "1", "JOB_BACKUP_FREQ": "1", "JOB_EVERY": str(EVERY)}
    died = _run(tmp_path, "died", 2, JOB_DIE_AT="[1, 3]", **settings)
    for log in died:
        assert log["status"] == DIED, log["stderr"][-4000:]
        assert log["batches"][-1] == [1, 3] and log["policy"] == "file"
    checkpoint = tmp_path / "job" / f"ckpt-{2 * EVERY:012d}"
    assert max(p.name for p in (tmp_path / "job").glob("ckpt-*")) == checkpoint.name
    backup = tmp_path / "job-backup"
    # tf_keras' BackupAndRestore refuses OneDeviceStrategy: one process of 2 replicas there.
    replicas = "1" if IS_KERAS3 else "2"
    if not IS_KERAS3:
        (refused,) = _run(tmp_path, "refused", 1, JOB_REPLICAS=replicas, **settings)
        said = refused["stderr"]
        assert refused["status"] == 1 and refused["batches"] == [], said[-4000:]
        assert "ResumeMismatchError" in said, said[-4000:]
        assert f"backup {backup} (epoch 2, after step 4) is newer than" in said, said[-4000:]
        assert f"checkpoint {checkpoint} (saved on 2 workers x 1 replica" in said
        assert f"remove the backup folder {backup}" in said
        shutil.rmtree(backup)
    (resumed,) = _run(tmp_path, "resumed", 1, JOB_REPLICAS=replicas, **settings)
    assert resumed["status"] == 0, resumed["stderr"][-4000:]
    assert resumed["resumed_from"] == str(checkpoint)
    assert "follows BackupAndRestore's backup" not in resumed["stderr"]
    # The interrupted epoch's ids: those counted on both workers up to the checkpoint (after
    # global step 8), and the resumed run's: each once (steps 9 and 10 trained again).
    parts = [log["counts"][2 * EVERY - 1] for log in died] + [resumed["epochs"]["1"]]
    assert np.sum(parts, axis=0).tolist() == [1.0] * N
    assert resumed["epochs"]["2"] == [1.0] * N
    assert resumed["iterations"] == EPOCHS * STEPS
