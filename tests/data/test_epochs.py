"""The epoch layout and plan: how many steps an epoch has and what each replica receives.

Pure. :func:`epoch_layout` is checked against a simulation that deals example ids one by one
to the replicas of each worker, step after step, as the pipeline does; :func:`plan_epochs`
and its helpers as tables.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from tfdp_utils.data._epochs import (
    EpochLayout,
    EpochPlan,
    StepShape,
    batches_layout,
    check_epochs_aligned,
    check_repeat,
    epoch_layout,
    needs_element_check,
    plan_epochs,
    split_evenly,
    splits_last_step,
)

pytestmark = pytest.mark.pure


# ------------------------------------------------ an independent simulation of one epoch


@dataclasses.dataclass
class Dealt:
    """What a simulated epoch gave: ids per step, by global replica id; ids never given."""

    steps: list[list[list[int]]]
    dropped: list[int]


def deal_epoch(
    examples_per_worker: list[int],
    batch: int,
    local: int,
    *,
    drop_remainder: bool = False,
    split_last_step: bool = True,
) -> Dealt:
    """Deal each worker's example ids to its replicas, one id at a time, step by step.

    A full step gives each local replica ``batch`` ids in turn. A partial last step is dealt
    round robin with ``split_last_step`` (so counts differ by at most one, earlier replicas
    first), else replica after replica up to ``batch``. The epoch lasts until every worker is
    out of ids; with ``drop_remainder`` only while every worker can fill a whole step.
    """
    queues = [[(worker, i) for i in range(n)] for worker, n in enumerate(examples_per_worker)]
    step_size = batch * local
    steps: list[list[list[int]]] = []
    while any(queues):
        if drop_remainder and any(len(q) < step_size for q in queues):
            break
        row: list[list[int]] = []
        for queue in queues:
            taken, queue[:] = queue[:step_size], queue[step_size:]
            replicas: list[list[Any]] = [[] for _ in range(local)]
            if split_last_step and len(taken) < step_size:
                for position, example in enumerate(taken):
                    replicas[position % local].append(example)
            else:
                for position, example in enumerate(taken):
                    replicas[position // batch].append(example)
            row.extend(replicas)
        steps.append(row)
    return Dealt(steps=steps, dropped=[example for queue in queues for example in queue])


def layout_of(dealt: Dealt, batch: int, replicas: int) -> EpochLayout:
    counts = [tuple(len(ids) for ids in row) for row in dealt.steps]
    full_steps = 0
    while full_steps < len(counts) and counts[full_steps] == (batch,) * replicas:
        full_steps += 1
    examples = sum(sum(row) for row in counts)
    return EpochLayout(
        steps=len(counts),
        full_steps=full_steps,
        tail=tuple(counts[full_steps:]),
        examples=examples,
        dropped=len(dealt.dropped),
    )


SHARES = [[0], [1], [5], [6], [7], [13], [24], [3, 3], [9, 3], [7, 0], [0, 0], [12, 11, 11]]


@pytest.mark.parametrize("split_last_step", [True, False])
@pytest.mark.parametrize("drop_remainder", [False, True])
@pytest.mark.parametrize(("batch", "local"), [(1, 1), (2, 1), (3, 2), (2, 3), (4, 4)])
@pytest.mark.parametrize("shares", SHARES, ids=str)
def test_epoch_layout_counts_what_dealing_the_examples_gives(
    shares: list[int], batch: int, local: int, drop_remainder: bool, split_last_step: bool
) -> None:
    dealt = deal_epoch(
        shares, batch, local, drop_remainder=drop_remainder, split_last_step=split_last_step
    )
    expected = layout_of(dealt, batch, local * len(shares))
    got = epoch_layout(
        shares, batch, local, drop_remainder=drop_remainder, split_last_step=split_last_step
    )
    assert got == expected


@pytest.mark.parametrize("n", range(0, 40))
def test_every_example_is_dealt_once_and_counted_once(n: int) -> None:
    shares = [len(range(w, n, 3)) for w in range(3)]  # DATA sharding over 3 workers
    dealt = deal_epoch(shares, 2, 2)
    ids = [example for row in dealt.steps for replica in row for example in replica]
    assert sorted(ids) == sorted({(w, i) for w, k in enumerate(shares) for i in range(k)})
    layout = epoch_layout(shares, 2, 2)
    assert layout.examples == n and layout.dropped == 0
    assert layout.full_steps * 2 * 6 + sum(map(sum, layout.tail)) == n


def test_drop_remainder_keeps_the_steps_every_worker_can_fill() -> None:
    layout = epoch_layout([9, 20], 2, 2, drop_remainder=True)
    # 9 examples fill two steps of 4; the other worker stops there too.
    assert layout == EpochLayout(steps=2, full_steps=2, tail=(), examples=16, dropped=13)


# ------------------------------------------------------------------------- split_evenly


@pytest.mark.parametrize(
    ("examples", "parts", "expected"),
    [
        (0, 1, (0,)),
        (7, 1, (7,)),
        (28, 2, (14, 14)),
        (29, 2, (15, 14)),
        (5, 4, (2, 1, 1, 1)),
        (2, 3, (1, 1, 0)),
        (0, 3, (0, 0, 0)),
    ],
)
def test_split_evenly_table(examples: int, parts: int, expected: tuple[int, ...]) -> None:
    assert split_evenly(examples, parts) == expected


@pytest.mark.parametrize("parts", [1, 2, 3, 8])
@pytest.mark.parametrize("examples", range(0, 20))
def test_split_evenly_is_dealing_round_robin(examples: int, parts: int) -> None:
    hands = [0] * parts
    for position in range(examples):
        hands[position % parts] += 1
    assert split_evenly(examples, parts) == tuple(hands)


# ---------------------------------------------------------------------------- StepShape


@pytest.mark.parametrize(
    ("shape", "global_batch", "per_worker"),
    [
        (StepShape(32, 1), 32, 1),
        (StepShape(32, 4), 128, 4),
        (StepShape(8, 4, num_workers=2), 32, 2),
        (StepShape(8, 1, num_workers=2), 8, 1),  # fewer replicas than workers: still one
    ],
)
def test_step_shape(shape: StepShape, global_batch: int, per_worker: int) -> None:
    assert shape.global_batch_size == global_batch
    assert shape.replicas_per_worker == per_worker


# -------------------------------------------------------------------------- check_repeat


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (False, False),
        (True, True),
        ("epochs", "epochs"),
        (np.bool_(True), True),  # a NumPy bool is a bool, as for every other flag
        (np.bool_(False), False),
    ],
)
def test_check_repeat_accepts_the_three_modes(given: Any, expected: Any) -> None:
    assert check_repeat(given) == expected
    assert type(check_repeat(given)) is type(expected)


@pytest.mark.parametrize(
    ("given", "fix"),
    [
        ("yes", "Strings other than 'epochs' are not read as booleans"),
        ("Epochs", "Strings other than 'epochs'"),
        ("epoch", "Strings other than 'epochs'"),
        ("true", "Strings other than 'epochs'"),
        (None, "Pass repeat=False (one pass per epoch, the default), True or 'epochs'."),
        # Numbers, although 1 == True and 0 == False: repeat=1 read as "once" would repeat
        # without end (issue 21), and repeat=2 is no count either.
        (1, "repeat takes no count"),
        (0, "repeat takes no count"),
        (2, "repeat takes no count"),
        (1.0, "fit(epochs=N)"),
        (np.int64(1), "repeat takes no count"),
    ],
)
def test_check_repeat_names_the_value_the_modes_and_the_fix(given: Any, fix: str) -> None:
    with pytest.raises(ValueError) as info:
        check_repeat(given)
    message = str(info.value)
    assert message.startswith(f"repeat={given!r} is not supported; expected False, True")
    assert "'epochs' (repeat whole epochs, padded to equal steps)" in message
    assert fix in message


# ------------------------------------------------------------- check_epochs_aligned

ALIGNED = EpochPlan(layout=EpochLayout(2, 1, ((3, 3),), 14, 0), epoch_batches=(4,), exact=True)
UNSIZED = EpochPlan(layout=None)
SPARSE = EpochPlan(layout=EpochLayout(2, 1, ((3, 3),), 14, 0), epoch_batches=None)


@pytest.mark.parametrize(
    ("plan", "kwargs", "says"),
    [
        (ALIGNED, {"repeat": "epochs", "source_kind": "arrays"}, None),
        (UNSIZED, {"repeat": True, "source_kind": "dataset"}, None),
        (UNSIZED, {"repeat": False, "source_kind": "files"}, None),
        (
            UNSIZED,
            {"repeat": "epochs", "source_kind": "dataset"},
            r"tf.data does not know the dataset's size.*assert_cardinality\(N\)",
        ),
        (UNSIZED, {"repeat": "epochs", "source_kind": "files"}, "count_examples=True"),
        (UNSIZED, {"repeat": "epochs", "source_kind": "function"}, "does not count the exam"),
        (
            UNSIZED,
            {"repeat": "epochs", "source_kind": "dataset", "infinite": True},
            r"infinite: it has no epoch to repeat. Pass repeat=True \(or False\) and fit",
        ),
        (
            UNSIZED,
            {"repeat": "epochs", "source_kind": "files", "distributed_epoch": True},
            "service_mode='synchronous'",
        ),
        (SPARSE, {"repeat": "epochs", "source_kind": "arrays"}, "sparse or ragged.*to_dense"),
    ],
)
def test_repeat_epochs_is_refused_where_epochs_cannot_be_aligned(
    plan: EpochPlan, kwargs: dict[str, Any], says: str | None
) -> None:
    if says is None:
        check_epochs_aligned(plan, **kwargs)
        return
    with pytest.raises(ValueError, match=says) as info:
        check_epochs_aligned(plan, **kwargs)
    assert str(info.value).startswith("repeat='epochs' repeats whole epochs")
    # It never points back at the value that was just refused as its own fix.
    assert "or repeat='epochs'" not in str(info.value)


# ------------------------------------------------------------------- batches_layout


def deal_batches(sizes_per_worker: list[list[int]], local: int) -> list[list[int]]:
    """Hand each worker's batches to its replicas in turn, as a list of steps (simulation)."""
    queues = [list(sizes) for sizes in sizes_per_worker]
    steps = []
    while any(queues):
        row = []
        for queue in queues:
            for _ in range(local):
                row.append(queue.pop(0) if queue else 0)
        steps.append(row)
    return steps


