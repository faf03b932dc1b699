"""An elastic resume's checks, without TensorFlow: what another shape may and may not change.

A checkpoint saved on one number of replicas or workers resumes on another when the global
batch is the same, divides over the new replicas, and the source keeps its global order on any
shape (arrays and sized datasets under DATA sharding, or one worker); everything else is
refused by name, with both shapes and the fix.
"""

from __future__ import annotations

from typing import Any

import pytest

from tfdp_utils.errors import ResumeMismatchError
from tfdp_utils.preemption import _arguments as arguments
from tfdp_utils.preemption import _elastic as elastic
from tfdp_utils.preemption import _mismatch as mismatch
from tfdp_utils.preemption._store import Saved

pytestmark = pytest.mark.pure

PATH = "/mnt/ckpt/ckpt-000000000010"


def facts(workers: int, replicas: int, **changes: Any) -> dict[str, Any]:
    """A builder dataset's facts (as ``Resumable.facts``) for 48 arrays, global batch 8."""
    return {
        "examples_per_epoch": 48,
        "steps_per_epoch": 6,
        "global_batch_size": 8,
        "num_replicas_in_sync": replicas,
        "num_workers": workers,
        "source_kind": "arrays",
        "policy": "off" if workers == 1 else "data",
        "files": [],
        "shuffle_buffer_size": 64,
        "drop_remainder": False,
        **changes,
    }


def file_facts(
    workers: int, files: list[list[str]], examples: list[int], **changes: Any
) -> dict[str, Any]:
    """Facts of 48 lines in three files, each worker reading its own (FILE)."""
    given: dict[str, Any] = {
        "source_kind": "files",
        "policy": "file",
        "files": files,
        "examples_per_worker": examples,
    }
    return facts(workers, workers, **{**given, **changes})


def check(before: dict[str, Any], now: dict[str, Any]) -> None:
    mismatch.check_facts(Saved(PATH, 10, {"dataset": before}), now)


@pytest.mark.parametrize(
    ("before", "now"),
    [
        (facts(1, 2), facts(1, 1)),
        (facts(1, 1), facts(1, 2)),
        (facts(2, 2), facts(1, 2)),
        (facts(1, 2), facts(2, 2)),
        (facts(2, 2, source_kind="dataset"), facts(1, 4, source_kind="dataset")),
        (facts(4, 4), facts(8, 8)),
        (facts(4, 8), facts(2, 2)),
        (  # files read under DATA sharding (or on one worker): one global order
            facts(2, 2, source_kind="files", files=[["a", "b"], ["a", "b"]]),
            facts(1, 1, source_kind="files", policy="data", files=[["b", "a"]]),
        ),
        (
            facts(1, 2, source_kind="files", files=[["a", "b"]]),
            facts(4, 4, source_kind="files", files=[["a", "b"]] * 4),
        ),
        (  # files sharded by file: the rest is laid out anew, the epoch's steps may differ
            file_facts(2, [["a"], ["b", "c"]], [20, 28], steps_per_epoch=7),
            file_facts(1, [["a", "b", "c"]], [48], policy="off"),
        ),
        (
            file_facts(1, [["a", "b", "c"]], [48], policy="off"),
            file_facts(2, [["a"], ["b", "c"]], [20, 28], steps_per_epoch=7),
        ),
    ],
)
def test_the_same_global_batch_resumes_on_another_shape(
    before: dict[str, Any], now: dict[str, Any]
) -> None:
    check(before, now)
    assert elastic.changed(before, now)


