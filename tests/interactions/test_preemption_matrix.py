"""PreemptionCheckpoint's stop and resume crossed with the settings users combine it with.

Each cell trains the job of :mod:`support.interactions` three times in this process: without
a stop (the reference), stopped by a real SIGTERM after step k (``exit=False``: ``fit``
returns after the save), and run again. The resumed job must end on the reference's weights
exactly and with its number of batches, and the interrupted epoch's examples (counted by a
layer of the model, independently of the callback) must each be trained once over the two
runs. The rows cover every pair of the settings' levels (pairwise, :mod:`support.pairwise`);
the tf_keras lane runs them all again on tf_keras. Data of unknown size cannot be positioned:
those cells check the refusal instead.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import interactions as job
from support.pairwise import all_pairs

import tfdp_utils as tdu
from tfdp_utils._tf import IS_KERAS3, keras

pytestmark = [pytest.mark.keras, pytest.mark.slow]

_FACTORS = {k: v for k, v in job.FACTORS.items() if k != "unknown_size"}
_STOPS = (9, 4, 6, 13, 1, 11, 8, 15, 3, 10, 16, 5)  # steps; 6 and 12 are epoch ends
ROWS = [(job.Settings(**row), _STOPS[i % len(_STOPS)]) for i, row in enumerate(all_pairs(_FACTORS))]


def _run(
    settings: job.Settings, directory: Path, backup: Path, extra: list[Any]
) -> tuple[job.Job, Any]:
    with job.applied(settings):
        strategy = job.strategy_for(settings)
        cell = job.Job(settings, strategy)
        callbacks: list[Any] = []
        if settings.backup:
            callbacks.append(keras.callbacks.BackupAndRestore(str(backup)))
        checkpoint = tdu.callbacks.PreemptionCheckpoint(directory, exit=False)
        validation = job.validation_data(strategy) if settings.validation else None
        data = job.dataset(settings, strategy)
        job.fit(cell, data, [*callbacks, *extra, checkpoint], validation=validation)
        return cell, checkpoint


@pytest.mark.parametrize(("settings", "stop"), ROWS, ids=[f"{s.label()}-stop{k}" for s, k in ROWS])
def test_a_stopped_job_resumes_on_the_uninterrupted_weights(
    tmp_path: Path, settings: job.Settings, stop: int
) -> None:
    if not IS_KERAS3 and settings.backup and settings.replicas == 1:
        # tf_keras' own refusal, before the first step (what auto_strategy gives 1 device).
        with pytest.raises(NotImplementedError, match=r"OneDeviceStrategy.*not supported"):
            _run(settings, tmp_path / "job", tmp_path / "backup", [])
        return
    reference, _ = _run(settings, tmp_path / "reference", tmp_path / "reference-backup", [])
    stopped, first = _run(
        settings, tmp_path / "job", tmp_path / "backup", [job.SignalAfter(stop, signal.SIGTERM)]
    )
    assert first.saved_path is not None, "the notice saved nothing"
    interrupted = len(stopped.epochs)  # the epochs before it ended
    partial = stopped.local_counts()
    resumed, second = _run(settings, tmp_path / "job", tmp_path / "backup", [])
    assert second.resumed_from == first.saved_path
    assert resumed.updates() == reference.updates()
    difference = job.max_difference(reference.weights(), resumed.weights())
    assert difference == 0.0, f"resumed weights differ from the reference by {difference}"
    for epoch in range(job.EPOCHS):  # every epoch trained each example once, over both runs
        parts = []
        if epoch in stopped.epochs:
            parts.append(stopped.epochs[epoch])
        elif epoch == interrupted:
            parts.append(partial)
        if epoch in resumed.epochs:
            parts.append(resumed.epochs[epoch])
        assert parts and job.ids_once(*parts), f"epoch {epoch}: {parts}"


@pytest.mark.parametrize("replicas", [1, 2])
def test_data_of_unknown_size_is_refused_by_name_before_the_first_step(
    tmp_path: Path, replicas: int
) -> None:
    settings = job.Settings(unknown_size=True, replicas=replicas)
    with pytest.raises(ValueError, match="unknown size") as raised:
        _run(settings, tmp_path / "job", tmp_path / "backup", [])
    assert "count_examples=True" in str(raised.value)  # the fix is named
    assert not any(tmp_path.glob("job/ckpt-*"))


def test_a_finished_job_run_again_says_so_and_keeps_its_weights(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = job.Settings()
    with job.applied(settings):
        strategy = job.strategy_for(settings)
        first = job.Job(settings, strategy)
        saves = tdu.callbacks.PreemptionCheckpoint(tmp_path, exit=False, every_steps=6)
        job.fit(first, job.dataset(settings, strategy), [saves])
        again = job.Job(settings, strategy)
        checkpoint = tdu.callbacks.PreemptionCheckpoint(tmp_path, exit=False)
        with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
            history = job.fit(again, job.dataset(settings, strategy), [checkpoint])
    assert history.history == {}  # nothing trained...
    assert "the job has finished, so fit trains nothing" in caplog.text  # ...and it says so
    assert "raise epochs=" in caplog.text
    assert job.max_difference(first.weights(), again.weights()) == 0.0  # restored, not fresh


def test_a_changed_shuffle_seed_is_refused_by_name(tmp_path: Path) -> None:
    settings = job.Settings()
    with job.applied(settings):
        strategy = job.strategy_for(settings)
        stopped = job.Job(settings, strategy)
        checkpoint = tdu.callbacks.PreemptionCheckpoint(tmp_path, exit=False)
        job.fit(stopped, job.dataset(settings, strategy), [job.SignalAfter(4), checkpoint])
        again = job.Job(settings, strategy)
        with pytest.raises(tdu.ResumeMismatchError, match="shuffle seed 5") as raised:
            job.fit(again, job.dataset(settings, strategy, seed=6), [checkpoint])
    assert "seed=5" in str(raised.value)
    assert again.batches() == 0
    np.testing.assert_array_equal(again.weights()[0], job.Job(settings, strategy).weights()[0])


def test_steps_per_execution_that_cuts_an_epoch_is_exact_on_tf_keras_and_refused_on_keras_3(
    tmp_path: Path,
) -> None:
    # 6 steps per epoch, 4 per execution: tf_keras cuts the last execution at the epoch's end,
    # Keras 3 runs it whole (into the next epoch's batches), so it is refused by name there.
    settings = job.Settings(spe=4)
    if IS_KERAS3:
        with pytest.raises(ValueError, match="steps_per_execution=4") as raised:
            _run(settings, tmp_path / "job", tmp_path / "backup", [])
        assert "divides 6 (1, 2, 3, 6)" in str(raised.value)
        return
    reference, _ = _run(settings, tmp_path / "reference", tmp_path / "reference-backup", [])
    _run(settings, tmp_path / "job", tmp_path / "backup", [job.SignalAfter(9)])
    resumed, second = _run(settings, tmp_path / "job", tmp_path / "backup", [])
    assert second.resumed_from is not None
    assert resumed.updates() == reference.updates() == job.EPOCHS * job.STEPS_PER_EPOCH
    assert job.max_difference(reference.weights(), resumed.weights()) == 0.0


class _SignalDuringValidation(keras.callbacks.Callback):  # type: ignore[misc]
    """SIGTERM after the first validation batch of the first epoch; counts validation batches."""

    def __init__(self) -> None:
        super().__init__()
        self.validation_batches = 0

    def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
        self.validation_batches += 1
        if self.validation_batches == 1:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize(
    "settings",
    [job.Settings(validation=True), job.Settings(validation=True, accumulation=2, replicas=1)],
    ids=lambda s: s.label(),
)
def test_a_notice_during_validation_stops_it_and_saves_the_epoch_end(
    tmp_path: Path, settings: job.Settings
) -> None:
    reference, _ = _run(settings, tmp_path / "reference", tmp_path / "reference-backup", [])
    probe = _SignalDuringValidation()
    _, first = _run(settings, tmp_path / "job", tmp_path / "backup", [probe])
    # 16 validation examples in batches of 8: 2 batches; the second never ran.
    assert probe.validation_batches == 1
    assert first.saved_path == str(tmp_path / "job" / f"ckpt-{job.STEPS_PER_EPOCH:012d}")
    resumed, second = _run(settings, tmp_path / "job", tmp_path / "backup", [])
    assert second.resumed_from == first.saved_path
    assert sorted(resumed.epochs) == [1, 2]
    assert job.max_difference(reference.weights(), resumed.weights()) == 0.0


@pytest.mark.parametrize("kind", ["arrays", "tf.data"])
def test_data_not_from_the_builder_is_refused_with_both_fixes(tmp_path: Path, kind: str) -> None:
    settings = job.Settings()
    x, y = job.arrays()
    with job.applied(settings):
        strategy = job.strategy_for(settings)
        cell = job.Job(settings, strategy)
        checkpoint = tdu.callbacks.PreemptionCheckpoint(tmp_path, exit=False)
        data: Any = (x, y) if kind == "arrays" else job.tf.data.Dataset.from_tensor_slices((x, y))
        with pytest.raises(TypeError, match=r"tdu\.build_distributed_dataset") as raised:
            if kind == "arrays":
                cell.model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[checkpoint])
            else:
                cell.model.fit(data.batch(8), epochs=1, verbose=0, callbacks=[checkpoint])
    message = str(raised.value)
    assert ("ndarray" if kind == "arrays" else "Dataset") in message
    assert "BackupAndRestore" in message  # the epoch-granular alternative
    assert cell.updates() == 0
