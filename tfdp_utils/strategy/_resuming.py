"""What ``auto_strategy(resume_from=...)`` adds to its reason line: the job resumes on another
shape. Pure.

A ``PreemptionCheckpoint`` resumes on another number of workers or replicas with the same global
batch (docs/preemption.md, "Elastic resume"). The strategy is built before the callback reads its
checkpoint, so the reason line would otherwise say nothing of it; given the callback's directory,
it says ``"resuming a 4-worker job on 2"``, and warns when the saved global batch will not divide
over the new replicas (the callback then refuses the resume).
"""

from __future__ import annotations

import os
from typing import Any

from tfdp_utils._checkpoint_files import SavedShape, latest_shape


def checked_directory(resume_from: Any) -> str | None:
    """``resume_from`` as a path, or None.

    Raises:
        TypeError: not a path.
    """
    if resume_from is None:
        return None
    if not isinstance(resume_from, (str, os.PathLike)) or not os.fspath(resume_from):
        raise TypeError(
            f"resume_from must be the PreemptionCheckpoint's directory (a str or os.PathLike "
            f"path), but received {resume_from!r} of type {type(resume_from).__name__}; pass "
            "the same folder as PreemptionCheckpoint(directory=...), or None."
        )
    return os.path.abspath(os.path.expanduser(os.fspath(resume_from)))


def _count(number: int, word: str) -> str:
    return f"{number} {word}{'s' if number != 1 else ''}"


def resume_clause(saved: SavedShape | None, num_workers: int, num_replicas: int) -> str | None:
    """``"resuming a 4-worker job on 2 (...)"`` when the checkpoint ``saved`` was saved on
    another number of workers or replicas than ``num_workers`` / ``num_replicas`` (this run's,
    replicas over all workers); None for a first run or the same shape."""
    if saved is None:
        return None
    old_workers, old_replicas = saved.num_workers, saved.num_replicas_in_sync
    if (old_workers, old_replicas) == (num_workers, num_replicas):
        return None
    if old_workers != num_workers:
        head = f"resuming a {old_workers}-worker job on {num_workers}"
    else:
        head = f"resuming a {old_replicas}-replica job on {num_replicas}"
    shapes = (
        f"{_count(old_workers, 'worker')}, {_count(old_replicas, 'replica')} -> "
        f"{_count(num_workers, 'worker')}, {_count(num_replicas, 'replica')}"
    )
    where = f"the latest checkpoint, at step {saved.step}: {saved.path}"
    batch = saved.global_batch_size
    if batch and batch % num_replicas:
        return (
            f"{head} ({shapes}; the global batch of {batch} does not divide over "
            f"{num_replicas} replicas, so PreemptionCheckpoint will refuse it; {where})"
        )
    if batch:
        per_replica = f"{batch // old_replicas} -> {batch // num_replicas} examples per replica"
        return f"{head} ({shapes}; the global batch of {batch} stays, {per_replica}; {where})"
    return f"{head} ({shapes}; {where})"


def resume_reason(directory: str | None, num_workers: int, num_replicas: int) -> str | None:
    """The clause for the latest checkpoint in ``directory``, read from disk (None: none)."""
    if directory is None:
        return None
    return resume_clause(latest_shape(directory), num_workers, num_replicas)
