"""The sharding decisions as tables: which policy, which files, what each replica receives.

Pure: nothing here needs TensorFlow (the same split checked against ``tf.data``'s own
``shard`` is in test_data.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tfdp_utils.data._epochs import epoch_layout, split_evenly
from tfdp_utils.data._sharding import (
    DEFAULT_SHUFFLE_SEED,
    assign_files,
    check_policy,
    decide_policy,
    file_imbalance,
    split_examples,
)

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    ("kind", "workers", "files", "expected"),
    [
        ("files", 1, 4, "off"),
        ("files", 2, 4, "file"),
        ("files", 2, 2, "file"),
        ("files", 3, 2, "data"),
        ("files", 2, 1, "data"),
        ("arrays", 1, None, "off"),
        ("arrays", 2, None, "data"),
        ("dataset", 1, None, "off"),
        ("dataset", 4, None, "data"),
        ("function", 1, None, "off"),
        ("function", 3, None, "off"),
    ],
)
def test_auto_decision_table(kind: Any, workers: int, files: int | None, expected: str) -> None:
    policy, reason = decide_policy("auto", source_kind=kind, num_workers=workers, num_files=files)
    assert policy == expected
    assert reason


@pytest.mark.parametrize("kind", ["arrays", "function", "dataset"])
def test_file_policy_on_a_source_without_files_is_refused(kind: Any) -> None:
    with pytest.raises(ValueError, match="shard_policy='file' needs a source that reads files"):
        decide_policy("file", source_kind=kind, num_workers=2)


def test_explicit_policies() -> None:
    assert decide_policy("FILE", source_kind="files", num_workers=2, num_files=1)[0] == "file"
    assert decide_policy("file", source_kind="dataset", num_workers=2, has_reader=True)[0] == "file"
    assert decide_policy("data", source_kind="files", num_workers=2, num_files=8)[0] == "data"
    assert decide_policy("off", source_kind="arrays", num_workers=2)[0] == "off"
    assert decide_policy("hint", source_kind="dataset", num_workers=2)[0] == "hint"
    with pytest.raises(ValueError, match=r"'hint' applies to a tf\.data\.Dataset"):
        decide_policy("hint", source_kind="files", num_workers=2, num_files=2)
    with pytest.raises(ValueError, match=r"shard_policy='bogus' is not a sharding policy.*'auto'"):
        decide_policy("bogus", source_kind="arrays", num_workers=2)


def test_assign_files_is_a_balanced_partition() -> None:
    files = [f"f{i}" for i in range(7)]
    sizes = [100, 10, 10, 10, 50, 50, 10]
    assigned = assign_files(files, 3, sizes)
    flat = [f for worker in assigned for f in worker]
    assert sorted(flat) == files
    loads = [sum(sizes[files.index(f)] for f in worker) for worker in assigned]
    assert max(loads) == 100  # the largest file alone bounds the busiest worker
    assert assign_files(files, 3, sizes) == assigned  # deterministic on every worker
    assert assign_files(files, 2) == (("f0", "f2", "f4", "f6"), ("f1", "f3", "f5"))
    assert assign_files(files[:1], 2, sizes[:1]) == (("f0",), ())
    assert file_imbalance(assigned, files, sizes) == pytest.approx(100 / (240 / 3))


def test_epoch_layout_arithmetic() -> None:
    layout = epoch_layout([13], 2, 3)
    assert (layout.steps, layout.full_steps, layout.tail) == (3, 2, ((1, 0, 0),))
    uneven = epoch_layout([9, 3], 2, 1)
    assert uneven.steps == 5 and uneven.full_steps == 1
    assert uneven.tail == ((2, 1), (2, 0), (2, 0), (1, 0))
    dropped = epoch_layout([9, 3], 2, 1, drop_remainder=True)
    assert (dropped.steps, dropped.examples, dropped.dropped) == (1, 4, 8)
    assert epoch_layout([], 2, 1).steps == 0


def test_default_seed_for_data_sharding_is_documented() -> None:
    assert isinstance(DEFAULT_SHUFFLE_SEED, int)


def test_split_evenly() -> None:
    assert split_evenly(28, 2) == (14, 14)
    assert split_evenly(29, 2) == (15, 14)
    assert split_evenly(5, 4) == (2, 1, 1, 1)
    assert split_evenly(2, 3) == (1, 1, 0)
    assert split_evenly(0, 2) == (0, 0)


def test_epoch_layout_splits_each_workers_last_step_evenly() -> None:
    layout = epoch_layout([1500], 32, 2)
    assert (layout.steps, layout.full_steps, layout.tail) == (24, 23, ((14, 14),))
    assert epoch_layout([1500], 32, 2, split_last_step=False).tail == ((28, 0),)
    assert epoch_layout([93], 32, 2).tail == ((15, 14),)
    assert epoch_layout([69], 16, 4).tail == ((2, 1, 1, 1),)
    # Two workers of two replicas: each worker splits its own last step.
    assert epoch_layout([13, 12], 4, 2).tail == ((3, 2, 2, 2),)
    assert epoch_layout([17, 16], 4, 2).tail == ((1, 0, 0, 0),)
    # A worker that runs out a step early gets empty batches in the last step.
    assert epoch_layout([24, 23], 4, 2).tail == ((4, 4, 4, 3),)
    assert epoch_layout([25, 23], 4, 2).tail == ((4, 4, 4, 3), (1, 0, 0, 0))


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("local", [1, 2, 4])
def test_data_sharding_last_step_leaves_a_replica_empty_only_when_it_must(
    workers: int, local: int
) -> None:
    batch = 3
    global_size = batch * local * workers
    for n in range(1, 4 * global_size):
        layout = epoch_layout(split_examples(n, workers), batch, local)
        for row in layout.tail:
            total = sum(row)
            assert max(row) - min(row) <= 1, (n, row)
            if min(row) == 0:
                assert total < workers * local, (n, row)


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [0, 1, 2, 9, 10, 11, 12, 31])
def test_split_examples_counts_what_every_workers_th_example_gives(n: int, workers: int) -> None:
    # shard(workers, index) keeps the examples at positions index, index + workers, ...
    kept = [[i for i in range(n) if i % workers == index] for index in range(workers)]
    assert split_examples(n, workers) == tuple(len(ids) for ids in kept)


@pytest.mark.parametrize(
    ("given", "normalised"),
    [("auto", "auto"), (" Data ", "data"), ("FILE", "file"), ("hint", "hint"), ("off", "off")],
)
def test_check_policy_accepts_each_policy_in_any_case(given: str, normalised: str) -> None:
    assert check_policy(given) == normalised


@pytest.mark.parametrize("given", ["shard", "", None, 1, True])
def test_check_policy_names_the_received_value_the_choices_and_the_fix(given: Any) -> None:
    with pytest.raises(ValueError) as info:
        check_policy(given)
    message = str(info.value)
    assert f"shard_policy={given!r} is not a sharding policy" in message
    assert "expected one of 'auto', 'file', 'data', 'hint', 'off'" in message
    assert "Use 'auto' to let the builder choose." in message


def test_assign_files_refuses_sizes_that_do_not_match_the_files() -> None:
    with pytest.raises(ValueError, match=r"got 2 sizes for 3 files\."):
        assign_files(["a", "b", "c"], 2, [1, 2])


@pytest.mark.parametrize(
    ("files_per_worker", "sizes", "expected"),
    [
        ((("a",), ("b",)), (5, 5), 1.0),
        ((("a", "b"), ()), (5, 5), 2.0),
        ((("a",), ("b", "c")), (6, 1, 2), 6 / 4.5),
        ((("a",), ("b",)), None, None),  # sizes unknown: nothing to say
        ((), (5, 5), None),
        ((("a",), ("b",)), (0, 0), None),  # nothing to read: no mean to compare against
    ],
)
def test_file_imbalance_is_the_busiest_load_over_the_mean(
    files_per_worker: tuple[tuple[str, ...], ...],
    sizes: tuple[int, ...] | None,
    expected: float | None,
) -> None:
    files = ("a", "b", "c")[: len(sizes) if sizes else 2]
    assert file_imbalance(files_per_worker, files, sizes) == (
        None if expected is None else pytest.approx(expected)
    )
