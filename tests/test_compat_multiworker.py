"""Real 2-worker MultiWorkerMirroredStrategy on localhost: Keras ``fit``/``evaluate``/``predict``.

One cluster run per flavour (Keras 3 here, tf_keras in the ``TF_USE_LEGACY_KERAS=1`` pass)
serves every test in this module; each worker reports JSON. On Keras 3 the workers first
train with the workarounds off (``TFDP_NO_KERAS_PATCHES=1`` while ``auto_strategy()`` builds
the strategy), to reproduce keras#20585, then with only keras#20585 fixed, to reproduce
tensorflow#72388, then with everything ``auto_strategy()`` would apply. On tf_keras the same
script must train in every phase with no patch at all.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from conftest import free_port, start_python, tf_config, wait_all

from tfdp_utils._tf import IS_KERAS3

pytestmark = [pytest.mark.slow, pytest.mark.keras]

EPOCHS = 2
BATCHES = 16
GLOBAL_BATCH = 16

WORKER = """
import json, logging, os, traceback
import numpy as np
import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf, IS_KERAS3

if hasattr(keras, "config") and hasattr(keras.config, "disable_traceback_filtering"):
    keras.config.disable_traceback_filtering()  # keep Keras' own frames in the traceback
result = {"keras3": IS_KERAS3}
strategy = tdu.auto_strategy(cluster_timeout=60, collective_timeout=120)
result["replicas"] = int(strategy.num_replicas_in_sync)
result["applied_when_disabled"] = list(tdu.compat.applied())
result["probes"] = {s.issue: s.bug_present for s in tdu.compat.status()}
del os.environ["TFDP_NO_KERAS_PATCHES"]

rng = np.random.RandomState(0)
x = rng.rand(%(examples)d, 3).astype("float32")
y = (x @ np.array([[1.0], [2.0], [3.0]], "float32") + 0.5).astype("float32")
init = [rng.randn(3, 1).astype("float32") * 0.1, np.zeros((1,), "float32")]
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(%(batch)d).with_options(options)
features = tf.data.Dataset.from_tensor_slices(x).batch(%(batch)d).with_options(options)


def model_for(steps_per_execution):
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse",
                      steps_per_execution=steps_per_execution)
    model.set_weights(init)
    return model


