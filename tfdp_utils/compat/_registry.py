"""The registry of every runtime change tfdp-utils makes to Keras or TensorFlow, and its tools.

Nothing here changes Keras by itself. The modules that do (the upstream workarounds
``_keras_20585``, ``_tf_72388``, ``_keras_19246``, ``_keras_20582``; ``_fit_binding``;
``_tf_keras_datasets``; the builder, the strategy and accumulation helpers through
:mod:`._changes`) make each change through :func:`replace_method`, :func:`set_attribute` or
:func:`change_object` and record it in :data:`REGISTRY`, so that :func:`tfdp_utils.compat.status`
lists it and :func:`tfdp_utils.compat.undo` takes it back out.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Literal

from tfdp_utils._known_issues import ISSUES
from tfdp_utils._tf import IS_KERAS3, KERAS_VERSION, keras, tf

MARK = "_tfdp_change"
"""Attribute of every replacement function: the name of the change it belongs to."""

Kind = Literal["workaround", "process", "object"]
"""``"workaround"``: an upstream bug's fix or guard. ``"process"``: another change to a class or
module, seen by every object in the process. ``"object"``: a change to each object tfdp-utils
makes or is handed (a dataset, a model, a strategy), never to its class."""


@dataclasses.dataclass
class Patch:
    """One attribute replaced on a Keras class or module, with what was there before."""

    owner: Any
    name: str
    original: Any
    replacement: Any

    inherited: bool = False

    def installed(self) -> bool:
        """Whether ``owner.name`` is still the replacement (nobody replaced or restored it)."""
        return getattr(self.owner, self.name, None) is self.replacement

    def undo(self) -> None:
        """Put the original attribute back (only if ours is still the one installed).

        An attribute the owner inherited is removed again, so the inherited one shows.
        """
        if self.installed():
            if self.inherited:
                delattr(self.owner, self.name)
            else:
                setattr(self.owner, self.name, self.original)

    def describe(self) -> str:
        """``"Owner.name"``: what this patch replaced, in words."""
        owner = getattr(self.owner, "__qualname__", None) or getattr(
            self.owner, "__name__", type(self.owner).__name__
        )
        return f"{owner}.{self.name}"


def set_attribute(owner: Any, name: str, replacement: Any) -> Patch:
    """Replace ``owner.name`` with ``replacement`` and return the record that undoes it."""
    own = getattr(owner, "__dict__", None)
    inherited = isinstance(owner, type) and own is not None and name not in own
    patch = Patch(owner, name, getattr(owner, name), replacement, inherited)
    setattr(owner, name, replacement)
    return patch


def replace_method(owner: Any, name: str, replacement: Any, *, change: str) -> Patch:
    """Replace the function ``owner.name`` with ``replacement``, marked as part of ``change``.

    The one way a function of a Keras or TensorFlow class or module is replaced: the
    replacement carries :data:`MARK` (the change's name) and, when it has none, the original's
    docstring; the returned :class:`Patch` undoes it. Record the patches in :data:`REGISTRY`.

    Args:
        owner: the class or module.
        name: the attribute to replace.
        replacement: the new function (usually a closure over the original).
        change: the name of the change, e.g. ``"keras#19246"`` or ``"fit-binding"``.

    Returns:
        The :class:`Patch` that puts the original back.
    """
    original = getattr(owner, name)
    if getattr(replacement, "__doc__", None) is None:
        replacement.__doc__ = getattr(original, "__doc__", None)
    setattr(replacement, MARK, change)
    return set_attribute(owner, name, replacement)


def change_of(value: Any) -> str | None:
    """The name of the change ``value`` is a replacement of, or None for Keras' own code."""
    name = getattr(value, MARK, None)
    return name if isinstance(name, str) else None


@dataclasses.dataclass(frozen=True)
class RuntimeChange:
    """What one runtime change to Keras or TensorFlow is, and why tfdp-utils makes it.

    Attributes:
        name: the upstream issue for a workaround (``"keras#19246"``), else a short name
            (``"fit-binding"``).
        kind: ``"workaround"``, ``"process"`` or ``"object"`` (see :data:`Kind`).
        changes: what is changed, e.g. ``"keras.Model.fit/evaluate/predict wrapped"``.
        why: what it is for, what fails without it, and the kill switch's effect on it.
        undoable: whether :func:`tfdp_utils.compat.undo` can take it back out.
        kill_switch: whether ``TFDP_NO_KERAS_PATCHES=1`` turns it off.
    """

    name: str
    kind: Kind
    changes: str
    why: str
    undoable: bool
    kill_switch: bool = True


@dataclasses.dataclass
class AppliedChange:
    """A change made in this process: when, by what, how often, and the patches that undo it.

    Attributes:
        change: what the change is.
        applied_at: when it was first made (``time.time()``).
        applied_by: what first made it, e.g. ``"build_distributed_dataset()"``.
        mode: ``"fix"`` or ``"guard"`` for a workaround, else ``"change"``.
        count: how many times it was made: objects changed for an ``"object"`` change.
        patches: what :meth:`undo` puts back, oldest first.
    """

    change: RuntimeChange
    applied_at: float
    applied_by: str
    mode: str = "change"
    count: int = 1
    patches: list[Patch] = dataclasses.field(default_factory=list)

    def undo(self) -> None:
        """Put back what the patches replaced, newest first."""
        for patch in reversed(self.patches):
            patch.undo()


class Registry:
    """The changes made in this process, by name, in the order they were first made.

    Thread-safe. One instance, :data:`REGISTRY`, serves the whole package.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._applied: dict[str, AppliedChange] = {}

    @property
    def lock(self) -> threading.RLock:
        """The lock held while a change is made and recorded (re-entrant)."""
        return self._lock

    def record(
        self,
        change: RuntimeChange,
        *,
        applied_by: str,
        patches: Sequence[Patch] = (),
        mode: str = "change",
    ) -> AppliedChange:
        """Record that ``change`` was made (again): its first time and cause are kept."""
        with self._lock:
            entry = self._applied.get(change.name)
            if entry is None:
                entry = AppliedChange(change, time.time(), applied_by, mode, 0)
                self._applied[change.name] = entry
            entry.count += 1
            entry.patches.extend(patches)
            return entry

    def get(self, name: str) -> AppliedChange | None:
        """The record of the change called ``name``, or None when it is not in effect."""
        with self._lock:
            return self._applied.get(name)

    def applied(self, kind: Kind | None = None) -> tuple[str, ...]:
        """Names of the changes in effect (of one ``kind``), in the order first made."""
        with self._lock:
            return tuple(name for name, e in self._applied.items() if kind in (None, e.change.kind))

    def undo(self, name: str) -> bool:
        """Take the change called ``name`` back out; False when it is not in effect.

        Raises:
            ValueError: the change cannot be undone (its ``why`` says why).
        """
        with self._lock:
            entry = self._applied.get(name)
            if entry is None:
                return False
            if not entry.change.undoable:
                raise ValueError(
                    f"{name} ({entry.change.changes}) cannot be undone: {entry.change.why}"
                )
            del self._applied[name]
            entry.undo()
            return True


REGISTRY = Registry()
"""Every runtime change to Keras or TensorFlow made in this process."""


def change_object(
    obj: Any, name: str, value: Any, *, change: RuntimeChange, applied_by: str
) -> None:
    """Set ``obj.name = value`` on one object (never its class) and count it under ``change``.

    For ``"object"`` changes: ``__class__`` of a dataset, ``train_step`` of a model, an
    attribute of a strategy. Nothing is kept of the object itself.

    Raises:
        TypeError: the object refuses the attribute (e.g. a class that forbids
            ``__class__`` assignment); nothing is counted then.
    """
    setattr(obj, name, value)
    REGISTRY.record(change, applied_by=applied_by)


@dataclasses.dataclass(frozen=True)
class Workaround:
    """An upstream bug, how to tell whether the installed Keras has it, and how to work around it.

    Attributes:
        issue: the upstream issue, e.g. ``"keras#19246"``; its entry in the known-issues table
            (:mod:`tfdp_utils._known_issues`, the one home of each bug's title and
            address) gives :attr:`summary` and :attr:`url`.
        verified_on: Keras versions on which the bug was reproduced and the workaround tested.
        changes: what the workaround replaces, e.g. ``"TensorFlowTrainer._make_function"``.
        probe: ``probe(trainer_module) -> bool``: True when the bug is present in this Keras.
        install: ``install(trainer_module) -> (mode, patches)``; ``mode`` is ``"fix"``, or
            ``"guard"`` for a clear error where no safe fix exists. Each patch comes from
            :func:`replace_method` with ``change=issue``.
    """

    issue: str
    verified_on: tuple[str, ...]
    changes: str
    probe: Callable[[ModuleType], bool]
    install: Callable[[ModuleType], tuple[str, list[Patch]]]

    @property
    def summary(self) -> str:
        """What fails without the workaround: the known-issues table's title."""
        return ISSUES[self.issue].title

    @property
    def url(self) -> str:
        """The upstream issue's address, from the known-issues table."""
        return ISSUES[self.issue].url

    @property
    def change(self) -> RuntimeChange:
        """This workaround as an entry of the registry."""
        return RuntimeChange(
            name=self.issue,
            kind="workaround",
            changes=self.changes,
            why=f"{self.issue} ({self.url}): {self.summary}; only the affected calls change, "
            "every other one runs Keras' own code. Applied only where the probe finds the bug",
            undoable=True,
        )


def source_shows(method: Callable[..., Any] | None, has_bug: Callable[[str], bool]) -> bool:
    """Whether ``method``'s source shows a bug (``has_bug(source)``): a probe's common part.

    A method that is gone means the code path changed: nothing known to work around, and a
    fixed Keras must run unhindered (False). Source that cannot be read is assumed to have the
    bug (True), so that the workaround's own checks decide.
    """
    if method is None:
        return False
    try:
        source = inspect.getsource(method)
    except (OSError, TypeError):
        return True
    return has_bug(source)


TRAINER_CLASS_NAMES: tuple[str, ...] = ("TensorFlowTrainer", "Trainer")
"""Keras 3's TensorFlow trainer class, in ``keras.src.backend.tensorflow.trainer``:
``TensorFlowTrainer`` up to Keras 3.15, ``Trainer`` in keras-nightly 3.16.0.dev (TensorFlow
2.22's Keras, whose backend-independent base became ``BaseTrainer``)."""

_TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"


def keras3_trainer_module() -> ModuleType | None:
    """Keras 3's ``keras.src.backend.tensorflow.trainer`` if the resolved Keras uses it, else None.

    Found through the resolved ``keras.Model`` rather than imported, so that a process on
    tf_keras never loads Keras 3 because of tfdp-utils, and tf_keras is never touched.
    """
    if not IS_KERAS3:
        return None
    for cls in getattr(keras, "Model", object).__mro__:
        if cls.__name__ == "TensorFlowTrainer" or cls.__module__ == _TRAINER_MODULE:
            return sys.modules.get(cls.__module__)
    return None  # Keras 3 on another backend (JAX, torch): none of these bugs apply.


def trainer_class(trainer: ModuleType) -> Any:
    """The TensorFlow trainer class of Keras 3's ``trainer`` module (``TensorFlowTrainer``, or
    ``Trainer`` in keras-nightly), or None when it has neither."""
    for name in TRAINER_CLASS_NAMES:
        cls = getattr(trainer, name, None)
        if isinstance(cls, type):
            return cls
    return None


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
