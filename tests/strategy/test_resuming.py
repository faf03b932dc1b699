"""``auto_strategy(resume_from=...)``'s reason line, without TensorFlow: the checkpoint a
``PreemptionCheckpoint`` wrote (through its own store) read back for the shape it was saved on,
and the clause that says the job resumes on another one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tfdp_utils import _checkpoint_files as files
from tfdp_utils.preemption import _store as store
from tfdp_utils.strategy._resuming import checked_directory, resume_clause, resume_reason

pytestmark = pytest.mark.pure


def _save(directory: Path, step: int, workers: int, replicas: int, batch: int = 8) -> str:
    """A checkpoint as PreemptionCheckpoint saves it (its store, a stand-in for the variables)."""

    def write(prefix: str) -> None:
        Path(prefix + ".index").write_text("variables")

    facts: dict[str, Any] = {
        "num_workers": workers,
        "num_replicas_in_sync": replicas,
        "global_batch_size": batch,
    }
    saved = store.save(str(directory), step, {"epoch": 1, "dataset": facts}, write, keep=3)
    return saved.path


def test_a_first_run_adds_nothing(tmp_path: Path) -> None:
    assert resume_reason(None, 2, 2) is None
    assert resume_reason(str(tmp_path / "missing"), 2, 2) is None
    assert resume_reason(str(tmp_path), 2, 2) is None  # empty
    (tmp_path / "a-file").write_text("x")
    assert resume_reason(str(tmp_path / "a-file"), 2, 2) is None


def test_the_same_shape_adds_nothing(tmp_path: Path) -> None:
    _save(tmp_path, 12, workers=4, replicas=4)
    assert resume_reason(str(tmp_path), 4, 4) is None


def test_fewer_workers_are_named_with_both_shapes_and_the_batch(tmp_path: Path) -> None:
    _save(tmp_path, 6, workers=4, replicas=4)
    path = _save(tmp_path, 12, workers=4, replicas=4)
    assert resume_reason(str(tmp_path), 2, 2) == (
        "resuming a 4-worker job on 2 (4 workers, 4 replicas -> 2 workers, 2 replicas; the "
        f"global batch of 8 stays, 2 -> 4 examples per replica; the latest checkpoint, at step "
        f"12: {path})"
    )


def test_another_number_of_replicas_on_as_many_workers(tmp_path: Path) -> None:
    path = _save(tmp_path, 9, workers=1, replicas=2)
    assert resume_reason(str(tmp_path), 1, 1) == (
        "resuming a 2-replica job on 1 (1 worker, 2 replicas -> 1 worker, 1 replica; the "
        f"global batch of 8 stays, 4 -> 8 examples per replica; the latest checkpoint, at step "
        f"9: {path})"
    )
    # 2 workers of 1 replica to 1 process of 2: the workers change, the replicas do not.
    assert str(resume_reason(str(tmp_path), 2, 2)).startswith(
        "resuming a 1-worker job on 2 (1 worker, 2 replicas -> 2 workers, 2 replicas;"
    )


def test_a_global_batch_that_no_longer_divides_is_said(tmp_path: Path) -> None:
    _save(tmp_path, 3, workers=2, replicas=4, batch=12)
    clause = str(resume_reason(str(tmp_path), 5, 5))
    assert clause.startswith("resuming a 2-worker job on 5 (2 workers, 4 replicas -> 5 workers")
    assert "the global batch of 12 does not divide over 5 replicas" in clause
    assert "PreemptionCheckpoint will refuse it" in clause


def test_a_damaged_newest_checkpoint_is_skipped_as_the_resume_skips_it(tmp_path: Path) -> None:
    path = _save(tmp_path, 4, workers=2, replicas=2)
    newest = _save(tmp_path, 8, workers=1, replicas=1)
    Path(newest, files.STATE_FILE).write_text("{not json")
    shape = files.latest_shape(str(tmp_path))
    assert shape is not None
    assert (shape.path, shape.step, shape.num_workers) == (path, 4, 2)
    assert str(resume_reason(str(tmp_path), 1, 1)).startswith("resuming a 2-worker job on 1")


def test_a_checkpoint_without_recorded_facts_adds_nothing(tmp_path: Path) -> None:
    store.save(str(tmp_path), 5, {"epoch": 0}, lambda prefix: None, keep=None)
    assert files.latest_shape(str(tmp_path)) is None
    assert resume_clause(None, 1, 1) is None


@pytest.mark.parametrize("bad", [5, "", b"/tmp", ["ckpt"]])
def test_resume_from_must_be_a_path(bad: Any) -> None:
    with pytest.raises(TypeError, match=r"resume_from must be the PreemptionCheckpoint's"):
        checked_directory(bad)


def test_resume_from_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert checked_directory("ckpt") == os.path.join(str(tmp_path), "ckpt")
    assert checked_directory(tmp_path) == str(tmp_path)
    assert checked_directory(None) is None
