"""Elastic resume of a file source, real processes: 2 localhost workers stopped by a notice to
one of them, resumed on 1 process.

Three text files hold the ids 0..47 (20, 16 and 12 lines); the builder reads them with
``shard_policy='data'`` and ``count_examples=True`` (every worker reads every file in an order
drawn from the shared seed, and keeps every 2nd example of one global order), 6 steps of a
global batch of 8 per epoch, 3 epochs, op determinism and a seeded shuffle. A layer inside the
model counts the ids each replica trains on. The resumed run must train each id of the
interrupted epoch once over the two runs, and end within 1e-4 of the uninterrupted 2-worker
run; ``auto_strategy(resume_from=)`` says it resumes a 2-worker job on 1.

Files sharded by file (FILE: each worker its own files) on another shape:
``tests/preemption/test_elastic_file_sharding.py``. The job: ``tests/support/elastic_job.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.elastic_job import EPOCHS, PREEMPTED, STEPS, N, run_job, write_files

pytestmark = pytest.mark.keras

SIZES = (20, 16, 12)


def _run(
    tmp: Path, tag: str, shape: tuple[int, int], signal_at: list[int] | None = None
) -> list[dict[str, Any]]:
    """The job on ``shape`` (workers, replicas each), every worker reading every file; the
    last worker alone gets the notice."""
    directory = tmp / ("reference" if tag == "reference" else "job")
    files = str(tmp / "files")
    return run_job(tmp, tag, directory, shape, signal_at, JOB_SOURCE="files-data", JOB_FILES=files)


def test_two_workers_reading_files_resume_on_one_process(tmp_path: Path) -> None:
    write_files(tmp_path / "files", SIZES)
    reference = _run(tmp_path, "reference", (2, 1))
    for log in reference:
        assert log["status"] == 0, log["stderr"][-4000:]
        assert "resuming" not in log["reason"]
    # The notice reaches worker 1 only; both stop after the step they agree on.
    stopped = _run(tmp_path, "stopped", (2, 1), [1, 2])
    for log in stopped:
        assert log["status"] == PREEMPTED, log["stderr"][-4000:]
    epoch, batch = stopped[0]["batches"][-1]
    assert stopped[1]["batches"][-1] == [epoch, batch]  # one agreed step, mid-epoch 2
    assert epoch == 1 and 2 <= batch < STEPS - 1, (epoch, batch)
    (resumed,) = _run(tmp_path, "resumed", (1, 1))
    assert resumed["status"] == 0, resumed["stderr"][-4000:]
    assert resumed["resumed_from"].endswith(f"ckpt-{STEPS + batch + 1:012d}")
    assert resumed["batches"][0] == [1, batch + 1]  # Keras' step numbers go on
    assert "on another shape" in resumed["stderr"], resumed["stderr"][-4000:]
    words = "; resuming a 2-worker job on 1 (2 workers, 2 replicas -> 1 worker, 1 replica;"
    assert words in resumed["reason"], resumed["reason"]
    # The interrupted epoch's ids, counted on every replica of both runs: each once.
    parts = [log["partial"] for log in stopped] + [resumed["epochs"]["1"]]
    assert np.sum(parts, axis=0).tolist() == [1.0] * N
    assert resumed["epochs"]["2"] == [1.0] * N  # and the next epoch whole, on one process
    assert resumed["iterations"] == reference[0]["iterations"] == EPOCHS * STEPS
    weights = zip(resumed["weights"], reference[0]["weights"], strict=True)
    diff = max(float(np.max(np.abs(np.array(a) - np.array(b)))) for a, b in weights)
    assert diff <= 1e-4
    print(f"files, 2 workers -> 1x1: max weight diff {diff:.2e}")
