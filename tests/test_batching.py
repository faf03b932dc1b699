"""Global <-> per-replica batch sizes, learning-rate scaling and steps per epoch."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import tfdp_utils as tdu
from tfdp_utils.batching import split_batch_size

REPLICA_COUNTS = (1, 2, 4)


def _strategy(replicas: int) -> tf.distribute.Strategy:
    if replicas == 1:
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


@pytest.fixture(scope="module")
def strategies() -> dict[int, tf.distribute.Strategy]:
    return {n: _strategy(n) for n in REPLICA_COUNTS}


# --- per-replica x replicas == global --------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(per_replica=st.integers(1, 4096), replicas=st.sampled_from(REPLICA_COUNTS))
def test_global_and_per_replica_are_inverse(strategies, per_replica, replicas):
    strategy = strategies[replicas]
    global_size = tdu.global_batch_size(per_replica, strategy=strategy)
    assert global_size == per_replica * replicas
    assert tdu.per_replica_batch_size(global_size, strategy=strategy) == per_replica


@settings(max_examples=8, deadline=None)
@given(per_replica=st.integers(1, 6), replicas=st.sampled_from(REPLICA_COUNTS))
def test_each_replica_receives_per_replica_batch_size_examples(strategies, per_replica, replicas):
    # Independent measurement: count what experimental_distribute_dataset hands each replica.
    strategy = strategies[replicas]
    global_size = tdu.global_batch_size(per_replica, strategy=strategy)
    dataset = tf.data.Dataset.range(global_size * 3).batch(global_size)
    counts = []
    for batch in strategy.experimental_distribute_dataset(dataset):
        counts.append([int(t.shape[0]) for t in strategy.experimental_local_results(batch)])
    expected = tdu.per_replica_batch_size(global_size, strategy=strategy)
    assert counts == [[expected] * replicas] * 3


@pytest.mark.parametrize("replicas", REPLICA_COUNTS)
def test_strategy_none_means_the_strategy_in_scope(strategies, replicas):
    strategy = strategies[replicas]
    assert tdu.num_replicas_in_sync() == 1
    with strategy.scope():
        assert tdu.num_replicas_in_sync() == replicas
        assert tdu.global_batch_size(16) == 16 * replicas
        assert tdu.per_replica_batch_size(16 * replicas) == 16
    assert tdu.global_batch_size(16) == 16


@settings(max_examples=100, deadline=None)
@given(global_size=st.integers(1, 10_000), replicas=st.integers(2, 64))
def test_indivisible_global_batch_names_the_nearest_valid_sizes(global_size, replicas):
    if global_size % replicas == 0:
        assert split_batch_size(global_size, replicas) * replicas == global_size
        return
    with pytest.raises(ValueError) as info:
        split_batch_size(global_size, replicas)
    message = str(info.value)
    assert f"global_batch_size={global_size}" in message
    assert f"{replicas} replicas" in message
    if global_size < replicas:
        assert "at least one example" in message
        return
    lower, upper = map(int, re.search(r"e\.g\. (\d+) or (\d+)", message).groups())
    assert lower % replicas == 0 and upper % replicas == 0
    assert lower < global_size < upper and upper - lower == replicas


def test_indivisible_error_names_the_strategy(strategies):
    with pytest.raises(
        ValueError,
        match=r"65 is not divisible by the 2 replicas in sync of "
        r"MirroredStrategy.*e\.g\. 64 or 66",
    ):
        tdu.per_replica_batch_size(65, strategy=strategies[2])


def test_batch_smaller_than_replica_count_is_an_error(strategies):
    with pytest.raises(ValueError, match=r"global_batch_size=3 is smaller than the 4 replicas"):
        tdu.per_replica_batch_size(3, strategy=strategies[4])


# --- learning-rate scaling --------------------------------------------------------------------

rates = st.floats(1e-6, 10.0, allow_nan=False)
sizes = st.integers(1, 1 << 16)


@settings(max_examples=200, deadline=None)
@given(rate=rates, base=sizes, size=sizes)
def test_linear_rule_scales_with_the_batch(rate, base, size):
    scaled = tdu.scale_learning_rate(rate, base_batch_size=base, global_batch_size=size)
    assert math.isclose(scaled / rate, size / base, rel_tol=1e-12)


@settings(max_examples=200, deadline=None)
@given(rate=rates, base=sizes, size=sizes)
def test_sqrt_rule_scales_with_the_square_root(rate, base, size):
    scaled = tdu.scale_learning_rate(
        rate, base_batch_size=base, global_batch_size=size, rule="sqrt"
    )
    assert math.isclose((scaled / rate) ** 2, size / base, rel_tol=1e-9)


@settings(max_examples=100, deadline=None)
@given(rate=rates, base=sizes, middle=sizes, size=sizes, rule=st.sampled_from(["linear", "sqrt"]))
def test_scaling_in_two_hops_equals_one_hop(rate, base, middle, size, rule):
    direct = tdu.scale_learning_rate(rate, base_batch_size=base, global_batch_size=size, rule=rule)
    first = tdu.scale_learning_rate(rate, base_batch_size=base, global_batch_size=middle, rule=rule)
    second = tdu.scale_learning_rate(
        first, base_batch_size=middle, global_batch_size=size, rule=rule
    )
    assert math.isclose(direct, second, rel_tol=1e-9)


@settings(max_examples=50, deadline=None)
@given(rate=rates, base=sizes, size=sizes)
def test_none_rule_keeps_the_rate(rate, base, size):
    kept = tdu.scale_learning_rate(rate, base_batch_size=base, global_batch_size=size, rule="none")
    assert kept == rate


def test_goyal_example():
    # Goyal et al. 2017: 0.1 for 256 images -> 3.2 for 8192 images.
    assert tdu.scale_learning_rate(0.1, base_batch_size=256, global_batch_size=8192) == 3.2


# --- steps per epoch --------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(examples=st.integers(0, 300), size=st.integers(1, 64), drop=st.booleans())
def test_steps_per_epoch_matches_a_counted_dataset(examples, size, drop):
    dataset = tf.data.Dataset.range(examples).batch(size, drop_remainder=drop)
    seen = [batch.numpy() for batch in dataset]
    counted_steps = len(seen)
    # The steps cover each example once (all of them unless the remainder is dropped).
    covered = np.concatenate(seen) if seen else np.array([], dtype=np.int64)
    assert len(set(covered.tolist())) == len(covered)
    assert tdu.steps_per_epoch(examples, size, drop_remainder=drop) == counted_steps


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, -64])
def test_non_positive_sizes_are_rejected(strategies, bad):
    with pytest.raises(
        ValueError,
        match=rf"per_replica_batch_size must be a positive integer, "
        rf"but received per_replica_batch_size={bad}",
    ):
        tdu.global_batch_size(bad, strategy=strategies[2])
    with pytest.raises(ValueError, match="global_batch_size must be a positive integer"):
        tdu.per_replica_batch_size(bad, strategy=strategies[2])
    with pytest.raises(ValueError, match="base_batch_size must be a positive integer"):
        tdu.scale_learning_rate(0.1, base_batch_size=bad, global_batch_size=64)
    with pytest.raises(ValueError, match="global_batch_size must be a positive integer"):
        tdu.steps_per_epoch(100, bad)


def test_negative_example_count_is_rejected():
    with pytest.raises(ValueError, match=r"num_examples must be an integer >= 0.*num_examples=-5"):
        tdu.steps_per_epoch(-5, 8)


@pytest.mark.parametrize("bad", [64.0, 32.5, "64", None, True])
def test_non_integer_sizes_are_rejected(strategies, bad):
    with pytest.raises(TypeError, match="per_replica_batch_size must be an integer"):
        tdu.global_batch_size(bad, strategy=strategies[2])
    with pytest.raises(TypeError, match="global_batch_size must be an integer"):
        tdu.per_replica_batch_size(bad, strategy=strategies[2])
    with pytest.raises(TypeError, match="must be an integer"):
        tdu.steps_per_epoch(bad, 8)


def test_whole_float_size_error_suggests_the_integer():
    with pytest.raises(
        TypeError,
        match=r"received 64\.0 of type float\. Pass "
        r"global_batch_size=64",
    ):
        tdu.steps_per_epoch(100, 64.0)


def test_numpy_integers_are_accepted(strategies):
    assert tdu.global_batch_size(np.int64(8), strategy=strategies[4]) == 32
    assert type(tdu.global_batch_size(np.int32(8), strategy=strategies[4])) is int


def test_unknown_rule_is_rejected():
    with pytest.raises(
        ValueError,
        match=r"rule='square' is not a learning-rate scaling rule; "
        r"expected one of 'linear', 'sqrt', 'none'",
    ):
        tdu.scale_learning_rate(0.1, base_batch_size=256, global_batch_size=512, rule="square")


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan"), float("inf")])
def test_bad_base_learning_rate_is_rejected(bad):
    with pytest.raises(ValueError, match="base_learning_rate must be a positive finite number"):
        tdu.scale_learning_rate(bad, base_batch_size=256, global_batch_size=512)


def test_non_numeric_learning_rate_is_rejected():
    with pytest.raises(TypeError, match="base_learning_rate must be a number"):
        tdu.scale_learning_rate("0.1", base_batch_size=256, global_batch_size=512)


# --- plan_global_batch: reaching a large global batch ----------------------------------------


def test_plan_reproduces_goyal_et_al(strategies):
    # Goyal et al. 2017, table/section 2: 0.1 per 256 images -> 3.2 at 8k, warm-up from 0.1
    # linearly over the first 5 epochs (ImageNet-1k: 1,281,167 images, 157 updates per epoch).
    updates = math.ceil(1_281_167 / 8192)
    plan = tdu.plan_global_batch(
        8192,
        strategy=strategies[4],
        max_per_replica_batch_size=512,
        base_learning_rate=0.1,
        warmup_epochs=5,
        steps_per_epoch=updates,
    )
    assert plan.effective_global_batch_size == 8192
    assert (plan.per_replica_batch_size, plan.num_replicas, plan.accumulation_steps) == (512, 4, 4)
    assert plan.global_batch_size == 2048
    assert plan.learning_rate == pytest.approx(3.2)
    assert plan.warmup_steps == 5 * updates
    schedule = plan.warmup_schedule
    rates = [float(schedule(step)) for step in (0, 5 * updates // 2, 5 * updates, 20 * updates)]
    assert rates[0] == pytest.approx(0.1)
    assert rates[1] == pytest.approx(0.1 + (3.2 - 0.1) * (5 * updates // 2) / (5 * updates))
    assert rates[2] == pytest.approx(3.2) and rates[3] == pytest.approx(3.2)
    sqrt = tdu.plan_global_batch(
        8192,
        strategy=strategies[1],
        max_per_replica_batch_size=8192,
        base_learning_rate=0.1,
        rule="sqrt",
    )
    assert sqrt.learning_rate == pytest.approx(math.sqrt(32) * 0.1)
    assert sqrt.accumulation_steps == 1 and sqrt.warmup_schedule is None


@settings(max_examples=150, deadline=None)
@given(
    target=st.integers(1, 5000),
    replicas=st.sampled_from(REPLICA_COUNTS),
    limit=st.integers(1, 700),
)
def test_plan_takes_the_fewest_accumulation_steps_that_fit(strategies, target, replicas, limit):
    # Independent: enumerate every (per_replica, steps) split by brute force.
    splits = [
        (p, k)
        for k in range(1, target + 1)
        for p in range(1, limit + 1)
        if p * replicas * k == target
    ]
    if not splits:
        with pytest.raises(ValueError, match="cannot be reached exactly"):
            tdu.plan_global_batch(
                target, strategy=strategies[replicas], max_per_replica_batch_size=limit
            )
        return
    plan = tdu.plan_global_batch(
        target, strategy=strategies[replicas], max_per_replica_batch_size=limit
    )
    assert (plan.per_replica_batch_size, plan.accumulation_steps) == min(splits, key=lambda s: s[1])
    assert plan.effective_global_batch_size == target and plan.learning_rate is None


def test_unreachable_target_names_the_nearest_reachable_sizes(strategies):
    with pytest.raises(ValueError) as info:
        tdu.plan_global_batch(8190, strategy=strategies[4], max_per_replica_batch_size=512)
    message = str(info.value)
    assert "target_global_batch_size=8190" in message and "4 replicas" in message
    assert "8188 (" in message and "8192 (512 per replica x 4 replicas x 4 steps)" in message
    assert "MirroredStrategy" in message


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"warmup_epochs": 5, "steps_per_epoch": 10}, ValueError, "base_learning_rate=None"),
        ({"base_learning_rate": 0.1, "warmup_epochs": 5}, ValueError, "steps_per_epoch=None"),
        ({"base_learning_rate": 0.1, "rule": "cube"}, ValueError, "rule='cube'"),
        ({"rule": "cube"}, ValueError, "rule='cube'"),
        ({"max_per_replica_batch_size": 0}, ValueError, "max_per_replica_batch_size must be"),
        ({"max_per_replica_batch_size": 8.0}, TypeError, "max_per_replica_batch_size=8"),
        ({"base_learning_rate": -1.0}, ValueError, "base_learning_rate must be"),
        (
            {"base_learning_rate": 0.1, "warmup_epochs": 0, "steps_per_epoch": 3},
            ValueError,
            "warmup_epochs must be",
        ),
    ],
)
def test_plan_rejects_bad_arguments(strategies, kwargs, error, pattern):
    arguments = {"strategy": strategies[2], "max_per_replica_batch_size": 64, **kwargs}
    with pytest.raises(error, match=pattern):
        tdu.plan_global_batch(256, **arguments)


def test_plan_is_frozen_and_uses_the_strategy_in_scope(strategies):
    with strategies[2].scope():
        plan = tdu.plan_global_batch(96, max_per_replica_batch_size=16)
    assert (plan.num_replicas, plan.per_replica_batch_size, plan.accumulation_steps) == (2, 16, 3)
    with pytest.raises(AttributeError):
        plan.accumulation_steps = 1  # type: ignore[misc]
