"""keras_xla: the verdict auto_strategy states, checked against what Keras itself resolves."""

from __future__ import annotations

import logging

import pytest

import tfdp_utils as tdu
from tfdp_utils.strategy._xla import keras_xla


@pytest.mark.parametrize(
    ("kind", "keras3", "accelerators", "expected"),
    [
        ("tpu", True, 8, "Keras fit: XLA (TPUStrategy"),
        ("tpu", False, 8, "Keras fit: XLA (TPUStrategy"),
        ("mirrored", True, 2, "no XLA (jit_compile='auto' is off under tf.distribute"),
        ("multi_worker", True, 1, "no XLA (jit_compile='auto' is off under tf.distribute"),
        ("one_device", True, 1, "no XLA (jit_compile='auto' is off under tf.distribute"),
        ("mirrored", True, 0, "no XLA (jit_compile='auto' is off on CPU only)"),
        ("mirrored", False, 2, "XLA only with compile(jit_compile=True)"),
    ],
)
def test_verdict_table(kind, keras3, accelerators, expected):
    assert expected in keras_xla(kind, keras3=keras3, accelerators=accelerators)


@pytest.mark.keras
def test_auto_strategy_says_what_keras_resolves(caplog):
    from tfdp_utils._tf import keras

    caplog.set_level(logging.INFO, logger="tfdp_utils")
    strategy = tdu.auto_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
    line = next(r.getMessage() for r in caplog.records if "replica(s) on" in r.getMessage())
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(
            optimizer="sgd", loss="mse", **({"jit_compile": "auto"} if tdu.IS_KERAS3 else {})
        )
    # Keras' own resolution, read back from the compiled model.
    compiles = bool(model.jit_compile)
    assert ("Keras fit: no XLA" in line or "XLA only with" in line) is (not compiles)
    assert keras_xla("mirrored", keras3=tdu.IS_KERAS3, accelerators=0) in line
