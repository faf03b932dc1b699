"""DatasetInfo: what each replica receives in a step, an epoch's range, and across epochs.

Pure. The counts are checked against a per-step table written out from the info's fields
(full steps, then the tail, then empty steps) and summed step by step, epoch after epoch.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

from tfdp_utils import _dataset_info as dataset_info
from tfdp_utils._dataset_info import DatasetInfo, DatasetRecord, info_of
from tfdp_utils.data._epochs import StepShape, dataset_info_for, plan_epochs

pytestmark = pytest.mark.pure


def epoch_rows(info: DatasetInfo, steps: int) -> list[tuple[int, ...]]:
    """Per-replica examples of positions 0 .. steps - 1 of one epoch, written out."""
    full = (info.per_replica_batch_size,) * info.num_replicas_in_sync
    empty = (0,) * info.num_replicas_in_sync
    rows = [full] * (info.full_steps or 0) + list(info.tail)
    return (rows + [empty] * steps)[:steps]


def summed(rows: list[tuple[int, ...]], replicas: int) -> tuple[int, ...]:
    return tuple(sum(row[i] for row in rows) for i in range(replicas))


# 4 replicas of 8 over 2 workers; 29 + 17 examples split evenly in each worker's last step.
TWO_WORKERS = DatasetInfo(
    global_batch_size=32,
    per_replica_batch_size=8,
    num_replicas_in_sync=4,
    num_workers=2,
    examples_per_epoch=46,
    steps_per_epoch=2,
    full_steps=1,
    tail=((7, 6, 1, 0),),
)
# 2 replicas of 4; two partial steps (one worker ran out first), three steps per epoch.
LONG_TAIL = DatasetInfo(
    global_batch_size=8,
    per_replica_batch_size=4,
    num_replicas_in_sync=2,
    examples_per_epoch=16,
    steps_per_epoch=3,
    full_steps=1,
    tail=((4, 3), (1, 0)),
    repeat=True,
)
# One replica, every step full (an epoch that divides evenly).
EVEN = DatasetInfo(
    global_batch_size=5,
    per_replica_batch_size=5,
    num_replicas_in_sync=1,
    examples_per_epoch=20,
    steps_per_epoch=4,
    full_steps=4,
)
KNOWN = [TWO_WORKERS, LONG_TAIL, EVEN]


@pytest.mark.parametrize(
    ("info", "step", "expected"),
    [
        (TWO_WORKERS, 0, (8, 8, 8, 8)),
        (TWO_WORKERS, 1, (7, 6, 1, 0)),
        (TWO_WORKERS, 2, (0, 0, 0, 0)),  # past the epoch: nothing
        (LONG_TAIL, 0, (4, 4)),
        (LONG_TAIL, 1, (4, 3)),
        (LONG_TAIL, 2, (1, 0)),
        (LONG_TAIL, 3, (0, 0)),
        (EVEN, 3, (5,)),
        (EVEN, 4, (0,)),
    ],
)
def test_examples_in_step(info: DatasetInfo, step: int, expected: tuple[int, ...]) -> None:
    assert info.examples_in_step(step) == expected


@pytest.mark.parametrize("step", [0, 1, 7, 1000])
def test_an_unknown_layout_counts_every_step_full(step: int) -> None:
    info = DatasetInfo(global_batch_size=12, per_replica_batch_size=4, num_replicas_in_sync=3)
    assert info.examples_in_step(step) == (4, 4, 4)
    assert info.examples_in_epoch_range(step, step + 3) == (12, 12, 12)
    assert info.examples_in_steps(step, step + 5) == (20, 20, 20)


@pytest.mark.parametrize("info", KNOWN, ids=["two_workers", "long_tail", "even"])
def test_an_epoch_range_is_the_sum_of_its_steps(info: DatasetInfo) -> None:
    replicas = info.num_replicas_in_sync
    # One position past the epoch too: Keras 3 can run one more (empty) step.
    positions = (info.steps_per_epoch or 0) + 2
    for first in range(positions + 1):
        for last in range(positions + 1):
            rows = epoch_rows(info, positions)[first:last]
            assert info.examples_in_epoch_range(first, last) == summed(rows, replicas), (
                first,
                last,
            )


@pytest.mark.parametrize("info", KNOWN, ids=["two_workers", "long_tail", "even"])
def test_steps_across_epochs_repeat_the_epoch_layout(info: DatasetInfo) -> None:
    replicas = info.num_replicas_in_sync
    per_epoch = info.steps_per_epoch
    assert per_epoch
    one_epoch = epoch_rows(info, per_epoch)
    for first in range(3 * per_epoch + 1):
        for last in range(first, 3 * per_epoch + 2):
            rows = [one_epoch[step % per_epoch] for step in range(first, last)]
            assert info.examples_in_steps(first, last) == summed(rows, replicas), (first, last)


@pytest.mark.parametrize("info", KNOWN, ids=["two_workers", "long_tail", "even"])
def test_an_epoch_adds_up_to_the_examples_per_epoch(info: DatasetInfo) -> None:
    assert info.steps_per_epoch is not None
    assert sum(info.examples_in_steps(0, info.steps_per_epoch)) == info.examples_per_epoch
    assert sum(info.examples_in_epoch_range(0, info.steps_per_epoch)) == info.examples_per_epoch


@pytest.mark.parametrize(("first", "last"), [(3, 3), (5, 2)])
def test_an_empty_range_counts_nothing(first: int, last: int) -> None:
    for info in KNOWN:
        zeros = (0,) * info.num_replicas_in_sync
        assert info.examples_in_steps(first, last) == zeros
        assert info.examples_in_epoch_range(first, last) == zeros


# ------------------------------------------------- the info the builder attaches (pure part)


@pytest.mark.parametrize(
    ("shares", "repeat", "dense", "expected"),
    [
        # One worker of 2 replicas of 8, 29 examples: one full step, then 13 split 7 + 6.
        (
            [29],
            False,
            True,
            {"steps_per_epoch": 2, "full_steps": 1, "tail": ((7, 6),), "exact": True},
        ),
        # Sparse elements: the last step fills replica 0 first.
        ([29], False, False, {"steps_per_epoch": 2, "tail": ((8, 5),), "exact": True}),
        # Examples repeated one by one: epochs run into each other, every step is full.
        ([29], True, True, {"steps_per_epoch": None, "full_steps": None, "repeat": True}),
        # Whole epochs repeated: the layout holds for every epoch.
        ([29], "epochs", True, {"steps_per_epoch": 2, "tail": ((7, 6),), "repeat": True}),
        # Unknown size: no layout, no promise about the last step.
        (None, False, True, {"examples_per_epoch": None, "steps_per_epoch": None, "exact": False}),
        (None, True, True, {"steps_per_epoch": None, "exact": True}),  # never ends: all full
    ],
)
def test_dataset_info_for_the_plan(
    shares: list[int] | None, repeat: Any, dense: bool, expected: dict[str, Any]
) -> None:
    shape = StepShape(8, 2)
    plan = plan_epochs(shares, shape, drop_remainder=False, repeat=repeat, dense=dense)
    info = dataset_info_for(plan, shape, repeat=repeat, infinite=False)
    assert (info.global_batch_size, info.per_replica_batch_size) == (16, 8)
    assert {key: getattr(info, key) for key in expected} == expected


def test_an_infinite_source_repeats_with_every_step_full() -> None:
    shape = StepShape(4, 2)
    plan = plan_epochs(None, shape, drop_remainder=False, repeat=False, dense=True)
    info = dataset_info_for(plan, shape, repeat=False, infinite=True)
    assert info.repeat is True and info.exact is True
    assert info.examples_in_steps(0, 10) == (40, 40)


# ------------------------------------------------------------- the info on a dataset


class Holder:
    """Anything the builder could attach the info to."""


def test_info_of_reads_only_a_dataset_info() -> None:
    dataset = Holder()
    assert info_of(dataset) is None
    dataset.tfdp = DatasetRecord("not an info", plan=None)  # type: ignore[attr-defined, arg-type]
    assert info_of(dataset) is None
    dataset.tfdp = DatasetRecord(EVEN, plan=None)  # type: ignore[attr-defined]
    assert info_of(dataset) is EVEN


def test_the_recorded_strategy_is_not_kept_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dataset_info, "_strategy_ref", None)
    assert dataset_info.last_strategy() is None
    strategy = Holder()
    dataset_info.record_strategy(strategy)
    assert dataset_info.last_strategy() is strategy
    del strategy
    gc.collect()
    assert dataset_info.last_strategy() is None


def test_a_strategy_without_weak_references_is_held(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dataset_info, "_strategy_ref", None)
    strategy = ("a", "tuple", "has", "no", "weak", "reference")
    dataset_info.record_strategy(strategy)
    assert dataset_info.last_strategy() is strategy
