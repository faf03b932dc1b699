"""ThroughputLogger's counts crossed with the settings users combine it with.

Each cell fits the job of :mod:`support.interactions` with a ThroughputLogger and compares the
examples it reports — the last point of the global series in the event file, read back, and
``summary()["examples"]`` — with the examples the model trained on, counted by a layer inside
the model (independently of the logger). The rows cover every pair of the settings' levels.
"""

from __future__ import annotations

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
