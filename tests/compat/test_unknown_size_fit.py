"""fit(dist, epochs=E) over a builder dataset of unknown size, the same code on both Kerases.

A source whose size tf.data cannot know (a generator) ends each epoch where its data ends.
Keras 3 reads every epoch to that end; tf_keras refused the dataset ("you must specify the
number of steps to run") until the ``tf_keras-datasets`` change taught it to read each epoch,
and each ``validation_data`` pass, to its end as well. Truth comes from inside the model's
step: metrics that count the example ids (``y_true``) each step receives, summed over the
replicas (``support.id_metrics``), never from the builder's own arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from support.id_metrics import id_metrics

import tfdp_utils as tdu
from tfdp_utils._tf import IS_KERAS3, keras, tf

pytestmark = pytest.mark.keras

STRATEGIES = {
    "no strategy": lambda: None,  # TensorFlow's default strategy: a plain tf.data.Dataset
    "1 replica": lambda: tdu.auto_strategy(devices=["/cpu:0"], verbose=False),
    "2 replicas": lambda: tdu.auto_strategy(devices=["/cpu:0", "/cpu:1"], verbose=False),
}


def _unknown_size(size: Callable[[], int]) -> Any:
    """Examples ``(id, id)`` for ids ``0 .. size() - 1``; ``size()`` is read at each pass."""

    def generate() -> Any:
        yield from range(size())

    source = tf.data.Dataset.from_generator(generate, output_signature=tf.TensorSpec([], tf.int64))
    assert int(source.cardinality()) == tf.data.UNKNOWN_CARDINALITY

    def pair(i: Any) -> Any:
        value = tf.reshape(tf.cast(i, tf.float32), [1])
        return value, value

    return source.map(pair)


def _model(strategy: Any, ids: int, *, steps_per_execution: int = 1) -> Any:
    scope = strategy.scope() if strategy is not None else tf.distribute.get_strategy().scope()
    with scope:
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(
            optimizer=keras.optimizers.SGD(1e-4),
            loss="mse",
            metrics=id_metrics(ids),
            steps_per_execution=steps_per_execution,
        )
    return model


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_epoch_and_validation_of_unknown_size_sees_each_example_once(name: str) -> None:
    n, m, epochs = 23, 11, 3  # 23 over batches of 4: a partial last step
    strategy = STRATEGIES[name]()
    dist = tdu.build_distributed_dataset(
        _unknown_size(lambda: n),
        strategy=strategy,
        global_batch_size=4,
        shuffle_buffer_size=n,
        seed=1,
    )
    val = tdu.build_distributed_dataset(
        _unknown_size(lambda: m), strategy=strategy, global_batch_size=4
    )
    assert dist.tfdp_info.steps_per_epoch is None and val.tfdp_info.steps_per_epoch is None
    model = _model(strategy, n)
    history = model.fit(dist, epochs=epochs, validation_data=val, verbose=0)
    assert history.history["seen"] == [n] * epochs
    assert history.history["once"] == [n] * epochs
    assert history.history["val_seen"] == [m] * epochs
    assert history.history["val_once"] == [m] * epochs
    results = model.evaluate(val, verbose=0, return_dict=True)
    assert results["seen"] == m and results["once"] == m


@pytest.mark.skipif(
    IS_KERAS3,
    reason="Keras 3 keeps the first epoch's step count for the later epochs "
    "(EpochIterator._num_batches) and makes each next epoch's iterator before on_epoch_end: "
    "a source that grows between epochs is cut short there",
)
@pytest.mark.parametrize("name", ["1 replica", "2 replicas"])
def test_each_epoch_of_unknown_size_ends_with_its_own_data(name: str) -> None:
    # The source grows by 5 examples each epoch: tf_keras's own rule for a dataset of unknown
    # size (the first epoch's step count kept for the later ones) would cut them short.
    sizes = [23, 28, 33]
    current = {"size": sizes[0]}
    strategy = STRATEGIES[name]()
    dist = tdu.build_distributed_dataset(
        _unknown_size(lambda: current["size"]), strategy=strategy, global_batch_size=4
    )

    class NextSize(keras.callbacks.Callback):  # type: ignore[misc]
        # tf_keras makes the next epoch's iterator after this hook.
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            current["size"] = sizes[min(epoch + 1, len(sizes) - 1)]

    model = _model(strategy, max(sizes))
    history = model.fit(dist, epochs=len(sizes), verbose=0, callbacks=[NextSize()])
    assert history.history["seen"] == sizes
    assert history.history["once"] == sizes


def test_steps_per_execution_over_an_epoch_of_unknown_size() -> None:
    # Keras 3 ends an execution at the end of the data; tf_keras ends an epoch only between
    # executions, so it is refused before the first step, with the fixes.
    n = 23
    strategy = STRATEGIES["2 replicas"]()
    dist = tdu.build_distributed_dataset(
        _unknown_size(lambda: n), strategy=strategy, global_batch_size=4
    )
    model = _model(strategy, n, steps_per_execution=3)
    before = [w.copy() for w in model.get_weights()]
    if IS_KERAS3:
        history = model.fit(dist, epochs=2, verbose=0)
        assert history.history["once"] == [n, n]
        return
    with pytest.raises(ValueError) as caught:
        model.fit(dist, epochs=2, verbose=0)
    message = str(caught.value)
    for needed in (
        "build_distributed_dataset of unknown size",  # what was received
        "steps_per_execution=3",
        "needs steps_per_execution=1",  # what was expected
        "count_examples=True",  # the fixes
        "assert_cardinality(N)",
    ):
        assert needed in message, (needed, message)
    assert int(model.optimizer.iterations.numpy()) == 0
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
