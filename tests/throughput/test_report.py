"""``tfdp-utils report``: event files written with tf.summary (known values), read back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tfdp_utils.throughput import _report as report
from tfdp_utils.throughput import _tags as tags
from tfdp_utils.throughput._tags import GLOBAL_RUN, replica_run, worker_run


def write_run(log_dir: Path, run: str, series: dict[str, list[tuple[int, float]]]) -> None:
    writer = tf.summary.create_file_writer(str(log_dir / run))
    with writer.as_default():
        for tag, points in series.items():
            for step, value in points:
                tf.summary.scalar(tag, value, step=step)
    writer.close()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    # 30 windows per run, more than EventAccumulator's default of 10 tensor events.
    steps = list(range(110, 3110, 100))
    rates = [float(v) for v in np.linspace(900, 1100, len(steps))]
    write_run(
        tmp_path,
        GLOBAL_RUN,
        {
            tags.EXAMPLES_PER_SEC: list(zip(steps, rates, strict=True)),
            tags.STEPS_PER_SEC: [(s, r / 8) for s, r in zip(steps, rates, strict=True)],
            tags.EXAMPLES: [(s, s * 8.0) for s in steps],
            tags.WORKER_SKEW: [(s, 0.02) for s in steps],
        },
    )
    write_run(tmp_path, replica_run(0), {tags.EXAMPLES_PER_SEC: [(s, 600.0) for s in steps]})
    write_run(tmp_path, replica_run(1), {tags.EXAMPLES_PER_SEC: [(s, 400.0) for s in steps]})
    write_run(tmp_path, worker_run(0), {tags.STEPS_PER_SEC: [(s, 125.0) for s in steps]})
    write_run(tmp_path, worker_run(1), {tags.STEPS_PER_SEC: [(s, 122.5) for s in steps]})
    # A run of Keras' own TensorBoard callback in the same log_dir is left out.
    write_run(tmp_path, "train", {"epoch_loss": [(0, 1.0)]})
    return tmp_path


def test_summary_figures(log_dir: Path) -> None:
    runs = report.read_runs(str(log_dir))
    assert list(runs) == [GLOBAL_RUN, replica_run(0), replica_run(1), worker_run(0), worker_run(1)]
    summary = report.summarize(runs)
    rates = summary["runs"][GLOBAL_RUN]["examples_per_sec"]
    assert summary["runs"][GLOBAL_RUN]["windows"] == 30
    assert rates["min"] == pytest.approx(900) and rates["max"] == pytest.approx(1100)
    assert rates["median"] == pytest.approx(1000)
    assert summary["runs"][GLOBAL_RUN]["examples"] == 3010 * 8
    assert summary["runs"][GLOBAL_RUN]["last_step"] == 3010
    assert summary["replica_skew"] == pytest.approx(200 / 600)
    assert summary["workers"]["count"] == 2
    assert summary["workers"]["median_steps_per_sec"] == {
        worker_run(0): 125.0,
        worker_run(1): 122.5,
    }
    assert summary["workers"]["median_skew"] == pytest.approx(0.02)


def test_table(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(log_dir)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["run", "windows"]
    assert any(line.startswith(GLOBAL_RUN) and "1,000.0" in line for line in lines)
    assert "replica skew (max-min)/max of median examples/s: 33.3%" in out
    rates = f"{worker_run(0)} 125.0, {worker_run(1)} 122.5 steps/s"
    assert f"workers: 2 ({rates}); median skew 2.0%" in out


def test_json_and_plot(log_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "throughput.png"
    assert report.main([str(log_dir), "--json", "--plot", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["runs"][replica_run(0)]["examples_per_sec"]["median"] == 600.0
    assert data["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 5000


def test_the_cli_mounts_report(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tfdp_utils.cli import main

    assert main(["report", str(log_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["runs"][GLOBAL_RUN]["examples_per_sec"]["median"] == pytest.approx(1000)
    assert main(["report", str(log_dir / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_missing_and_empty_log_dirs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    write_run(tmp_path, "train", {"epoch_loss": [(0, 1.0)]})
    assert report.main([str(tmp_path)]) == 1
    assert "no throughput runs" in capsys.readouterr().err


@pytest.mark.keras
def test_report_on_a_real_logger_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tfdp_utils._tf import keras
    from tfdp_utils.callbacks import ThroughputLogger

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    x = np.zeros((800, 4), "float32")
    logger = ThroughputLogger(tmp_path, global_batch_size=8, log_every_n_steps=10)
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[logger])
    assert report.main([str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["runs"]) == {GLOBAL_RUN, replica_run(0), replica_run(1)}
    assert data["runs"][GLOBAL_RUN]["examples"] == 800
    assert data["runs"][GLOBAL_RUN]["windows"] == logger.summary()["windows"]
    assert data["replica_skew"] == pytest.approx(0.0, abs=1e-9)
