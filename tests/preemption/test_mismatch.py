"""Whether a checkpoint is this run's, without TensorFlow: each check as a table.

A checkpoint's ``state.json`` is read against the run: a different dataset fact, optimizer,
model, Keras or shuffle seed is refused with a ResumeMismatchError that names the checkpoint,
both values and the fix; what the checkpoint does not record is not checked.
"""

from __future__ import annotations

from typing import Any

import pytest

from tfdp_utils.errors import ResumeMismatchError
from tfdp_utils.preemption import _mismatch as mismatch
from tfdp_utils.preemption._store import Saved

pytestmark = pytest.mark.pure

PATH = "/mnt/ckpt/ckpt-000000000042"
FACTS = {"global_batch_size": 64, "num_workers": 2, "steps_per_epoch": 10, "policy": "DATA"}


def saved(**state: Any) -> Saved:
    return Saved(PATH, 42, state)


@pytest.mark.parametrize(
    ("before", "refused"),
    [
        ({}, None),  # recorded nothing: nothing to compare
        (FACTS, None),
        ({"global_batch_size": 64}, None),  # only what is recorded is compared
        ({"unknown_fact": 1}, None),
        (
            {**FACTS, "global_batch_size": 32},
            "saved with global batch size 32, but this run has 64",
        ),
        # Another number of workers or replicas: an elastic resume (test_elastic.py).
        ({**FACTS, "policy": "FILE"}, "saved with sharding policy 'FILE', but this run has 'DATA'"),
        ({"files": ["a", "b"]}, "saved with files (per worker) ['a', 'b'], but this run has None"),
        # The causes are named before the steps per epoch that follow from them.
        (
            {**FACTS, "global_batch_size": 32, "steps_per_epoch": 20},
            "saved with global batch size 32, but this run has 64",
        ),
        ({**FACTS, "steps_per_epoch": 20}, "saved with steps per epoch 20, but this run has 10"),
    ],
)
def test_the_dataset_s_facts_are_those_it_was_saved_with(
    before: dict[str, Any], refused: str | None
) -> None:
    checkpoint = saved(dataset=before)
    if refused is None:
        mismatch.check_facts(checkpoint, FACTS)
        return
    with pytest.raises(ResumeMismatchError) as caught:
        mismatch.check_facts(checkpoint, FACTS)
    assert f"the checkpoint {PATH} was {refused}" in str(caught.value)
    assert "resuming would not continue the same epochs" in str(caught.value)
    assert "another directory=" in str(caught.value)


@pytest.mark.parametrize(
    ("before", "now", "refused"),
    [
        (None, "Adam", None),
        ("Adam", "Adam", None),
        ("SGD", "Adam", "holds the state of a SGD optimizer, but this run's optimizer is Adam"),
    ],
)
def test_the_optimizer_is_the_one_whose_state_was_saved(
    before: str | None, now: str, refused: str | None
) -> None:
    checkpoint = saved(**({"optimizer": before} if before is not None else {}))
    if refused is None:
        mismatch.check_optimizer(checkpoint, now)
        return
    with pytest.raises(ResumeMismatchError, match="Train with SGD to resume") as caught:
        mismatch.check_optimizer(checkpoint, now)
    assert refused in str(caught.value)


KERNEL, BIAS = ["dense/kernel", [3, 2]], ["dense/bias", [2]]


@pytest.mark.parametrize(
    ("before", "now", "refused"),
    [
        (None, [KERNEL, BIAS], None),  # an older checkpoint without the shapes
        ([KERNEL, BIAS], [KERNEL, BIAS], None),
        ([KERNEL, BIAS], [["d_1/kernel", [3, 2]], ["d_1/bias", [2]]], None),  # renamed: same
        (
            [KERNEL, BIAS],
            [["dense/kernel", [4, 2]], BIAS],
            "dense/kernel has shape [3, 2] there, dense/kernel has [4, 2] here",
        ),
        ([KERNEL, BIAS], [KERNEL], "2 weights there, 1 here"),
        ([KERNEL], [KERNEL, BIAS], "1 weights there, 2 here"),
    ],
)
def test_the_model_is_the_one_whose_weights_were_saved(
    before: list[Any] | None, now: list[Any], refused: str | None
) -> None:
    checkpoint = saved(**({"variables": before} if before is not None else {}))
    if refused is None:
        mismatch.check_weights(checkpoint, now)
        return
    with pytest.raises(ResumeMismatchError) as caught:
        mismatch.check_weights(checkpoint, now)
    assert f"the checkpoint {PATH} was saved from a different model: {refused}." in str(
        caught.value
    )


@pytest.mark.parametrize(
    ("before", "now", "refused"),
    [
        (None, "3.5.0", None),  # an older checkpoint: not recorded
        ("", "tf_keras", None),
        ("3.5.0", "3.5.0", None),
        ("3.3.3", "3.5.0", None),  # another Keras 3 names its variables the same
        ("tf_keras", "tf_keras", None),
        (
            "tf_keras",
            "3.5.0",
            "saved under tf_keras (TF_USE_LEGACY_KERAS=1), but this run uses Keras 3 (3.5.0)"
            ": the two Kerases name their variables differently, so nothing would be "
            "restored. Resume under tf_keras: set TF_USE_LEGACY_KERAS=1,",
        ),
        (
            "3.5.0",
            "tf_keras",
            "saved under Keras 3 (3.5.0), but this run uses tf_keras (TF_USE_LEGACY_KERAS=1)"
            ": the two Kerases name their variables differently, so nothing would be "
            "restored. Resume under Keras 3: unset TF_USE_LEGACY_KERAS,",
        ),
    ],
)
def test_a_checkpoint_of_the_other_keras_is_refused(
    before: str | None, now: str, refused: str | None
) -> None:
    checkpoint = saved(**({"keras": before} if before is not None else {}))
    if refused is None:
        mismatch.check_flavour(checkpoint, now)
        return
    with pytest.raises(ResumeMismatchError) as caught:
        mismatch.check_flavour(checkpoint, now)
    assert f"the checkpoint {PATH} was {refused}" in str(caught.value)


@pytest.mark.parametrize(
    ("before", "given", "expected"),
    [
        (None, None, None),
        (None, 7, None),  # not recorded: the checkpoint's (none) is kept
        (1234, None, 1234),  # a seed drawn by the first run: kept
        (1234, 1234, 1234),
        (1234, 7, "saved with the shuffle seed 1234, but this run's dataset has seed=7"),
    ],
)
def test_the_shuffle_seed_is_the_checkpoint_s(
    before: int | None, given: int | None, expected: int | str | None
) -> None:
    checkpoint = saved(seed=before)
    if not isinstance(expected, str):
        assert mismatch.checked_seed(checkpoint, given) == expected
        return
    with pytest.raises(ResumeMismatchError, match="Resume with seed=1234") as caught:
        mismatch.checked_seed(checkpoint, given)
    assert expected in str(caught.value)
