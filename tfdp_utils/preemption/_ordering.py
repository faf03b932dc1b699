"""Where ``PreemptionCheckpoint``'s hooks run among a ``fit`` call's callbacks.

Keras calls each hook on the callbacks in the order given. Two of the checkpoint's hooks must
not wait for the others: the restore at train begin comes after ``BackupAndRestore``'s (the
state followed is restored last, :mod:`._backups`) and before every other callback's, so that
each starts from the resumed state; and after a notice the stop ends the epoch's loop before
any other callback's epoch-end or validation hooks act on a cut epoch (``BackupAndRestore``
would save it as complete, a learning-rate callback step on it). Each is a small callback that
calls the checkpoint's own hook, placed in the list where it must run.

TensorFlow glue: the callbacks subclass the active Keras' ``Callback``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tfdp_utils._tf import keras
from tfdp_utils.preemption import _backups as backups

_Callback: Any = keras.callbacks.Callback


class Owner(Protocol):
    """The hooks of the ``PreemptionCheckpoint`` the placed callbacks call."""

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None: ...

    def _stop_after_loop(self) -> None: ...


def ordered(callbacks: Sequence[Any], owner: Owner) -> list[Any]:
    """``callbacks`` with the owner's stop first and its restore after the last
    ``BackupAndRestore`` (or first among the given ones)."""
    restoring = backups.with_restorer(callbacks, RestoreFirst(owner))
    return [StopFirst(owner), *restoring]


class RestoreFirst(_Callback):  # type: ignore[misc]
    """Before the other callbacks' ``on_train_begin`` (after BackupAndRestore's): the
    checkpoint is read back there, so that every other callback starts from the resumed state."""

    def __init__(self, owner: Owner) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self._owner = owner

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self._owner.on_train_begin(logs)


class StopFirst(_Callback):  # type: ignore[misc]
    """First in a fit's callbacks: after a notice, the stop comes before the other callbacks'
    epoch-end, validation and train-end hooks run on the cut epoch."""

    def __init__(self, owner: Owner) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self._owner = owner

    def on_test_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self._owner._stop_after_loop()

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        self._owner._stop_after_loop()

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        self._owner._stop_after_loop()
