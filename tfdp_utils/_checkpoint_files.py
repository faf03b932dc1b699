"""A ``PreemptionCheckpoint`` directory's files, named and read back. Pure, a leaf of the floor.

Each checkpoint is a folder ``ckpt-<step>`` (the step zero-padded, so names sort in step order)
holding ``state.json``: the training position and the facts a resume is checked against
(:mod:`tfdp_utils.preemption._position`). The preemption pillar writes them
(:mod:`tfdp_utils.preemption._store`); :func:`tfdp_utils.auto_strategy` reads the shape the
latest one was saved on (``resume_from=``), below the preemption pillar, hence here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

FORMAT = 1
STATE_FILE = "state.json"
PREFIX = "ckpt-"


def folder_name(step: int) -> str:
    """``ckpt-000000000120`` for step 120: names sort in step order."""
    return f"{PREFIX}{step:012d}"


def step_of(name: str) -> int | None:
    """The step in a checkpoint folder's name, or None for any other name."""
    if not name.startswith(PREFIX):
        return None
    digits = name[len(PREFIX) :]
    return int(digits) if digits.isascii() and digits.isdigit() else None


def read_state(path: str) -> dict[str, Any] | None:
    """A checkpoint folder's ``state.json``, or None when missing or unreadable."""
    try:
        with open(os.path.join(path, STATE_FILE), encoding="utf-8") as handle:
            state = json.load(handle)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and state.get("format") == FORMAT else None


def saved(directory: str) -> list[tuple[int, str]]:
    """``(step, folder)`` of every checkpoint folder in ``directory``, oldest first."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [
        (step, os.path.join(directory, name))
        for name in names
        if (step := step_of(name)) is not None
    ]
    return sorted(found)


@dataclasses.dataclass(frozen=True)
class SavedShape:
    """The shape the latest checkpoint of a directory was saved on.

    Attributes:
        path: the checkpoint's folder.
        step: the global step it was saved at.
        num_workers: the workers of the run that saved it.
        num_replicas_in_sync: its replicas over all workers.
        global_batch_size: its global batch (0 when not recorded).
    """

    path: str
    step: int
    num_workers: int
    num_replicas_in_sync: int
    global_batch_size: int


def latest_shape(directory: str) -> SavedShape | None:
    """The shape the newest checkpoint in ``directory`` whose ``state.json`` reads back was
    saved on; None when there is none (a first run) or it records no shape."""
    for step, path in reversed(saved(directory)):
        state = read_state(path)
        if state is None:
            continue
        facts = state.get("dataset")
        if not isinstance(facts, dict) or "num_replicas_in_sync" not in facts:
            return None
        return SavedShape(
            path=path,
            step=step,
            num_workers=int(facts.get("num_workers") or 1),
            num_replicas_in_sync=int(facts["num_replicas_in_sync"] or 1),
            global_batch_size=int(facts.get("global_batch_size") or 0),
        )
    return None