@pytest.mark.parametrize(
    ("before", "now", "refused", "fix"),
    [
        (
            facts(1, 2),
            facts(1, 1, global_batch_size=4, steps_per_epoch=12),
            "saved with a global batch of 8 examples, this run has 4 (saved on 1 worker x 2 "
            "replicas (4 examples per replica), resumed on 1 worker x 1 replica (4 examples "
            "per replica))",
            "global_batch_size=8 (per-replica batch 8 on 1 replicas)",
        ),
        (
            facts(1, 2),
            facts(1, 3, global_batch_size=9, steps_per_epoch=6),
            "its global batch of 8 examples does not divide over this run's 3 replicas",
            "Resume on a number of replicas that divides 8 (1, 2, 4, 8",
        ),
        (  # files sharded by file, saved before checkpoints recorded examples per worker
            facts(2, 2, source_kind="files", policy="file", files=[["a"], ["b"]]),
            facts(1, 2, source_kind="files", policy="off", files=[["a", "b"]]),
            "its files were sharded by file (FILE) and it does not record how many examples "
            "each worker held (it was saved by an earlier tfdp-utils)",
            "Resume on the saved shape until the epoch ends",
        ),
        (
            facts(2, 2, source_kind="files", files=[["a", "b"], ["a", "b"]]),
            facts(1, 1, source_kind="files", files=[["a", "c"]]),
            "it was saved reading other files (1 not read here, e.g. ['b']; 1 new, e.g. ['c'])",
            "Resume with the same files",
        ),
        (
            facts(2, 2, policy="off"),
            facts(1, 2),
            "in the checkpoint's run, shard_policy='off' over 2 workers trains every example "
            "on each worker",
            "Resume on the saved shape",
        ),
        (
            facts(1, 2),
            facts(2, 2, source_kind="function", policy="off"),
            "in this run, a fn(input_context) source shards its own data",
            "Resume on the saved shape",
        ),
    ],
    ids=[
        "global-batch",
        "not-divisible",
        "file-sharding-unrecorded",
        "other-files",
        "policy-off",
        "function",
    ],
)
def test_what_another_shape_cannot_continue_is_refused_by_name(
    before: dict[str, Any], now: dict[str, Any], refused: str, fix: str
) -> None:
    with pytest.raises(ResumeMismatchError) as caught:
        check(before, now)
    message = str(caught.value)
    assert message.startswith(f"the checkpoint {PATH} cannot be resumed on another shape: ")
    assert refused in message
    assert fix in message
    assert "another directory=" in message


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"examples_per_epoch": 50}, "examples per epoch 48, but this run has 50"),
        ({"shuffle_buffer_size": 8}, "shuffle buffer size 64, but this run has 8"),
        ({"drop_remainder": True}, "drop_remainder False, but this run has True"),
    ],
)
def test_another_shape_still_needs_the_same_data(change: dict[str, Any], words: str) -> None:
    with pytest.raises(ResumeMismatchError, match="resuming would not continue the same epochs"):
        check(facts(2, 2), facts(1, 1, **change))
    with pytest.raises(ResumeMismatchError) as caught:
        check(facts(2, 2), facts(1, 1, **change))
    assert words in str(caught.value)


def test_the_change_is_described_in_the_user_s_words() -> None:
    assert elastic.describe_change(facts(1, 2), facts(1, 2)) is None
    assert elastic.describe_change(facts(2, 2), facts(1, 2)) == (
        "2 workers x 1 replica (4 examples per replica) -> "
        "1 worker x 2 replicas (4 examples per replica)"
    )
    assert elastic.describe_change({}, facts(1, 2)) is None  # nothing recorded: not compared


def test_files_sharded_by_file_resume_with_the_rest_laid_out_on_the_new_shape() -> None:
    before = file_facts(2, [["a"], ["b", "c"]], [20, 28], steps_per_epoch=7)
    now = file_facts(1, [["a", "b", "c"]], [48], policy="off")
    assert elastic.redistributes(before, now)
    rest = elastic.epoch_rest(PATH, {"dataset": before}, now, 1, 2)
    assert rest is not None
    assert (rest.epoch, rest.kept, rest.step_examples, rest.remaining) == (1, (20, 28), 4, 32)
    assert rest.steps == 4  # 32 examples in global batches of 8: steps 2..5 of 6 here
    # At an epoch's start nothing is left to lay out: the new shape's own epoch begins.
    assert elastic.epoch_rest(PATH, {"dataset": before}, now, 1, 0) is None
    # The same shape without a recorded rest: the epoch's own steps go on.
    assert elastic.epoch_rest(PATH, {"dataset": before}, before, 1, 2) is None
    # A checkpoint saved during a rest resumes that rest, on any shape.
    state = {"dataset": now, elastic.REST_KEY: rest.after(1).to_json()}
    again = elastic.epoch_rest(PATH, state, before, 1, 3)
    assert again is not None and again.steps == 3 and again.trained == 8
    assert elastic.epoch_rest(PATH, state, before, 2, 0) is None  # another epoch's record


