"""DivergenceGuard on 2 in-process replicas: a planted inf is named, never applied, and skipped
exactly as a run without that batch; an overflowing layer is named; replicas that disagree are
named at the first step. References are runs of the same strategy without the guard."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import tfdp_utils as tdu
from tfdp_utils import compat
from tfdp_utils._tf import IS_KERAS3, keras
from tfdp_utils.callbacks import DivergenceGuard
from tfdp_utils.training import _mixed_precision as mixed_precision

pytestmark = pytest.mark.keras


@pytest.fixture(autouse=True, scope="module")
def _op_determinism() -> Any:
    """Op determinism for this module's runs (bit-equal references), and off again after it:
    the tests that share this process draw unseeded random ops."""
    from tensorflow.python.framework import config as tf_config

    tf.config.experimental.enable_op_determinism()
    yield
    tf_config.disable_op_determinism()


BATCH = 8  # global: replica 0 gets examples 0..3 of each batch, replica 1 examples 4..7
STEPS = 8
BAD_BATCH = 3
BAD_EXAMPLE = BAD_BATCH * BATCH + 5  # in replica 1's half of batch 3


@pytest.fixture
def strategy() -> Any:
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def data(*, plant: bool = True) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.randn(STEPS * BATCH, 4).astype("float32")
    y = rng.randn(STEPS * BATCH, 1).astype("float32")
    if plant:
        x[BAD_EXAMPLE, 2] = np.inf
    return x, y


def build(strategy: Any, layers: list[Any] | None = None) -> Any:
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,))]
            + (layers or [keras.layers.Dense(3, name="d1")])
            + [keras.layers.Dense(1, name="d2")]
        )
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def fit(model: Any, x: np.ndarray, y: np.ndarray, **kwargs: Any) -> Any:
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    return model.fit(dataset, verbose=0, shuffle=False, **kwargs)


def assert_same_weights(model: Any, reference: Any) -> None:
    for got, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def all_finite(model: Any) -> bool:
    return all(np.isfinite(w).all() for w in model.get_weights())


def test_stop_names_the_step_and_replica_and_keeps_the_last_finite_weights(
    strategy: Any, caplog: pytest.LogCaptureFixture
) -> None:
    x, y = data()
    model = build(strategy)
    guard = DivergenceGuard()
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        history = fit(model, x, y, epochs=3, callbacks=[guard])
    found = guard.divergence
    assert found is not None
    assert (found.epoch, found.batch, found.step) == (0, BAD_BATCH, BAD_BATCH + 1)
    assert found.replicas == (1,) and found.workers == (0,) and found.loss_replicas == (1,)
    assert len(history.history["loss"]) == 1  # stopped at the first read, the epoch's end
    assert guard.summary()["stopped"] and all_finite(model)
    assert "batch 3 (step 4 of this fit) on replica 1 on worker 0" in caplog.text
    # The weights are those of the same run on the batches before the bad one.
    reference = build(strategy)
    fit(reference, x[: BAD_BATCH * BATCH], y[: BAD_BATCH * BATCH], epochs=1)
    assert_same_weights(model, reference)


def test_skip_ends_with_the_weights_of_a_run_without_that_batch(strategy: Any) -> None:
    x, y = data()
    model = build(strategy)
    guard = DivergenceGuard(policy="skip", check_every_n_steps=2)
    history = fit(model, x, y, epochs=2, callbacks=[guard])
    assert len(history.history["loss"]) == 2
    summary = guard.summary()
    assert summary["skipped_steps"] == 2 and not summary["stopped"]  # once per epoch
    assert summary["steps"] == 2 * STEPS
    assert summary["divergence"].step == BAD_BATCH + 1
    assert summary["divergence"].replicas == (1,)
    keep = np.ones(len(x), bool)
    keep[BAD_BATCH * BATCH : (BAD_BATCH + 1) * BATCH] = False
    reference = build(strategy)
    x_clean, y_clean = x[keep], y[keep]
    # The same global batches without batch 3, epoch after epoch.
    fit(reference, x_clean, y_clean, epochs=2)
    assert_same_weights(model, reference)
    assert all_finite(model)


def test_skip_stops_after_more_than_max_skipped_steps(strategy: Any) -> None:
    x, y = data()
    x[[5, 13, 21, 37], 0] = np.nan  # batches 0, 1, 2 and 4; batch 3 holds the planted inf
    model = build(strategy)
    guard = DivergenceGuard(policy="skip", max_skipped_steps=3, check_every_n_steps=1)
    fit(model, x, y, epochs=3, callbacks=[guard])
    summary = guard.summary()
    assert summary["stopped"] and summary["skipped_steps"] == 4
    assert summary["divergence"].step == 1 and summary["divergence"].replicas == (1,)
    assert all_finite(model)


class Overflow(keras.layers.Layer):  # type: ignore[misc]
    """The identity forward; backward, the gradient times 1e30 twice: inf in float32."""

    def call(self, inputs: Any) -> Any:
        @tf.custom_gradient
        def identity(value: Any) -> Any:
            return tf.identity(value), lambda upstream: upstream * 1e30 * 1e30

        return identity(inputs)


def test_an_overflowing_gradient_names_its_layer(strategy: Any) -> None:
    x, y = data(plant=False)
    model = build(strategy, [keras.layers.Dense(3, name="d1"), Overflow(name="boom")])
    guard = DivergenceGuard(check_every_n_steps=1)
    fit(model, x, y, epochs=1, callbacks=[guard])
    found = guard.divergence
    assert found is not None and found.step == 1 and found.loss_replicas == ()
    assert found.replicas == (0, 1)
    # d1 lies below the overflowing layer: its gradient went non-finite; d2's stayed finite.
    assert found.variable is not None and "d1" in found.variable and "bias" in found.variable
    assert all_finite(model)


def test_a_replica_with_other_weights_is_named_at_the_first_step(strategy: Any) -> None:
    x, y = data(plant=False)
    model = build(strategy)
    kernel = model.layers[0].kernel
    kernel = kernel.value if IS_KERAS3 else kernel
    replica_one = kernel.values[1]
    replica_one.assign(replica_one + 0.5)
    guard = DivergenceGuard()
    fit(model, x, y, epochs=2, callbacks=[guard])
    found = guard.summary()["disagreement"]
    assert found is not None and found.step == 1 and found.replicas == (1,)
    variable = model.layers[0].kernel
    assert [d.variable for d in found.differences] == [getattr(variable, "path", variable.name)]
    difference = found.differences[0]
    assert difference.sum_difference == pytest.approx(0.5 * 12, rel=1e-5)
    assert guard.summary()["stopped"]


def test_agreeing_replicas_and_finite_steps_report_nothing(strategy: Any) -> None:
    x, y = data(plant=False)
    model = build(strategy)
    guard = DivergenceGuard(check_replicas_every=3, check_every_n_steps=1)
    fit(model, x, y, epochs=2, callbacks=[guard])
    summary = guard.summary()
    assert summary["divergence"] is None and summary["disagreement"] is None
    assert summary["skipped_steps"] == 0 and not summary["stopped"]
    assert summary["checked_at_step"] == 16  # step 16 of 16: the last multiple of 3, plus one
    reference = build(strategy)
    fit(reference, x, y, epochs=2)
    assert_same_weights(model, reference)
    listed = {s.issue: s for s in compat.status()}["divergence-guard"]
    assert listed.applied and listed.applied_by == "DivergenceGuard()"


def build_mixed(strategy: Any) -> Any:
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(3, name="d1", dtype="mixed_float16"),
                keras.layers.Dense(1, name="d2", dtype="float32"),
            ]
        )
        # A scale of 2**40 overflows float16 at once: the optimizer skips and lowers it.
        optimizer = keras.mixed_precision.LossScaleOptimizer(
            keras.optimizers.Adam(0.01), initial_scale=2.0**40
        )
        model.compile(optimizer=optimizer, loss="mse")
    return model


def test_a_loss_scale_optimizers_own_skips_are_not_divergence(strategy: Any) -> None:
    x, y = data(plant=False)
    model = build_mixed(strategy)
    guard = DivergenceGuard(check_every_n_steps=1)
    fit(model, x, y, epochs=2, callbacks=[guard])
    summary = guard.summary()
    assert summary["divergence"] is None and not summary["stopped"]
    assert summary["skipped_steps"] == 0 and summary["steps"] == 2 * STEPS
    # The loss scale went down, so the optimizer did skip steps of its own.
    assert mixed_precision.current_loss_scale(model.optimizer) < 2.0**40
    assert all_finite(model)


def test_a_non_finite_loss_under_loss_scaling_is_divergence(strategy: Any) -> None:
    x, y = data()
    model = build_mixed(strategy)
    guard = DivergenceGuard(policy="skip", check_every_n_steps=1)
    fit(model, x, y, epochs=1, callbacks=[guard])
    found = guard.summary()["divergence"]
    assert found is not None and found.step == BAD_BATCH + 1 and found.loss_replicas == (1,)
    assert guard.summary()["skipped_steps"] == 1 and all_finite(model)


def test_one_device_without_a_strategy_is_guarded_too() -> None:
    x, y = data()
    model = build(tf.distribute.get_strategy())
    guard = DivergenceGuard(policy="skip", check_every_n_steps=1)
    fit(model, x, y, epochs=1, callbacks=[guard])
    found = guard.summary()["divergence"]
    assert found is not None and found.step == BAD_BATCH + 1 and found.replicas == (0,)
    assert guard.summary()["skipped_steps"] == 1 and all_finite(model)


def custom_loop(strategy: Any, x: np.ndarray, y: np.ndarray, guard: Any = None) -> tuple[Any, int]:
    """``make_distributed_train_step`` over the batches of (x, y); returns the model and the
    batches trained before the guard said stop."""
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(3, name="d1"), keras.layers.Dense(1, name="d2")]
        )
        optimizer = keras.optimizers.Adam(0.01)
    step = tdu.make_distributed_train_step(
        model,
        loss=keras.losses.MeanSquaredError(reduction="none"),
        optimizer=optimizer,
        strategy=strategy,
    )
    if guard is not None:
        guard.watch(model, optimizer=optimizer)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    trained = 0
    for batch in strategy.experimental_distribute_dataset(dataset):
        step(batch)
        trained += 1
        if guard is not None and guard.check():
            break
    return model, trained


def test_a_custom_loop_is_guarded_and_told_to_stop(strategy: Any) -> None:
    x, y = data()
    guard = DivergenceGuard(check_every_n_steps=1)
    model, trained = custom_loop(strategy, x, y, guard)
    assert trained == BAD_BATCH + 1  # check() said stop right after the bad step
    found = guard.divergence
    assert found is not None and found.step == BAD_BATCH + 1 and found.replicas == (1,)
    reference, _ = custom_loop(strategy, x[: BAD_BATCH * BATCH], y[: BAD_BATCH * BATCH])
    assert_same_weights(model, reference)


def test_a_custom_loop_under_skip_equals_a_loop_without_that_batch(strategy: Any) -> None:
    x, y = data()
    guard = DivergenceGuard(policy="skip")
    model, trained = custom_loop(strategy, x, y, guard)
    assert trained == STEPS and guard.summary()["skipped_steps"] == 1
    keep = np.ones(len(x), bool)
    keep[BAD_BATCH * BATCH : (BAD_BATCH + 1) * BATCH] = False
    reference, _ = custom_loop(strategy, x[keep], y[keep])
    assert_same_weights(model, reference)
    assert all_finite(model)


def test_a_later_fit_without_the_guard_trains_and_still_applies_no_inf(strategy: Any) -> None:
    x, y = data()
    model = build(strategy)
    guard = DivergenceGuard()
    fit(model, x, y, epochs=1, callbacks=[guard])
    assert guard.summary()["stopped"]
    before = model.get_weights()
    fit(model, x, y, epochs=1)  # the step keeps the guard's check, but holds nothing still
    after = model.get_weights()
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert all_finite(model)