@pytest.mark.parametrize(
    ("sizes", "batch", "local"),
    [
        ([[4] * 12], 4, 1),  # the input tutorial's 12 full batches on one replica
        ([[4] * 12 + [3]], 4, 2),  # 13 batches on 2 replicas: the last step is (3, 0)
        ([[4, 4, 2], [4, 4]], 4, 1),  # two workers, the first one batch longer
        ([[4, 4, 4], [4]], 4, 2),  # uneven workers: steps of the busiest
        ([[], [4]], 4, 1),  # a worker with nothing
        ([[]], 4, 2),  # no batches at all
    ],
)
def test_batches_layout_matches_dealing_the_batches(
    sizes: list[list[int]], batch: int, local: int
) -> None:
    layout = batches_layout(sizes, batch, local)
    dealt = deal_batches(sizes, local)
    assert layout.steps == len(dealt)
    full = [batch] * (local * len(sizes))
    rows = [[batch] * len(full)] * layout.full_steps + [list(row) for row in layout.tail]
    assert rows == dealt
    assert all(row != full for row in dealt[layout.full_steps : layout.full_steps + 1])
    assert layout.examples == sum(map(sum, sizes)) and layout.dropped == 0


# ------------------------------------------------------------------- splits_last_step


@pytest.mark.parametrize(
    ("local", "drop_remainder", "repeat_by_example", "dense", "splits"),
    [
        (2, False, False, True, True),
        (4, False, False, True, True),
        (1, False, False, True, False),  # one replica: nothing to split
        (2, True, False, True, False),  # only full steps
        (2, False, True, True, False),  # repeating example by example: no last step
        (2, False, False, False, False),  # sparse elements are not cut by rows
    ],
)
def test_splits_last_step_table(
    local: int, drop_remainder: bool, repeat_by_example: bool, dense: bool, splits: bool
) -> None:
    got = splits_last_step(
        local, drop_remainder=drop_remainder, repeat_by_example=repeat_by_example, dense=dense
    )
    assert got is splits


