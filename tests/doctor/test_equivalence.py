"""check_replica_equivalence: the tutorial's models pass; three planted replica bugs are caught."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tfdp_utils as tdu
from tfdp_utils import demo
from tfdp_utils._tf import keras, tf
from tfdp_utils.doctor._equivalence import StepRecord, compare_records
from tfdp_utils.errors import ReplicaDivergenceError, ReplicaDivergenceWarning

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
