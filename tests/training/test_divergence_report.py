"""DivergenceGuard's report as data: where a guard step lies in a fit, which replicas' checksums
differ and by how much, and the words a user reads."""

from __future__ import annotations

import math

import pytest

from tfdp_utils.training._divergence_report import (
    Disagreement,
    Divergence,
    ReplicaExamples,
    compare_checksums,
    step_place,
    worker_of,
)

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    ("step", "place"),
    [(0, (0, 0)), (7, (0, 7)), (8, (1, 0)), (13, (1, 5)), (20, (2, 0)), (25, (2, 5))],
)
def test_a_step_is_placed_in_its_epoch(step: int, place: tuple[int, int]) -> None:
    assert step_place(step, {0: 0, 1: 8, 2: 20}) == place


def test_a_fit_that_started_at_a_later_epoch_counts_from_it() -> None:
    assert step_place(3, {4: 0}) == (4, 3)


@pytest.mark.parametrize(("replica", "worker"), [(0, 0), (1, 0), (2, 1), (5, 2)])
def test_replicas_belong_to_workers_in_order(replica: int, worker: int) -> None:
    assert worker_of(replica, local_replicas=2) == worker


def test_equal_checksums_differ_nowhere() -> None:
    rows = ((1.0, 2.0), (-3.0, 4.0))
    assert compare_checksums([rows, rows, rows], ["a", "b"], local_replicas=1) == ()


def test_a_differing_variable_is_named_with_its_replica_worker_and_size() -> None:
    reference = ((1.0, 4.0), (-3.0, 9.0))
    shifted = ((1.0, 4.0), (-1.0, 16.0))
    found = compare_checksums(
        [reference, reference, reference, shifted], ["a", "b"], local_replicas=2
    )
    assert len(found) == 1
    difference = found[0]
    assert (difference.replica, difference.worker, difference.variable) == (3, 1, "b")
    assert difference.sum_difference == 2.0
    assert difference.norm_difference == pytest.approx(4.0 - 3.0)


def test_rounding_noise_is_no_difference_but_nan_against_a_number_is() -> None:
    reference = ((1000.0, 5.0),)
    assert compare_checksums([reference, ((1000.0 + 1e-7, 5.0),)], ["a"], local_replicas=1) == ()
    found = compare_checksums([reference, ((math.nan, 5.0),)], ["a"], local_replicas=1)
    assert [d.replica for d in found] == [1]


def test_the_divergence_reads_as_a_sentence() -> None:
    found = Divergence(
        epoch=1,
        batch=3,
        step=12,
        replicas=(3,),
        workers=(1,),
        loss_replicas=(),
        variable="model/d1/bias",
        policy="stop",
    )
    text = found.describe()
    assert text.startswith(
        "non-finite gradients at epoch 2 (index 1), batch 3 (step 12 of this fit) on replica "
        "3 on worker 1; the first gradient to go non-finite (in backpropagation order) was that "
        "of 'model/d1/bias'."
    )
    assert "training stops with the last finite weights" in text


def test_the_disagreement_names_replicas_workers_and_variables() -> None:
    found = compare_checksums([((0.0, 1.0),), ((0.5, 1.0),)], ["d/kernel"], local_replicas=1)
    text = Disagreement(
        epoch=0, batch=0, step=1, replicas=(1,), workers=(1,), differences=found
    ).describe()
    assert "replicas [1] (workers [1]) differ from replica 0's" in text
    assert "'d/kernel': sum differs by 0.5, norm by 0" in text


def divergence(**fields: object) -> Divergence:
    base: dict[str, object] = dict(
        epoch=0,
        batch=3,
        step=4,
        replicas=(1,),
        workers=(0,),
        loss_replicas=(1,),
        variable=None,
        policy="stop",
    )
    base.update(fields)
    return Divergence(**base)  # type: ignore[arg-type]


def test_the_examples_of_the_step_are_said_with_the_non_finite_ones() -> None:
    found = divergence(examples=(ReplicaExamples(1, (28, 29, 30, 31), (29,)),))
    assert found.non_finite_examples == (29,)
    assert (
        "Replica 1 received source examples [28, 29, 30, 31]; non-finite values in examples [29]."
        in found.describe()
    )


def test_a_long_batch_is_cut_short_and_counted() -> None:
    found = divergence(examples=(ReplicaExamples(1, tuple(range(40)), ()),))
    text = found.describe()
    assert "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, ... (40 in all)]" in text
    assert "none of them holds a non-finite value" in text
    assert found.non_finite_examples == ()


def test_examples_not_named_say_why() -> None:
    found = divergence(examples_unknown="the source's size is unknown")
    assert "Its examples are not named: the source's size is unknown." in found.describe()
    assert "examples" not in divergence().describe()
