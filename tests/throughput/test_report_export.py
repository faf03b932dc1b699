"""``tfdp-utils report --csv / --windows-json``: every point, compared with TensorBoard's reader."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tfdp_utils.cli import main
from tfdp_utils.throughput._tags import GLOBAL_RUN, replica_run

TAGS = {
    "examples_per_sec": "throughput/examples_per_sec",
    "steps_per_sec": "throughput/steps_per_sec",
    "examples": "throughput/examples",
}


def tensorboard_points(run_dir: Path) -> dict[str, dict[int, tuple[float, float]]]:
    """column -> step -> (value, wall time), through TensorBoard's own reader."""
    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    found = acc.Tags()["tensors"]
    return {
        column: {
            e.step: (float(tf.make_ndarray(e.tensor_proto)), e.wall_time) for e in acc.Tensors(tag)
        }
        for column, tag in TAGS.items()
        if tag in found
    }


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tfdp_utils._tf import keras
    from tfdp_utils.callbacks import ThroughputLogger

    path = tmp_path_factory.mktemp("logs")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    x = np.zeros((800, 4), "float32")
    logger = ThroughputLogger(path, global_batch_size=8, log_every_n_steps=10)
    model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0, callbacks=[logger])
    return path


def check_rows(rows: list[dict[str, str | float | int | None]], log_dir: Path) -> None:
    runs = {GLOBAL_RUN, replica_run(0), replica_run(1)}
    assert {str(r["run"]) for r in rows} == runs
    for run in runs:
        expected = tensorboard_points(log_dir / run)
        mine = [r for r in rows if r["run"] == run]
        steps = sorted({s for points in expected.values() for s in points})
        assert [int(str(r["step"])) for r in mine] == steps
        for row in mine:
            step = int(str(row["step"]))
            # The row's wall time is one of the times its values were written at.
            walls = [points[step][1] for points in expected.values() if step in points]
            assert min(walls) - 1e-3 <= float(str(row["wall_time"])) <= max(walls) + 1e-3
            for column in TAGS:
                point = expected.get(column, {}).get(step)
                cell = row[column]
                if point is None:
                    assert cell in ("", None)
                    continue
                assert float(str(cell)) == pytest.approx(point[0], rel=1e-6)
    last_global = [r for r in rows if r["run"] == GLOBAL_RUN][-1]
    assert float(str(last_global["examples"])) == 1600  # 2 epochs of 800 examples


def test_csv_file_holds_every_point(log_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "points.csv"
    assert main(["report", str(log_dir), "--csv", str(out)]) == 0
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    check_rows(rows, log_dir)  # type: ignore[arg-type]


def test_json_file_and_csv_on_stdout(
    log_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "points.json"
    assert main(["report", str(log_dir), "--windows-json", str(out), "--csv", "-"]) == 0
    check_rows(json.loads(out.read_text()), log_dir)
    check_rows(list(csv.DictReader(io.StringIO(capsys.readouterr().out))), log_dir)  # type: ignore[arg-type]


def test_json_on_stdout_replaces_the_table(
    log_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(log_dir), "--windows-json", "-"]) == 0
    check_rows(json.loads(capsys.readouterr().out), log_dir)


def test_an_unwritable_export_path_is_exit_2(log_dir: Path, tmp_path: Path) -> None:
    assert main(["report", str(log_dir), "--csv", str(tmp_path / "missing" / "x.csv")]) == 2
