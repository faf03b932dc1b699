"""diagnose_input crossed with the settings users combine it with.

Each cell diagnoses the job's model on its builder dataset, then trains it with ``fit``. The
diagnosis must give finite rates and leave the model as it was (every weight and optimizer
variable, read back and compared), so that the ``fit`` after it trains exactly as a ``fit``
without it (same weights, each example once per epoch: counted by a layer of the model). A
dataset of unknown size is read anew each epoch, so its orders move on (each example still
once per epoch). The rows cover every pair of the settings' levels.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from support import interactions as job
from support.pairwise import all_pairs

import tfdp_utils as tdu
from tfdp_utils._tf import IS_KERAS3

pytestmark = [pytest.mark.keras, pytest.mark.slow]

_FACTORS = {k: v for k, v in job.FACTORS.items() if k not in ("backup", "validation")}
ROWS = [job.Settings(**row) for row in all_pairs(_FACTORS)]


def _state(model: Any) -> list[np.ndarray]:
    # tf_keras' gradient accumulators (enable_gradient_accumulation) are no Keras variables.
    accumulators = getattr(getattr(model, "_tfdp_accumulation", None), "variables", [])
    variables = [*accumulators, *model.weights, *model.optimizer.variables]  # slots may follow
    return [np.asarray(v.numpy()) for v in variables]


@pytest.mark.parametrize("settings", ROWS, ids=[s.label() for s in ROWS])
def test_a_diagnosis_leaves_the_model_as_it_was_and_fit_exact(settings: job.Settings) -> None:
    with job.applied(settings):
        strategy = job.strategy_for(settings)
        reference = job.Job(settings, strategy)
        data = job.dataset(settings, strategy)
        if not IS_KERAS3 and settings.unknown_size and settings.spe > 1:
            return  # fit refuses it on tf_keras (tests/interactions/test_throughput_matrix.py)
        job.fit(reference, data, [])
        cell = job.Job(settings, strategy)
        before = _state(cell.model)
        diagnosis = tdu.diagnose_input(cell.model, data, steps=4, max_seconds=3)
        for phase, rate in (
            ("input", diagnosis.input_examples_per_sec),
            ("model", diagnosis.model_examples_per_sec),
            ("cached", diagnosis.cached_examples_per_sec),
            ("together", diagnosis.training_examples_per_sec),
        ):
            if rate is None:  # not timed: only a phase the budget cut short
                assert phase in diagnosis.cut_short, diagnosis.summary()
            else:
                assert math.isfinite(rate) and rate > 0, diagnosis.summary()
        after = _state(cell.model)
        # The optimizer's slots may be built by the diagnosis (as fit would): fresh values,
        # which the fit after it must then train from exactly as a fit without it.
        assert all(np.array_equal(a, b) for a, b in zip(before, after[: len(before)], strict=True))
        job.fit(cell, data, [])
    assert sorted(cell.epochs) == list(range(job.EPOCHS))
    assert all(job.ids_once(counts) for counts in cell.epochs.values()), cell.epochs
    if settings.unknown_size:
        # Keras iterates a dataset of unknown size anew each epoch, and each iteration draws
        # the next shuffle order: the diagnosis's iterations move the epochs' orders on
        # (docs/why-slow.md says so). A sized dataset trains as one stream of whole epochs
        # rebuilt from its seed, whatever was iterated before: exactly the same weights.
        return
    assert job.max_difference(reference.weights(), cell.weights()) == 0.0
