"""Keras' ``BackupAndRestore`` beside ``PreemptionCheckpoint``: which state a resumed fit takes.

Both callbacks restore weights and optimizer state when ``fit`` begins, and Keras' also moves
the first epoch (Keras 3 through ``Model._initial_epoch``, tf_keras through
``_maybe_load_initial_counters_from_ckpt``). Left alone, whichever restores last wins the
weights while the other's epoch may win the loop: a resumed job trained on a mix (keras#19179:
Keras 3 restores only the epoch of a mid-epoch backup). So before ``fit`` starts, the position
each one holds is read here, and the newer one is followed whole: its weights, its epoch and
step, with the data positioned there. A tie goes to ``PreemptionCheckpoint``, which also holds
the shuffle seed.

TensorFlow glue: the backup's position is read from its files (Keras 3: the JSON metadata
beside the weights; tf_keras: the two counters in its checkpoint), without restoring anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from tfdp_utils._tf import IS_KERAS3, keras, tf


@dataclasses.dataclass(frozen=True)
class BackupPosition:
    """Where a ``BackupAndRestore`` backup would resume.

    Attributes:
        path: the backup's folder.
        epoch: the epoch it resumes in (0-based).
        step: the steps of that epoch its weights have trained.
    """

    path: str
    epoch: int
    step: int

    def global_step(self, steps_per_epoch: int) -> int:
        return self.epoch * steps_per_epoch + self.step


def backups_in(callbacks: Any) -> list[Any]:
    """The ``keras.callbacks.BackupAndRestore`` instances among ``callbacks``."""
    items = list(getattr(callbacks, "callbacks", None) or callbacks or ())
    return [c for c in items if isinstance(c, keras.callbacks.BackupAndRestore)]


def with_restorer(callbacks: Sequence[Any], restorer: Any) -> list[Any]:
    """``callbacks`` with ``restorer`` inserted after the last ``BackupAndRestore``, or first.

    ``on_train_begin`` is where these restore: the restorer's after the backups', so the
    state it follows is the one kept (see the module docstring), and before every other
    callback's, so that each of those starts from the resumed state (a ThroughputLogger's
    step axis and counts). The other hooks keep the order the user gave.
    """
    items = list(callbacks)
    backups = [i for i, c in enumerate(items) if isinstance(c, keras.callbacks.BackupAndRestore)]
    items.insert(backups[-1] + 1 if backups else 0, restorer)
    return items


def position_of(backup: Any, steps_per_epoch: int) -> BackupPosition | None:
    """The position ``backup`` would resume at, or None when it holds no backup."""
    folder = os.fspath(getattr(backup, "backup_dir", "") or "")
    if not folder:
        return None
    if IS_KERAS3:
        return _keras3_position(backup, folder, steps_per_epoch)
    return _tf_keras_position(backup, folder, steps_per_epoch)


def _after(epoch: int, steps: int, steps_per_epoch: int, path: str) -> BackupPosition:
    if steps >= steps_per_epoch:
        return BackupPosition(path, epoch + 1, 0)
    return BackupPosition(path, epoch, steps)


def _keras3_position(backup: Any, folder: str, steps_per_epoch: int) -> BackupPosition | None:
    weights = getattr(backup, "_weights_path", None)
    metadata = getattr(backup, "_training_metadata_path", None)
    if not weights or not metadata or not os.path.exists(weights):
        return None
    try:
        with open(metadata, encoding="utf-8") as handle:
            content = json.load(handle)
        epoch, batch = int(content["epoch"]), int(content.get("batch", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if getattr(backup, "save_freq", "epoch") == "epoch":
        return BackupPosition(folder, epoch, 0)  # saved at the end of epoch - 1
    # Saved after batch index `batch` of epoch `epoch` (Keras itself resumes at its start).
    return _after(epoch, batch + 1, steps_per_epoch, folder)


def _tf_keras_position(backup: Any, folder: str, steps_per_epoch: int) -> BackupPosition | None:
    latest = tf.train.latest_checkpoint(os.path.join(folder, "chief"))
    if latest is None:
        return None
    try:
        reader = tf.train.load_checkpoint(latest)
        names = reader.get_variable_to_shape_map()
        epoch = next(n for n in names if n.startswith("ckpt_saved_epoch/"))
        batch = next(n for n in names if n.startswith("ckpt_saved_batch/"))
        saved_epoch, saved_batch = int(reader.get_tensor(epoch)), int(reader.get_tensor(batch))
    except (StopIteration, tf.errors.OpError, ValueError):
        return None
    if saved_epoch < 0:
        return None
    if isinstance(getattr(backup, "save_freq", "epoch"), int) and saved_batch >= 0:
        return _after(saved_epoch, saved_batch + 1, steps_per_epoch, folder)
    return BackupPosition(folder, saved_epoch + 1, 0)


def newest(backups: Sequence[Any], steps_per_epoch: int) -> BackupPosition | None:
    """The newest position among ``backups`` (None when none holds one)."""
    found = [p for b in backups if (p := position_of(b, steps_per_epoch)) is not None]
    return max(found, key=lambda p: p.global_step(steps_per_epoch), default=None)
