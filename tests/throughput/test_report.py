"""``tfdp-utils report``: event files written with tf.summary (known values), read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from tfdp_utils.throughput import _report as report
from tfdp_utils.throughput import _tags as tags
from tfdp_utils.throughput._plot import legend_label
from tfdp_utils.throughput._tags import GLOBAL_RUN, replica_run, worker_run


def write_run(
    log_dir: Path,
    run: str,
    series: dict[str, list[tuple[int, float]]],
    texts: dict[str, list[tuple[int, str]]] | None = None,
) -> None:
    writer = tf.summary.create_file_writer(str(log_dir / run))
    with writer.as_default():
        for tag, points in series.items():
            for step, value in points:
                tf.summary.scalar(tag, value, step=step)
        for tag, notes in (texts or {}).items():
            for step, text in notes:
                tf.summary.text(tag, text, step=step)
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


def _png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]  # the signature, then the IHDR chunk: width, height
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


def test_the_plot_draws_the_jobs_goodput_where_a_fit_wrote_its_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tfdp_utils.throughput._goodput import FitLedger
    from tfdp_utils.throughput._plot import goodput_segments

    ledger = FitLedger(
        fit_begin=10.0,
        fit_end=110.0,
        process_start=0.0,
        first_step=0,
        last_step=3010,
        step_seconds=80.0,
        epoch_start_seconds=(5.0,),
        validation_seconds=4.0,
        input_wait_seconds=8.0,
        checkpoint_save_seconds=2.0,
    )
    rates = {tags.EXAMPLES_PER_SEC: [(s, 1000.0) for s in range(110, 3110, 100)]}
    write_run(tmp_path / "plain", GLOBAL_RUN, rates)
    without = tmp_path / "without.png"
    assert report.main([str(tmp_path / "plain"), "--plot", str(without)]) == 0
    ledgers = {tags.GOODPUT_LEDGER: [(3010, ledger.to_json())]}
    write_run(tmp_path / "job", GLOBAL_RUN, rates, ledgers)
    capsys.readouterr()
    png = tmp_path / "with.png"
    assert report.main([str(tmp_path / "job"), "--json", "--plot", str(png)]) == 0
    goodput = json.loads(capsys.readouterr().out)["goodput"]
    assert goodput["goodput"] == pytest.approx(70 / 110)  # 80 s of steps less 8 + 2
    # A panel of its own: the same figure, taller by the goodput bar.
    (width, height), (width_before, height_before) = _png_size(png), _png_size(without)
    assert width == width_before and height > height_before
    assert [label for label, _ in goodput_segments(goodput)] == [
        "productive 70.0 s (64%)",
        "startup 15.0 s (14%)",  # 10 s before fit + the first epoch's 5 s
        "validation 4.0 s (4%)",
        "input_wait 8.0 s (7%)",
        "checkpoint_saves 2.0 s (2%)",
        "other 11.0 s (10%)",
    ]


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


# ------------------------------------------------------------------------ issue 21


def one_worker_job(log_dir: Path, *, global_until: int = 16) -> None:
    """A single-worker job of 2 replicas, 8 examples a step; the global run may end early."""
    steps = [0, 4, 8, 12, 16]
    write_run(
        log_dir,
        GLOBAL_RUN,
        {
            tags.EXAMPLES: [(s, 8.0 * s) for s in steps if s <= global_until],
            tags.EXAMPLES_PER_SEC: [(s, 800.0) for s in steps[1:] if s <= global_until],
        },
    )
    for k in range(2):
        write_run(
            log_dir,
            replica_run(k),
            {
                tags.EXAMPLES: [(s, 4.0 * s) for s in steps],
                tags.EXAMPLES_PER_SEC: [(s, 400.0) for s in steps[1:]],
            },
        )


def test_json_counts_one_worker_as_the_table_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one_worker_job(tmp_path)
    assert report.main([str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workers"]["count"] == 1
    assert data["complete"] is True and data["cut_short"] == {}
    assert report.main([str(tmp_path)]) == 0
    assert "workers: 1" in capsys.readouterr().out


def test_a_run_that_ends_early_is_marked_cut_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one_worker_job(tmp_path, global_until=8)  # global 64 examples, each replica 64 of 128
    assert report.main([str(tmp_path)]) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith(GLOBAL_RUN))
    assert row.rstrip().endswith("CUT SHORT")
    assert "CUT SHORT global: ends at step 8 while other runs of the job reach step 16" in table
    assert report.main([str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["complete"] is False
    assert list(data["cut_short"]) == [GLOBAL_RUN]
    assert data["runs"][replica_run(0)]["cut_short"] == []


def test_a_truncated_event_file_is_marked_in_table_json_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one_worker_job(tmp_path)
    (events,) = (tmp_path / GLOBAL_RUN).glob("*.tfevents.*")
    events.write_bytes(events.read_bytes()[:-5])  # the last record cut in the middle
    png = tmp_path / "plot.png"
    assert report.main([str(tmp_path / "."), "--json", "--plot", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    reasons = data["cut_short"][GLOBAL_RUN]
    assert any("ends in a partial record" in r for r in reasons), reasons
    assert png.stat().st_size > 5000
    runs = report.read_runs(str(tmp_path))
    entry = data["runs"][GLOBAL_RUN]
    last_rate = runs[GLOBAL_RUN].series[tags.EXAMPLES_PER_SEC][-1][0]
    assert last_rate == 12  # the cut record held the rate at step 16
    label = legend_label(GLOBAL_RUN, entry, last_rate)
    assert label == "global (CUT SHORT at step 12)"


def test_counts_that_disagree_with_the_replicas_are_marked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path, GLOBAL_RUN, {tags.EXAMPLES: [(0, 0.0), (8, 64.0)]})
    write_run(tmp_path, replica_run(0), {tags.EXAMPLES: [(0, 0.0), (8, 64.0)]})
    write_run(tmp_path, replica_run(1), {tags.EXAMPLES: [(0, 0.0), (8, 64.0)]})
    assert report.main([str(tmp_path)]) == 0
    assert "counts 64 examples at step 8 but its replica runs add up to 128" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    ("plot", "says"),
    [
        pytest.param("missing/dir/out.png", "does not exist", id="missing-directory"),
        pytest.param(".", "is a directory", id="a-directory"),
        pytest.param("out.jpg", "does not end in .png", id="not-png"),
    ],
)
def test_a_bad_plot_path_is_one_line_and_exit_2_before_reading(
    plot: str, says: str, log_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / plot)
    for logdir in (str(log_dir), str(tmp_path / "no-such-logdir")):  # checked before reading
        assert report.main([logdir, "--plot", path]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.count("\n") == 1 and says in err, err


def test_a_closed_pipe_ends_quietly(log_dir: Path) -> None:
    # `| true` closes the pipe before report writes: every write then fails with EPIPE.
    import shlex
    import subprocess
    import sys

    command = (
        f"{shlex.quote(sys.executable)} -m tfdp_utils.cli report {shlex.quote(str(log_dir))} | true"
    )
    result = subprocess.run(
        ["bash", "-c", "set -o pipefail; " + command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.stderr == "", result.stderr
    assert result.returncode == 141  # as a command stopped by SIGPIPE, like every tfdp-utils one


# ------------------------------------------------------------------ steps that go back


def test_a_fit_resumed_behind_the_steps_logged_is_said_and_both_fits_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A job killed without notice after logging step 910, resumed from its checkpoint of
    # step 900: the second fit's event file starts at 900 (its count there), as the logger's.
    killed = [(s, 8.0 * s) for s in (10, 110, 210, 310, 410, 510, 610, 710, 810, 910)]
    write_run(
        tmp_path,
        GLOBAL_RUN,
        {tags.EXAMPLES: killed, tags.EXAMPLES_PER_SEC: [(s, 800.0) for s, _ in killed[1:]]},
    )
    resumed = [900, 910, 1010, 1110]
    write_run(
        tmp_path,
        GLOBAL_RUN,
        {
            tags.EXAMPLES: [(s, 8.0 * s) for s in resumed],
            tags.EXAMPLES_PER_SEC: [(s, 700.0) for s in resumed[1:]],
        },
    )
    runs = report.read_runs(str(tmp_path))
    # Kept as TensorBoard shows it: both fits' rates at step 910; the equal counts once.
    rates = runs[GLOBAL_RUN].series[tags.EXAMPLES_PER_SEC]
    assert [p for p in rates if p[0] == 910] == [(910, 800.0), (910, 700.0)]
    assert [s for s, _ in runs[GLOBAL_RUN].series[tags.EXAMPLES]].count(910) == 1
    text = (
        "fit 2 resumed at step 900, behind step 910 that fit 1 reached: steps 900-910 "
        "(10 steps) trained twice"
    )
    assert report.main([str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["steps_back"] == {GLOBAL_RUN: [text]}
    (back,) = data["runs"][GLOBAL_RUN]["steps_back"]
    assert (back["fit"], back["resumed_at"], back["reached"], back["reached_by"]) == (
        2,
        900,
        910,
        1,
    )
    assert data["runs"][GLOBAL_RUN]["windows"] == 9 + 3
    assert report.main([str(tmp_path)]) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith(GLOBAL_RUN))
    assert row.rstrip().endswith("STEPS BACK")
    assert f"STEPS BACK {GLOBAL_RUN}: {text}" in table, table


@pytest.mark.keras
def test_the_loggers_own_files_of_a_fit_resumed_from_an_older_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two fits with the real ThroughputLogger: the first trains 20 steps, saving a checkpoint
    # at step 12; the job is restored from it (as after a SIGKILL) and trains on; a third fit
    # goes on where the second ended, which is no step back.
    import tfdp_utils as tdu
    from tfdp_utils._tf import keras
    from tfdp_utils.callbacks import ThroughputLogger

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x = np.arange(80, dtype="float32").reshape(-1, 1)
    dist = tdu.build_distributed_dataset((x, x), strategy=strategy, global_batch_size=8)
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    iterations = model.optimizer.iterations
    checkpoint = tf.train.Checkpoint(step=iterations)
    saved: list[str] = []

    class SaveAt12(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if int(iterations.numpy()) == 12:
                saved.append(checkpoint.save(str(tmp_path / "ckpt" / "step")))

    def fit(**kwargs: Any) -> None:
        logger = ThroughputLogger(tmp_path / "logs", log_every_n_steps=4, warmup_steps=1)
        model.fit(dist, verbose=0, callbacks=[logger, *kwargs.pop("callbacks", [])], **kwargs)

    fit(epochs=2, callbacks=[SaveAt12()])  # steps 0-20
    assert int(iterations.numpy()) == 20 and len(saved) == 1
    checkpoint.restore(saved[0]).assert_consumed()
    assert int(iterations.numpy()) == 12
    fit(epochs=1)  # steps 12-22
    fit(epochs=1)  # steps 22-32: goes on
    assert report.main([str(tmp_path / "logs"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    text = (
        "fit 2 resumed at step 12, behind step 20 that fit 1 reached: steps 12-20 "
        "(8 steps) trained twice"
    )
    assert data["steps_back"] == {GLOBAL_RUN: [text]}, data["steps_back"]
    for replica in (replica_run(0), replica_run(1)):  # the replicas' runs show it too
        assert [b["text"] for b in data["runs"][replica]["steps_back"]] == [text]
    runs = report.read_runs(str(tmp_path / "logs"))
    assert runs[GLOBAL_RUN].fits[0].last_step == 20 and runs[GLOBAL_RUN].fits[1].first_step == 12
    assert report.main([str(tmp_path / "logs")]) == 0
    assert f"STEPS BACK {GLOBAL_RUN}: {text}" in capsys.readouterr().out
