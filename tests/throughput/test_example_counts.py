"""Per-replica example counts over step ranges, checked against a step-by-step count."""

from __future__ import annotations

import pytest

from tfdp_utils._dataset_info import DatasetInfo
from tfdp_utils.throughput._counts import ExampleCounter, even_split

pytestmark = pytest.mark.pure

# 5 full steps of 4 per replica, then a partial step split (3, 2) and an empty tail step.
INFO = DatasetInfo(
    global_batch_size=8,
    per_replica_batch_size=4,
    num_replicas_in_sync=2,
    examples_per_epoch=45,
    steps_per_epoch=7,
    full_steps=5,
    tail=((3, 2), (0, 0)),
)


def one_by_one(info: DatasetInfo, first: int, last: int) -> tuple[int, ...]:
    """The independent count: every step's examples, added one step at a time."""
    totals = [0] * info.num_replicas_in_sync
    for position in range(max(first, 0), last):
        for i, value in enumerate(info.examples_in_step(position)):
            totals[i] += value
    return tuple(totals)


@pytest.mark.parametrize(("total", "replicas"), [(8, 2), (10, 4), (3, 4), (7, 1)])
def test_even_split_adds_up_and_differs_by_at_most_one(total: int, replicas: int) -> None:
    parts = even_split(total, replicas)
    assert sum(parts) == total and len(parts) == replicas
    assert max(parts) - min(parts) <= 1 and list(parts) == sorted(parts, reverse=True)


@pytest.mark.parametrize("first", range(-1, 9))
@pytest.mark.parametrize("length", range(0, 10))
def test_epoch_range_matches_a_step_by_step_count(first: int, length: int) -> None:
    assert INFO.examples_in_epoch_range(first, first + length) == one_by_one(
        INFO, first, first + length
    )


def test_counter_restarts_the_layout_at_each_epoch_and_continues_carried_counts() -> None:
    counter = ExampleCounter(num_replicas=2, step=100, carried=(1, 2))
    counter.info = INFO
    counter.count_to(103)
    counter.end_epoch(108)  # Keras 3 ran one empty step more than the epoch has batches
    counter.count_to(110)
    assert counter.counts == [1 + 23 + 8, 2 + 22 + 8]
    counter.count_to(109)  # a step already counted adds nothing
    assert counter.counts == [32, 32]


def test_counter_with_a_repeating_dataset_follows_the_dataset_layout() -> None:
    info = DatasetInfo(**{**INFO.__dict__, "repeat": True})
    counter = ExampleCounter(num_replicas=2, step=0)
    counter.info = info
    counter.end_epoch(4)  # fit's epochs do not restart a repeating dataset's layout
    counter.count_to(14)
    assert tuple(counter.counts) == info.examples_in_steps(0, 14) == (2 * 23, 2 * 22)


def test_counter_with_a_global_batch_size_counts_every_step_full() -> None:
    counter = ExampleCounter(num_replicas=3, step=0, carried=(5,), global_batch_size=10)
    counter.count_to(4)
    assert counter.counts == [16, 12, 12]  # carried counts for another replica count are dropped


def test_counter_without_a_way_to_count_says_so() -> None:
    with pytest.raises(ValueError, match="DatasetInfo or a global_batch_size"):
        ExampleCounter(num_replicas=1, step=0).count_to(1)
