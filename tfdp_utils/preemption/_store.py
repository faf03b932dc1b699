"""The checkpoint directory: atomic saves, the latest good one, the last k kept.

Pure Python (no TensorFlow): the folders are named and their ``state.json`` read back by
:mod:`tfdp_utils._checkpoint_files` (on the floor, as :func:`~tfdp_utils.auto_strategy` reads
them too); the variables are written by a ``write(prefix)`` function the caller passes
(``tf.train.Checkpoint.write``), and read back by a ``check(prefix)`` function
(``tf.train.load_checkpoint``). Each checkpoint is a folder ``ckpt-<step>`` holding
``state.json`` (the training position and the facts a resume is checked against) and the
variables under the prefix ``variables``. A folder is written under a hidden temporary name
and renamed into place only when complete, so a save cut short (SIGKILL during the write) is
never the one restored.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from tfdp_utils._checkpoint_files import FORMAT as FORMAT
from tfdp_utils._checkpoint_files import STATE_FILE as STATE_FILE
from tfdp_utils._checkpoint_files import folder_name as folder_name
from tfdp_utils._checkpoint_files import read_state as read_state
from tfdp_utils._checkpoint_files import saved as saved
from tfdp_utils._checkpoint_files import step_of as step_of

logger = logging.getLogger("tfdp_utils")

VARIABLES = "variables"
_TEMPORARY = ".tmp-"
_PROBE = ".probe-"  # a writability probe: every worker makes its own, at the same time


@dataclasses.dataclass(frozen=True)
class Saved:
    """One complete checkpoint on disk.

    Attributes:
        path: its folder.
        step: the training steps done when it was saved.
        state: the contents of its ``state.json``.
    """

    path: str
    step: int
    state: Mapping[str, Any]

    @property
    def variables(self) -> str:
        """The prefix its variables were written under."""
        return os.path.join(self.path, VARIABLES)


def check_directory(directory: Any) -> str:
    """``directory`` as an absolute local path, created and checked writable.

    Raises:
        TypeError: not a path.
        ValueError: a URL (``gs://...``), whose folders cannot be renamed atomically.
        NotADirectoryError: it is a file, or lies under one.
        PermissionError: not writable (the message names the folder and the fix).
        OSError: it cannot be created (a full disk...).
    """
    if isinstance(directory, os.PathLike):
        directory = os.fspath(directory)
    if not isinstance(directory, str) or not directory:
        raise TypeError(
            f"directory={directory!r} is not a folder path; pass the folder that keeps the "
            "checkpoints, on a volume that outlives the job's processes (e.g. a Kubernetes "
            "PersistentVolumeClaim or a shared file system)."
        )
    if "://" in directory:
        raise ValueError(
            f"directory={directory!r} is a URL; PreemptionCheckpoint writes to a local or "
            "mounted folder, where a finished checkpoint is renamed into place atomically. "
            "Mount the bucket (e.g. gcsfuse) or use a persistent volume."
        )
    path = os.path.abspath(os.path.expanduser(directory))
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(
            f"directory={directory!r} is a file, not a folder; pass a folder path for the "
            "checkpoints."
        )
    above = _file_above(path)
    if above is not None:
        raise NotADirectoryError(
            f"directory={directory!r} cannot be made: {above!r} on its path is a file, not a "
            "folder. Pass another folder path for the checkpoints, or move that file away."
        )
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=_PROBE, delete=True) as probe:
            probe.write(b"x")
            probe.flush()
    except PermissionError:
        raise PermissionError(
            f"cannot write checkpoints to {path!r}: permission denied. Pass a folder this "
            "process can write to, or fix its permissions."
        ) from None
    except OSError as error:
        raise OSError(
            error.errno,
            f"cannot write checkpoints to {path!r}: {error.strerror}. Free space or pass "
            "another folder.",
        ) from None
    return path


def _file_above(path: str) -> str | None:
    """The nearest existing parent of ``path`` when it is not a folder (nothing can be made
    under it), else None."""
    parent = os.path.dirname(path)
    while parent and not os.path.exists(parent):
        if os.path.dirname(parent) == parent:
            return None
        parent = os.path.dirname(parent)
    return parent if parent and not os.path.isdir(parent) else None


def _fsync_folder(path: str) -> None:
    try:
        handle = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without folder handles
        return
    try:
        os.fsync(handle)
    except OSError:  # pragma: no cover - file systems that refuse it
        pass
    finally:
        os.close(handle)


def _write_json(path: str, content: Mapping[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(content, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())


def save(
    directory: str,
    step: int,
    state: Mapping[str, Any],
    write: Callable[[str], Any],
    *,
    keep: int | None,
) -> Saved:
    """Write one checkpoint for ``step`` atomically and keep the last ``keep``.

    The variables (``write(prefix)``) and ``state.json`` go into a hidden folder first, which
    is renamed to ``ckpt-<step>`` once both are on disk. A checkpoint of the same step that
    is already there is kept as it is.
    """
    final = os.path.join(directory, folder_name(step))
    if os.path.isdir(final):
        return Saved(final, step, read_state(final) or dict(state))
    temporary = tempfile.mkdtemp(prefix=f"{_TEMPORARY}{folder_name(step)}-", dir=directory)
    try:
        write(os.path.join(temporary, VARIABLES))
        content = {"format": FORMAT, "step": step, **state}
        _write_json(os.path.join(temporary, STATE_FILE), content)
        _fsync_folder(temporary)
        os.rename(temporary, final)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    _fsync_folder(directory)
    if keep is not None:
        prune(directory, keep)
    return Saved(final, step, content)


def scratch_save(directory: str, worker: int, write: Callable[[str], Any]) -> None:
    """A non-chief worker's part of a save: write (the collectives need it), then delete."""
    scratch = tempfile.mkdtemp(prefix=f"{_TEMPORARY}worker-{worker}-", dir=directory)
    try:
        write(os.path.join(scratch, VARIABLES))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def latest(directory: str, check: Callable[[str], Any]) -> Saved | None:
    """The newest checkpoint whose state and variables read back, or None.

    A newer one that does not read back (a damaged file) is skipped with a WARNING naming
    it, and the one before is used.
    """
    for step, path in reversed(saved(directory)):
        state = read_state(path)
        problem = None
        if state is None:
            problem = f"{STATE_FILE} is missing or unreadable"
        else:
            try:
                check(os.path.join(path, VARIABLES))
            except Exception as error:  # any reader error means: not this one
                problem = f"its variables do not read back ({type(error).__name__}: {error})"
        if problem is None and state is not None:
            return Saved(path, step, state)
        logger.warning(
            "tfdp_utils: PreemptionCheckpoint skips the checkpoint %s: %s. Resuming from "
            "the one before it, if any.",
            path,
            str(problem).splitlines()[0],
        )
    return None


def prune(directory: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` checkpoints; the deleted folders."""
    found = saved(directory)
    removed = []
    for _, path in found[: max(0, len(found) - keep)]:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def clear_temporary(directory: str) -> None:
    """Delete the folders of saves cut short (the chief, before training; no save runs then).

    Writability probes (another worker's may be in use right now) are left alone.
    """
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if name.startswith(_TEMPORARY) and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
