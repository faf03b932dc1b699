"""The files DivergenceGuard(directory=) writes for a non-finite step: written and read back
(the batch's nest of arrays, the weights in order, the report), without TensorFlow."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tfdp_utils.training._step_files import _rebuild, save_step

pytestmark = pytest.mark.pure


def test_a_saved_step_reads_back_as_written(tmp_path: Path) -> None:
    batch = ({"image": np.ones((2, 3), "float32"), "mask": np.zeros((2,), "int64")}, np.arange(2.0))
    weights = [np.full((3, 1), 0.5, "float32"), np.array([np.inf], "float32")]
    folder = Path(
        save_step(
            str(tmp_path),
            step=4,
            names=["d/kernel", "d/bias"],
            weights=weights,
            batch=batch,
            report={"step": 4, "replicas": (1,)},
        )
    )
    assert folder == tmp_path / "step-4"
    content = json.loads((folder / "step.json").read_text())
    assert content["variables"] == ["d/kernel", "d/bias"] and content["report"]["replicas"] == [1]
    with np.load(folder / "batch.npz") as leaves:
        rebuilt = _rebuild(content["batch"], dict(leaves))
    assert isinstance(rebuilt, tuple) and set(rebuilt[0]) == {"image", "mask"}
    np.testing.assert_array_equal(rebuilt[0]["image"], batch[0]["image"])
    np.testing.assert_array_equal(rebuilt[0]["mask"], batch[0]["mask"])
    np.testing.assert_array_equal(rebuilt[1], batch[1])
    with np.load(folder / "weights.npz") as saved:
        for i, want in enumerate(weights):
            np.testing.assert_array_equal(saved[f"w_{i}"], want)


def test_a_step_without_its_batch_saves_the_weights_only(tmp_path: Path) -> None:
    folder = Path(
        save_step(str(tmp_path), step=1, names=["w"], weights=[np.ones(2)], batch=None, report={})
    )
    assert json.loads((folder / "step.json").read_text())["batch"] is None
    assert (folder / "weights.npz").exists() and not (folder / "batch.npz").exists()
