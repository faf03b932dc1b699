"""Hostile-input campaign: the throughput logger's figures and ``tfdp-utils report``.

Each row is one case (see ``tests/hostile/test_hostile_inputs.py`` for the vocabulary). The
logger's rows train a tiny model on 2 logical CPUs: every figure given to the logger is checked
against what ``fit`` trains on before the first step. The report's rows run ``tfdp-utils
report`` in this process: an argument error is one line on stderr, nothing on stdout, exit 2.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import tempfile
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from support.hostile import Accepts, Case, Raises, check_case, parametrize, scratch_folder

import tfdp_utils as tdu
from tfdp_utils._tf import IS_KERAS3, keras
from tfdp_utils.callbacks import ThroughputLogger
from tfdp_utils.throughput import ThroughputMeter
from tfdp_utils.throughput import _tags as tags

pytestmark = pytest.mark.keras

X = np.arange(192, dtype="float32").reshape(96, 2)
Y = np.arange(96, dtype="float32").reshape(96, 1)


class CliRefused(Exception):
    """``tfdp-utils`` refused its arguments as docs/cli.md promises: one line, exit 2."""


def _strategy() -> Any:
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _fit(data: Any, logger: Any, *, steps: int | None = None) -> Any:
    strategy = _strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[logger])
    return model


def _builder(batch: int, n: int = 96) -> tuple[Any, int | None]:
    # tf_keras needs steps_per_epoch (and so a repeated dataset) for a distributed dataset.
    dist = tdu.build_distributed_dataset(
        (X[:n], Y[:n]), strategy=_strategy(), global_batch_size=batch, repeat=not IS_KERAS3
    )
    return dist, None if IS_KERAS3 else -(-n // batch)


_FOLDER = scratch_folder("tfdp-hostile-throughput-")


def _logdir() -> str:
    return tempfile.mkdtemp(dir=_FOLDER)


def _gbs_against_builder() -> None:
    dist, steps = _builder(16)
    _fit(dist, ThroughputLogger(_logdir(), global_batch_size=15), steps=steps)


def _gbs_not_divisible() -> None:
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    _fit(data, ThroughputLogger(_logdir(), global_batch_size=15))


def _gbs_against_static_batch() -> None:
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16, drop_remainder=True)
    _fit(data, ThroughputLogger(_logdir(), global_batch_size=8))


def _dataset_of_another_fit() -> None:
    dist, steps = _builder(16)
    other, _ = _builder(16, n=80)
    _fit(dist, ThroughputLogger(_logdir(), dataset=other), steps=steps)


def _hooks_outside_fit() -> None:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    logger = ThroughputLogger(_logdir())
    logger.set_model(model)
    logger.set_params({"epochs": 1, "steps": 2, "verbose": 0})
    logger.on_train_begin()


def _report(*arguments: str) -> int:
    """``tfdp-utils report ...`` in this process; CliRefused for a one-line exit 2."""
    from tfdp_utils.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["report", *arguments])
    lines = err.getvalue().strip().splitlines()
    if status == 2:
        assert len(lines) == 1 and not out.getvalue(), (out.getvalue(), lines)
        raise CliRefused(lines[0])
    return status


def _logged_run() -> str:
    """A log_dir of a real (tiny) logger run."""
    folder = _logdir()
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)
    _fit(data, ThroughputLogger(folder, global_batch_size=8, log_every_n_steps=2))
    return folder


def _report_cut_short() -> None:
    folder = pathlib.Path(_logged_run())
    (events,) = (folder / tags.GLOBAL_RUN).glob("*.tfevents.*")
    events.write_bytes(events.read_bytes()[:-7])  # the last record cut in the middle
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        from tfdp_utils.cli import main

        assert main(["report", str(folder)]) == 0
    assert "CUT SHORT global" in out.getvalue(), out.getvalue()


def _report_plot_into(path: str) -> None:
    _report(_logged_run(), "--plot", path)


ALL_CASES: list[Case] = [
    # ThroughputLogger: figures against what fit trains on (checked before the first step)
    (
        "ThroughputLogger(global_batch_size=15) on a builder dataset of 16",
        _gbs_against_builder,
        Raises(ValueError, r"global_batch_size=15\) disagrees with the dataset fit trains on"),
    ),
    (
        "ThroughputLogger(global_batch_size=15) on 2 replicas",
        _gbs_not_divisible,
        Raises(ValueError, r"not divisible by the 2 replicas in sync .*e\.g\. 14 or 16"),
    ),
    (
        "ThroughputLogger(global_batch_size=8) on batches of 16",
        _gbs_against_static_batch,
        Raises(ValueError, r"every element holds 16 examples .*global_batch_size=16"),
    ),
    (
        "ThroughputLogger(dataset=<another builder dataset>)",
        _dataset_of_another_fit,
        Raises(ValueError, r"describes another dataset .*examples_per_epoch 80 vs 96"),
    ),
    (
        "ThroughputLogger hooks outside fit",
        _hooks_outside_fit,
        Raises(ValueError, r"its hooks run outside Model\.fit"),
    ),
    (
        "ThroughputLogger('')",
        lambda: ThroughputLogger(""),
        Raises(TypeError, "log_dir='' is not a directory path"),
    ),
    (
        "ThroughputLogger(global_batch_size=True)",
        lambda: ThroughputLogger("logs", global_batch_size=True),
        Raises(TypeError, "global_batch_size must be an integer, but received True"),
    ),
    (
        "ThroughputLogger(flops_per_example=nan)",
        lambda: ThroughputLogger("logs", flops_per_example=float("nan")),
        Raises(ValueError, "positive finite number, but received flops_per_example=nan"),
    ),
    (
        "ThroughputLogger(log_dir=pathlib.Path)",
        lambda: ThroughputLogger(pathlib.Path("logs")),
        Accepts("a pathlib.Path log_dir is a directory path, as a str is"),
    ),
    # ThroughputMeter
    (
        "ThroughputMeter.exclude(steps=-1)",
        lambda: ThroughputMeter().exclude(steps=-1, replica_examples=[0]),
        Raises(ValueError, r"needs steps >= 0"),
    ),
    (
        "ThroughputMeter.exclude(replica_examples=[1, 2]) on 1 replica",
        lambda: ThroughputMeter().exclude(steps=1, replica_examples=[1, 2]),
        Raises(ValueError, r"one count >= 0 per replica \(1\)"),
    ),
    (
        "ThroughputMeter.update(replica_examples=[1]) on 2 replicas",
        lambda: ThroughputMeter(num_replicas=2).update(step=0, time=0.0, replica_examples=[1]),
        Raises(ValueError, r"replica_examples has 1 entries; expected one per replica \(2\)"),
    ),
    # tfdp-utils report
    (
        "report --plot into a missing directory",
        lambda: _report_plot_into("/nonexistent-tfdp/dir/out.png"),
        Raises(CliRefused, r"directory '/nonexistent-tfdp/dir' does not exist"),
    ),
    (
        "report --plot onto a directory",
        lambda: _report_plot_into(tempfile.gettempdir()),
        Raises(CliRefused, "is a directory; pass a file path ending in .png"),
    ),
    (
        "report --plot out.txt",
        lambda: _report_plot_into(str(pathlib.Path(_logdir()) / "out.txt")),
        Raises(CliRefused, r"does not end in \.png"),
    ),
    (
        "report --plot checked before a missing LOGDIR is read",
        lambda: _report("/nonexistent-tfdp/logs", "--plot", "/nonexistent-tfdp/out.png"),
        Raises(CliRefused, r"--plot .*does not exist"),
    ),
    (
        "report on an event file cut short",
        _report_cut_short,
        Accepts("a run cut short is reported (marked CUT SHORT), exit 0: a job may still write"),
    ),
]


@parametrize(ALL_CASES)
def test_hostile_input(call: Any, outcome: Raises | Accepts) -> None:
    check_case(call, outcome)
