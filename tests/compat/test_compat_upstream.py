"""keras#19246 reproduced in a fresh process, with the workarounds off and then on.

The subprocess has 2 logical CPUs and starts with ``TFDP_NO_KERAS_PATCHES=1``: it trains
with ``steps_per_execution=4`` on ``MirroredStrategy`` over both CPUs as Keras does it, then
turns the workarounds on and trains again. The probe must match what happened with them off:
on Keras 3.15.1 the placeholder error, on tf_keras (the ``TF_USE_LEGACY_KERAS=1`` pass) or on
a Keras that has fixed keras#19246 no failure, and then the probe returns False and tfdp-utils
applies nothing, which this test reports as the workaround no longer being needed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.processes import run_python

from tfdp_utils._tf import IS_KERAS3

pytestmark = [pytest.mark.keras]

SCRIPT = """
import json, os
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import tfdp_utils as tdu
from tfdp_utils._tf import keras

strategy = tdu.auto_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
report = {"applied_when_disabled": list(tdu.compat.applied())}
report["probe"] = {s.issue: s.bug_present for s in tdu.compat.status()}["keras#19246"]

x = np.random.RandomState(0).rand(128, 3).astype("float32")
y = x.sum(axis=1, keepdims=True)
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)


def train():
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", steps_per_execution=4)
    try:
        model.fit(data, verbose=0)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: ...{str(exc)[-1500:]}"}
    return {"iterations": int(model.optimizer.iterations.numpy())}


report["off"] = train()
del os.environ["TFDP_NO_KERAS_PATCHES"]
report["applied"] = list(tdu.compat.apply_for_strategy(strategy))
report["on"] = train()
print("REPORT " + json.dumps(report))
"""


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    done = run_python(
        SCRIPT,
        env={"TFDP_NO_KERAS_PATCHES": "1", "CUDA_VISIBLE_DEVICES": ""},
        timeout=240,
        preloaded=True,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return dict(json.loads(lines[-1][len("REPORT ") :]))


def test_probe_matches_upstream_behaviour(report: dict[str, Any]) -> None:
    """With the workaround off, spe=4 on 2 replicas fails exactly when the probe says so."""
    assert report["applied_when_disabled"] == []
    failed = "error" in report["off"]
    assert report["probe"] == failed, (
        f"the keras#19246 probe says {report['probe']} but spe=4 without the workaround "
        f"{'failed' if failed else 'trained'}: {report['off']}"
    )
    if failed:
        assert "You must feed a value for placeholder tensor" in report["off"]["error"]
    else:
        # Keras trains without help (tf_keras, or a Keras that fixed keras#19246): the
        # workaround is no longer needed and must not be applied.
        assert "keras#19246" not in report["applied"]
        assert report["off"]["iterations"] == 16
    if not IS_KERAS3:
        assert not failed and report["applied"] == []


def test_workaround_on_trains_every_batch(report: dict[str, Any]) -> None:
    assert "error" not in report["on"], report["on"]
    assert report["on"]["iterations"] == 16
    if report["probe"]:
        assert "keras#19246" in report["applied"]
