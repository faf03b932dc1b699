"""fit(dist, epochs=E) over a builder dataset of unknown size, the same code on both Kerases.

A source whose size tf.data cannot know (a generator) ends each epoch where its data ends.
Keras 3 reads every epoch to that end; tf_keras refused the dataset ("you must specify the
number of steps to run") until the ``tf_keras-datasets`` change taught it to read each epoch,
and each ``validation_data`` pass, to its end as well. From the second epoch on, ``fit``
reads the same data through one iterator, each epoch padded to the steps the first one had
(compat change ``fit-one-iterator``). Truth comes from inside the model's step: metrics that
count the example ids (``y_true``) each step receives, summed over the replicas
(``support.id_metrics``), or record them in order, never from the builder's own arithmetic;
iterators are counted where TensorFlow starts one.
"""

from __future__ import annotations

import itertools
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.id_metrics import id_metrics
from tensorflow.python.distribute import input_lib

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


class _Steps(keras.callbacks.Callback):  # type: ignore[misc]
    """Steps Keras ran in each epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.per_epoch: list[int] = []

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.per_epoch.append(0)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.per_epoch[-1] += 1


def _sizes_by_pass(sizes: list[int]) -> Callable[[], int]:
    """``size()`` for :func:`_unknown_size`: ``sizes[k]`` at the source's k-th pass (each
    epoch is one pass, read ahead of training from the second epoch on)."""
    passes = itertools.count()

    def size() -> int:
        return sizes[min(next(passes), len(sizes) - 1)]

    return size


@pytest.mark.parametrize("name", ["1 replica", "2 replicas"])
def test_a_source_that_shrinks_trains_each_epochs_examples_once(name: str) -> None:
    # Epochs after the first are padded to its 6 steps: a shorter one ends in empty steps.
    sizes = [23, 18, 21]
    strategy = STRATEGIES[name]()
    dist = tdu.build_distributed_dataset(
        _unknown_size(_sizes_by_pass(sizes)), strategy=strategy, global_batch_size=4
    )
    steps = _Steps()
    model = _model(strategy, max(sizes))
    history = model.fit(dist, epochs=len(sizes), verbose=0, callbacks=[steps])
    assert history.history["seen"] == sizes
    assert history.history["once"] == sizes
    assert steps.per_epoch == [6] * len(sizes)


@pytest.mark.parametrize("name", ["1 replica", "2 replicas"])
def test_nothing_is_read_past_the_last_epoch(name: str) -> None:
    # The stream of the later epochs ends with the fit's last epoch: no pass of the source
    # starts after it (a read ahead into an epoch no step takes, whose reads the iterator's
    # destruction would wait for), and the fit returns without waiting for that destruction.
    from tfdp_utils.compat import _learned_steps

    passes: list[int] = []

    def size() -> int:
        passes.append(23)
        return 23

    strategy = STRATEGIES[name]()
    dist = tdu.build_distributed_dataset(
        _unknown_size(size), strategy=strategy, global_batch_size=4, shuffle_buffer_size=8
    )
    steps = _Steps()
    history = _model(strategy, 23).fit(dist, epochs=3, verbose=0, callbacks=[steps])
    _learned_steps.join_releases(timeout=30.0)  # what the interpreter's exit waits for
    assert steps.per_epoch == [6] * 3
    assert history.history["once"] == [23] * 3
    assert len(passes) == 3, f"{len(passes)} passes of the source for 3 epochs"
    assert not [t for t in threading.enumerate() if t.name == "tfdp-release-iterator"]


@pytest.mark.parametrize("name", ["1 replica", "2 replicas"])
def test_a_source_that_grows_stops_fit_with_what_to_do(name: str) -> None:
    # 23 examples (6 steps) in the first epoch, 28 (7 steps) in the second: its last
    # examples would go untrained in the first epoch's 6 steps, so fit stops and says why.
    strategy = STRATEGIES[name]()
    dist = tdu.build_distributed_dataset(
        _unknown_size(_sizes_by_pass([23, 28])), strategy=strategy, global_batch_size=4
    )
    steps = _Steps()
    model = _model(strategy, 28)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        model.fit(dist, epochs=3, verbose=0, callbacks=[steps])
    message = str(caught.value)
    for needed in (
        "more than the 6 steps its first epoch in this fit had",  # what was received
        "the source grew between epochs",
        "Give every epoch the same examples",  # how to fix
        "undo the compat change fit-one-iterator before fit with tdu.compat.undo",
    ):
        assert needed in message, (needed, message)
    assert steps.per_epoch[0] == 6


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


# ------------------------------------------------------- one iterator from the second epoch


@pytest.fixture
def iterators(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """This worker's input iterators of every distributed iterator made while the test runs,
    counted where TensorFlow starts one from a dataset."""
    made: list[Any] = []
    cls = input_lib._SingleWorkerOwnedDatasetIterator
    original = cls.__init__

    def counted(self: Any, dataset: Any = None, *args: Any, **kwargs: Any) -> None:
        original(self, dataset, *args, **kwargs)
        if dataset is not None:
            made.append(dataset)

    monkeypatch.setattr(cls, "__init__", counted)
    return made


class _Recorder:
    """Replica 0's example ids, one list per step, in the order its steps received them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.steps: list[list[int]] = []

    def record(self, replica: Any, ids: Any) -> Any:
        if int(replica) == 0:
            with self.lock:
                self.steps.append(ids.numpy().astype(int).tolist())
        return np.int32(0)

    def metric(self) -> Any:
        recorder = self

        class Order(keras.metrics.Metric):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__(name="order")
                self.total = self.add_weight(name="total", shape=(), initializer="zeros")

            def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
                context = tf.distribute.get_replica_context()
                replica = context.replica_id_in_sync_group if context is not None else 0
                ids = tf.cast(tf.reshape(y_true, [-1]), tf.int64)
                done = tf.reshape(tf.py_function(recorder.record, [replica, ids], tf.int32), [])
                self.total.assign_add(tf.cast(done, "float32"))

            def result(self) -> Any:
                return tf.identity(self.total)

            def reset_state(self) -> None:
                self.total.assign(0.0)

        return Order()


