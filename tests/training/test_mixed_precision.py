"""make_distributed_train_step under mixed_float16 / mixed_bfloat16 on 2 replicas.

The reference is an independent float32 run on one device (a plain GradientTape loop, no
strategy, no loss scaling) over the same global batches.
"""

from __future__ import annotations

import numpy as np
import pytest

import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf
from tfdp_utils.training._mixed_precision import current_loss_scale

pytestmark = pytest.mark.keras

GLOBAL_BATCH = 16
STEPS = 8
# Documented in docs/batching.md: float16 keeps ~3 decimal digits, bfloat16 ~2.
TOLERANCES = {"mixed_float16": 1e-3, "mixed_bfloat16": 5e-3}


def _data(steps: int = STEPS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(steps * GLOBAL_BATCH, 6)).astype("float32")
    y = rng.integers(0, 3, size=steps * GLOBAL_BATCH).astype("int64")
    return x, y


def _model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(3, dtype="float32"),  # logits in float32, as Keras advises
        ]
    )


@pytest.fixture(scope="module")
def initial_weights() -> list[np.ndarray]:
    return [w.copy() for w in _model().get_weights()]


@pytest.fixture(scope="module")
def strategy() -> tf.distribute.Strategy:
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


@pytest.fixture
def policy(request: pytest.FixtureRequest):
    keras.mixed_precision.set_global_policy(request.param)
    yield request.param
    keras.mixed_precision.set_global_policy("float32")


def _float32_reference(initial_weights, x, y):
    model = _model()
    model.set_weights(initial_weights)
    optimizer = keras.optimizers.SGD(0.3)
    losses = []
    for start in range(0, len(x), GLOBAL_BATCH):
        with tf.GradientTape() as tape:
            logits = model(x[start : start + GLOBAL_BATCH], training=True)
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(
                    y[start : start + GLOBAL_BATCH], logits, from_logits=True
                )
            )
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        losses.append(float(loss))
    return losses, model.get_weights()


def _mixed_setup(strategy, initial_weights, loss_scaling):
    with strategy.scope():
        model = _model()
        model.set_weights(initial_weights)
        optimizer = keras.optimizers.SGD(0.3)
        if loss_scaling:
            optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    step = tdu.make_distributed_train_step(
        model,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
        optimizer=optimizer,
        strategy=strategy,
    )
    return model, optimizer, step


def _batches(strategy, x, y):
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    return list(strategy.experimental_distribute_dataset(dataset))


def _max_difference(a, b) -> float:
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b, strict=True))


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"], indirect=True)
def test_mixed_precision_tracks_the_float32_run(strategy, initial_weights, policy):
    x, y = _data()
    keras.mixed_precision.set_global_policy("float32")
    ref_losses, ref_weights = _float32_reference(initial_weights, x, y)
    keras.mixed_precision.set_global_policy(policy)
    model, _, step = _mixed_setup(strategy, initial_weights, policy == "mixed_float16")
    assert model.layers[0].compute_dtype == policy.split("_")[1]
    losses = [float(step(batch)) for batch in _batches(strategy, x, y)]
    tolerance = TOLERANCES[policy]
    print(
        f"{policy}: max loss difference {np.max(np.abs(np.subtract(losses, ref_losses))):.2e}, "
        f"max weight difference {_max_difference(model.get_weights(), ref_weights):.2e}"
    )
    np.testing.assert_allclose(losses, ref_losses, atol=tolerance, rtol=0)
    assert _max_difference(model.get_weights(), ref_weights) <= tolerance
    assert step.skipped_steps == 0
    # It trained as far as float32 did (~0.14 here); a step that divides unscaled gradients
    # by the loss scale moves the weights by ~1/32768 of that.
    assert _max_difference(model.get_weights(), initial_weights) > 0.05


@pytest.mark.parametrize("policy", ["mixed_float16"], indirect=True)
def test_overflow_step_is_skipped_and_counted(strategy, initial_weights, policy):
    x, y = _data(3)
    x[GLOBAL_BATCH + 3, 0] = 1e5  # fine in float32, inf in float16 (max 65504)
    keras.mixed_precision.set_global_policy("float32")
    ref_losses, _ = _float32_reference(initial_weights, x, y)
    assert np.all(np.isfinite(ref_losses))  # float32 does not overflow on this batch
    keras.mixed_precision.set_global_policy(policy)
    model, optimizer, step = _mixed_setup(strategy, initial_weights, loss_scaling=True)
    first, overflowing, last = _batches(strategy, x, y)
    step(first)
    before, scale = model.get_weights(), current_loss_scale(optimizer)
    step(overflowing)
    assert step.skipped_steps == 1
    assert _max_difference(model.get_weights(), before) == 0.0  # not applied
    assert current_loss_scale(optimizer) == scale / 2
    step(last)
    assert step.skipped_steps == 1
    assert _max_difference(model.get_weights(), before) > 1e-4  # training goes on


@pytest.mark.parametrize("policy", ["mixed_float16"], indirect=True)
def test_float16_without_loss_scaling_is_refused(strategy, initial_weights, policy):
    with pytest.raises(ValueError, match=r"computes in float16.*LossScaleOptimizer"):
        _mixed_setup(strategy, initial_weights, loss_scaling=False)


def _float16_layer_model(last_dtype: str = "float32") -> keras.Model:
    # Float32 model (global policy float32), one hidden layer in float16.
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="tanh", dtype="mixed_float16"),
            keras.layers.Dense(3, dtype=last_dtype),
        ]
    )


def test_a_float16_layer_without_loss_scaling_is_refused_too(strategy):
    # Issue 21: only the global policy was caught; a layer's own dtype trained without a word.
    with strategy.scope():
        model = _float16_layer_model()
        optimizer = keras.optimizers.SGD(0.3)
    assert model.compute_dtype == "float32" and model.layers[0].compute_dtype == "float16"
    with pytest.raises(ValueError) as raised:
        tdu.make_distributed_train_step(
            model,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
            optimizer=optimizer,
            strategy=strategy,
        )
    message = str(raised.value)
    name = model.layers[0].name
    assert f"has layers that compute in float16 ('{name}'" in message
    assert "optimizer SGD scales no loss" in message and "LossScaleOptimizer" in message


def test_a_float16_layer_with_loss_scaling_trains(strategy, initial_weights):
    x, y = _data(2)
    with strategy.scope():
        model = _float16_layer_model()
        model.set_weights(initial_weights)
        optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.3))
    step = tdu.make_distributed_train_step(
        model,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
        optimizer=optimizer,
        strategy=strategy,
    )
    for batch in _batches(strategy, x, y):
        step(batch)
    assert _max_difference(model.get_weights(), initial_weights) > 1e-3


def test_bfloat16_layers_need_no_loss_scaling(strategy):
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, dtype="mixed_bfloat16")])
        optimizer = keras.optimizers.SGD(0.3)
    tdu.make_distributed_train_step(
        model,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
        optimizer=optimizer,
        strategy=strategy,
    )
