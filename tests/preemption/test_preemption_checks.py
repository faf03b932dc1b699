"""PreemptionCheckpoint refuses what it cannot resume exactly, before the first step.

In one process (``exit=False``, so that ``fit`` returns after a save): a checkpoint is made by a
real SIGTERM during ``fit``, then a second ``fit`` with something changed must raise
``ResumeMismatchError`` naming the difference, having trained nothing. A damaged newest
checkpoint is skipped for the one before, with a WARNING naming it. Another replica count
with the same global batch is an elastic resume: accepted, and said. A stopped run whose
folder several tests start from is made once per setting and copied into each test's folder.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf

pytestmark = pytest.mark.keras

N = 40


def _strategy() -> Any:
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _data(strategy: Any, global_batch_size: int = 8, examples: int = N) -> Any:
    x = np.random.default_rng(0).normal(size=(examples, 3)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    return tdu.build_distributed_dataset(
        (x, y), strategy=strategy, global_batch_size=global_batch_size, shuffle_buffer_size=64
    )


def _model(strategy: Any, width: int = 4, optimizer: str = "adam") -> Any:
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((3,)), keras.layers.Dense(width), keras.layers.Dense(1)]
        )
        model.compile(optimizer, "mse")
    return model


class _Term(keras.callbacks.Callback):  # type: ignore[misc]
    """Sends this process SIGTERM after global step ``at`` (PreemptionCheckpoint catches it)."""

    def __init__(self, at: int, times: int = 1) -> None:
        super().__init__()
        self.at, self.times, self.step = at, times, 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.step += 1
        if self.step == self.at:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGTERM)


def _checkpoint(directory: Path | str, **kwargs: Any) -> Any:
    return tdu.callbacks.PreemptionCheckpoint(directory, exit=False, **kwargs)


def _stopped_job(directory: Path, at: int = 7, **kwargs: Any) -> Any:
    """A first run, stopped by SIGTERM after step ``at``; its saved checkpoint's path."""
    strategy = _strategy()
    checkpoint = _checkpoint(directory, **kwargs)
    _model(strategy).fit(_data(strategy), epochs=3, verbose=0, callbacks=[_Term(at), checkpoint])
    assert checkpoint.saved_path is not None
    return checkpoint


_STOPPED: dict[tuple[int, tuple[tuple[str, Any], ...]], Path] = {}


def _stopped_copy(
    factory: pytest.TempPathFactory, directory: Path, at: int = 7, **kwargs: Any
) -> None:
    """The folder of :func:`_stopped_job` for these settings, copied into ``directory``.

    The stopped run is made once per module for each setting (a fit whose saves depend only on
    the settings) and shared: each test resumes from, or damages, its own copy.
    """
    key = (at, tuple(sorted(kwargs.items())))
    if key not in _STOPPED:
        folder = factory.mktemp("stopped") / "job"
        _stopped_job(folder, at, **kwargs)
        _STOPPED[key] = folder
    shutil.copytree(_STOPPED[key], directory, dirs_exist_ok=True)


def _iterations(model: Any) -> int:
    return int(model.optimizer.iterations.numpy())


def test_a_sigterm_saves_once_even_when_it_comes_twice(tmp_path: Path) -> None:
    strategy = _strategy()
    checkpoint = _checkpoint(tmp_path)
    model = _model(strategy)
    model.fit(_data(strategy), epochs=3, verbose=0, callbacks=[_Term(7, times=2), checkpoint])
    assert _iterations(model) == 7
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000000000007"]
    assert signal.getsignal(signal.SIGTERM) is not checkpoint  # handlers put back after fit


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"global_batch_size": 16}, "global batch size 8"),
        ({"examples": N + 8}, "examples per epoch 40"),
        ({"width": 5}, "shape [3, 4] there"),
        ({"optimizer": "sgd"}, "Adam optimizer"),
    ],
)
def test_a_checkpoint_of_another_setup_is_refused_before_training(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, change: dict[str, Any], words: str
) -> None:
    _stopped_copy(tmp_path_factory, tmp_path)
    strategy = _strategy()
    model = _model(
        strategy, width=change.get("width", 4), optimizer=change.get("optimizer", "adam")
    )
    data = _data(
        strategy,
        global_batch_size=change.get("global_batch_size", 8),
        examples=change.get("examples", N),
    )
    with pytest.raises(tdu.ResumeMismatchError, match="another directory=") as raised:
        model.fit(data, epochs=3, verbose=0, callbacks=[_checkpoint(tmp_path)])
    assert words in str(raised.value)
    assert str(tmp_path / "ckpt-000000000007") in str(raised.value)
    assert _iterations(model) == 0  # nothing trained


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_last_bytes(path: Path) -> None:  # same size: only the checksum can tell
    content = bytearray(path.read_bytes())
    content[-8:] = bytes(255 - b for b in content[-8:])
    path.write_bytes(bytes(content))


