"""ThroughputLogger's counts crossed with the settings users combine it with.

Each cell fits the job of :mod:`support.interactions` with a ThroughputLogger and compares the
examples it reports — the last point of the global series in the event file, read back, and
``summary()["examples"]`` — with the examples the model trained on, counted by a layer inside
the model (independently of the logger). The rows cover every pair of the settings' levels.

A second set of cells stops the job with a notice (``PreemptionCheckpoint``) and runs it again
into the same log directory: the resumed run's series must go on from where the stopped one
ended (no point behind it), at the logger's cadence through the epoch boundaries (no window
longer than one log interval), with the examples the job's layout puts at each step.
"""

from __future__ import annotations

import itertools
import math
import signal
from pathlib import Path
from typing import Any

import pytest
from support import interactions as job
from support.pairwise import all_pairs
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import tfdp_utils as tdu
from tfdp_utils._tf import IS_KERAS3, tf
from tfdp_utils.throughput import _tags as tags

pytestmark = [pytest.mark.keras, pytest.mark.slow]

_FACTORS = {k: v for k, v in job.FACTORS.items() if k != "backup"}
ROWS = [job.Settings(**row) for row in all_pairs(_FACTORS)]


def _last_count(log_dir: Path) -> float:
    events = EventAccumulator(str(log_dir / tags.GLOBAL_RUN), size_guidance={"tensors": 0})
    events.Reload()
    points = events.Tensors(tags.EXAMPLES)
    return float(tf.make_ndarray(points[-1].tensor_proto)) if points else float("nan")


@pytest.mark.parametrize("settings", ROWS, ids=[s.label() for s in ROWS])
def test_the_logged_examples_are_the_examples_trained(
    tmp_path: Path, settings: job.Settings
) -> None:
    with job.applied(settings):
        strategy = job.strategy_for(settings)
        cell = job.Job(settings, strategy)
        logger = tdu.callbacks.ThroughputLogger(str(tmp_path), log_every_n_steps=2)
        validation = job.validation_data(strategy) if settings.validation else None
        data = job.dataset(settings, strategy)
        if not IS_KERAS3 and settings.unknown_size and settings.spe > 1:
            # tf_keras ends an epoch only between executions: refused before the first step.
            with pytest.raises(ValueError, match="unknown size") as raised:
                job.fit(cell, data, [logger], validation=validation)
            assert "steps_per_execution=3" in str(raised.value)
            assert cell.updates() == 0
            return
        job.fit(cell, data, [logger], validation=validation)
        summary: Any = logger.summary()
    trained = cell.examples_trained()
    assert trained == job.EPOCHS * job.N
    # The one-iterator fit (one stream of whole epochs): each epoch trains every example once.
    assert sorted(cell.epochs) == list(range(job.EPOCHS))
    assert all(job.ids_once(counts) for counts in cell.epochs.values()), cell.epochs
    share = summary["input_wait_share"]  # measured, or unknown with the reason
    if share is None:
        assert summary.get("input_wait_note"), summary
        if settings.determinism:
            assert "determinism" in summary["input_wait_note"]
    else:
        assert 0.0 <= share <= 1.0
    if not summary["exact"]:  # a count it cannot make exact says why
        assert summary["derived_reason"], summary
        return
    assert summary["examples"] == trained, summary
    assert _last_count(tmp_path) == trained


RESUME_ROWS = [
    (job.Settings(replicas=1), 9),
    (job.Settings(spe=3, seed=0), 9),
    (job.Settings(validation=True, seed=None), 4),
    (job.Settings(accumulation=2, mixed=True, replicas=1), 8),
    (job.Settings(backup=True, determinism=True), 10),
]
EVERY = 2  # log_every_n_steps


def _points(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(log_dir / tags.GLOBAL_RUN), size_guidance={"tensors": 0})
    events.Reload()
    if tag not in events.Tags()["tensors"]:
        return []
    return [(p.step, float(tf.make_ndarray(p.tensor_proto))) for p in events.Tensors(tag)]