def test_a_rest_longer_than_the_new_shape_s_epoch_is_refused_by_name() -> None:
    before = file_facts(2, [["a"], ["b", "c"]], [8, 40], steps_per_epoch=10)
    now = file_facts(1, [["a", "b", "c"]], [48], policy="off", drop_remainder=False)
    with pytest.raises(ResumeMismatchError) as caught:
        elastic.epoch_rest(PATH, {"dataset": before}, dict(now, steps_per_epoch=3), 1, 1)
    message = str(caught.value)
    assert "the rest of epoch 2 (40 examples of files sharded by file) takes 5 global steps" in (
        message
    )
    assert "an epoch has 3 steps on this shape" in message


def test_an_unreadable_record_of_a_rest_is_refused_by_name() -> None:
    before = file_facts(1, [["a", "b", "c"]], [48], policy="off")
    state = {"dataset": before, elastic.REST_KEY: {"epoch": 1, "kept": "?"}}
    with pytest.raises(ResumeMismatchError, match="its record of the rest of epoch 2 does not"):
        elastic.epoch_rest(PATH, state, before, 1, 3)


def test_keras_3_executions_must_divide_the_rest_of_a_file_epoch() -> None:
    # Not a rest, tf_keras (it cuts executions at the epoch's end), or executions that fit.
    arguments.check_executions_fit_rest(2, 6, None, whole_executions=True)
    arguments.check_executions_fit_rest(2, 6, 3, whole_executions=False)
    arguments.check_executions_fit_rest(2, 6, 2, whole_executions=True)
    with pytest.raises(ValueError) as caught:
        arguments.check_executions_fit_rest(2, 6, 3, whole_executions=True)
    message = str(caught.value)
    assert "the rest of an epoch of files sharded by file in 3 steps (from step 3 of 6" in message
    assert "steps_per_execution=2" in message
    assert "divides both 3 and 6 (e.g. 3)" in message


BACKUP = "/mnt/backup"
_FILES_2 = file_facts(2, [["a"], ["b", "c"]], [20, 28], steps_per_epoch=7)
_FILES_1 = file_facts(1, [["a", "b", "c"]], [48], policy="off")


@pytest.mark.parametrize(
    ("before", "now", "in_rest", "positions", "refused"),
    [
        # Arrays (DATA): step k is the same global batch on any shape.
        (facts(2, 2), facts(1, 1), False, ((1, 4),), False),
        # FILE on another shape: mid-epoch refused, an epoch's start followed.
        (_FILES_2, _FILES_1, True, ((1, 4),), True),
        (_FILES_1, _FILES_2, True, ((1, 4),), True),
        (_FILES_2, _FILES_1, True, ((2, 0),), False),
        # An epoch's end by one shape's count, mid-epoch by the other's (7 and 6 steps).
        (_FILES_2, _FILES_1, True, ((2, 0), (1, 6)), True),
        # The shape the checkpoint was saved on, outside a rest: its own steps go on.
        (_FILES_2, _FILES_2, False, ((1, 4),), False),
        # Inside a rest laid out anew (a checkpoint saved during it), on its shape too.
        (_FILES_1, _FILES_1, True, ((1, 4),), True),
    ],
    ids=[
        "arrays",
        "file-2-to-1",
        "file-1-to-2",
        "epoch-start",
        "epoch-end-by-one-count",
        "same-shape",
        "in-a-rest",
    ],
)
def test_a_newer_mid_epoch_backup_is_refused_where_its_step_names_other_examples(
    before: dict[str, Any],
    now: dict[str, Any],
    in_rest: bool,
    positions: tuple[tuple[int, int], ...],
    refused: bool,
) -> None:
    def follow() -> None:
        elastic.check_backup_position(
            PATH, before, now, in_rest=in_rest, backup=BACKUP, positions=positions
        )

    if not refused:
        follow()
        return
    with pytest.raises(ResumeMismatchError) as caught:
        follow()
    message = str(caught.value)
    epoch, step = next(p for p in positions if p[1])
    assert f"backup {BACKUP} (epoch {epoch + 1}, after step {step}) is newer than" in message
    assert f"checkpoint {PATH} (saved on {elastic.Shape.of(before).describe()})" in message
    assert f"this run is on {elastic.Shape.of(now).describe()}" in message
    assert f"remove the backup folder {BACKUP}" in message