def _garbage(path: Path) -> None:
    path.write_bytes(b"\0" * 5)


@pytest.mark.parametrize(
    ("data_damage", "index_damage"),
    [
        (_garbage, _garbage),
        (_truncate, None),  # the index intact: it alone reads back
        (_flip_last_bytes, None),
        (None, _truncate),
    ],
    ids=["both-garbage", "data-truncated", "data-overwritten", "index-truncated"],
)
def test_a_damaged_newest_checkpoint_is_skipped_for_the_one_before(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    caplog: pytest.LogCaptureFixture,
    data_damage: Any,
    index_damage: Any,
) -> None:
    _stopped_copy(tmp_path_factory, tmp_path, at=7, every_steps=3)  # saves after 3, 6 and 7
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000000000003",
        "ckpt-000000000006",
        "ckpt-000000000007",
    ]
    newest = tmp_path / "ckpt-000000000007"
    for data_file in newest.glob("variables.data-*"):
        if data_damage is not None:
            data_damage(data_file)
    if index_damage is not None:
        index_damage(newest / "variables.index")
    strategy = _strategy()
    model = _model(strategy)
    checkpoint = _checkpoint(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        model.fit(_data(strategy), epochs=3, verbose=0, callbacks=[checkpoint])
    assert checkpoint.resumed_from == str(tmp_path / "ckpt-000000000006")
    assert str(newest) in caplog.text
    assert _iterations(model) == 15  # 3 epochs of 5 steps: resumed after step 6


def test_a_notice_before_the_first_step_stops_without_training(tmp_path: Path) -> None:
    class Early(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_begin(self, logs: Any = None) -> None:
            os.kill(os.getpid(), signal.SIGTERM)

    strategy = _strategy()
    model = _model(strategy)
    checkpoint = _checkpoint(tmp_path)
    model.fit(_data(strategy), epochs=3, verbose=0, callbacks=[Early(), checkpoint])
    assert _iterations(model) == 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"signals": ("SIGKILL",)}, ValueError, "SIGKILL"),
        ({"every_steps": 0}, ValueError, "every_steps must be a positive integer"),
        ({"keep": 0}, ValueError, "keep must be a positive integer"),
        ({"grace_seconds": -1}, ValueError, "grace_seconds must be a positive finite number"),
        ({"exit": "yes"}, TypeError, "exit must be True or False"),
    ],
)
def test_bad_arguments_get_clear_errors(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        tdu.callbacks.PreemptionCheckpoint(tmp_path, **kwargs)


def test_a_directory_that_is_a_file_or_a_url_is_refused_before_training(tmp_path: Path) -> None:
    strategy = _strategy()
    model = _model(strategy)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file, not a folder"):
        model.fit(_data(strategy), epochs=1, verbose=0, callbacks=[_checkpoint(a_file)])
    with pytest.raises(ValueError, match="is a URL"):
        model.fit(_data(strategy), epochs=1, verbose=0, callbacks=[_checkpoint("gs://b/c")])
    assert _iterations(model) == 0


def test_a_dataset_it_cannot_position_is_refused_with_what_to_do(tmp_path: Path) -> None:
    strategy = _strategy()
    model = _model(strategy)
    plain = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1)))).batch(4)
    with pytest.raises(TypeError, match=r"tdu\.build_distributed_dataset"):
        model.fit(plain, epochs=1, verbose=0, callbacks=[_checkpoint(tmp_path)])
    with pytest.raises(ValueError, match="differs from the dataset's epoch of 5 steps"):
        model.fit(
            _data(strategy),
            epochs=1,
            steps_per_epoch=3,
            verbose=0,
            callbacks=[_checkpoint(tmp_path)],
        )


