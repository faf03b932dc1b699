"""check_replica_equivalence: the tutorial's models pass; three planted replica bugs are caught;
a run that compared nothing or blew up is never "the same"; bad arguments are refused first."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import tfdp_utils as tdu
from tfdp_utils import demo
from tfdp_utils._tf import keras, tf
from tfdp_utils.doctor._comparison import (
    DISTRIBUTED_RUN,
    OVERFLOW_BOUND,
    REFERENCE_RUN,
    EquivalenceReport,
    StepRecord,
    compare_records,
)
from tfdp_utils.errors import ReplicaDivergenceError, ReplicaDivergenceWarning
from tfdp_utils.strategy import _choice as choice

GLOBAL_BATCH = 16


def _strategy():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _synthetic(features: int = 6, examples: int = 4 * GLOBAL_BATCH):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(examples, features)).astype("float32")
    y = rng.integers(0, 3, size=examples).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


# ------------------------------------------------------------------------- pure comparison


def _record(step: int, loss: float, kernel: float) -> StepRecord:
    return StepRecord(step, {"loss": loss}, {"kernel": np.full((2, 2), kernel, "float32")})


def test_compare_records_finds_the_first_divergent_step_and_nans() -> None:
    reference = [_record(1, 1.0, 0.5), _record(2, 0.9, 0.4), _record(3, 0.8, 0.3)]
    distributed = [_record(1, 1.0, 0.5), _record(2, 0.9, 0.41), _record(3, math.nan, 0.3)]
    found = compare_records(reference, distributed, rtol=1e-4, atol=1e-5)
    assert found["first_divergent_step"] == 2
    assert found["divergent"] == ("kernel", "loss")
    assert found["weight_differences"]["kernel"] == pytest.approx(0.01, rel=1e-3)
    assert found["nan_step_distributed"] == 3 and found["nan_step_reference"] is None
    same = compare_records(reference, reference, rtol=0.0, atol=0.0)
    assert same["first_divergent_step"] is None and same["max_weight_difference"] == 0.0


def test_compare_records_refuses_different_steps() -> None:
    with pytest.raises(ValueError, match="different steps"):
        compare_records([_record(1, 1.0, 0.5)], [_record(2, 1.0, 0.5)], rtol=0, atol=0)


def _report(found: dict, *, trajectory_compared: bool = True) -> EquivalenceReport:
    return EquivalenceReport(
        strategy="MirroredStrategy",
        num_replicas=2,
        steps=len(found["recorded_steps"]),
        random_in_training=not trajectory_compared,
        replicas_share_random_numbers=False,
        trajectory_compared=trajectory_compared,
        rtol=1e-4,
        atol=1e-5,
        **found,
    )


def _runs(reference_kernel: float, distributed_kernel: float, *, at_step: int = 2):
    """Two 3-step runs that agree except for the kernel at ``at_step`` and after."""
    reference = [_record(s, 1.0, reference_kernel if s >= at_step else 0.5) for s in (1, 2, 3)]
    distributed = [_record(s, 1.0, distributed_kernel if s >= at_step else 0.5) for s in (1, 2, 3)]
    return reference, distributed


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["reference", "distributed", "both"])
def test_nan_and_inf_on_either_side_are_divergence(bad: float, where: str) -> None:
    reference, distributed = _runs(
        bad if where in ("reference", "both") else 0.4,
        bad if where in ("distributed", "both") else 0.4,
    )
    for trajectory_compared in (True, False):  # a random model's blow-up is judged too
        report = _report(
            compare_records(reference, distributed, rtol=1e-4, atol=1e-5),
            trajectory_compared=trajectory_compared,
        )
        assert not report.ok, report.summary()
        assert "DIVERGED" in report.summary() and "the same" not in report.summary()
    assert report.first_divergent_step == 2 and report.divergent == ("kernel",)
    assert math.isinf(report.max_weight_difference)
    runs = {"reference": [REFERENCE_RUN], "distributed": [DISTRIBUTED_RUN]}
    expected = runs.get(where, [REFERENCE_RUN, DISTRIBUTED_RUN])
    assert sorted(found.run for found in report.non_finite) == sorted(expected)
    for found in report.non_finite:
        assert (found.step, found.name) == (2, "kernel")
        assert found.value == bad or (math.isnan(bad) and math.isnan(found.value))
        assert f"{found.run}: step 2, kernel = " in report.summary()


def test_an_infinite_reference_does_not_widen_the_tolerance() -> None:
    # The old rule |b - a| <= atol + rtol * |a| let inf "agree" with any finite value.
    reference, distributed = _runs(math.inf, 0.4)
    found = compare_records(reference, distributed, rtol=1e-4, atol=1e-5)
    assert found["divergent"] == ("kernel",) and found["nan_step_reference"] == 2
    assert found["nan_step_distributed"] is None


@pytest.mark.parametrize("rtol", [1e-4, 1e-2, 0.5])
@pytest.mark.parametrize("order", ["grown_in_the_reference", "grown_under_the_strategy"])
def test_weights_that_overflowed_are_divergence_in_both_directions(rtol: float, order: str) -> None:
    # Documented rule: a value beyond OVERFLOW_BOUND (2**64, about 1.8e19) never agrees, so a
    # relative tolerance cannot call a difference of 1e19 "the same".
    small, large = 1e22, 1e22 * (1 + 1e-3)
    first, second = (small, large) if order == "grown_in_the_reference" else (large, small)
    reference, distributed = _runs(first, second)
    report = _report(compare_records(reference, distributed, rtol=rtol, atol=1e-5))
    assert not report.ok and report.first_divergent_step == 2, report.summary()
    assert report.max_weight_difference == pytest.approx(1e19, rel=1e-3)  # float32
    assert {(f.run, f.step, f.name) for f in report.non_finite} == {
        (REFERENCE_RUN, 2, "kernel"),
        (DISTRIBUTED_RUN, 2, "kernel"),
    }
    assert "beyond +-1.8e+19" in report.summary() and "DIVERGED" in report.summary()
    # Equal overflowing values are a blow-up too, not agreement.
    reference, distributed = _runs(1e22, 1e22)
    assert not _report(compare_records(reference, distributed, rtol=rtol, atol=1e-5)).ok


def test_the_overflow_bound_is_where_a_square_leaves_float32() -> None:
    assert np.isfinite(np.float32(OVERFLOW_BOUND / 2) ** 2)
    with np.errstate(over="ignore"):
        assert np.isinf(np.float32(OVERFLOW_BOUND * 2) ** 2)
    below, above = _runs(OVERFLOW_BOUND / 2, OVERFLOW_BOUND / 2), _runs(1e20, 1e20)
    assert _report(compare_records(*below, rtol=1e-4, atol=1e-5)).ok
    assert not _report(compare_records(*above, rtol=1e-4, atol=1e-5)).ok


@pytest.mark.parametrize("order", ["larger_in_the_reference", "larger_under_the_strategy"])
def test_the_relative_tolerance_is_symmetric(order: str) -> None:
    # |a - b| <= atol + rtol * min(|a|, |b|): which run is the reference does not matter.
    def verdict(a: float, b: float, rtol: float) -> bool:
        first, second = (b, a) if order == "larger_in_the_reference" else (a, b)
        return _report(compare_records(*_runs(first, second), rtol=rtol, atol=0.0)).ok

    assert verdict(1000.0, 1000.0 * (1 + 1e-6), rtol=1e-4)
    assert not verdict(1000.0, 1000.0 * (1 + 1e-3), rtol=1e-4)
    # 1 vs 2 at rtol=0.5: the old rule (scaled by the reference) passed it one way only.
    assert not verdict(1.0, 2.0, rtol=0.5)
    assert verdict(1.0, 1.4, rtol=0.5)


# --------------------------------------------------------------------- the tutorial passes


@pytest.fixture(scope="module")
def digits():
    _, (x, y), _ = demo.load_data(prefer_mnist=False)
    return tf.data.Dataset.from_tensor_slices((x[:128], y[:128])).batch(32)


@pytest.mark.keras
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_the_tutorials_models_train_the_same_on_two_replicas(kind: str, digits) -> None:
    def model_fn():
        model = demo.build_model(kind)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        return model

    report = tdu.check_replica_equivalence(model_fn, digits, strategy=_strategy(), steps=4)
    assert report.ok, report.summary()
    assert report.num_replicas == 2 and report.steps == 4
    assert report.recorded_steps == (1, 2, 3, 4)
    assert report.trajectory_compared and not report.random_in_training
    assert report.max_weight_difference < 1e-4
    assert report.first_divergent_step is None


# ------------------------------------------------------------- planted bug 1: the divisor


class CustomStepModel(keras.Model):  # type: ignore[misc]
    """A user's train_step: per-replica ``reduce_mean`` (the bug) or the global-batch mean."""

    def __init__(self, *, per_replica_mean: bool) -> None:
        super().__init__()
        self.per_replica_mean = per_replica_mean
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(3)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, x, training=None):
        return self.out(self.hidden(x))

    @property
    def metrics(self):
        return [self.loss_tracker]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            logits = self(x, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            if self.per_replica_mean:
                loss = tf.reduce_mean(per_example)  # divides by the per-replica batch
            else:
                loss = tf.nn.compute_average_loss(per_example)  # by the global batch
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
        self.loss_tracker.update_state(tf.reduce_mean(per_example))
        return {"loss": self.loss_tracker.result()}


def _custom_model_fn(per_replica_mean: bool):
    def model_fn():
        model = CustomStepModel(per_replica_mean=per_replica_mean)
        model.compile(optimizer=keras.optimizers.SGD(0.5))
        model(tf.zeros((1, 6)))
        return model

    return model_fn


@pytest.mark.keras
def test_a_train_step_that_averages_over_the_per_replica_batch_is_caught() -> None:
    with pytest.raises(ReplicaDivergenceError) as caught:
        tdu.check_replica_equivalence(_custom_model_fn(True), _synthetic(), strategy=_strategy())
    report = caught.value.report
    assert report.first_divergent_step == 1
    assert any("kernel" in name for name in report.divergent)
    assert "DIVERGED" in str(caught.value)


@pytest.mark.keras
def test_the_same_train_step_with_the_global_batch_divisor_passes() -> None:
    report = tdu.check_replica_equivalence(
        _custom_model_fn(False), _synthetic(), strategy=_strategy()
    )
    assert report.ok, report.summary()


# ------------------------------------------------------ planted bug 2: shared random numbers


class FixedSeedNoise(keras.layers.Layer):  # type: ignore[misc]
    """Gaussian noise from an op with a fixed seed: every replica draws the same numbers."""

    def call(self, x, training=None):
        if training:
            return x + tf.random.normal(tf.shape(x), stddev=0.5, seed=7)
        return x


@pytest.mark.keras
def test_a_layer_that_draws_the_same_noise_on_every_replica_is_caught() -> None:
    def model_fn():
        model = keras.Sequential([keras.Input((6,)), FixedSeedNoise(), keras.layers.Dense(3)])
        model.compile(
            optimizer="sgd",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    with pytest.raises(ReplicaDivergenceError, match="same random numbers") as caught:
        tdu.check_replica_equivalence(model_fn, _synthetic(), strategy=_strategy(), steps=2)
    report = caught.value.report
    assert report.random_in_training and report.replicas_share_random_numbers
    assert not report.trajectory_compared


# ------------------------------------------------------------ planted bug 3: a metric's sum


class BatchMaxAbsLogit(keras.metrics.Metric):  # type: ignore[misc]
    """The batch's largest |logit|, stored by assignment: under N replicas the variable's
    aggregation combines the replicas' maxima (Keras 3 averages them, tf_keras adds them up)
    instead of taking the largest."""

    def __init__(self, name: str = "max_abs_logit", **kwargs) -> None:
        super().__init__(name=name, **kwargs)
        self.value = self.add_weight(name="value", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.value.assign(tf.reduce_max(tf.abs(y_pred)))  # a max over replicas is needed

    def result(self):
        return tf.identity(self.value)

    def reset_state(self):
        self.value.assign(0.0)


@pytest.mark.keras
def test_a_metric_aggregated_wrongly_is_caught_and_named() -> None:
    def model_fn():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        model.compile(
            optimizer="sgd",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[BatchMaxAbsLogit()],
        )
        return model

    report = tdu.check_replica_equivalence(
        model_fn, _synthetic(), strategy=_strategy(), steps=2, on_divergence="ignore"
    )
    assert not report.ok
    assert report.divergent == ("max_abs_logit",), report.summary()
    assert report.max_weight_difference < 1e-5  # the training itself is right


# ----------------------------------------------------------------------------- arguments


@pytest.mark.keras
def test_warn_instead_of_raise() -> None:
    with pytest.warns(ReplicaDivergenceWarning, match="DIVERGED"):
        report = tdu.check_replica_equivalence(
            _custom_model_fn(True), _synthetic(), strategy=_strategy(), on_divergence="warn"
        )
    assert not report.ok


@pytest.mark.keras
def test_clear_errors_for_inputs_it_cannot_replay() -> None:
    strategy = _strategy()
    distributed = strategy.experimental_distribute_dataset(_synthetic())
    with pytest.raises(TypeError, match=r"tf\.data\.Dataset of global batches"):
        tdu.check_replica_equivalence(_custom_model_fn(False), distributed, strategy=strategy)
    with pytest.raises(ValueError, match="on_divergence"):
        tdu.check_replica_equivalence(
            _custom_model_fn(False), _synthetic(), strategy=strategy, on_divergence="loud"
        )
    with strategy.scope(), pytest.raises(RuntimeError, match=r"outside strategy\.scope"):
        tdu.check_replica_equivalence(_custom_model_fn(False), _synthetic(), strategy=strategy)


# ------------------------------------------------------- verdicts that must not reassure


def _dense_model_fn(optimizer: Any = "sgd", loss: Any = "sparse_categorical_crossentropy"):
    def model_fn():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        model.compile(optimizer=optimizer, loss=loss)
        return model

    return model_fn


@pytest.mark.keras
@pytest.mark.parametrize("given", ["mirrored_on_one_device", "one_device", "auto_on_one_device"])
def test_one_replica_is_refused_not_passed(given: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Used to return "the same": one device compared with one device compares nothing.
    one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
    strategy = {"mirrored_on_one_device": tf.distribute.MirroredStrategy(["/cpu:0"])}.get(
        given, one_device
    )
    if given == "auto_on_one_device":  # what auto_strategy() picks on a 1-device machine
        monkeypatch.setattr(choice, "auto_strategy", lambda **_: one_device)
        strategy, source = None, "strategy=None chose OneDeviceStrategy"
    else:
        source = f"received {type(strategy).__name__}"
    expected = rf"2 or more replicas, but {source} with 1 replica"
    with pytest.raises(ValueError, match=expected) as raised:
        tdu.check_replica_equivalence(_dense_model_fn(), _synthetic(), strategy=strategy)
    message = str(raised.value)
    assert "nothing would be compared" in message
    assert "set_logical_device_configuration" in message and "tfdp-utils doctor" in message
    assert type(raised.value) is ValueError


def _exploding_model_fn():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
    return model


def _exploding_data():
    rng = np.random.default_rng(5)
    x = (100 * rng.normal(size=(4 * GLOBAL_BATCH, 6))).astype("float32")
    y = (100 * rng.normal(size=(4 * GLOBAL_BATCH, 3))).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


@pytest.mark.keras
def test_training_that_blows_up_is_divergence_and_names_where() -> None:
    # Used to print "the same" next to a loss of 1e26: the relative tolerance grew with it.
    report = tdu.check_replica_equivalence(
        _exploding_model_fn, _exploding_data(), strategy=_strategy(), on_divergence="ignore"
    )
    assert not report.ok, report.summary()
    assert "DIVERGED" in report.summary() and "training blew up" in report.summary()
    # An independent look at the same run: the values it recorded were beyond the bound.
    assert report.non_finite, report.summary()
    first = report.non_finite[0]
    assert first.run in (REFERENCE_RUN, DISTRIBUTED_RUN) and first.step in report.recorded_steps
    assert not math.isfinite(first.value) or abs(first.value) > OVERFLOW_BOUND
    assert first.name == "loss" or any(first.name == n for n in report.weight_differences)
    assert f"step {first.step}, {first.name} = " in report.summary()
    with pytest.raises(ReplicaDivergenceError, match="training blew up"):
        tdu.check_replica_equivalence(_exploding_model_fn, _exploding_data(), strategy=_strategy())


def _batched(x: np.ndarray, y: np.ndarray | None, batch: int) -> Any:
    data = (x, y) if y is not None else x
    return tf.data.Dataset.from_tensor_slices(data).batch(batch)


FEATURES = np.random.default_rng(2).normal(size=(64, 6)).astype("float32")
LABELS = np.random.default_rng(2).integers(0, 3, size=64)


@pytest.mark.keras
def test_a_global_batch_that_does_not_split_is_refused_before_training() -> None:
    # tf_keras reported DIVERGED, Keras 3 a raw AddN shape error.
    with pytest.raises(ValueError, match=r"batch 1 has 15 examples, which does not split evenly"):
        tdu.check_replica_equivalence(
            _dense_model_fn(), _batched(FEATURES, LABELS, 15), strategy=_strategy()
        )
    # A partial last batch (64 = 4 x 15 + 4 -> fine; 61 = 4 x 14 + 5 -> 5 is not).
    partial = _batched(FEATURES[:61], LABELS[:61], 14)
    with pytest.raises(ValueError, match=r"batch 5 has 5 examples.*partial last batch.*steps=4"):
        tdu.check_replica_equivalence(_dense_model_fn(), partial, strategy=_strategy())


@pytest.mark.keras
def test_a_model_instead_of_a_function_is_refused() -> None:
    with pytest.raises(TypeError, match=r"model_fn must be a function.*Keras model \(Sequential\)"):
        tdu.check_replica_equivalence(
            _dense_model_fn()(), _batched(FEATURES, LABELS, 16), strategy=_strategy()
        )

    def uncompiled():  # the old check never saw this on Keras 3 (compiled_loss is a method)
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])

    with pytest.raises(TypeError, match=r"call model\.compile\(\.\.\.\) inside model_fn"):
        tdu.check_replica_equivalence(
            uncompiled, _batched(FEATURES, LABELS, 16), strategy=_strategy()
        )
    built = _dense_model_fn()()
    with pytest.raises(ValueError, match="returned the same Sequential object twice"):
        tdu.check_replica_equivalence(
            lambda: built, _batched(FEATURES, LABELS, 16), strategy=_strategy()
        )


@pytest.mark.keras
def test_unbatched_examples_are_refused() -> None:
    unbatched = tf.data.Dataset.from_tensor_slices((FEATURES, LABELS))
    with pytest.raises(ValueError, match=r"y is a scalar.*looks unbatched.*\.batch\(64\)"):
        tdu.check_replica_equivalence(_dense_model_fn(), unbatched, strategy=_strategy())
    # Labels with the features' length: only the model's input shape tells.
    one_hot = tf.data.Dataset.from_tensor_slices(
        (FEATURES, np.eye(6, dtype="float32")[:1].repeat(64, 0))
    )
    with pytest.raises(ValueError, match=r"shape \(6,\), one dimension fewer than the model's"):
        tdu.check_replica_equivalence(_dense_model_fn(loss="mse"), one_hot, strategy=_strategy())


@pytest.mark.keras
def test_missing_labels_are_refused_for_a_compiled_loss() -> None:
    with pytest.raises(ValueError, match=r"x only \(no labels\).*sparse_categorical_crossentropy"):
        tdu.check_replica_equivalence(
            _dense_model_fn(), _batched(FEATURES, None, 16), strategy=_strategy()
        )


class Autoencoder(keras.Model):  # type: ignore[misc]
    """Its own train_step: learns to reproduce x, from batches without labels."""

    def __init__(self) -> None:
        super().__init__()
        self.code = keras.layers.Dense(3, activation="tanh")
        self.back = keras.layers.Dense(6)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, x, training=None):
        return self.back(self.code(x))

    @property
    def metrics(self):
        return [self.loss_tracker]

    def train_step(self, data):
        x = data
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(self(x, training=True) - x), axis=-1)
            loss = tf.nn.compute_average_loss(per_example)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
        self.loss_tracker.update_state(tf.reduce_mean(per_example))
        return {"loss": self.loss_tracker.result()}


@pytest.mark.keras
def test_a_model_with_its_own_train_step_may_train_without_labels() -> None:
    def model_fn():
        model = Autoencoder()
        model.compile(optimizer=keras.optimizers.SGD(0.1))
        model(tf.zeros((1, 6)))
        return model

    report = tdu.check_replica_equivalence(
        model_fn, _batched(FEATURES, None, 16), strategy=_strategy(), steps=3
    )
    assert report.ok and report.recorded_steps == (1, 2, 3), report.summary()
