"""fit() over a builder dataset keeps one distributed iterator for the whole job.

Truth from independent measurements: the example ids the model's step actually received
(a metric that records its ``y_true`` ids through ``py_function``, per replica, in order), the
steps Keras ran per epoch (a callback), and every distributed iterator made during ``fit``
(TensorFlow's distributed dataset classes' ``__iter__``, counted).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tensorflow.python.distribute import input_lib

import tfdp_utils as tdu
from tfdp_utils import compat
from tfdp_utils._dataset_info import DatasetInfo
from tfdp_utils._tf import IS_KERAS3, keras, tf
from tfdp_utils.compat import _one_iterator as one_iterator

PER_REPLICA = 3


# ----------------------------------------------------------------------------- pure rules


def _info(**kwargs: Any) -> DatasetInfo:
    fields: dict[str, Any] = {
        "global_batch_size": 6,
        "per_replica_batch_size": 3,
        "num_replicas_in_sync": 2,
        "steps_per_epoch": 4,
        "full_steps": 3,
        "examples_per_epoch": 22,
    }
    fields.update(kwargs)
    return DatasetInfo(**fields)


@pytest.mark.parametrize(
    ("info", "call", "steps"),
    [
        (_info(), {}, 4),
        (_info(), {"epochs": 1}, None),  # one epoch: one iterator anyway
        (_info(), {"epochs": 5, "initial_epoch": 4}, None),
        (_info(), {"steps_per_epoch": 4}, None),  # the user's own count stays
        (_info(repeat=True), {}, None),  # repeat=True / "epochs": as given
        (_info(steps_per_epoch=None, full_steps=None, exact=False), {}, None),  # unknown size
        (_info(), {"steps_per_execution": 2}, 4),
        (_info(), {"steps_per_execution": 3}, None),  # an execution across an epoch's end
        (_info(), {"steps_per_execution": None}, None),  # tuned while training
    ],
)
def test_when_fit_keeps_one_iterator(info: DatasetInfo, call: dict[str, Any], steps: Any) -> None:
    arguments = {
        "steps_per_epoch": None,
        "epochs": 3,
        "initial_epoch": 0,
        "steps_per_execution": 1,
        **call,
    }
    assert one_iterator.whole_job_steps(info, **arguments) == steps


# ------------------------------------------------------------------------- through fit


class _Recorder:
    """The ids each replica's step received, in order: one list per step and replica."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.steps: dict[int, list[list[int]]] = {}

    def record(self, replica: Any, ids: Any) -> Any:
        with self.lock:
            self.steps.setdefault(int(replica), []).append(ids.numpy().astype(int).tolist())
        return np.int32(0)

    def metric(self) -> Any:
        recorder = self

        class Ids(keras.metrics.Metric):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__(name="ids")
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

        return Ids()


class _Steps(keras.callbacks.Callback):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.per_epoch: list[int] = []

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.per_epoch.append(0)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.per_epoch[-1] += 1


