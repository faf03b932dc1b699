"""The saved position's arithmetic and record, as tables: each row worked out by hand.

A position is an epoch (0-based) and the steps of it done; a step or a whole execution moves
it, and an epoch's last step moves it to the next epoch's start. Periodic saves come at the
first hook after each multiple of ``every_steps``; ``state.json`` records the position with the
facts a resume is checked against, and gives it back.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tfdp_utils.preemption import _position as position

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    ("epoch", "step", "steps_per_epoch", "expected"),
    [
        (0, 0, 10, 0),
        (0, 7, 10, 7),
        (2, 3, 10, 23),
        (3, 0, 4, 12),
        (1, 1, 1, 2),
    ],
)
def test_the_global_step_counts_every_step_since_the_first_epoch(
    epoch: int, step: int, steps_per_epoch: int, expected: int
) -> None:
    assert position.global_step(epoch, step, steps_per_epoch) == expected


@pytest.mark.parametrize(
    ("epoch", "done", "steps_per_epoch", "expected"),
    [
        (0, 1, 10, (0, 1)),
        (0, 9, 10, (0, 9)),
        (0, 10, 10, (1, 0)),  # the epoch's last step: the next epoch's start
        (4, 5, 5, (5, 0)),
        (2, 1, 1, (3, 0)),  # one step per epoch: every step ends one
    ],
)
def test_a_step_moves_the_position_and_an_epoch_s_last_step_ends_it(
    epoch: int, done: int, steps_per_epoch: int, expected: tuple[int, int]
) -> None:
    assert position.after_step(epoch, done, steps_per_epoch) == expected


@pytest.mark.parametrize(
    ("epoch", "begun", "per_execution", "steps_per_epoch", "expected"),
    [
        (0, 0, 1, 10, (0, 1)),
        (0, 3, 1, 10, (0, 4)),
        (0, 0, 4, 12, (0, 4)),
        (1, 4, 4, 12, (1, 8)),
        (1, 8, 4, 12, (2, 0)),  # the epoch's last execution
        (0, 8, 4, 10, (1, 0)),  # cut at the epoch's end (tf_keras), not 2 steps into the next
        (3, 9, 1, 10, (4, 0)),
    ],
)
def test_a_whole_execution_moves_the_position_at_most_to_the_epoch_s_end(
    epoch: int, begun: int, per_execution: int, steps_per_epoch: int, expected: tuple[int, int]
) -> None:
    assert position.after_execution(epoch, begun, per_execution, steps_per_epoch) == expected


@pytest.mark.parametrize(
    ("step", "every_steps", "last", "expected"),
    [
        (0, 5, None, 0),  # the run's start marks where the count begins
        (12, 5, None, 2),
        (4, 5, 0, None),
        (5, 5, 0, 1),  # a multiple reached
        (7, 5, 0, 1),  # passed between two hooks (steps_per_execution): due at the next
        (9, 5, 1, None),
        (10, 5, 1, 2),
        (20, 5, 2, 4),  # several multiples passed: one save
        (10, 5, 3, None),  # behind the last save's mark
    ],
)
def test_a_periodic_save_is_due_once_a_multiple_was_passed_since_the_last(
    step: int, every_steps: int, last: int | None, expected: int | None
) -> None:
    assert position.periodic_mark(step, every_steps, last) == expected


@pytest.mark.parametrize(
    ("per_execution", "accumulation", "expected"),
    [(1, 1, 1), (4, 1, 4), (1, 3, 3), (4, 6, 12), (3, 3, 3), (2, 4, 4)],
)
def test_saves_come_at_the_boundaries_executions_and_updates_share(
    per_execution: int, accumulation: int, expected: int
) -> None:
    assert position.save_unit(per_execution, accumulation) == expected


@pytest.mark.parametrize(
    ("steps", "expected"),
    [(1, [1]), (7, [1, 7]), (12, [1, 2, 3, 4, 6, 12]), (16, [1, 2, 4, 8, 16])],
)
def test_the_divisors_of_an_epoch(steps: int, expected: list[int]) -> None:
    assert position.divisors(steps) == expected


class _Variable:
    def __init__(self, shape: tuple[int, ...], *, path: str | None = None, name: str = "") -> None:
        if path is not None:
            self.path = path  # Keras 3; tf_keras' variables have only a name
        self.name, self.shape = name, shape


class _Model:
    def __init__(self, *weights: _Variable) -> None:
        self.weights = list(weights)


class Adam:
    pass


def test_the_record_holds_the_position_the_facts_the_model_and_the_keras() -> None:
    model = _Model(
        _Variable((3, 2), path="sequential/dense/kernel"), _Variable((2,), name="dense/bias:0")
    )
    state = position.record(
        epoch=2,
        step=3,
        steps_per_epoch=8,
        seed=1234,
        facts={"global_batch_size": 64},
        model=model,
        optimizer=Adam(),
        keras="3.5.0",
        reason="every_steps",
        saved_at=1700000000.5,
    )
    assert json.loads(json.dumps(state)) == {
        "epoch": 2,
        "step_in_epoch": 3,
        "steps_per_epoch": 8,
        "seed": 1234,
        "dataset": {"global_batch_size": 64},
        "optimizer": "Adam",
        "variables": [["sequential/dense/kernel", [3, 2]], ["dense/bias:0", [2]]],
        "keras": "3.5.0",
        "reason": "every_steps",
        "saved_at": 1700000000.5,
    }


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ({"epoch": 0, "step_in_epoch": 0}, (0, 0)),
        ({"epoch": 2, "step_in_epoch": 3, "steps_per_epoch": 8}, (2, 3)),
        ({"epoch": 5.0, "step_in_epoch": "7"}, (5, 7)),  # read back as integers
    ],
)
def test_the_recorded_position_is_read_back(
    state: dict[str, Any], expected: tuple[int, int]
) -> None:
    assert position.recorded(state) == expected
