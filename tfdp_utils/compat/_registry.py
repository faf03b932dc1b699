"""Shared machinery of the Keras workarounds: finding Keras 3's TF trainer, recording patches.

Nothing here changes Keras; the workaround modules (``keras_20585``, ``tf_72388``,
``keras_19246``) do, through :func:`set_attribute`, so every change can be listed and undone.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from tfdp_utils._tf import IS_KERAS3, KERAS_VERSION, keras, tf


@dataclasses.dataclass
class Patch:
    """One attribute replaced on a Keras class or module, with what was there before."""

    owner: Any
    name: str
    original: Any
    replacement: Any

    inherited: bool = False

    def undo(self) -> None:
        """Put the original attribute back (only if ours is still the one installed).

        An attribute the owner inherited is removed again, so the inherited one shows.
        """
        if getattr(self.owner, self.name, None) is self.replacement:
            if self.inherited:
                delattr(self.owner, self.name)
            else:
                setattr(self.owner, self.name, self.original)


def set_attribute(owner: Any, name: str, replacement: Any) -> Patch:
    """Replace ``owner.name`` with ``replacement`` and return the record that undoes it."""
    own = getattr(owner, "__dict__", None)
    inherited = isinstance(owner, type) and own is not None and name not in own
    patch = Patch(owner, name, getattr(owner, name), replacement, inherited)
    setattr(owner, name, replacement)
    return patch


@dataclasses.dataclass(frozen=True)
class Workaround:
    """An upstream bug, how to tell whether the installed Keras has it, and how to work around it.

    Attributes:
        issue: the upstream issue, e.g. ``"keras#19246"``.
        summary: one line saying what fails without the workaround.
        url: the upstream issue.
        verified_on: Keras versions on which the bug was reproduced and the workaround tested.
        probe: ``probe(trainer_module) -> bool``: True when the bug is present in this Keras.
        install: ``install(trainer_module) -> (mode, patches)``; ``mode`` is ``"fix"``, or
            ``"guard"`` for a clear error where no safe fix exists.
    """

    issue: str
    summary: str
    url: str
    verified_on: tuple[str, ...]
    probe: Callable[[ModuleType], bool]
    install: Callable[[ModuleType], tuple[str, list[Patch]]]


def keras3_trainer_module() -> ModuleType | None:
    """Keras 3's ``keras.src.backend.tensorflow.trainer`` if the resolved Keras uses it, else None.

    Found through the resolved ``keras.Model`` rather than imported, so that a process on
    tf_keras never loads Keras 3 because of tfdp-utils, and tf_keras is never touched.
    """
    if not IS_KERAS3:
        return None
    for cls in getattr(keras, "Model", object).__mro__:
        if cls.__name__ == "TensorFlowTrainer":
            return sys.modules.get(cls.__module__)
    return None  # Keras 3 on another backend (JAX, torch): none of these bugs apply.


def keras_version() -> str:
    """The version of the Keras that ``tf.keras`` resolves to."""
    return KERAS_VERSION


def is_mirrored_family(strategy: Any) -> bool:
    """MirroredStrategy or MultiWorkerMirroredStrategy (they trace replicas in threads)."""
    return isinstance(
        strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
    )


def first_local_value(strategy: Any, value: Any) -> Any:
    """The first local replica's component of a distributed value; other values unchanged."""
    if isinstance(value, tf.distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value
