"""ThroughputLogger's epoch figures in Keras' logs (History, CSVLogger), Keras 3 and tf_keras."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from tfdp_utils._tf import keras
from tfdp_utils.callbacks import ThroughputLogger

pytestmark = pytest.mark.keras

BATCH = 16
STEPS = 200  # per epoch
EPOCHS = 3


class EpochTimer(keras.callbacks.Callback):  # type: ignore[misc]
    """A second timer: host time at the end of each epoch's first and last step."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[list[float]] = []

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.marks.append([])

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if batch in (0, STEPS - 1):
            self.marks[-1].append(time.perf_counter())


def dataset() -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * STEPS, 64)).astype("float32")
    y = rng.normal(size=(BATCH * STEPS, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)


def fit(callbacks: list[Any]) -> Any:
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer="sgd", loss="mse")
    return model.fit(dataset(), epochs=EPOCHS, verbose=0, callbacks=callbacks)


def test_history_has_the_epoch_figures_of_an_independent_timer(tmp_path: Path) -> None:
    timer = EpochTimer()
    history = fit([ThroughputLogger(tmp_path / "logs", global_batch_size=BATCH), timer])
    rates = history.history["examples_per_sec"]
    steps = history.history["steps_per_sec"]
    assert len(rates) == len(steps) == EPOCHS
    for epoch in range(EPOCHS):
        first, last = timer.marks[epoch]
        # Counted independently: STEPS - 1 full batches after the first step of the epoch.
        assert steps[epoch] == pytest.approx((STEPS - 1) / (last - first), rel=0.1)
        assert rates[epoch] == pytest.approx((STEPS - 1) * BATCH / (last - first), rel=0.1)
        assert rates[epoch] / steps[epoch] == pytest.approx(BATCH)


@pytest.mark.parametrize("csv_first", [True, False], ids=["csvlogger_first", "csvlogger_last"])
def test_csvlogger_records_the_figures_in_either_order(tmp_path: Path, csv_first: bool) -> None:
    path = tmp_path / "log.csv"
    recorder = keras.callbacks.CSVLogger(str(path))
    logger = ThroughputLogger(tmp_path / "logs", global_batch_size=BATCH)
    callbacks = [recorder, logger] if csv_first else [logger, recorder]
    history = fit(callbacks)
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == EPOCHS
    for row, rate, steps in zip(
        rows, history.history["examples_per_sec"], history.history["steps_per_sec"], strict=True
    ):
        assert float(row["examples_per_sec"]) == pytest.approx(rate)
        assert float(row["steps_per_sec"]) == pytest.approx(steps)
    assert callbacks == ([recorder, logger] if csv_first else [logger, recorder])  # user's list


def test_epoch_logs_false_adds_nothing(tmp_path: Path) -> None:
    history = fit([ThroughputLogger(tmp_path / "logs", global_batch_size=BATCH, epoch_logs=False)])
    assert "examples_per_sec" not in history.history
    assert "loss" in history.history


def test_epoch_logs_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"epoch_logs must be True or False, but received 'no'"):
        ThroughputLogger(tmp_path, global_batch_size=BATCH, epoch_logs="no")  # type: ignore[arg-type]