def _ordered_model(strategy: Any, ids: int, recorder: _Recorder) -> Any:
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(
            optimizer=keras.optimizers.SGD(1e-4),
            loss="mse",
            metrics=[*id_metrics(ids), recorder.metric()],
        )
    return model


@pytest.mark.parametrize("name", ["1 replica", "2 replicas"])
def test_fit_keeps_one_iterator_from_the_second_epoch(name: str, iterators: list[Any]) -> None:
    n, epochs = 23, 4  # 6 steps of 4, the last one partial
    strategy = STRATEGIES[name]()
    dist = tdu.build_distributed_dataset(
        _unknown_size(lambda: n),
        strategy=strategy,
        global_batch_size=4,
        shuffle_buffer_size=n,
        seed=3,
    )
    recorder, steps = _Recorder(), _Steps()
    model = _ordered_model(strategy, n, recorder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(dist, epochs=epochs, verbose=0, callbacks=[steps])
    # The first epoch's iterator, then one for every later epoch (Keras' own: one an epoch).
    assert len(iterators) == 2, f"{len(iterators)} distributed iterators for {epochs} epochs"
    assert steps.per_epoch == [6] * epochs
    assert history.history["seen"] == [n] * epochs
    assert history.history["once"] == [n] * epochs
    assert not [w for w in caught if "ran out of data" in str(w.message)]
    per_epoch = len(recorder.steps) // epochs
    assert len(recorder.steps) == per_epoch * epochs
    orders = [
        tuple(i for ids in recorder.steps[e * per_epoch : (e + 1) * per_epoch] for i in ids)
        for e in range(epochs)
    ]
    assert len(set(orders)) == epochs, "an order repeats across epochs"


@pytest.mark.parametrize("name", ["1 replica", "2 replicas"])
def test_validation_beside_the_learned_epochs_is_read_whole_every_epoch(name: str) -> None:
    n, m, epochs = 23, 11, 3
    strategy = STRATEGIES[name]()
    dist = tdu.build_distributed_dataset(
        _unknown_size(lambda: n), strategy=strategy, global_batch_size=4, shuffle_buffer_size=8
    )
    val = tdu.build_distributed_dataset(
        _unknown_size(lambda: m), strategy=strategy, global_batch_size=4
    )
    model = _model(strategy, n)
    assert dist.tfdp.learnable() is not None  # fit streams it from its second epoch on
    steps = _Steps()
    history = model.fit(dist, epochs=epochs, validation_data=val, verbose=0, callbacks=[steps])
    assert steps.per_epoch == [6] * epochs
    assert history.history["seen"] == [n] * epochs
    assert history.history["once"] == [n] * epochs
    assert history.history["val_seen"] == [m] * epochs
    assert history.history["val_once"] == [m] * epochs


def test_the_change_undone_makes_an_iterator_every_epoch(iterators: list[Any]) -> None:
    from tfdp_utils import compat
    from tfdp_utils.compat import _one_iterator as one_iterator

    n, epochs = 23, 3
    strategy = STRATEGIES["2 replicas"]()
    dist = tdu.build_distributed_dataset(
        _unknown_size(lambda: n), strategy=strategy, global_batch_size=4
    )
    model = _model(strategy, n)
    compat.undo("fit-one-iterator")
    try:
        history = model.fit(dist, epochs=epochs, verbose=0)
    finally:
        one_iterator.install(applied_by="test")
    assert history.history["once"] == [n] * epochs
    assert len(iterators) >= epochs


WORKER = r"""
import json, os, sys, threading
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import input_lib
import tfdp_utils as tdu
from tfdp_utils._tf import keras

folder, epochs = sys.argv[1], int(sys.argv[2])
# As a user builds it: the workarounds, the collective bound and the clean exit come with it.
strategy = tdu.auto_strategy(collective_timeout=120)

made = []
original = input_lib._SingleWorkerOwnedDatasetIterator.__init__
def counted(self, dataset=None, *args, **kwargs):
    original(self, dataset, *args, **kwargs)
    if dataset is not None:
        made.append(1)
input_lib._SingleWorkerOwnedDatasetIterator.__init__ = counted

lock, steps_seen = threading.Lock(), []
def record(ids):
    with lock:
        steps_seen.append(ids.numpy().astype(int).tolist())
    return np.int32(0)

class Ids(keras.metrics.Metric):
    def __init__(self):
        super().__init__(name="ids")
        self.total = self.add_weight(name="total", shape=(), initializer="zeros")
    def update_state(self, y_true, y_pred, sample_weight=None):
        ids = tf.cast(tf.reshape(y_true, [-1]), tf.int64)
        done = tf.reshape(tf.py_function(record, [ids], tf.int32), [])
        self.total.assign_add(tf.cast(done, "float32"))
    def result(self):
        return tf.identity(self.total)
    def reset_state(self):
        self.total.assign(0.0)

class Steps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.per_epoch = []
    def on_epoch_begin(self, epoch, logs=None):
        self.per_epoch.append(0)
    def on_train_batch_end(self, batch, logs=None):
        self.per_epoch[-1] += 1

def parse(line):
    value = tf.reshape(tf.strings.to_number(line, tf.float32), [1])
    return value, value

files = sorted(os.path.join(folder, f) for f in os.listdir(folder))
# FILE sharding of files not counted (unknown size): 21 + 3 examples on one worker, 2 + 2
# on the other, so the second runs out 5 steps before the first.
dist = tdu.build_distributed_dataset(
    files, strategy=strategy, global_batch_size=4, reader=tf.data.TextLineDataset,
    map_fn=parse, shuffle_buffer_size=32)
with strategy.scope():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=[Ids()])
steps = Steps()
model.fit(dist, epochs=epochs, callbacks=[steps], verbose=0)
out = {
    "iterators": len(made),
    "steps_per_epoch": steps.per_epoch,
    "info_steps": dist.tfdp_info.steps_per_epoch,
    "ids": list(steps_seen),
}
print("RESULT " + json.dumps(out), flush=True)
"""


def _write_id_files(folder: Path, sizes: tuple[int, ...]) -> None:
    first = 0
    for index, size in enumerate(sizes):
        path = folder / f"part-{index}.txt"
        path.write_text("".join(f"{i}\n" for i in range(first, first + size)))
        first += size


@pytest.mark.slow
def test_two_workers_learn_the_same_steps_and_train_every_example_once(tmp_path: Path) -> None:
    from support.processes import free_port, result_line, start_python, tf_config, wait_all

    epochs, n = 3, 28
    folder = tmp_path / "files"
    folder.mkdir()
    _write_id_files(folder, (21, 2, 3, 2))  # ids 0..27
    ports = [free_port(), free_port()]
    processes = [
        start_python(
            WORKER,
            args=[str(folder), str(epochs)],
            env={"TF_CONFIG": tf_config(ports, index)},
            preloaded=True,
        )
        for index in range(2)
    ]
    workers = [result_line(outcome) for outcome in wait_all(processes, timeout=420)]
    steps = workers[0]["steps_per_epoch"][0]
    for result in workers:
        assert result["info_steps"] is None  # unknown size: the steps were learnt
        assert result["iterators"] == 2, f"{result['iterators']} iterators"
        assert result["steps_per_epoch"] == [steps] * epochs  # equal on both workers
        assert len(result["ids"]) == steps * epochs
    for epoch in range(epochs):
        trained = [
            i
            for result in workers
            for ids in result["ids"][epoch * steps : (epoch + 1) * steps]
            for i in ids
        ]
        assert sorted(trained) == list(range(n)), f"epoch {epoch}"
    orders = {
        tuple(i for ids in workers[0]["ids"][e * steps : (e + 1) * steps] for i in ids)
        for e in range(epochs)
    }
    assert len(orders) == epochs, "an order repeats across epochs"


@pytest.mark.parametrize(
    ("case", "learns"),
    [
        ("as a user writes it", True),
        ("one epoch", False),  # one iterator either way
        ("steps_per_epoch given", False),  # the user's own count stays
        ("steps_per_execution 2", False),  # a count of executions is not one of steps
        ("drop_remainder", False),  # full batches of a static size: no empty batch pads them
        ("known size", False),  # streamed from the first epoch (test_fit_one_iterator.py)
    ],
)
def test_which_fit_calls_learn_their_steps(case: str, learns: bool) -> None:
    from tfdp_utils.compat import _learned_steps as learned_steps

    strategy = STRATEGIES["2 replicas"]()
    source = _unknown_size(lambda: 23)
    if case == "known size":
        source = source.apply(tf.data.experimental.assert_cardinality(23))
    dist = tdu.build_distributed_dataset(
        source, strategy=strategy, global_batch_size=4, drop_remainder=case == "drop_remainder"
    )
    arguments = {"x": dist, "steps_per_epoch": 6 if case == "steps_per_epoch given" else None}
    learned = learned_steps.learning_for(
        arguments,
        epochs=1 if case == "one epoch" else 3,
        initial_epoch=0,
        steps_per_execution=2 if case == "steps_per_execution 2" else 1,
    )
    assert (learned is not None) == learns
