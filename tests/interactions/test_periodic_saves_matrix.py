"""Periodic saves (``every_steps``) crossed with steps_per_execution, accumulation, mixed
precision and BackupAndRestore: a job that dies without notice resumes exactly from the last
periodic save, which is never more than the announced number of steps behind.

A crash (an exception from a callback) stands in for SIGKILL in this process: nothing runs
after it but Python's unwinding, so the last checkpoint on disk is the last periodic save.
The real SIGKILL of a real process is in tests/preemption/test_preemption_resume.py.
"""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from typing import Any

import pytest
from support import interactions as job
from support.pairwise import all_pairs

import tfdp_utils as tdu
from tfdp_utils._tf import IS_KERAS3, keras

pytestmark = [pytest.mark.keras, pytest.mark.slow]

EVERY = 5
_FACTORS: dict[str, tuple[Any, ...]] = {
    "spe": (1, 3),
    "accumulation": (1, 2),
    "mixed": (False, True),
    "backup": (False, True),
    "replicas": (2, 1),
    "seed": (0, None),
}
_CRASHES = (14, 9, 17, 11, 7, 16)
ROWS = [
    (job.Settings(**row), _CRASHES[i % len(_CRASHES)]) for i, row in enumerate(all_pairs(_FACTORS))
]


class _Died(Exception):
    """The stand-in for SIGKILL."""


class _Crash(keras.callbacks.Callback):  # type: ignore[misc]
    def __init__(self, step: int) -> None:
        super().__init__()
        self.step, self.epoch = step, 0

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.epoch * job.STEPS_PER_EPOCH + batch + 1 >= self.step:
            raise _Died("the process dies here")


def _first_hook_at_or_after(step: int, per_execution: int) -> int:
    """Keras calls batch hooks after each execution: every ``per_execution`` steps of an
    epoch, and at its last step."""
    steps = job.STEPS_PER_EPOCH
    hooks = [
        epoch * steps + min(end, steps)
        for epoch in range(job.EPOCHS)
        for end in range(per_execution, steps + per_execution, per_execution)
    ]
    return next(hook for hook in sorted(set(hooks)) if hook >= step)


def _run(settings: job.Settings, tmp: Path, name: str, extra: list[Any]) -> tuple[job.Job, Any]:
    with job.applied(settings):
        strategy = job.strategy_for(settings)
        cell = job.Job(settings, strategy)
        callbacks: list[Any] = []
        if settings.backup:
            callbacks.append(keras.callbacks.BackupAndRestore(str(tmp / f"{name}-backup")))
        checkpoint = tdu.callbacks.PreemptionCheckpoint(
            tmp / name, exit=False, every_steps=EVERY, keep=2
        )
        with contextlib.suppress(_Died):
            job.fit(cell, job.dataset(settings, strategy), [*callbacks, *extra, checkpoint])
        return cell, checkpoint


@pytest.mark.parametrize(
    ("settings", "crash"), ROWS, ids=[f"{s.label()}-crash{k}" for s, k in ROWS]
)
def test_a_job_killed_without_notice_resumes_exactly_from_its_last_periodic_save(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, settings: job.Settings, crash: int
) -> None:
    if not IS_KERAS3 and settings.backup and settings.replicas == 1:
        # tf_keras' own refusal, before the first step (what auto_strategy gives 1 device).
        with pytest.raises(NotImplementedError, match=r"OneDeviceStrategy.*not supported"):
            _run(settings, tmp_path, "job", [])
        return
    unit = math.lcm(settings.spe, settings.accumulation)
    reference, _ = _run(settings, tmp_path, "reference", [])
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        _run(settings, tmp_path, "job", [_Crash(crash)])
    rounded = "at most" in caplog.text and f"every_steps={EVERY}" in caplog.text
    assert rounded == (EVERY % unit != 0), caplog.text  # said exactly when saves are rounded
    saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "job").glob("ckpt-*"))
    assert saved, "no periodic save before the crash"
    executed = _first_hook_at_or_after(crash, settings.spe)  # the crash comes at a batch hook
    assert executed - saved[-1] <= EVERY + unit - 1, (saved, crash)
    resumed, second = _run(settings, tmp_path, "job", [])
    epoch_ends = (executed - 1) // job.STEPS_PER_EPOCH * job.STEPS_PER_EPOCH  # ended before
    if settings.backup and epoch_ends > saved[-1]:  # BackupAndRestore's epoch end is newer
        assert second.resumed_from == str(tmp_path / "job-backup")
    else:
        assert second.resumed_from == str(tmp_path / "job" / f"ckpt-{saved[-1]:012d}")
    assert resumed.updates() == reference.updates()
    difference = job.max_difference(reference.weights(), resumed.weights())
    assert difference == 0.0, f"resumed weights differ from the reference by {difference}"
