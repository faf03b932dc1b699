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
        (
            facts(2, 2, source_kind="files", policy="file", files=[["a"], ["b"]]),
            facts(1, 2, source_kind="files", policy="off", files=[["a", "b"]]),
            "files sharded by file (FILE) give each worker its own files",
            "Resume on the saved shape",
        ),
        (
            facts(1, 2, source_kind="files", files=[["a"]]),
            facts(1, 1, source_kind="files", files=[["a"]]),
            "an elastic resume of file sources is not supported yet",
            "Resume on the saved shape",
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
    ids=["global-batch", "not-divisible", "file-sharding", "files", "policy-off", "function"],
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