def test_a_checkpoint_of_another_replica_count_resumes_with_the_same_global_batch(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
) -> None:
    _stopped_copy(tmp_path_factory, tmp_path)  # 2 replicas, stopped after step 7
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    model = _model(strategy)
    resumed = _checkpoint(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        model.fit(_data(strategy), epochs=3, verbose=0, callbacks=[resumed])
    assert resumed.resumed_from == str(tmp_path / "ckpt-000000000007")
    assert "on another shape: 1 worker x 2 replicas" in caplog.text
    assert _iterations(model) == 15  # the 8 steps left of 3 epochs of 5


def test_a_checkpoint_of_another_replica_count_and_global_batch_is_refused(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _stopped_copy(tmp_path_factory, tmp_path)  # 2 replicas, a global batch of 8
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    model = _model(strategy)
    with pytest.raises(
        tdu.ResumeMismatchError, match="cannot be resumed on another shape"
    ) as raised:
        data = _data(strategy, global_batch_size=4)  # the same 4 examples per replica
        model.fit(data, epochs=3, verbose=0, callbacks=[_checkpoint(tmp_path)])
    assert "saved with a global batch of 8 examples, this run has 4" in str(raised.value)
    assert "global_batch_size=8" in str(raised.value)
    assert _iterations(model) == 0


def test_a_notice_during_the_save_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tfdp_utils.preemption import _store

    real_save = _store.save

    def save_while_told_again(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)  # the scheduler repeats itself mid-write
        return real_save(*args, **kwargs)

    monkeypatch.setattr(_store, "save", save_while_told_again)
    checkpoint = _stopped_job(tmp_path, at=7)
    assert checkpoint.notice.count == 2
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000000000007"]
    strategy = _strategy()
    model = _model(strategy)
    resumed = _checkpoint(tmp_path)
    model.fit(_data(strategy), epochs=3, verbose=0, callbacks=[resumed])
    assert resumed.resumed_from == str(tmp_path / "ckpt-000000000007")
    assert _iterations(model) == 15


def test_a_save_still_running_at_the_grace_period_s_end_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class SlowStep(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 2:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1.5)  # the step outlasts the grace period

    strategy = _strategy()
    checkpoint = _checkpoint(tmp_path, grace_seconds=0.5)
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        _model(strategy).fit(
            _data(strategy), epochs=1, verbose=0, callbacks=[SlowStep(), checkpoint]
        )
    assert "has not finished" in caplog.text
    assert "SIGKILL will cut it short" in caplog.text


def test_periodic_saves_are_left_out_of_the_productive_time_and_itemised(tmp_path: Path) -> None:
    """The goodput's ``checkpoint_saves``: the periodic saves' seconds while the steps' clock
    ran, bracketed by the test's own clocks (callbacks listed just before and just after the
    checkpoint note when its batch hook began and ended), and left out of the productive time;
    the save after the last step counts after it, not twice."""
    from tfdp_utils.throughput._events import read_runs
    from tfdp_utils.throughput._goodput import FitLedger
    from tfdp_utils.throughput._summary import summarize

    class Seen(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.times: list[float] = []

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.times.append(time.perf_counter())

    strategy = _strategy()
    before, after = Seen(), Seen()
    checkpoint = _checkpoint(tmp_path / "checkpoints", every_steps=2)
    logger = tdu.callbacks.ThroughputLogger(tmp_path / "logs", log_every_n_steps=4)
    _model(strategy).fit(
        _data(strategy), epochs=2, verbose=0, callbacks=[logger, before, checkpoint, after]
    )
    assert len(before.times) == len(after.times) == 10
    spans = [end - begin for begin, end in zip(before.times, after.times, strict=True)]
    assert len(checkpoint.fit_save_spans()) == 5  # after global steps 2, 4, 6, 8 and 10
    # Steps 2, 4, 6 and 8 end while the clock runs (the logger, listed first, restarted it at
    # step 6's end); the save after step 10, the last, falls in the time after the last step.
    between = sum(spans[1:9:2])
    ledger = FitLedger.from_json(read_runs(str(tmp_path / "logs"))["global"].ledgers[0] or "")
    assert ledger is not None
    # Inside the hook's spans at those steps, and most of them (the rest is bookkeeping).
    assert 0.5 * between <= ledger.checkpoint_save_seconds <= between
    assert spans[9] <= ledger.after_last_step_seconds
    job = summarize(read_runs(str(tmp_path / "logs")))["goodput"]
    saves = job["losses"]["checkpoint_saves"]
    assert saves["seconds"] == pytest.approx(ledger.checkpoint_save_seconds)
    assert saves["kind"] == "measured"
    # Not productive: the steps' clock holds the saves, the productive time does not.
    waited = ledger.input_wait_seconds or 0.0
    assert ledger.step_seconds - waited - ledger.checkpoint_save_seconds > 0
    assert job["productive_seconds"] == pytest.approx(
        ledger.step_seconds - waited - ledger.checkpoint_save_seconds
    )
