"""The official tutorials' patterns taken as they are: windowed examples, a self-batching
``dataset_fn(input_context)``, evaluation without the strategy, ``validation_split``.

Every Keras test counts example ids inside the model's step (``id_metrics``), apart from the
builder's own bookkeeping, and runs on Keras 3 and (``-m keras``) tf_keras.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from support.id_metrics import id_metrics

import tfdp_utils as tdu
from tfdp_utils.errors import StrategyMismatchError

WINDOW = 11  # 10 inputs and 10 targets per window, as the text-generation tutorial's split


def _mirrored(n: int = 2) -> Any:
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])


def _split_window(window: Any) -> Any:
    # Inputs and targets as the tutorial's split_input_target; the window's id as the label
    # the id metrics count (its first token // WINDOW).
    inputs = tf.cast(window[:-1], tf.float32)
    return inputs, window[0] // WINDOW


def _windows(n: int) -> Any:
    return tf.data.Dataset.range(n * WINDOW).batch(WINDOW, drop_remainder=True).map(_split_window)


def _id_model(strategy: Any, n: int, inputs: int) -> Any:
    from tfdp_utils._tf import keras

    with strategy.scope():
        model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", metrics=id_metrics(n))
    return model


# ---------------------------------------------------------------- telling elements apart


@pytest.mark.parametrize(
    ("source", "element", "steps", "sizes"),
    [
        # A batch at the end: batches, unbatched and batched again (10 -> 4 + 4 + 2).
        (tf.data.Dataset.range(10).batch(5).prefetch(1), "auto", 3, [4, 4, 2]),
        # A map that changes the batch's leading size: windows, one example each.
        (_windows(5), "auto", 2, [4, 1]),
        # An ambiguous map, said to be examples: each batch of 2 is one example.
        (tf.data.Dataset.range(10).batch(2).map(lambda b: b * 2), "example", 2, [4, 1]),
        (tf.data.Dataset.range(10).batch(2).map(lambda b: b * 2), "batch", 3, [4, 4, 2]),
    ],
)
def test_examples_and_batches_are_told_apart(
    source: Any, element: str, steps: int, sizes: list[int]
) -> None:
    strategy = _mirrored(2)
    dist = tdu.build_distributed_dataset(
        source, strategy=strategy, global_batch_size=4, element=element
    )
    got = []
    for step in dist:
        first = tf.nest.flatten(step)[0]
        got.append(sum(int(p.shape[0]) for p in strategy.experimental_local_results(first)))
    assert got == sizes
    assert dist.tfdp_info.steps_per_epoch == steps and dist.tfdp_info.exact


def test_a_dataset_of_batches_gives_each_example_once_with_its_own_batch_size() -> None:
    strategy = _mirrored(2)
    source = tf.data.Dataset.range(13).batch(6, drop_remainder=True)  # 12 examples
    dist = tdu.build_distributed_dataset(source, strategy=strategy)  # global batch 6
    ids = [
        i
        for step in dist
        for part in strategy.experimental_local_results(step)
        for i in part.numpy().tolist()
    ]
    assert sorted(ids) == list(range(12))
    assert dist.tfdp_info.global_batch_size == 6 and dist.tfdp_info.examples_per_epoch == 12


def test_element_errors_say_what_to_pass() -> None:
    strategy = _mirrored(2)
    with pytest.raises(ValueError, match="element='bogus' is not supported"):
        tdu.build_distributed_dataset(
            np.arange(4), strategy=strategy, global_batch_size=2, element="bogus"
        )
    with pytest.raises(ValueError, match=r"element=.batch. applies to a tf\.data\.Dataset"):
        tdu.build_distributed_dataset(
            np.arange(4), strategy=strategy, global_batch_size=2, element="batch"
        )
    with pytest.raises(ValueError, match=r"batches of unknown size.*global_batch_size="):
        tdu.build_distributed_dataset(tf.data.Dataset.range(8).batch(3), strategy=strategy)

    def asks_but_hides_its_batch(context: Any) -> Any:
        size = context.get_per_replica_batch_size(4)
        return tf.data.Dataset.range(8).batch(size).map(lambda b: b + 1)

    with pytest.raises(ValueError, match=r"followed by a map.*per-replica batches"):
        tdu.build_distributed_dataset(asks_but_hides_its_batch, strategy=strategy)

    def batches(context: Any) -> Any:
        return tf.data.Dataset.range(8).batch(context.get_per_replica_batch_size(4))

    with pytest.raises(
        ValueError, match=r"shuffle_buffer_size=8 cannot apply.*inside the function"
    ):
        tdu.build_distributed_dataset(batches, strategy=strategy, shuffle_buffer_size=8)
    with pytest.raises(
        ValueError, match=r"global_batch_size=8 gives 4 .*get_per_replica_batch_size\(4\)"
    ):
        tdu.build_distributed_dataset(batches, strategy=strategy, global_batch_size=8)
    with pytest.raises(TypeError, match="takes a dataset from build_distributed_dataset"):
        tdu.single_device_dataset(tf.data.Dataset.range(3))


def test_a_self_batching_function_is_called_once_and_counted_exactly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = _mirrored(2)
    calls = []

    def dataset_fn(context: Any) -> Any:
        calls.append(context.input_pipeline_id)
        size = context.get_per_replica_batch_size(8)
        return tf.data.Dataset.range(20).batch(size).prefetch(2)

    with caplog.at_level("INFO", logger="tfdp_utils"):
        dist = tdu.build_distributed_dataset(dataset_fn, strategy=strategy)
    assert calls == [0]
    info = dist.tfdp_info
    # Its dataset has a known size: 3 steps of 8, 8 and 4 examples, counted exactly.
    assert (info.global_batch_size, info.per_replica_batch_size, info.exact) == (8, 4, True)
    assert (info.steps_per_epoch, info.examples_per_epoch) == (3, 20)
    assert "batches itself (4 per replica" in dist.tfdp_plan.reason
    assert "Counted: the 3 steps per epoch" in caplog.text
    parts = [
        [p.numpy().tolist() for p in strategy.experimental_local_results(step)] for step in dist
    ]
    assert parts[-1] == [[16, 17, 18, 19], []]  # the function's batches as they are
    assert sorted(i for step in parts for part in step for i in part) == list(range(20))
    single = tdu.single_device_dataset(dist)
    assert [b.numpy().tolist() for b in single][-1] == [16, 17, 18, 19]  # batches of 8 on 1


# -------------------------------------------------------------------- with Keras, counted


@pytest.mark.keras
def test_windowed_examples_train_each_window_once() -> None:
    n = 13
    strategy = _mirrored(2)
    dist = tdu.build_distributed_dataset(
        _windows(n), strategy=strategy, global_batch_size=4, shuffle_buffer_size=n, seed=2
    )
    model = _id_model(strategy, n, WINDOW - 1)
    history = model.fit(dist, epochs=2, verbose=0)
    assert history.history["seen"] == [n, n] and history.history["once"] == [n, n]
    assert dist.tfdp_info.examples_per_epoch == n


@pytest.mark.keras
def test_the_input_tutorials_dataset_fn_trains_each_example_once() -> None:
    from tfdp_utils._tf import IS_KERAS3

    n, global_batch = 48, 8
    x = np.arange(n, dtype="float32").reshape(-1, 1)

    def dataset_fn(input_context: Any) -> Any:
        batch_size = input_context.get_per_replica_batch_size(global_batch)
        dataset = tf.data.Dataset.from_tensor_slices((x, x))
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return dataset.batch(batch_size).prefetch(2)

    strategy = _mirrored(2)
    # tf_keras needs steps_per_epoch for a source function (its steps are unknown), and then
    # keeps one iterator: the batches repeat, and 6 steps are one pass.
    dist = tdu.build_distributed_dataset(dataset_fn, strategy=strategy, repeat=not IS_KERAS3)
    assert dist.tfdp_info.global_batch_size == global_batch
    model = _id_model(strategy, n, 1)
    steps = None if IS_KERAS3 else n // global_batch
    history = model.fit(dist, epochs=2, steps_per_epoch=steps, verbose=0)
    assert history.history["seen"] == [n, n] and history.history["once"] == [n, n]


@pytest.mark.keras
def test_a_model_without_the_strategy_evaluates_the_same_data(tmp_path: Path) -> None:
    from tfdp_utils._tf import keras

    n = 13
    strategy = _mirrored(2)
    ids = np.arange(n, dtype="float32").reshape(-1, 1)
    dist = tdu.build_distributed_dataset((ids, ids), strategy=strategy, global_batch_size=4)
    model = _id_model(strategy, n, 1)
    model.fit(dist, epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path, compile=False)  # outside the scope, as the tutorial
    loaded.compile(loss="mse", metrics=id_metrics(n))
    with pytest.raises(StrategyMismatchError, match=r"single_device_dataset\(x\)"):
        loaded.evaluate(dist, verbose=0)
    single = tdu.single_device_dataset(dist)
    assert single.tfdp_info.global_batch_size == 4 and single.tfdp_info.num_replicas_in_sync == 1
    results = loaded.evaluate(single, verbose=0, return_dict=True)
    assert results["seen"] == n and results["once"] == n


@pytest.mark.keras
def test_validation_split_takes_the_last_fraction_before_shuffling() -> None:
    n = 13  # Keras: floor(13 * 0.8) = 10 train, the last 3 validate
    strategy = _mirrored(2)
    ids = np.arange(n, dtype="float32").reshape(-1, 1)
    train, val = tdu.split_for_validation(
        (ids, ids),
        validation_split=0.2,
        strategy=strategy,
        global_batch_size=2,
        shuffle_buffer_size=n,
        seed=5,
    )
    validation_ids = [i for _, y in tdu.single_device_dataset(val) for i in y.numpy().ravel()]
    assert validation_ids == [10, 11, 12]
    model = _id_model(strategy, n, 1)
    with pytest.raises(ValueError, match=r"tdu\.split_for_validation"):
        model.fit(train, validation_split=0.2, verbose=0)
    history = model.fit(train, validation_data=val, epochs=2, verbose=0).history
    assert history["seen"] == [10, 10] and history["once"] == [10, 10]
    assert history["val_seen"] == [3, 3] and history["val_once"] == [3, 3]


def test_validation_split_of_a_dataset_and_its_errors(tmp_path: Path) -> None:
    strategy = _mirrored(2)
    train, val = tdu.split_for_validation(
        _windows(10), validation_split=0.25, strategy=strategy, global_batch_size=2
    )
    assert (train.tfdp_info.examples_per_epoch, val.tfdp_info.examples_per_epoch) == (7, 3)
    last = [int(y) for _, ys in tdu.single_device_dataset(val) for y in ys.numpy()]
    assert last == [7, 8, 9]
    split = tdu.split_for_validation
    with pytest.raises(ValueError, match="between 0 and 1"):
        split(np.arange(10), validation_split=1.5, global_batch_size=2)
    with pytest.raises(ValueError, match="too few to split"):
        split(np.arange(3), validation_split=0.9, global_batch_size=2)
    with pytest.raises(ValueError, match="shuffled before the split"):
        split(tf.data.Dataset.range(10).shuffle(10), validation_split=0.2, global_batch_size=2)
    with pytest.raises(ValueError, match="size is unknown"):
        split(
            tf.data.Dataset.range(10).filter(lambda i: i > 2),
            validation_split=0.2,
            global_batch_size=2,
        )
    with pytest.raises(TypeError, match="received files"):
        path = tmp_path / "a.tfrecord"
        path.write_bytes(b"")
        split(str(path), validation_split=0.2, global_batch_size=2)
