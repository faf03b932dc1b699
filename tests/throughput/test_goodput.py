"""Goodput as a table of jobs: each case's figures worked out by hand, not by the code.

The ledgers are what a chief would write (wall times in seconds); the expected goodput and
losses are computed in the case itself from the scenario's story.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfdp_utils.throughput._goodput import (
    FitLedger,
    Goodput,
    goodput_of,
    job_goodput,
    ledgers_of,
    process_start_time,
)
from tfdp_utils.throughput._restarts import FitSpan
from tfdp_utils.throughput._tags import GOODPUT_LOSSES

pytestmark = pytest.mark.pure


def _losses(report: Goodput) -> dict[str, float]:
    return {loss.name: round(loss.seconds, 6) for loss in report.losses}


def test_one_run_its_startup_validation_input_and_tail() -> None:
    # Process up at 0; fit begins at 12 (imports, strategy, model); the first epoch's start
    # (trace + first step) 8 s; 3 more epoch starts of 1 s; 100 s of steps of which 10 waited
    # for input and 3 went to periodic checkpoint saves between steps; 6 s of validation; 2 s
    # after the last step; 4 s in other callbacks' hooks: fit ends at 135.
    fit = FitLedger(
        fit_begin=12.0,
        fit_end=135.0,
        process_start=0.0,
        first_step=0,
        last_step=400,
        step_seconds=100.0,
        epoch_start_seconds=(8.0, 1.0, 1.0, 1.0),
        validation_seconds=6.0,
        input_wait_seconds=10.0,
        after_last_step_seconds=2.0,
        checkpoint_save_seconds=3.0,
    )
    report = job_goodput([fit])
    assert report.wall_seconds == 135.0 and report.fits == 1
    assert report.productive_seconds == 87.0  # 100 s of steps less 10 s waiting, 3 s saving
    assert report.goodput == pytest.approx(87 / 135)
    assert _losses(report) == {
        "startup": 20.0,  # 12 before fit + 8 for the first trace and step
        "restarts": 0.0,
        "epoch_starts": 3.0,
        "validation": 6.0,
        "input_wait": 10.0,
        "checkpoint_saves": 3.0,
        "steps_trained_twice": 0.0,
        "after_last_step": 2.0,
        "other": 4.0,  # the rest: the hooks
    }
    assert [loss.name for loss in report.losses] == list(GOODPUT_LOSSES)
    assert {loss.name: loss.kind for loss in report.losses}["steps_trained_twice"] == "derived"


def test_a_job_stopped_and_resumed_counts_the_restart_between_its_runs() -> None:
    first = FitLedger(
        fit_begin=5.0,
        fit_end=65.0,
        process_start=0.0,
        first_step=0,
        last_step=300,
        step_seconds=50.0,
        epoch_start_seconds=(5.0,),
    )
    # The scheduler brought the job back 40 s after the first run's fit ended.
    second = FitLedger(
        fit_begin=110.0,
        fit_end=170.0,
        process_start=105.0,
        first_step=300,
        last_step=600,
        step_seconds=50.0,
        epoch_start_seconds=(5.0,),
    )
    report = job_goodput([second, first])  # any order: by start
    assert report.fits == 2 and report.wall_seconds == 170.0
    assert report.productive_seconds == 100.0
    losses = _losses(report)
    assert losses["restarts"] == 40.0  # 105 - 65
    assert losses["startup"] == 5 + 5 + 5 + 5  # each run: before its fit, and its first step
    assert losses["other"] == 170 - 100 - 40 - 20


def test_two_fits_of_one_process_have_one_startup_and_no_restart() -> None:
    one = FitLedger(
        fit_begin=10.0,
        fit_end=30.0,
        process_start=0.0,
        first_step=0,
        last_step=100,
        step_seconds=15.0,
        epoch_start_seconds=(3.0,),
    )
    two = FitLedger(
        fit_begin=35.0,
        fit_end=50.0,
        process_start=0.0,
        first_step=100,
        last_step=200,
        step_seconds=12.0,
        epoch_start_seconds=(1.0,),
    )
    losses = _losses(job_goodput([one, two]))
    assert losses["startup"] == 10 + 3 + 1  # no second "process start" before fit two
    assert losses["restarts"] == 0.0  # 30 -> 35 is the program's own time: in other
    assert losses["other"] == 50 - 27 - 14


def test_steps_trained_twice_after_a_resume_from_an_older_checkpoint() -> None:
    # Killed at step 910 (91 s of steps: 0.1 s a step), resumed from the save at step 900.
    killed = FitLedger(
        fit_begin=0.0,
        fit_end=100.0,
        process_start=0.0,
        first_step=0,
        last_step=910,
        step_seconds=91.0,
    )
    resumed = FitLedger(
        fit_begin=120.0,
        fit_end=200.0,
        process_start=120.0,
        first_step=900,
        last_step=1800,
        step_seconds=80.0,
    )
    report = job_goodput([killed, resumed])
    assert _losses(report)["steps_trained_twice"] == pytest.approx(1.0)  # 10 steps x 0.1 s
    assert report.productive_seconds == pytest.approx(91 + 80 - 1)


def test_a_killed_run_without_a_ledger_stands_in_from_its_points() -> None:
    resumed = FitLedger(
        fit_begin=60.0,
        fit_end=90.0,
        process_start=55.0,
        first_step=40,
        last_step=80,
        step_seconds=20.0,
    )
    spans = [FitSpan(0, 50), FitSpan(40, 80)]
    walls = [(1.0, 51.0), (61.0, 89.0)]
    ledgers = ledgers_of(spans, [None, resumed.to_json()], walls)
    assert ledgers[0].derived and ledgers[0].step_seconds == 50.0 and ledgers[1] == resumed
    report = goodput_of(spans, [None, resumed.to_json()], walls)
    assert report is not None and report.fits == 2
    assert any("killed without notice" in note for note in report.notes)
    # Steps 40-50 were trained twice: 10 steps at the killed run's 1 s a step.
    assert _losses(report)["steps_trained_twice"] == pytest.approx(10.0)
    # No ledger at all (a log of an older version): unknown, not a guess.
    assert goodput_of(spans, [None, None], walls) is None
    assert goodput_of(spans, [], []) is None


def test_ledger_json_round_trip_and_what_it_refuses() -> None:
    ledger = FitLedger(
        fit_begin=1.5,
        fit_end=2.5,
        process_start=None,
        first_step=3,
        last_step=9,
        step_seconds=0.75,
        epoch_start_seconds=(0.25,),
        input_wait_seconds=None,
        worker=1,
    )
    assert FitLedger.from_json(ledger.to_json()) == ledger
    assert FitLedger.from_json("not json") is None
    assert FitLedger.from_json('{"version": 99}') is None
    assert FitLedger.from_json('{"version": 1, "fit_begin": 1}') is None  # fields missing
    report = job_goodput([ledger])
    assert any("process start is unknown" in note for note in report.notes)
    with pytest.raises(ValueError, match="no fit ended"):
        job_goodput([])


def test_the_process_start_is_the_kernels_against_a_second_clock(tmp_path: Path) -> None:
    if not os.path.exists("/proc/self/stat"):
        pytest.skip("the process start is read from /proc (Linux)")
    code = (
        "import time; first = time.time()\n"
        "from tfdp_utils.throughput._goodput import process_start_time\n"
        "print(first, process_start_time())"
    )
    before = time.time()
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ).stdout.split()
    first, started = float(out[0]), float(out[1])
    # The child started after this process asked for it and before its first line ran.
    assert before - 0.05 <= started <= first + 0.05, (before, started, first)
    assert process_start_time(str(tmp_path)) is None  # no /proc there
