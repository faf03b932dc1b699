"""Real 2-worker MultiWorkerMirroredStrategy on localhost: Keras ``fit``/``evaluate``/``predict``.

One cluster run per flavour (Keras 3 here, tf_keras in the ``TF_USE_LEGACY_KERAS=1`` pass)
serves every test in this module: the ``compat`` phase of the shared 2-worker cluster
(tests/two_worker_cluster.py); each worker reports JSON. On Keras 3 the workers first
train with the workarounds off (``TFDP_NO_KERAS_PATCHES=1`` while ``auto_strategy()`` builds
the strategy), to reproduce keras#20585, then with only keras#20585 fixed, to reproduce
tensorflow#72388, then with everything ``auto_strategy()`` would apply. On tf_keras the same
script must train in every phase with no patch at all.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.two_worker_cluster import BATCHES, EPOCHS, GLOBAL_BATCH, phase_results

from tfdp_utils._tf import IS_KERAS3

pytestmark = [pytest.mark.slow, pytest.mark.keras]


@pytest.fixture(scope="module")
def workers(two_worker_phases: dict[str, Any]) -> list[dict[str, Any]]:
    """The compat phase of the shared 2-worker cluster; the reports, by task index."""
    return phase_results(two_worker_phases, "compat")


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
