"""DivergenceGuard crossed with steps_per_execution and gradient accumulation, on 2 in-process
replicas (and one): named at the right step, skipped as a run without that batch, or refused
by name where the guard cannot guard it (tf_keras' enable_gradient_accumulation) or where
Keras 3 itself fails without tfdp-utils' workaround (keras#19246, keras#20582).
References are runs of the same strategy without the guard, under op determinism."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from support.guard_loop import guarded_loop

import tfdp_utils as tdu
from tfdp_utils import compat
from tfdp_utils._tf import IS_KERAS3, keras
from tfdp_utils.callbacks import DivergenceGuard

pytestmark = pytest.mark.keras

BATCH = 8  # global: replica 0 gets examples 0..3 of each batch, replica 1 examples 4..7
STEPS = 8
BAD_BATCH = 3
BAD_EXAMPLE = BAD_BATCH * BATCH + 5


@pytest.fixture(autouse=True, scope="module")
def _op_determinism() -> Any:
    from tensorflow.python.framework import config as tf_config

    tf.config.experimental.enable_op_determinism()
    yield
    tf_config.disable_op_determinism()


@pytest.fixture
def strategy() -> Any:
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


@pytest.fixture
def workarounds() -> Any:
    """Keras 3's workarounds for keras#19246 and keras#20582 applied for the test (as
    auto_strategy applies them), and taken out again if the test applied them."""
    issues = ["keras#19246", "keras#20582"]
    newly = [i for i in issues if i not in compat.applied()]
    compat.apply(issues)
    yield
    for issue in newly:
        if issue in compat.applied():
            compat.undo(issue)


@pytest.fixture
def no_workarounds() -> Any:
    """Neither workaround applied for the test; applied again after it where they were."""
    issues = ["keras#19246", "keras#20582"]
    were = [i for i in issues if i in compat.applied()]
    for issue in were:
        compat.undo(issue)
    yield
    if were:
        compat.apply(were)


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.randn(STEPS * BATCH, 4).astype("float32")
    y = rng.randn(STEPS * BATCH, 1).astype("float32")
    x[BAD_EXAMPLE, 2] = np.inf
    return x, y


def build(strategy: Any, **compile_options: Any) -> Any:
    optimizer_options = {}
    if "gradient_accumulation_steps" in compile_options:
        optimizer_options["gradient_accumulation_steps"] = compile_options.pop(
            "gradient_accumulation_steps"
        )
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(3, name="d1"), keras.layers.Dense(1, name="d2")]
        )
        optimizer = keras.optimizers.Adam(0.01, **optimizer_options)
        model.compile(optimizer=optimizer, loss="mse", **compile_options)
    return model


def fit(model: Any, x: np.ndarray, y: np.ndarray, **kwargs: Any) -> Any:
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    return model.fit(dataset, verbose=0, shuffle=False, **kwargs)


def without_bad_batch(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = np.ones(len(x), bool)
    keep[BAD_BATCH * BATCH : (BAD_BATCH + 1) * BATCH] = False
    return x[keep], y[keep]


def assert_same_weights(model: Any, reference: Any) -> None:
    for got, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.usefixtures("workarounds")
def test_steps_per_execution_names_the_step_and_skips_it(strategy: Any) -> None:
    x, y = data()
    model = build(strategy, steps_per_execution=3)  # the bad step is inside an execution
    guard = DivergenceGuard(policy="skip", check_every_n_steps=1)
    fit(model, x, y, epochs=2, callbacks=[guard])
    found = guard.summary()["divergence"]
    assert (found.epoch, found.batch, found.step, found.replicas) == (0, 3, 4, (1,))
    assert guard.summary()["skipped_steps"] == 2 and guard.summary()["steps"] == 2 * STEPS
    reference = build(strategy, steps_per_execution=3)
    fit(reference, *without_bad_batch(x, y), epochs=2)
    assert_same_weights(model, reference)


@pytest.mark.usefixtures("workarounds")
def test_steps_per_execution_under_stop_keeps_the_weights_before_the_step(strategy: Any) -> None:
    x, y = data()
    model = build(strategy, steps_per_execution=2)
    guard = DivergenceGuard(check_every_n_steps=1)
    fit(model, x, y, epochs=2, callbacks=[guard])
    found = guard.divergence
    assert found is not None and (found.batch, found.step, found.replicas) == (3, 4, (1,))
    assert guard.summary()["stopped"]
    reference = build(strategy, steps_per_execution=2)
    fit(reference, x[: BAD_BATCH * BATCH], y[: BAD_BATCH * BATCH], epochs=1)
    assert_same_weights(model, reference)


@pytest.mark.skipif(not IS_KERAS3, reason="tf_keras has no keras#19246")
@pytest.mark.usefixtures("no_workarounds")
def test_keras3_steps_per_execution_without_its_workaround_is_refused_naming_it(
    strategy: Any,
) -> None:
    x, y = data()
    model = build(strategy, steps_per_execution=2)
    with pytest.raises(ValueError, match=r"steps_per_execution=2 over 2 replicas.*keras#19246"):
        fit(model, x, y, epochs=1, callbacks=[DivergenceGuard()])


def test_steps_per_execution_on_one_replica_names_the_step() -> None:
    x, y = data()
    model = build(tf.distribute.get_strategy(), steps_per_execution=3)
    guard = DivergenceGuard(policy="skip", check_every_n_steps=1)
    fit(model, x, y, epochs=1, callbacks=[guard])
    found = guard.summary()["divergence"]
    assert (found.batch, found.step, found.replicas) == (3, 4, (0,))
    assert guard.summary()["skipped_steps"] == 1
    reference = build(tf.distribute.get_strategy(), steps_per_execution=3)
    fit(reference, *without_bad_batch(x, y), epochs=1)
    assert_same_weights(model, reference)


KERAS3_ONLY = pytest.mark.skipif(
    not IS_KERAS3, reason="gradient_accumulation_steps is a Keras 3 optimizer option"
)


@KERAS3_ONLY
@pytest.mark.usefixtures("workarounds")
@pytest.mark.parametrize("replicas", [2, 1])
def test_keras3_gradient_accumulation_checks_each_batch_and_skips_it(
    strategy: Any, replicas: int
) -> None:
    """Each micro-batch is checked before it is accumulated: a skipped one leaves the
    accumulators and the optimizer's counter alone, so the next batch takes its place, as in
    a run without that batch (7 batches: the last one waits in the accumulators in both)."""
    on = strategy if replicas == 2 else tf.distribute.get_strategy()
    x, y = data()
    model = build(on, gradient_accumulation_steps=2)
    guard = DivergenceGuard(policy="skip", check_every_n_steps=1)
    fit(model, x, y, epochs=2, callbacks=[guard])
    found = guard.summary()["divergence"]
    assert (found.epoch, found.batch, found.step) == (0, 3, 4)
    assert found.replicas == ((1,) if replicas == 2 else (0,))
    assert guard.summary()["skipped_steps"] == 2 and guard.summary()["steps"] == 2 * STEPS
    reference = build(on, gradient_accumulation_steps=2)
    fit(reference, *without_bad_batch(x, y), epochs=2)
    assert_same_weights(model, reference)


@KERAS3_ONLY
@pytest.mark.usefixtures("workarounds")
def test_keras3_gradient_accumulation_under_stop_keeps_the_weights_before_the_step(
    strategy: Any,
) -> None:
    x, y = data()
    model = build(strategy, gradient_accumulation_steps=2)
    guard = DivergenceGuard(check_every_n_steps=1)
    fit(model, x, y, epochs=2, callbacks=[guard])
    assert guard.divergence is not None and guard.divergence.step == BAD_BATCH + 1
    assert guard.summary()["stopped"]
    reference = build(strategy, gradient_accumulation_steps=2)
    fit(reference, x[: BAD_BATCH * BATCH], y[: BAD_BATCH * BATCH], epochs=1)
    assert_same_weights(model, reference)


@KERAS3_ONLY
@pytest.mark.usefixtures("no_workarounds")
def test_keras3_gradient_accumulation_without_its_workaround_is_refused_naming_it(
    strategy: Any,
) -> None:
    x, y = data()
    model = build(strategy, gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=2.*keras#20582"):
        fit(model, x, y, epochs=1, callbacks=[DivergenceGuard()])


@pytest.mark.skipif(
    IS_KERAS3, reason="enable_gradient_accumulation is tf_keras' (Keras 3 refuses it)"
)
def test_tf_keras_gradient_accumulation_is_refused_by_name(strategy: Any) -> None:
    x, y = data()
    model = tdu.enable_gradient_accumulation(build(strategy), 2)
    with pytest.raises(ValueError, match="enable_gradient_accumulation"):
        fit(model, x, y, epochs=1, callbacks=[DivergenceGuard()])


def accumulating_loop(
    strategy: Any, x: np.ndarray, y: np.ndarray, guard: Any = None
) -> tuple[Any, Any, int]:
    """``make_distributed_train_step(..., accumulation_steps=2)`` over the builder's batches of
    (x, y) (support.guard_loop): the model, the step and the micro-batches trained before the
    guard said stop."""
    return guarded_loop(strategy, x, y, guard, builder=True, accumulation_steps=2)


def planted(bad_batch: int) -> tuple[np.ndarray, np.ndarray, int]:
    rng = np.random.RandomState(0)
    x = rng.randn(STEPS * BATCH, 4).astype("float32")
    y = rng.randn(STEPS * BATCH, 1).astype("float32")
    bad = bad_batch * BATCH + 5  # replica 1's half of that micro-batch
    x[bad, 2] = np.inf
    return x, y, bad


def assert_names_the_micro_batch(found: Any, bad_batch: int, bad: int) -> None:
    assert found is not None and found.examples_unknown == ""
    assert (found.epoch, found.batch, found.step, found.replicas) == (
        0,
        bad_batch,
        bad_batch + 1,
        (1,),
    )
    first = bad_batch * BATCH + 4
    assert [(e.replica, e.indices, e.non_finite) for e in found.examples] == [
        (1, tuple(range(first, first + 4)), (bad,))
    ]


@pytest.mark.parametrize(
    "bad_batch",
    [2, 3],  # accumulated first in its window of 2 (micro-batches 2, 3), or the one applying it
)
def test_accumulation_steps_in_a_custom_loop_names_the_micro_batch_and_skips_its_update(
    strategy: Any, bad_batch: int
) -> None:
    """Under "skip" the window's accumulated update is not applied, and the accumulators start
    the next window from zero: the loop ends with the weights of a loop without that window's
    two micro-batches (an inf carried over would poison every later window)."""
    x, y, bad = planted(bad_batch)
    guard = DivergenceGuard(policy="skip", check_every_n_steps=1, check_replicas_every=1)
    model, step, trained = accumulating_loop(strategy, x, y, guard)
    assert trained == STEPS and step.pending_micro_steps == 0
    assert_names_the_micro_batch(guard.summary()["divergence"], bad_batch, bad)
    assert guard.summary()["skipped_steps"] == 1 and guard.summary()["steps"] == STEPS
    assert guard.summary()["disagreement"] is None and guard.summary()["checked_at_step"] == STEPS
    keep = np.ones(len(x), bool)
    window = bad_batch // 2 * 2
    keep[window * BATCH : (window + 2) * BATCH] = False
    reference, _, _ = accumulating_loop(strategy, x[keep], y[keep])
    assert_same_weights(model, reference)
    assert all(np.isfinite(w).all() for w in model.get_weights())


def test_accumulation_steps_in_a_custom_loop_stops_before_the_window_is_applied(
    strategy: Any,
) -> None:
    """The inf accumulated in micro-batch 3 of 4 (the first of its window) is never applied:
    the loop stops when the window closes, on the weights of the windows before it."""
    x, y, bad = planted(2)
    guard = DivergenceGuard(check_every_n_steps=1)
    model, _, trained = accumulating_loop(strategy, x, y, guard)
    assert trained == 4 and guard.summary()["stopped"]
    assert_names_the_micro_batch(guard.divergence, 2, bad)
    assert guard.divergence is not None and guard.divergence.variable is not None
    reference, _, _ = accumulating_loop(strategy, x[: 2 * BATCH], y[: 2 * BATCH])
    assert_same_weights(model, reference)