def _examples_at(step: int) -> float:
    """The job's layout: epochs of 6 steps, 5 of 8 examples and one of 4."""
    epochs, steps = divmod(step, job.STEPS_PER_EPOCH)
    return float(epochs * job.N + steps * job.GLOBAL_BATCH)


def _fit_logged(settings: job.Settings, root: Path, extra: list[Any]) -> Any:
    """Fit with a ThroughputLogger and a PreemptionCheckpoint; returns the checkpoint."""
    from tfdp_utils._tf import keras

    with job.applied(settings):
        strategy = job.strategy_for(settings)
        cell = job.Job(settings, strategy)
        callbacks: list[Any] = []
        if settings.backup:
            callbacks.append(keras.callbacks.BackupAndRestore(str(root / "backup")))
        checkpoint = tdu.callbacks.PreemptionCheckpoint(root / "job", exit=False)
        callbacks += [
            tdu.callbacks.ThroughputLogger(str(root / "logs"), log_every_n_steps=EVERY),
            *extra,
            checkpoint,
        ]
        validation = job.validation_data(strategy) if settings.validation else None
        job.fit(cell, job.dataset(settings, strategy), callbacks, validation=validation)
        return checkpoint


@pytest.mark.parametrize(
    ("settings", "stop"), RESUME_ROWS, ids=[f"{s.label()}-stop{k}" for s, k in RESUME_ROWS]
)
def test_a_resumed_job_goes_on_with_its_series(
    tmp_path: Path, settings: job.Settings, stop: int
) -> None:
    checkpoint = _fit_logged(settings, tmp_path, [job.SignalAfter(stop, signal.SIGTERM)])
    first = _points(tmp_path / "logs", tags.EXAMPLES)
    first_rates = len(_points(tmp_path / "logs", tags.STEPS_PER_SEC))
    # The stopped run's last point is where its checkpoint is (ckpt-<step>).
    stopped_at = int(Path(checkpoint.saved_path).name.rsplit("-", 1)[1])
    assert first[-1] == (stopped_at, _examples_at(stopped_at)), (first[-3:], stopped_at)
    _fit_logged(settings, tmp_path, [])
    examples = _points(tmp_path / "logs", tags.EXAMPLES)[len(first) :]
    rates = _points(tmp_path / "logs", tags.STEPS_PER_SEC)[first_rates:]
    # Nothing behind the stopped run's last point: the series goes on from there.
    steps = [step for step, _ in examples]
    assert steps[0] >= stopped_at and steps == sorted(steps), (stopped_at, steps)
    # Each point holds the examples of the steps before it, over both runs.
    assert [value for _, value in examples] == [_examples_at(step) for step in steps]
    assert steps[-1] == job.EPOCHS * job.STEPS_PER_EPOCH
    # The cadence through the epoch boundaries: windows of one log interval (rounded up to a
    # whole execution); the fit's first execution (warm-up) and each epoch's first (its
    # boundary) are left out of the rates, so a window next to one may end one execution later.
    spe = settings.spe
    gap = math.ceil(EVERY / spe) * spe
    rate_steps = [step for step, _ in rates]
    assert rate_steps and rate_steps[0] <= stopped_at + 2 * spe + gap, rate_steps
    assert all(b - a <= gap + spe for a, b in itertools.pairwise(rate_steps)), rate_steps
    # The job's goodput spans both fits (one process: no restart between them), whatever the
    # settings; validation is a loss exactly where the cell validates.
    from tfdp_utils.throughput._events import read_runs
    from tfdp_utils.throughput._summary import summarize

    goodput = summarize(read_runs(str(tmp_path / "logs")))["goodput"]
    assert goodput is not None and goodput["fits"] == 2, goodput
    assert 0 < goodput["goodput"] < 1 and goodput["losses"]["restarts"]["seconds"] == 0.0
    # Resumed from the checkpoint at the stop: no step is trained twice (the resumed fit's
    # ledger starts at the restored step, not at the counter's layout origin).
    assert goodput["losses"]["steps_trained_twice"]["seconds"] == 0.0, goodput
    assert (goodput["losses"]["validation"]["seconds"] > 0) == settings.validation, goodput