@pytest.fixture
def iterators(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """This worker's input iterators of every distributed iterator made while the test runs.

    Counted where TensorFlow starts one from a dataset (one per distributed iterator and
    worker); an iterator rebuilt from its components (a ``tf.function`` tracing with it)
    starts none.
    """
    made: list[Any] = []
    cls = input_lib._SingleWorkerOwnedDatasetIterator
    original = cls.__init__

    def counted(self: Any, dataset: Any = None, *args: Any, **kwargs: Any) -> None:
        original(self, dataset, *args, **kwargs)
        if dataset is not None:
            made.append(dataset)

    monkeypatch.setattr(cls, "__init__", counted)
    return made


def _strategy(replicas: int) -> Any:
    if replicas == 1:
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


def _write_id_files(folder: Path, sizes: tuple[int, ...]) -> list[str]:
    paths, first = [], 0
    for index, size in enumerate(sizes):
        path = folder / f"part-{index}.txt"
        path.write_text("".join(f"{i}\n" for i in range(first, first + size)))
        paths.append(str(path))
        first += size
    return paths


def _parse(line: Any) -> Any:
    value = tf.strings.to_number(line, tf.float32)
    return tf.reshape(value, [1]), tf.reshape(value, [1])


def _dataset(source: str, strategy: Any, n: int, tmp_path: Path, **kwargs: Any) -> Any:
    global_batch = PER_REPLICA * strategy.num_replicas_in_sync
    if source == "files":
        sizes = (n // 3, n // 3, n - 2 * (n // 3))
        return tdu.build_distributed_dataset(
            _write_id_files(tmp_path, sizes),
            strategy=strategy,
            global_batch_size=global_batch,
            reader=tf.data.TextLineDataset,
            map_fn=_parse,
            count_examples=True,
            shuffle_buffer_size=n,
            **kwargs,
        )
    ids = np.arange(n, dtype="float32").reshape(-1, 1)
    return tdu.build_distributed_dataset(
        (ids, ids),
        strategy=strategy,
        global_batch_size=global_batch,
        shuffle_buffer_size=n,
        **kwargs,
    )


def _model(strategy: Any, recorder: _Recorder) -> Any:
    with strategy.scope():
        model = keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", metrics=[recorder.metric()])
    return model


def _epochs_of(recorder: _Recorder, steps: int, epochs: int) -> list[list[int]]:
    """The ids trained in each epoch, over all replicas; each replica's steps in order."""
    per_epoch: list[list[int]] = [[] for _ in range(epochs)]
    for replica_steps in recorder.steps.values():
        assert len(replica_steps) == steps * epochs  # the same steps on every replica
        for index, ids in enumerate(replica_steps):
            per_epoch[index // steps].extend(ids)
    return per_epoch


def _orders(recorder: _Recorder, steps: int, epochs: int) -> list[list[int]]:
    """Replica 0's ids of each epoch, in the order it trained them."""
    first = recorder.steps[0]
    return [[i for ids in first[e * steps : (e + 1) * steps] for i in ids] for e in range(epochs)]


@pytest.mark.keras
@pytest.mark.parametrize(
    ("source", "replicas", "epochs"),
    [("files", 1, 2), ("files", 2, 4), ("arrays", 2, 2), ("arrays", 1, 4)],
)
def test_fit_trains_every_example_once_per_epoch_through_one_iterator(
    source: str, replicas: int, epochs: int, iterators: list[Any], tmp_path: Path
) -> None:
    n = 29  # a partial last step: 29 = 4 * 6 + 5 over 2 replicas
    strategy = _strategy(replicas)
    dist = _dataset(source, strategy, n, tmp_path)
    steps = dist.tfdp_info.steps_per_epoch
    recorder, counted = _Recorder(), _Steps()
    logger = tdu.callbacks.ThroughputLogger(tmp_path / "logs", log_every_n_steps=2)
    model = _model(strategy, recorder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(dist, epochs=epochs, callbacks=[counted, logger], verbose=0)
    assert not [w for w in caught if "ran out of data" in str(w.message)]
    assert len(iterators) == 1, f"{len(iterators)} distributed iterators for one fit"
    assert counted.per_epoch == [steps] * epochs
    for epoch, ids in enumerate(_epochs_of(recorder, steps, epochs)):
        assert sorted(ids) == list(range(n)), f"epoch {epoch}: not every example exactly once"
    orders = _orders(recorder, steps, epochs)
    assert len({tuple(order) for order in orders}) == epochs, "an order repeats across epochs"
    # The logger counted with the dataset passed: exactly the ids the model saw.
    assert logger.summary()["examples"] == n * epochs
    assert logger.summary()["exact"]


@pytest.mark.keras
@pytest.mark.skipif(not IS_KERAS3, reason="Keras 3's symbolic build (tf_keras has none)")
def test_a_resumed_fit_builds_the_model_without_an_iterator_of_its_own(
    iterators: list[Any], tmp_path: Path
) -> None:
    """PreemptionCheckpoint's positioned stream (a resume mid-epoch): Keras 3 builds the model
    from its element spec, so the stream's pipeline is started once, not once more for a
    batch read and thrown away."""
    n = 29
    strategy = _strategy(2)
    dist = _dataset("files", strategy, n, tmp_path)
    steps = dist.tfdp_info.steps_per_epoch

    class Notice(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    stopped = tdu.callbacks.PreemptionCheckpoint(tmp_path / "job", exit=False)
    _model(strategy, _Recorder()).fit(dist, epochs=2, callbacks=[Notice(), stopped], verbose=0)
    assert stopped.saved_path is not None
    iterators.clear()
    recorder = _Recorder()
    resumed = tdu.callbacks.PreemptionCheckpoint(tmp_path / "job", exit=False)
    _model(strategy, recorder).fit(dist, epochs=2, callbacks=[resumed], verbose=0)
    assert resumed.resumed_from == stopped.saved_path
    assert len(iterators) == 1, f"{len(iterators)} distributed iterators for one resumed fit"
    for replica_steps in recorder.steps.values():  # epoch 1's last steps, then epoch 2
        assert len(replica_steps) == steps - 2 + steps
    (last,) = _epochs_of(_last_steps(recorder, steps), steps, 1)
    assert sorted(last) == list(range(n))


def _last_steps(recorder: _Recorder, steps: int) -> _Recorder:
    """The recorder's last ``steps`` steps of every replica."""
    last = _Recorder()
    last.steps = {replica: ids[-steps:] for replica, ids in recorder.steps.items()}
    return last


@contextlib.contextmanager
def _change_off() -> Iterator[None]:
    """Keras' own fit for the block: the change undone through the registry."""
    compat.undo("fit-one-iterator")
    try:
        assert "fit-one-iterator" not in {s.issue for s in compat.status() if s.applied}
        yield
    finally:
        one_iterator.install(applied_by="test")


@pytest.mark.keras
def test_without_the_change_keras_makes_an_iterator_every_epoch(
    iterators: list[Any], tmp_path: Path
) -> None:
    strategy = _strategy(2)
    dist = _dataset("arrays", strategy, 29, tmp_path)
    recorder = _Recorder()
    model = _model(strategy, recorder)
    with _change_off():
        model.fit(dist, epochs=3, verbose=0)
    # At least one per epoch (Keras 3 also starts the next epoch's at each epoch's end, and
    # one for the model's symbolic build).
    assert len(iterators) >= 3
    for ids in _epochs_of(recorder, dist.tfdp_info.steps_per_epoch, 3):
        assert sorted(ids) == list(range(29))


def _fit_twice(make: Any, iterators: list[Any], **kwargs: Any) -> tuple[int, int, Any, list[str]]:
    """Iterators made by ``fit`` with the change, and by Keras' own ``fit``; the recorder
    and warnings of the first."""
    recorder = _Recorder()
    strategy, dist = make()
    model = _model(strategy, recorder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(dist, verbose=0, **kwargs)
    with_change = len(iterators)
    strategy, dist = make()
    with _change_off():
        _model(strategy, _Recorder()).fit(dist, verbose=0, **kwargs)
    return with_change, len(iterators) - with_change, recorder, [str(w.message) for w in caught]


@pytest.mark.keras
# A dataset of unknown size is streamed from its second epoch on:
# tests/compat/test_unknown_size_fit.py.
@pytest.mark.parametrize("case", ["steps_per_epoch", "repeat_true", "one_epoch"])
def test_calls_it_does_not_apply_to_run_as_before(
    case: str, iterators: list[Any], tmp_path: Path
) -> None:
    n, epochs = 24, 1 if case == "one_epoch" else 2
    kwargs: dict[str, Any] = {"epochs": epochs}
    if case in ("steps_per_epoch", "repeat_true"):
        kwargs["steps_per_epoch"] = 4

    def make() -> tuple[Any, Any]:
        strategy = _strategy(2)
        dist = _dataset("arrays", strategy, n, tmp_path, repeat=case == "repeat_true")
        return strategy, dist

    with_change, keras_own, recorder, said = _fit_twice(make, iterators, **kwargs)
    assert with_change == keras_own  # the call reached Keras as given
    assert not [text for text in said if "ran out of data" in text]
    if case != "repeat_true":
        for ids in _epochs_of(recorder, 4, epochs):
            assert sorted(ids) == list(range(n))


@pytest.mark.keras
@pytest.mark.skipif(
    not IS_KERAS3,
    reason="Keras 3's own warning: tf_keras reads a dataset of unknown size to its end without "
    "one (tests/compat/test_unknown_size_fit.py)",
)
def test_a_dataset_of_unknown_size_ends_each_epoch_without_keras_3s_warning() -> None:
    def make() -> tuple[Any, Any]:
        strategy = _strategy(2)
        ids = tf.data.Dataset.range(20).filter(lambda i: i >= 0)
        source = ids.map(lambda i: (tf.cast([i], "float32"), tf.cast([i], "float32")))
        dist = tdu.build_distributed_dataset(source, strategy=strategy, global_batch_size=6)
        return _model(strategy, _Recorder()), dist

    def warned(model: Any, dist: Any) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(dist, validation_data=dist, epochs=2, verbose=0)
            model.evaluate(dist, verbose=0)
            model.predict(dist, verbose=0)
        return [str(w.message) for w in caught if "ran out of data" in str(w.message)]

    ours, keras_own = make(), make()  # built first: a builder call makes the change again
    assert warned(*ours) == []
    with _change_off():  # Keras 3's own: a warning at every end of the data
        assert len(warned(*keras_own)) >= 4


@pytest.mark.keras
def test_validation_data_is_read_as_given_every_epoch(iterators: list[Any], tmp_path: Path) -> None:
    strategy = _strategy(2)
    dist = _dataset("arrays", strategy, 24, tmp_path)
    held_out = np.arange(100, 112, dtype="float32").reshape(-1, 1)
    validation = tdu.build_distributed_dataset(
        (held_out, held_out), strategy=strategy, global_batch_size=6
    )
    recorder = _Recorder()
    model = _model(strategy, recorder)
    history = model.fit(dist, validation_data=validation, epochs=3, verbose=0)
    assert len(history.history["val_loss"]) == 3
    trained = [
        ids for steps in recorder.steps.values() for ids in steps if not any(i >= 100 for i in ids)
    ]
    validated = sorted(
        i for steps in recorder.steps.values() for ids in steps for i in ids if i >= 100
    )
    assert validated == sorted(list(range(100, 112)) * 3)  # every epoch, once each
    assert sorted(i for ids in trained for i in ids) == sorted(list(range(24)) * 3)


@pytest.mark.keras
def test_status_lists_the_change_and_the_builder_turns_it_on(tmp_path: Path) -> None:
    _dataset("arrays", _strategy(1), 8, tmp_path)
    entry = {s.issue: s for s in compat.status()}["fit-one-iterator"]
    assert entry.applied == "change" and entry.kind == "process"
    assert entry.undoable and entry.kill_switch
    assert "validation_data" in entry.why and "TFDP_NO_KERAS_PATCHES=1" in entry.why
    if IS_KERAS3:
        # TensorFlowTrainer up to Keras 3.15, Trainer in keras-nightly 3.16.0.dev
        assert entry.patched in (
            ("TensorFlowTrainer._maybe_symbolic_build",),
            ("Trainer._maybe_symbolic_build",),
        )


@pytest.mark.keras
def test_evaluate_and_predict_read_the_dataset_passed(iterators: list[Any], tmp_path: Path) -> None:
    strategy = _strategy(2)
    dist = _dataset("arrays", strategy, 24, tmp_path)
    model = _model(strategy, _Recorder())
    model.evaluate(dist, verbose=0)
    model.predict(dist, verbose=0)
    with_change = len(iterators)
    with _change_off():
        model.evaluate(dist, verbose=0)
        model.predict(dist, verbose=0)
    assert with_change == len(iterators) - with_change  # as Keras makes them


# ------------------------------------------------------------------------- two workers

WORKER = r"""
import json, os, sys, threading
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import input_lib
import tfdp_utils as tdu
from tfdp_utils._tf import keras

folder, epochs = sys.argv[1], int(sys.argv[2])
options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=120)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
worker = strategy.cluster_resolver.task_id
tdu.compat.apply_for_strategy(strategy)  # keras#20585, tensorflow#72388 (as auto_strategy)

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
out = {}
for name in ("files", "arrays"):
    if name == "files":  # FILE: 21 + 3 examples on one worker, 2 + 2 on the other
        dist = tdu.build_distributed_dataset(
            files, strategy=strategy, global_batch_size=4, reader=tf.data.TextLineDataset,
            map_fn=parse, count_examples=True, shuffle_buffer_size=32)
    else:  # DATA: 29 examples, every 2nd on each worker
        ids = np.arange(29, dtype="float32").reshape(-1, 1)
        dist = tdu.build_distributed_dataset(
            (ids, ids), strategy=strategy, global_batch_size=4, shuffle_buffer_size=29)
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", metrics=[Ids()])
    del made[:], steps_seen[:]
    steps = Steps()
    model.fit(dist, epochs=epochs, callbacks=[steps], verbose=0)
    out[name] = {
        "iterators": len(made),
        "steps_per_epoch": steps.per_epoch,
        "info_steps": dist.tfdp_info.steps_per_epoch,
        "ids": list(steps_seen),
    }
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.slow
@pytest.mark.keras
def test_two_workers_train_every_example_once_per_epoch_with_equal_steps(
    tmp_path: Path,
) -> None:
    from support.processes import free_port, result_line, start_python, tf_config, wait_all

    epochs = 3
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
    results = [result_line(outcome) for outcome in wait_all(processes, timeout=420)]
    for name, n in (("files", 28), ("arrays", 29)):
        workers = [result[name] for result in results]
        steps = workers[0]["info_steps"]
        for result in workers:
            assert result["iterators"] == 1, f"{name}: {result['iterators']} iterators"
            assert result["steps_per_epoch"] == [steps] * epochs, name  # equal on both
            assert len(result["ids"]) == steps * epochs
        for epoch in range(epochs):
            trained = [
                i
                for result in workers
                for ids in result["ids"][epoch * steps : (epoch + 1) * steps]
                for i in ids
            ]
            assert sorted(trained) == list(range(n)), f"{name}, epoch {epoch}"
        orders = {
            tuple(i for ids in workers[0]["ids"][e * steps : (e + 1) * steps] for i in ids)
            for e in range(epochs)
        }
        assert len(orders) == epochs, f"{name}: an order repeats across epochs"