def _starts(*backups: tuple[str | None, int]) -> list[elastic.WorkerStart]:
    """Each worker's start in epoch 2: ``(backup folder or None, steps done)``."""
    return [elastic.WorkerStart(i, 1, step, backup) for i, (backup, step) in enumerate(backups)]


@pytest.mark.parametrize(
    "starts",
    [
        _starts((None, 2), (None, 2), (None, 2)),  # the checkpoint on every worker
        _starts(("/b/worker_0", 3), ("/b/worker_1", 3), ("/b/worker_2", 3)),  # one backup step
    ],
    ids=["checkpoint", "backups"],
)
def test_workers_that_start_alike_resume(starts: list[elastic.WorkerStart]) -> None:
    assert (
        elastic.check_same_start(starts, checkpoint=PATH, before=facts(2, 2), now=facts(3, 3))
        is None
    )


def test_per_worker_backups_on_more_workers_than_wrote_them_are_refused_by_name() -> None:
    starts = _starts(("/b/worker_0", 3), ("/b/worker_1", 3), (None, 2))
    message = elastic.check_same_start(starts, checkpoint=PATH, before=facts(2, 2), now=facts(3, 3))
    assert message is not None
    assert message.startswith(
        "Keras' BackupAndRestore backups /b/worker_0, /b/worker_1 (epoch 2, after step 3) are "
        f"newer than PreemptionCheckpoint's checkpoint {PATH} (saved on 2 workers x 1 replica "
        "(4 examples per replica)), and only workers 0, 1 of this run on 3 workers x 1 replica"
    )
    assert "worker 2 found none in its own folder" in message
    assert (
        "remove the backup folders /b/worker_0, /b/worker_1 (the job goes on from the " in message
    )
    assert message.endswith("or resume on the checkpoint's 2 workers until the epoch ends.")


def test_backups_at_different_steps_or_without_a_checkpoint_are_refused_by_name() -> None:
    starts = _starts(("/b/worker_0", 3), ("/b/worker_1", 4))
    message = elastic.check_same_start(starts, checkpoint=PATH, before=facts(2, 2), now=facts(2, 2))
    assert message is not None
    assert "(epoch 2, after step 3; epoch 2, after step 4)" in message
    assert "the backups are at different steps" in message
    starts = _starts(("/b/worker_0", 3), (None, 0))
    message = elastic.check_same_start(starts, checkpoint=None, before={}, now=facts(2, 2))
    assert message is not None
    assert "newer than any checkpoint of PreemptionCheckpoint (its directory has none)" in message
    assert "(the job starts afresh on every worker)" in message


def test_a_refusal_one_worker_met_is_every_worker_s() -> None:
    starts = [elastic.WorkerStart(0, 1, 2), elastic.WorkerStart(1, 1, 2, refused="no: because")]
    for start in starts:
        assert elastic.WorkerStart.decode(start.encode()) == start
    assert elastic.check_same_start(starts, checkpoint=PATH, before={}, now={}) == "no: because"