@pytest.mark.parametrize(
    ("examples", "repeat", "local", "drop_remainder", "needed"),
    [
        (None, "epochs", 2, False, False),  # fn(input_context): sizes never known
        ([10], False, 1, False, False),
        ([10], False, 2, False, True),
        ([10], False, 2, True, False),
        ([10], True, 2, False, True),
        ([10], "epochs", 1, False, True),
        ([10], "epochs", 1, True, True),
    ],
)
def test_needs_element_check_table(
    examples: list[int] | None, repeat: Any, local: int, drop_remainder: bool, needed: bool
) -> None:
    got = needs_element_check(
        examples, repeat=repeat, replicas_per_worker=local, drop_remainder=drop_remainder
    )
    assert got is needed


# -------------------------------------------------------------------------- plan_epochs


def test_unknown_size_gives_no_layout_but_still_says_whether_to_split() -> None:
    shape = StepShape(4, 2)
    plan = plan_epochs(None, shape, drop_remainder=False, repeat=False, dense=True)
    assert plan.layout is None and plan.split_last_step is True
    assert plan.take_per_worker is None and plan.epoch_batches is None
    assert plan.exact is False and plan.epoch_steps is None
    unknown = plan_epochs(None, shape, drop_remainder=False, repeat=False, dense=None)
    assert unknown.split_last_step is False


