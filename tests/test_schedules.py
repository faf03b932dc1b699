"""WarmupSchedule: values, use in training, serialization on Keras 3 and tf_keras."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.processes import run_python

import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf

pytestmark = pytest.mark.keras

schedules = keras.optimizers.schedules


def _values(schedule, steps):
    return [float(schedule(step)) for step in steps]


def test_linear_ramp_then_constant():
    schedule = tdu.WarmupSchedule(0.4, 4)
    np.testing.assert_allclose(_values(schedule, range(7)), [0.0, 0.1, 0.2, 0.3, 0.4, 0.4, 0.4])


def test_ramp_from_an_initial_rate():
    schedule = tdu.WarmupSchedule(1.0, 5, initial_learning_rate=0.5)
    np.testing.assert_allclose(_values(schedule, range(7)), [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0])


def test_after_starts_at_its_own_step_zero():
    after = schedules.PiecewiseConstantDecay(boundaries=[2], values=[0.4, 0.04])
    schedule = tdu.WarmupSchedule(0.4, 2, after=after)
    # Warm-up steps 0, 1; then `after` at its steps 0, 1, 2 (boundary 2 -> 0.04), 3.
    np.testing.assert_allclose(
        _values(schedule, range(6)), [0.0, 0.2, 0.4, 0.4, 0.4, 0.04], rtol=1e-6
    )


@settings(max_examples=40, deadline=None)
@given(
    target=st.floats(1e-4, 10.0),
    initial_fraction=st.floats(0.0, 1.0),
    warmup=st.integers(1, 1000),
)
def test_ramp_properties(target, initial_fraction, warmup):
    initial = target * initial_fraction
    schedule = tdu.WarmupSchedule(target, warmup, initial_learning_rate=initial)
    steps = sorted({0, warmup // 3, warmup // 2, warmup - 1, warmup, warmup + 1, 3 * warmup})
    values = dict(zip(steps, _values(schedule, steps), strict=True))
    assert values[0] == pytest.approx(initial, rel=1e-5, abs=1e-7)
    assert values[warmup] == pytest.approx(target, rel=1e-5)
    assert values[3 * warmup] == pytest.approx(target, rel=1e-5)
    ordered = [values[s] for s in steps]
    assert all(a <= b * (1 + 1e-6) for a, b in itertools.pairwise(ordered))


def test_step_may_be_an_int64_variable():
    schedule = tdu.WarmupSchedule(0.4, 4)
    step = tf.Variable(2, dtype=tf.int64)
    assert float(schedule(step)) == pytest.approx(0.2)


def test_the_rates_an_optimizer_applies_follow_the_schedule():
    # Independent measurement: loss = w * x with x = 1, so SGD moves w by exactly the rate it
    # applied; read the rates back from the weight after each step.
    schedule = tdu.WarmupSchedule(
        0.4, 4, initial_learning_rate=0.1, after=schedules.ExponentialDecay(0.4, 1, 0.5)
    )
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    model.set_weights([np.zeros((1, 1), "float32")])
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=schedule),
        loss=lambda y_true, y_pred: y_pred,
    )
    weights = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            weights.append(float(self.model.get_weights()[0][0, 0]))

    x = np.ones((7, 1), "float32")
    model.fit(
        x,
        np.zeros((7, 1), "float32"),
        batch_size=1,
        epochs=1,
        verbose=0,
        callbacks=[Record()],
        shuffle=False,
    )
    applied = -np.diff([0.0, *weights])
    expected = [0.1, 0.175, 0.25, 0.325, 0.4, 0.2, 0.1]
    np.testing.assert_allclose(applied, expected, rtol=1e-5)


def test_serialize_deserialize_round_trip():
    after = schedules.CosineDecay(0.4, decay_steps=10, alpha=0.1)
    schedule = tdu.WarmupSchedule(0.4, 5, initial_learning_rate=0.01, after=after, name="warm")
    config = schedules.serialize(schedule)
    json.dumps(config)  # the config must be plain JSON, as .keras files store it
    restored = schedules.deserialize(config)
    assert isinstance(restored, tdu.WarmupSchedule)
    assert isinstance(restored.after, schedules.CosineDecay)
    assert restored.get_config()["after"] == schedule.get_config()["after"]
    steps = range(20)
    np.testing.assert_allclose(_values(restored, steps), _values(schedule, steps), rtol=1e-7)


def test_nested_warmup_schedules_round_trip():
    inner = tdu.WarmupSchedule(0.2, 3, initial_learning_rate=0.1)
    schedule = tdu.WarmupSchedule(0.1, 2, after=inner)
    restored = schedules.deserialize(schedules.serialize(schedule))
    np.testing.assert_allclose(_values(restored, range(8)), _values(schedule, range(8)))


def _compiled_model(schedule):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=schedule, momentum=0.9), loss="mse")
    model.fit(np.ones((8, 3), "float32"), np.ones((8, 1), "float32"), batch_size=4, verbose=0)
    return model


def _schedule_of(optimizer):
    # Both Keras flavours keep the schedule object (not its current value) here.
    return optimizer._learning_rate


def test_keras_model_save_and_load(tmp_path):
    after = schedules.CosineDecay(0.4, decay_steps=10)
    schedule = tdu.WarmupSchedule(0.4, 5, after=after)
    path = tmp_path / "model.keras"
    _compiled_model(schedule).save(path)
    loaded = keras.models.load_model(path)
    restored = _schedule_of(loaded.optimizer)
    assert isinstance(restored, tdu.WarmupSchedule)
    assert int(loaded.optimizer.iterations.numpy()) == 2
    np.testing.assert_allclose(_values(restored, range(20)), _values(schedule, range(20)))


@pytest.mark.slow
def test_keras_model_loads_in_a_fresh_process(tmp_path):
    schedule = tdu.WarmupSchedule(0.4, 5, after=schedules.CosineDecay(0.4, decay_steps=10))
    path = tmp_path / "model.keras"
    _compiled_model(schedule).save(path)
    expected = _values(schedule, range(20))
    result = run_python(
        f"""
        import json
        import tensorflow
        import tfdp_utils as tdu  # registers WarmupSchedule (TensorFlow is in use)
        from tfdp_utils._tf import keras
        model = keras.models.load_model({str(path)!r})
        schedule = model.optimizer._learning_rate
        print(json.dumps([type(schedule).__name__, [float(schedule(s)) for s in range(20)]]))
        """,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    name, values = json.loads(result.stdout.strip().splitlines()[-1])
    assert name == "WarmupSchedule"
    np.testing.assert_allclose(values, expected, rtol=1e-7)


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3])
def test_non_positive_warmup_steps_are_rejected(bad):
    with pytest.raises(
        ValueError,
        match=rf"warmup_steps must be a positive integer, but "
        rf"received warmup_steps={bad}",
    ):
        tdu.WarmupSchedule(0.1, bad)


@pytest.mark.parametrize("bad", [2.5, 5.0, "5", True, None])
def test_non_integer_warmup_steps_are_rejected(bad):
    with pytest.raises(TypeError, match="warmup_steps must be an integer, but received"):
        tdu.WarmupSchedule(0.1, bad)


@pytest.mark.parametrize("bad", [0.1, "cosine", lambda step: 0.1, [0.1]])
def test_after_that_is_not_a_schedule_is_rejected(bad):
    with pytest.raises(
        TypeError, match=r"after must be a keras\.optimizers\.schedules\.LearningRateSchedule"
    ):
        tdu.WarmupSchedule(0.1, 5, after=bad)


def test_constant_after_points_to_the_default():
    with pytest.raises(TypeError, match="pass after=None"):
        tdu.WarmupSchedule(0.1, 5, after=0.1)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_bad_rates_are_rejected(bad):
    with pytest.raises(ValueError, match="target_learning_rate must be a finite number >= 0"):
        tdu.WarmupSchedule(bad, 5)
    with pytest.raises(ValueError, match="initial_learning_rate must be a finite number >= 0"):
        tdu.WarmupSchedule(0.1, 5, initial_learning_rate=bad)


def test_non_numeric_rate_is_rejected():
    with pytest.raises(TypeError, match="target_learning_rate must be a number"):
        tdu.WarmupSchedule("0.1", 5)
