"""ThroughputLogger's input-wait share against injected, known delays.

A reader that takes ``d`` seconds per global batch (serially) feeds a model whose step takes
``s`` seconds, and the prefetching pipeline overlaps the two: the loop waits
``max(0, d - s)`` of every ``max(d, s)``. ``s`` is timed by the test itself (the median time
between batch ends of a fit on undelayed input), and so is the last window's time per step,
``max(d, s)`` (batch ends again: on a loaded machine the reader takes longer than the injected
sleep). The share the logger wrote last into the event file must agree within 0.10, and the
fit's share must lie in the regime the injected delays give.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.graph import sleeping
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf
from tfdp_utils.throughput import _tags as tags

pytestmark = [pytest.mark.slow, pytest.mark.keras]

GLOBAL_BATCH = 8
STEP_SLEEP = 0.04  # the model's step (per replica, in a py_function)
STEPS = 26  # two epochs of 13; warm-up 2, windows of 8 steps (the last in epoch 2)
TOLERANCE = 0.10


class Sleep(keras.layers.Layer):  # type: ignore[misc]
    def call(self, x: Any) -> Any:
        return sleeping(x, STEP_SLEEP)


def strategy_of(replicas: int) -> Any:
    if replicas == 1:
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


def dataset(strategy: Any, delay: float, steps: int) -> Any:
    """``steps`` global batches, each read in ``delay`` seconds, one after the other."""
    n = steps * GLOBAL_BATCH

    source = (
        tf.data.Dataset.from_tensor_slices(np.ones((n, 4), "float32"))
        .batch(GLOBAL_BATCH)
        .map(lambda batch: sleeping(batch, delay))
        .unbatch()
        .apply(tf.data.experimental.assert_cardinality(n))
        .map(lambda x: (x, x[:1]))
    )
    return tdu.build_distributed_dataset(source, strategy=strategy, global_batch_size=GLOBAL_BATCH)


def model_for(strategy: Any) -> Any:
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), Sleep(), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    return model


class StepTimes(keras.callbacks.Callback):  # type: ignore[misc]
    """The host time at the end of every batch (this test's own clock)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.times.append(time.perf_counter())


def measured_step_seconds(strategy: Any) -> float:
    """The model's step on undelayed input, timed here: the median time between batch ends."""
    times = StepTimes()
    model_for(strategy).fit(dataset(strategy, 0.0, STEPS), verbose=0, callbacks=[times])
    gaps = np.diff(times.times[2:])
    return float(np.median(gaps))


def last_logged_share(run: Path) -> tuple[int, float]:
    acc = EventAccumulator(str(run), size_guidance={"tensors": 0})
    acc.Reload()
    event = acc.Tensors(tags.INPUT_WAIT_SHARE)[-1]
    return event.step, float(tf.make_ndarray(event.tensor_proto))


@pytest.fixture(scope="module", params=[1, 2], ids=["1rep", "2rep"])
def setup(request: pytest.FixtureRequest) -> tuple[Any, float]:
    strategy = strategy_of(request.param)
    return strategy, measured_step_seconds(strategy)


@pytest.mark.timing
@pytest.mark.parametrize(
    ("ratio", "regime"),
    [(0.5, (0.0, 0.15)), (2.0, (0.3, 0.7)), (4.0, (0.55, 0.95))],
    ids=["d=s/2", "d=2s", "d=4s"],
)
def test_logged_share_matches_the_injected_delays(
    setup: tuple[Any, float], ratio: float, regime: tuple[float, float], tmp_path: Path
) -> None:
    strategy, step = setup
    delay = ratio * step
    logger = tdu.callbacks.ThroughputLogger(tmp_path, log_every_n_steps=8, warmup_steps=2)
    times = StepTimes()
    # Two epochs: fit trains on one stream of both epochs (fit-one-iterator), whose waits
    # count on the dataset passed.
    model_for(strategy).fit(
        dataset(strategy, delay, STEPS // 2), epochs=2, verbose=0, callbacks=[logger, times]
    )
    summary = logger.summary()
    last_step, last_share = last_logged_share(tmp_path / "global")
    # The last window (steps 19-26) by this test's clock: each step takes max(d, s), where d
    # is the reader's actual time (the injected sleep, longer on a loaded machine).
    window = (times.times[STEPS - 1] - times.times[STEPS - 9]) / 8
    expected = max(0.0, window - step) / window
    context = (
        f"compute step {step * 1000:.1f} ms, injected delay {delay * 1000:.1f} ms, last window "
        f"{window * 1000:.1f} ms/step: expected {expected:.3f}, logged {last_share:.3f}; {summary}"
    )
    assert last_step == STEPS, context
    assert abs(last_share - expected) <= TOLERANCE, context
    low, high = regime  # what the injected delays give on an idle machine, loosely
    assert low <= summary["input_wait_share"] <= high, context
    assert summary["input_wait_verdict"].startswith("input wait: ")


def test_a_plain_tf_data_dataset_says_the_share_is_unknown(tmp_path: Path) -> None:
    strategy = strategy_of(1)
    x = np.ones((64, 4), "float32")
    plain = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8, drop_remainder=True)
    logger = tdu.callbacks.ThroughputLogger(tmp_path, global_batch_size=8, warmup_steps=1)
    model_for(strategy).fit(plain, verbose=0, callbacks=[logger])
    summary = logger.summary()
    assert summary["input_wait_share"] is None
    assert "unknown: fit trains on a " in summary["input_wait_note"]
    assert "build_distributed_dataset" in summary["input_wait_note"]
    acc = EventAccumulator(str(tmp_path / "global"), size_guidance={"tensors": 0})
    acc.Reload()
    assert tags.INPUT_WAIT_SHARE not in acc.Tags()["tensors"]


def test_a_builder_dataset_without_a_strategy_says_the_share_is_unknown(tmp_path: Path) -> None:
    # Without a strategy the builder returns a plain tf.data.Dataset: no clock, no false 0.
    x = np.ones((64, 4), "float32")
    dataset = tdu.build_distributed_dataset((x, x[:, :1]), global_batch_size=8)
    logger = tdu.callbacks.ThroughputLogger(tmp_path, warmup_steps=1)
    model_for(tf.distribute.get_strategy()).fit(dataset, verbose=0, callbacks=[logger])
    summary = logger.summary()
    assert summary["input_wait_share"] is None
    assert "returned a plain tf.data.Dataset" in summary["input_wait_note"]


def test_under_op_determinism_training_runs_and_the_share_is_unknown(tmp_path: Path) -> None:
    # enable_op_determinism refuses tf.timestamp: the clock must count fetches without timing
    # them, and the logger must say the share is unknown rather than report 0.
    code = f"""
import json, logging, sys
import numpy as np
import tensorflow as tf
tf.config.experimental.enable_op_determinism()
logging.basicConfig(level=logging.INFO)
import tfdp_utils as tdu
from tfdp_utils._tf import keras
from tfdp_utils.data._input_wait import clock_of

x = np.ones((64, 4), "float32")
strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
dist = tdu.build_distributed_dataset((x, x[:, :1]), strategy=strategy, global_batch_size=8)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
logger = tdu.callbacks.ThroughputLogger({str(tmp_path)!r}, warmup_steps=1, log_every_n_steps=2)
model.fit(dist, epochs=2, verbose=0, callbacks=[logger])
progress = clock_of(dist).progress()
summary = logger.summary()
print("RESULT " + json.dumps([summary["input_wait_share"], summary["input_wait_note"],
                              summary["input_wait_verdict"], progress.received,
                              progress.waited_seconds]))
"""
    from support.processes import result_line, run_python

    done = run_python(code, timeout=180, preloaded=True)
    share, note, verdict, received, waited = result_line(done)
    assert share is None, done.stderr[-3000:]
    assert note.startswith("unknown: op determinism is on") and "tf.timestamp" in note, note
    assert verdict == f"input wait: {note}"
    assert received >= 16 and waited == 0.0
    assert f"input-wait share: {note}" in done.stderr  # the log (INFO) says it too
    # The event files carry the reason (a text beside the counts), and the report reads it.
    from tfdp_utils.throughput import _report as report

    runs = report.read_runs(str(tmp_path))
    assert [text for _, text in runs[tags.GLOBAL_RUN].input_wait_notes] == [note]
    summary_of_logs = report.summarize(runs)
    assert summary_of_logs["input"]["verdict"] == verdict
    assert verdict in report.format_table(summary_of_logs)
