"""Counts bound to the data each ``fit`` call trains on, and epochs that end.

Every figure here is checked against an independent count: the examples the model's step
actually received, counted inside the step (``id_metrics``-style, by batch sizes summed in a
variable), never against the logger's own arithmetic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import tfdp_utils as tdu
from tfdp_utils._tf import IS_KERAS3, keras
from tfdp_utils.callbacks import ThroughputLogger
from tfdp_utils.compat import _fit_binding as fit_binding
from tfdp_utils.throughput import _tags as tags

pytestmark = pytest.mark.keras

TRAIN, VAL, BATCH, VAL_BATCH = 1000, 300, 64, 100


def strategy_of(replicas: int) -> Any:
    if replicas == 1:
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


class CountingModel(keras.Model):  # type: ignore[misc]
    """A linear model that counts, in a variable, the examples it is trained on.

    Counted in ``call`` with ``training=True`` (what every train step runs, also
    tdu.enable_gradient_accumulation's): one copy per replica, summed when read.
    """

    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(1)
        self.seen = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
        )

    def call(self, x: Any, training: Any = None) -> Any:
        if training:
            self.seen.assign_add(tf.cast(tf.shape(x)[0], tf.int64))
        return self.dense(x)


def make_model(strategy: Any) -> Any:
    with strategy.scope():
        model = CountingModel()
        model.build((None, 4))
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)).astype("float32"), rng.normal(size=(n, 1)).astype("float32")


def last_event(run: Path, tag: str) -> tuple[int, float]:
    acc = EventAccumulator(str(run), size_guidance={"tensors": 0})
    acc.Reload()
    event = acc.Tensors(tag)[-1]
    return event.step, float(tf.make_ndarray(event.tensor_proto))


@pytest.mark.parametrize("replicas", [1, 2], ids=["1rep", "2rep"])
def test_second_fit_with_validation_data_counts_its_training_data(
    replicas: int, tmp_path: Path
) -> None:
    strategy = strategy_of(replicas)
    train = tdu.build_distributed_dataset(
        arrays(TRAIN, 0), strategy=strategy, global_batch_size=BATCH
    )
    val = tdu.build_distributed_dataset(
        arrays(VAL, 1), strategy=strategy, global_batch_size=VAL_BATCH
    )
    model = make_model(strategy)
    first = ThroughputLogger(tmp_path / "first", log_every_n_steps=4, warmup_steps=2)
    model.fit(train, epochs=2, verbose=0, callbacks=[first])
    # Between fits: evaluate and predict on other data, and another model trained on it.
    model.evaluate(val, verbose=0)
    model.predict(val, verbose=0)
    other = make_model(strategy)
    other_logger = ThroughputLogger(tmp_path / "other", log_every_n_steps=2, warmup_steps=1)
    other.fit(val, epochs=1, verbose=0, callbacks=[other_logger])
    seen_before = int(model.seen.numpy())
    second = ThroughputLogger(tmp_path / "second", log_every_n_steps=4, warmup_steps=2)
    model.fit(train, epochs=2, validation_data=val, verbose=0, callbacks=[second])
    trained = int(model.seen.numpy()) - seen_before
    assert trained == 2 * TRAIN  # the independent count
    assert second.summary()["examples"] == trained
    assert first.summary()["examples"] == seen_before == 2 * TRAIN
    assert other_logger.summary()["examples"] == int(other.seen.numpy()) == VAL
    # TensorBoard ends on the same totals.
    assert last_event(tmp_path / "second" / tags.GLOBAL_RUN, tags.EXAMPLES) == (
        int(model.optimizer.iterations.numpy()),
        float(2 * TRAIN),
    )
    assert last_event(tmp_path / "other" / tags.GLOBAL_RUN, tags.EXAMPLES)[1] == VAL


@pytest.mark.parametrize("replicas", [1, 2], ids=["1rep", "2rep"])
def test_every_fit_ends_with_its_total(replicas: int, tmp_path: Path) -> None:
    # 1,000 examples at 64 per step: 16 steps a epoch (the last one 40), 4 epochs, 64 steps.
    strategy = strategy_of(replicas)
    dist = tdu.build_distributed_dataset(
        arrays(TRAIN, 2), strategy=strategy, global_batch_size=BATCH
    )
    model = make_model(strategy)
    logger = ThroughputLogger(tmp_path, log_every_n_steps=4, warmup_steps=3)
    model.fit(dist, epochs=4, verbose=0, callbacks=[logger])
    summary = logger.summary()
    assert int(model.seen.numpy()) == 4 * TRAIN == summary["examples"]
    assert summary["step"] == 64
    assert last_event(tmp_path / tags.GLOBAL_RUN, tags.EXAMPLES) == (64, 4000.0)
    per_replica = [
        last_event(tmp_path / tags.replica_run(k), tags.EXAMPLES) for k in range(replicas)
    ]
    assert [step for step, _ in per_replica] == [64] * replicas
    assert [int(v) for _, v in per_replica] == summary["replica_examples"]
    # The last window has a rate, and ends at the final step.
    assert last_event(tmp_path / tags.GLOBAL_RUN, tags.EXAMPLES_PER_SEC)[0] == 64
    assert summary["last_window"]["step"] == 64


def test_short_fit_still_writes_its_count(tmp_path: Path) -> None:
    # Fewer steps than the warm-up: no rate, but the count at the final step is written.
    strategy = strategy_of(2)
    dist = tdu.build_distributed_dataset(arrays(200, 3), strategy=strategy, global_batch_size=64)
    model = make_model(strategy)
    logger = ThroughputLogger(tmp_path)  # defaults: warm-up of 10 steps, windows of 100
    model.fit(dist, epochs=1, verbose=0, callbacks=[logger])
    assert last_event(tmp_path / tags.GLOBAL_RUN, tags.EXAMPLES) == (4, 200.0)
    assert logger.summary()["examples"] == int(model.seen.numpy()) == 200


def test_a_logger_on_plain_data_never_borrows_a_builder_layout(tmp_path: Path) -> None:
    strategy = strategy_of(2)
    dist = tdu.build_distributed_dataset(arrays(128, 4), strategy=strategy, global_batch_size=64)
    model = make_model(strategy)
    model.fit(dist, epochs=1, verbose=0, callbacks=[ThroughputLogger(tmp_path / "a")])
    plain = tf.data.Dataset.from_tensor_slices(arrays(64, 5)).batch(32)
    with pytest.raises(ValueError, match=r"fit trains on a \w+Dataset, which is not a dataset"):
        model.fit(plain, epochs=1, verbose=0, callbacks=[ThroughputLogger(tmp_path / "b")])
    steps = int(model.optimizer.iterations.numpy())
    assert steps == 2  # refused before its first step
    logger = ThroughputLogger(tmp_path / "c", global_batch_size=32)
    before = int(model.seen.numpy())
    model.fit(plain, epochs=1, verbose=0, callbacks=[logger])
    assert logger.summary()["examples"] == int(model.seen.numpy()) - before == 64


def test_a_logger_outside_fit_names_the_arguments(tmp_path: Path) -> None:
    model = make_model(strategy_of(1))
    logger = ThroughputLogger(tmp_path)
    logger.set_model(model)
    with pytest.raises(ValueError, match=r"outside Model.fit.*global_batch_size=.*dataset="):
        logger.on_train_begin()


@pytest.mark.parametrize(
    ("call", "argument", "steps"),
    [
        ("fit", "steps_per_epoch", 16),
        ("validation", "validation_steps", 16),
        ("evaluate", "steps", 16),
        ("predict", "steps", 16),
    ],
)
def test_an_endless_builder_dataset_without_steps_fails_at_once(
    call: str, argument: str, steps: int
) -> None:
    strategy = strategy_of(2)
    endless = tdu.build_distributed_dataset(
        arrays(TRAIN, 6), strategy=strategy, global_batch_size=BATCH, repeat=True
    )
    once = tdu.build_distributed_dataset(
        arrays(TRAIN, 6), strategy=strategy, global_batch_size=BATCH
    )
    model = make_model(strategy)
    calls = {
        "fit": lambda: model.fit(endless, epochs=1, verbose=0),
        "validation": lambda: model.fit(once, validation_data=endless, epochs=1, verbose=0),
        "evaluate": lambda: model.evaluate(endless, verbose=0),
        "predict": lambda: model.predict(endless, verbose=0),
    }
    with pytest.raises(
        fit_binding.EndlessEpochError, match=rf"no {argument}=.*Pass {argument}={steps} "
    ):
        calls[call]()
    assert int(model.optimizer.iterations.numpy()) == 0
    assert int(model.seen.numpy()) == 0
    # With the step count it trains, one pass per epoch.
    if call == "fit":
        model.fit(endless, epochs=2, steps_per_epoch=steps, verbose=0)
        assert int(model.seen.numpy()) == 2 * steps * BATCH


def test_an_endless_source_without_steps_says_so() -> None:
    strategy = strategy_of(2)
    endless = tdu.build_distributed_dataset(
        tf.data.Dataset.range(10**6)
        .repeat()
        .map(lambda i: (tf.fill([4], tf.cast(i, tf.float32)), tf.zeros([1]))),
        strategy=strategy,
        global_batch_size=BATCH,
    )
    model = make_model(strategy)
    with pytest.raises(fit_binding.EndlessEpochError, match="the steps you want per epoch") as e:
        model.fit(endless, epochs=1, verbose=0)
    # repeat='epochs' needs counted epochs: not suggested where the builder would refuse it.
    assert "repeat='epochs'" not in str(e.value)


def test_a_finite_source_of_unknown_size_repeated_is_not_called_infinite() -> None:
    strategy = strategy_of(2)
    unsized = (
        tf.data.Dataset.range(40)
        .filter(lambda i: i % 2 == 0)
        .map(lambda i: (tf.fill([4], tf.cast(i, tf.float32)), tf.zeros([1])))
    )
    endless = tdu.build_distributed_dataset(
        unsized, strategy=strategy, global_batch_size=BATCH, repeat=True
    )
    model = make_model(strategy)
    with pytest.raises(fit_binding.EndlessEpochError) as raised:
        model.fit(endless, epochs=1, verbose=0)
    message = str(raised.value)
    assert "the dataset's size is unknown" in message and "is infinite" not in message
    assert "repeat='epochs'" not in message


@pytest.mark.parametrize("replicas", [1, 2], ids=["1rep", "2rep"])
def test_counts_stay_exact_under_gradient_accumulation(replicas: int, tmp_path: Path) -> None:
    # 1,000 examples at 64 per micro-batch: 16 micro-batches an epoch, 2 per update.
    strategy = strategy_of(replicas)
    if replicas == 2:
        tdu.compat.apply_for_strategy(strategy)  # keras#20582 under MirroredStrategy
    dist = tdu.build_distributed_dataset(
        arrays(TRAIN, 7), strategy=strategy, global_batch_size=BATCH
    )
    with strategy.scope():
        model = CountingModel()
        model.build((None, 4))
        if IS_KERAS3:
            optimizer = keras.optimizers.SGD(0.01, gradient_accumulation_steps=2)
        else:
            optimizer = keras.optimizers.SGD(0.01)
        model.compile(optimizer=optimizer, loss="mse")
    if not IS_KERAS3:
        tdu.enable_gradient_accumulation(model, 2)
    logger = ThroughputLogger(tmp_path, log_every_n_steps=4, warmup_steps=2)
    model.fit(dist, epochs=2, verbose=0, callbacks=[logger])
    summary = logger.summary()
    assert int(model.seen.numpy()) == 2 * TRAIN == summary["examples"]
    assert int(model.optimizer.iterations.numpy()) == 16  # updates
    assert summary["step"] == 32  # micro-batches, the step axis
    assert summary["accumulation_steps"] == 2
    assert summary["updates_per_sec"] == pytest.approx(summary["steps_per_sec"] / 2)
    assert last_event(tmp_path / tags.GLOBAL_RUN, tags.EXAMPLES) == (32, 2000.0)
    acc = EventAccumulator(str(tmp_path / tags.GLOBAL_RUN), size_guidance={"tensors": 0})
    acc.Reload()
    described = acc.SummaryMetadata(tags.STEPS_PER_SEC).summary_description
    assert "micro-batches (gradient accumulation: 2 per optimizer update" in described


def test_counts_from_an_inexact_layout_are_labelled_derived(tmp_path: Path) -> None:
    # A layout whose per-step counts are not known (DatasetInfo.exact=False: a self-batching
    # function, the tf.data service's distributed_epoch) is counted, and says it is derived.
    from tfdp_utils._dataset_info import DatasetInfo

    strategy = strategy_of(2)
    info = DatasetInfo(
        global_batch_size=BATCH,
        per_replica_batch_size=BATCH // 2,
        num_replicas_in_sync=2,
        exact=False,
    )
    plain = tf.data.Dataset.from_tensor_slices(arrays(128, 8)).batch(BATCH)
    model = make_model(strategy)
    model.fit(plain, epochs=1, verbose=0, callbacks=[ThroughputLogger(tmp_path, dataset=info)])
    acc = EventAccumulator(str(tmp_path / tags.GLOBAL_RUN), size_guidance={"tensors": 0})
    acc.Reload()
    assert acc.SummaryMetadata(tags.EXAMPLES).summary_description.startswith("Derived count")
    replica = EventAccumulator(str(tmp_path / tags.replica_run(0)), size_guidance={"tensors": 0})
    replica.Reload()
    assert "split evenly" in replica.SummaryMetadata(tags.EXAMPLES_PER_SEC).summary_description
