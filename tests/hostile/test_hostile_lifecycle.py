"""Hostile-input campaign: the job's lifecycle (PreemptionCheckpoint, its custom loop,
diagnose_input, worker_backup_dir).

Each row is one case (see ``tests/hostile/test_hostile_inputs.py`` for the vocabulary):
arguments checked where they enter, before anything is trained, each error naming what it
received, what it expects and the fix.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from support.hostile import Accepts, Case, Raises, check_case, parametrize, scratch_folder

import tfdp_utils as tdu
from tfdp_utils._tf import keras

pytestmark = pytest.mark.keras

_FOLDER = str(scratch_folder("tfdp-hostile-lifecycle-"))


def _checkpoint(**kwargs: Any) -> Any:
    return lambda: tdu.callbacks.PreemptionCheckpoint(kwargs.pop("directory", _FOLDER), **kwargs)


def _model_and_data() -> tuple[Any, Any, Any]:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x = np.arange(64, dtype="float32").reshape(32, 2)
    dist = tdu.build_distributed_dataset(
        (x, x[:, :1]), strategy=strategy, global_batch_size=8, shuffle_buffer_size=32, seed=1
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    return strategy, model, dist


def _loop(**kwargs: Any) -> Any:
    def call() -> None:
        _, model, dist = _model_and_data()
        checkpoint = tdu.callbacks.PreemptionCheckpoint(_FOLDER, exit=False)
        arguments = {"epochs": 1, **kwargs}
        if arguments.pop("no_optimizer", False):
            model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        checkpoint.loop(model, arguments.pop("dataset", dist), **arguments)

    return call


def _diagnose(**kwargs: Any) -> Any:
    def call() -> None:
        _, model, dist = _model_and_data()
        arguments = {"steps": 2, "max_seconds": 2.0, **kwargs}
        tdu.diagnose_input(
            arguments.pop("model", model), arguments.pop("dataset", dist), **arguments
        )

    return call


def _backup_dir(directory: Any, strategy: Any = "default") -> Any:
    def call() -> None:
        chosen = tf.distribute.get_strategy() if strategy == "default" else strategy
        tdu.worker_backup_dir(directory, chosen)

    return call


ALL_CASES: list[Case] = [
    (
        "PreemptionCheckpoint(None)",
        _checkpoint(directory=None),
        Raises(TypeError, r"directory must be a folder path, but received None"),
    ),
    (
        "PreemptionCheckpoint('')",
        _checkpoint(directory=""),
        Raises(TypeError, r"directory must be a folder path, but received ''"),
    ),
    (
        "PreemptionCheckpoint(123)",
        _checkpoint(directory=123),
        Raises(TypeError, r"received 123.*outlives"),
    ),
    (
        "PreemptionCheckpoint(b'ckpt')",
        _checkpoint(directory=b"ckpt"),
        Raises(TypeError, r"received b'ckpt'"),
    ),
    (
        "PreemptionCheckpoint(signals='SIGKILL')",
        _checkpoint(signals="SIGKILL"),
        Raises(ValueError, r"SIGKILL cannot be caught"),
    ),
    (
        "PreemptionCheckpoint(signals=['SIGSTOP'])",
        _checkpoint(signals=["SIGSTOP"]),
        Raises(ValueError, r"SIGSTOP cannot be caught"),
    ),
    (
        "PreemptionCheckpoint(signals=['SIGINT'])",
        _checkpoint(signals=["SIGINT"]),
        Raises(ValueError, r"SIGINT is Ctrl-C"),
    ),
    (
        "PreemptionCheckpoint(signals=[])",
        _checkpoint(signals=[]),
        Raises(ValueError, r"impossible to receive"),
    ),
    (
        "PreemptionCheckpoint(signals=['NOPE'])",
        _checkpoint(signals=["NOPE"]),
        Raises(ValueError, r"'NOPE', which is not a signal"),
    ),
    (
        "PreemptionCheckpoint(signals=[9999])",
        _checkpoint(signals=[9999]),
        Raises(ValueError, r"9999, which is not a signal"),
    ),
    (
        "PreemptionCheckpoint(signals=[3.5])",
        _checkpoint(signals=[3.5]),
        Raises(TypeError, r"signals contains 3.5 \(float\)"),
    ),
    (
        "PreemptionCheckpoint(signals=True)",
        _checkpoint(signals=True),
        Raises(TypeError, r"signals contains True \(bool\)"),
    ),
    (
        "PreemptionCheckpoint(signals={'SIGTERM': 1})",
        _checkpoint(signals={"SIGTERM": 1}),
        Raises(TypeError, r"is not a list of signals"),
    ),
    (
        "PreemptionCheckpoint(every_steps=0)",
        _checkpoint(every_steps=0),
        Raises(
            ValueError,
            r"every_steps must be a positive integer, but received every_steps=0\. Pass e\.g\.",
        ),
    ),
    (
        "PreemptionCheckpoint(every_steps=-5)",
        _checkpoint(every_steps=-5),
        Raises(ValueError, r"every_steps must be a positive integer, but received every_steps=-5"),
    ),
    (
        "PreemptionCheckpoint(every_steps=2.5)",
        _checkpoint(every_steps=2.5),
        Raises(TypeError, r"every_steps must be an integer, but received 2\.5 of type float"),
    ),
    (
        "PreemptionCheckpoint(every_steps=True)",
        _checkpoint(every_steps=True),
        Raises(TypeError, r"every_steps must be an integer, but received True of type bool"),
    ),
    (
        "PreemptionCheckpoint(every_steps='10')",
        _checkpoint(every_steps="10"),
        Raises(TypeError, r"every_steps must be an integer, but received '10' of type str"),
    ),
    (
        "PreemptionCheckpoint(keep=0)",
        _checkpoint(keep=0),
        Raises(
            ValueError,
            r"keep must be a positive integer, but received keep=0\. Pass e\.g\. keep=3",
        ),
    ),
    (
        "PreemptionCheckpoint(keep=None)",
        _checkpoint(keep=None),
        Raises(TypeError, r"keep must be an integer, but received None of type NoneType"),
    ),
    (
        "PreemptionCheckpoint(keep=1.0)",
        _checkpoint(keep=1.0),
        Raises(
            TypeError, r"keep must be an integer, but received 1\.0 of type float\. Pass keep=1"
        ),
    ),
    (
        "PreemptionCheckpoint(exit='yes')",
        _checkpoint(exit="yes"),
        Raises(TypeError, r"exit must be True or False, but received 'yes'"),
    ),
    (
        "PreemptionCheckpoint(exit=1)",
        _checkpoint(exit=1),
        Raises(TypeError, r"exit must be True or False, but received 1 of type int"),
    ),
    (
        "PreemptionCheckpoint(grace_seconds=0)",
        _checkpoint(grace_seconds=0),
        Raises(
            ValueError,
            r"grace_seconds must be a positive finite .* received grace_seconds=0\. Pass",
        ),
    ),
    (
        "PreemptionCheckpoint(grace_seconds=-1)",
        _checkpoint(grace_seconds=-1),
        Raises(
            ValueError,
            r"grace_seconds must be a positive finite .* received grace_seconds=-1",
        ),
    ),
    (
        "PreemptionCheckpoint(grace_seconds=nan)",
        _checkpoint(grace_seconds=math.nan),
        Raises(
            ValueError,
            r"grace_seconds must be a positive finite .* received grace_seconds=nan",
        ),
    ),
    (
        "PreemptionCheckpoint(grace_seconds=inf)",
        _checkpoint(grace_seconds=math.inf),
        Raises(
            ValueError,
            r"grace_seconds must be a positive finite .* received grace_seconds=inf",
        ),
    ),
    (
        "PreemptionCheckpoint(grace_seconds='25')",
        _checkpoint(grace_seconds="25"),
        Raises(
            TypeError, r"grace_seconds must be a number of seconds, but received '25' of type str"
        ),
    ),
    (
        "PreemptionCheckpoint(grace_seconds=True)",
        _checkpoint(grace_seconds=True),
        Raises(
            TypeError, r"grace_seconds must be a number of seconds, but received True of type bool"
        ),
    ),
    (
        "loop(epochs=0)",
        _loop(epochs=0),
        Raises(
            ValueError,
            r"epochs must be a positive integer, but received epochs=0\. Pass e\.g\. epochs=3",
        ),
    ),
    (
        "loop(epochs=2.5)",
        _loop(epochs=2.5),
        Raises(TypeError, r"epochs must be an integer, but received 2\.5 of type float"),
    ),
    (
        "loop(epochs=True)",
        _loop(epochs=True),
        Raises(TypeError, r"epochs must be an integer, but received True of type bool"),
    ),
    (
        "loop(<model without optimizer>)",
        _loop(no_optimizer=True),
        Raises(ValueError, r"needs the optimizer the step applies"),
    ),
    (
        "diagnose_input(steps=0)",
        _diagnose(steps=0),
        Raises(ValueError, r"steps must be a positive integer, but received steps=0"),
    ),
    (
        "diagnose_input(steps=-1)",
        _diagnose(steps=-1),
        Raises(ValueError, r"steps must be a positive integer, but received steps=-1"),
    ),
    (
        "diagnose_input(steps=2.5)",
        _diagnose(steps=2.5),
        Raises(TypeError, r"steps must be an integer, but received 2\.5 of type float"),
    ),
    (
        "diagnose_input(steps=True)",
        _diagnose(steps=True),
        Raises(TypeError, r"steps must be an integer, but received True of type bool"),
    ),
    (
        "diagnose_input(max_seconds=0)",
        _diagnose(max_seconds=0),
        Raises(
            ValueError,
            r"max_seconds must be a positive finite number of seconds, but received max_seconds=0",
        ),
    ),
    (
        "diagnose_input(max_seconds=-1)",
        _diagnose(max_seconds=-1),
        Raises(
            ValueError,
            r"max_seconds must be a positive finite number of seconds, but received max_seconds=-1",
        ),
    ),
    (
        "diagnose_input(max_seconds=nan)",
        _diagnose(max_seconds=math.nan),
        Raises(
            ValueError,
            r"max_seconds must be a positive finite .* received max_seconds=nan",
        ),
    ),
    (
        "diagnose_input(max_seconds='10')",
        _diagnose(max_seconds="10"),
        Raises(
            TypeError, r"max_seconds must be a number of seconds, but received '10' of type str"
        ),
    ),
    ("diagnose_input('model', dataset)", _diagnose(model="model"), Raises(TypeError, r"model")),
    ("diagnose_input(model, None)", _diagnose(dataset=None), Raises(TypeError, r"dataset")),
    (
        "diagnose_input(model, [1, 2, 3])",
        _diagnose(dataset=[1, 2, 3]),
        Raises(TypeError, r"dataset"),
    ),
    ("worker_backup_dir(None, strategy)", _backup_dir(None), Raises(TypeError, r"None")),
    ("worker_backup_dir('', strategy)", _backup_dir(""), Raises(ValueError, r"''")),
    (
        "worker_backup_dir('backup', 'mirrored')",
        _backup_dir("backup", "mirrored"),
        Raises(TypeError, r"'mirrored'"),
    ),
    (
        "PreemptionCheckpoint(signals='TERM')",
        _checkpoint(signals="TERM"),
        Accepts("a signal name without its SIG prefix names the same signal"),
    ),
    (
        "PreemptionCheckpoint(signals=['SIGTERM', 'SIGTERM'])",
        _checkpoint(signals=["SIGTERM", "SIGTERM"]),
        Accepts("a signal named twice is caught once"),
    ),
]


@parametrize(ALL_CASES)
def test_case(call: Any, outcome: Any) -> None:
    check_case(call, outcome)