@pytest.mark.parametrize(
    ("examples", "batch", "replicas", "workers", "drop", "repeat", "dense", "expected"),
    [
        # A single epoch of dense elements: the last step is split, the layout is exact.
        ([29], 8, 2, 1, False, False, True, {"split": True, "exact": True, "steps": 2}),
        # Sparse elements fill replicas in order.
        ([29], 8, 2, 1, False, False, False, {"split": False, "exact": True, "steps": 2}),
        # drop_remainder keeps whole steps of 16 on every worker: 1 step, 16 examples each.
        ([29, 17], 8, 4, 2, True, False, True, {"take": 16, "exact": True, "steps": 1}),
        # repeat=True repeats examples: epochs run into each other, no layout holds.
        ([29], 8, 2, 1, False, True, True, {"split": False, "exact": False, "steps": 2}),
        # repeat='epochs' on dense elements: every epoch padded to the same batches.
        ([29], 8, 2, 1, False, "epochs", True, {"split": True, "batches": (4,), "exact": True}),
        ([29, 17], 8, 2, 2, False, "epochs", True, {"batches": (4, 3), "exact": True}),
        ([29, 17], 8, 4, 2, False, "epochs", True, {"batches": (4, 4), "exact": True}),
        ([29, 17], 8, 4, 2, True, "epochs", True, {"batches": (2, 2), "take": 16}),
        # repeat='epochs' on sparse elements falls back to repeating examples.
        ([29], 8, 2, 1, False, "epochs", False, {"batches": None, "exact": False}),
    ],
)
def test_plan_epochs_table(
    examples: list[int],
    batch: int,
    replicas: int,
    workers: int,
    drop: bool,
    repeat: Any,
    dense: bool,
    expected: dict[str, Any],
) -> None:
    shape = StepShape(batch, replicas, workers)
    plan = plan_epochs(examples, shape, drop_remainder=drop, repeat=repeat, dense=dense)
    got = {
        "split": plan.split_last_step,
        "exact": plan.exact,
        "take": plan.take_per_worker,
        "batches": plan.epoch_batches,
        "steps": None if plan.layout is None else plan.layout.steps,
    }
    assert {key: got[key] for key in expected} == expected
    # The layout is the one epoch_layout gives for the same split.
    assert plan.layout == epoch_layout(
        examples,
        batch,
        shape.replicas_per_worker,
        drop_remainder=drop,
        split_last_step=plan.split_last_step,
    )
    assert plan.epoch_steps == (plan.layout.steps if plan.epoch_batches is not None else None)


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize(("batch", "local"), [(8, 1), (8, 2), (3, 4)])
@pytest.mark.parametrize("shares", [[29], [29, 17], [5, 40, 0], [48, 48]], ids=str)
def test_epoch_batches_are_the_replica_batches_dealing_makes(
    shares: list[int], batch: int, local: int, drop: bool
) -> None:
    shape = StepShape(batch, local * len(shares), len(shares))
    plan = plan_epochs(shares, shape, drop_remainder=drop, repeat="epochs", dense=True)
    dealt = deal_epoch(
        shares, batch, local, drop_remainder=drop, split_last_step=plan.split_last_step
    )
    # A worker's pipeline makes one batch per replica in each step it still has examples
    # for (cut from a whole step when split, else `batch` at a time); padding comes after.
    made = []
    for worker in range(len(shares)):
        mine = [row[worker * local : (worker + 1) * local] for row in dealt.steps]
        if plan.split_last_step or drop:
            made.append(sum(local for step in mine if any(step)))
        else:
            made.append(sum(1 for step in mine for replica in step if replica))
    assert plan.epoch_batches == tuple(made)
    assert plan.exact is True