def attempt(name, steps_per_execution, full=False):
    phase = {}
    model = model_for(steps_per_execution)
    try:
        history = model.fit(data, epochs=%(epochs)d, verbose=0)
        phase["loss"] = [float(v) for v in history.history["loss"]]
        phase["iterations"] = int(model.optimizer.iterations.numpy())
        phase["weights"] = [w.tolist() for w in model.get_weights()]
        if full:
            phase["evaluate"] = float(model.evaluate(data, verbose=0))
            phase["predict"] = model.predict(features, verbose=0).tolist()
    except Exception as exc:
        phase["error"] = f"{type(exc).__name__}: {exc}"[:3000]
        phase["frames"] = [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
    result[name] = phase


attempt("off", 1)
tdu.compat.apply(["keras#20585"])
result["applied_20585_only"] = list(tdu.compat.applied())
attempt("only_20585", 1)
result["applied"] = list(tdu.compat.apply_for_strategy(strategy))
attempt("on", 1, full=True)
attempt("on_spe4", 4, full=True)
print("RESULT " + json.dumps(result), flush=True)
"""


def _parse(rc: int, out: str, err: str) -> dict[str, Any]:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert rc == 0 and lines, f"worker failed (rc={rc}):\n{out[-3000:]}\n{err[-6000:]}"
    return dict(json.loads(lines[-1][len("RESULT ") :]))


@pytest.fixture(scope="module")
def workers() -> list[dict[str, Any]]:
    """Run the two workers once for the whole module; their reports, by task index."""
    ports = [free_port(), free_port()]
    code = WORKER % {"examples": BATCHES * GLOBAL_BATCH, "batch": GLOBAL_BATCH, "epochs": EPOCHS}
    processes = [
        start_python(
            code,
            env={
                "TF_CONFIG": tf_config(ports, index),
                "TFDP_NO_KERAS_PATCHES": "1",
                "CUDA_VISIBLE_DEVICES": "",
            },
        )
        for index in range(2)
    ]
    return [_parse(*outcome) for outcome in wait_all(processes, timeout=420)]


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.rand(BATCHES * GLOBAL_BATCH, 3).astype("float32")
    y = (x @ np.array([[1.0], [2.0], [3.0]], "float32") + 0.5).astype("float32")
    return x, y


def test_cluster_is_two_workers_and_disabled_means_unpatched(workers: list[dict[str, Any]]) -> None:
    for report in workers:
        assert report["keras3"] == IS_KERAS3  # the workers run the flavour of this pass
        assert report["replicas"] == 2
        assert report["applied_when_disabled"] == []


def test_keras_20585_reproduced_without_the_workaround(workers: list[dict[str, Any]]) -> None:
    """Fails with the workaround off exactly when the probe says Keras has the bug.

    The day Keras fixes keras#20585, the probe returns False, no patch is applied, and this
    test checks that ``fit`` then works without it.
    """
    for report in workers:
        failed = "error" in report["off"]
        assert report["probes"]["keras#20585"] == failed, report["off"]
        if failed:
            assert "PerReplica" in report["off"]["error"]
            assert "_maybe_symbolic_build" in report["off"]["frames"]
        if not report["keras3"]:
            assert not failed


def test_tensorflow_72388_reproduced_once_past_keras_20585(workers: list[dict[str, Any]]) -> None:
    """With only keras#20585 worked around, Keras 3 fails in reduce_per_replica on scalars."""
    for report in workers:
        failed = "error" in report["only_20585"]
        assert report["probes"]["tensorflow#72388"] == failed, report["only_20585"]
        if failed:
            assert "Invalid reduction dimension" in report["only_20585"]["error"]
            assert "reduce_per_replica" in report["only_20585"]["frames"]


def test_workarounds_applied_only_where_the_bug_is(workers: list[dict[str, Any]]) -> None:
    for report in workers:
        present = [issue for issue, bug in report["probes"].items() if bug]
        assert report["applied"] == present
        if not report["keras3"]:
            assert report["applied"] == []  # tf_keras is never patched


def test_fit_evaluate_predict_agree_on_both_workers(workers: list[dict[str, Any]]) -> None:
    first, second = (report["on"] for report in workers)
    assert "error" not in first, first.get("error")
    assert "error" not in second, second.get("error")
    assert first["loss"] == second["loss"]
    assert first["weights"] == second["weights"]
    assert first["evaluate"] == second["evaluate"]
    assert first["predict"] == second["predict"]
    # One optimizer step per global batch, on every worker.
    assert first["iterations"] == second["iterations"] == EPOCHS * BATCHES
    assert first["loss"][1] < first["loss"][0]


def test_evaluate_and_predict_match_numpy_on_the_final_weights(
    workers: list[dict[str, Any]],
) -> None:
    """predict() returns every example in order, and evaluate() the mean squared error."""
    x, y = _data()
    report = workers[0]["on"]
    kernel, bias = (np.asarray(w, "float32") for w in report["weights"])
    expected = x @ kernel + bias
    predicted = np.asarray(report["predict"], "float32")
    assert predicted.shape == expected.shape
    np.testing.assert_allclose(predicted, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(report["evaluate"], np.mean((expected - y) ** 2), rtol=1e-4)


def test_steps_per_execution_4_same_as_1_on_two_workers(workers: list[dict[str, Any]]) -> None:
    """keras#19246 under MultiWorkerMirroredStrategy: with spe=4 every batch is one step.

    ``evaluate`` and ``predict`` with spe=4 give what they give with spe=1.
    """
    for report in workers:
        spe4 = report["on_spe4"]
        assert "error" not in spe4, spe4.get("error")
        assert spe4["iterations"] == EPOCHS * BATCHES
        np.testing.assert_allclose(
            np.concatenate([np.ravel(w) for w in spe4["weights"]]),
            np.concatenate([np.ravel(w) for w in report["on"]["weights"]]),
            rtol=1e-6,
            atol=1e-6,
        )
        assert spe4["loss"][-1] == pytest.approx(report["on"]["loss"][-1], rel=1e-5)
        assert spe4["evaluate"] == pytest.approx(report["on"]["evaluate"], rel=1e-5)
        np.testing.assert_allclose(spe4["predict"], report["on"]["predict"], rtol=1e-5, atol=1e-6)
