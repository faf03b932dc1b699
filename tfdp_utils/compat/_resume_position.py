"""Start ``fit``'s first epoch at a given step: how a preempted job resumes mid-epoch.

Keras starts every epoch at its first batch: Keras 3's ``EpochIterator`` enumerates
``range(0, steps_per_epoch)``, and tf_keras' ``DataHandler`` starts at a step that only its own
``BackupAndRestore`` can set (``Model._maybe_load_initial_counters_from_ckpt``). To resume at
step ``b`` of epoch ``e``, :func:`first_epoch_starts_at` marks the next ``fit`` call: its
training loop runs steps ``b .. steps_per_epoch - 1`` of epoch ``e`` (numbered so, as callbacks
see them), then whole epochs. The data is positioned by the builder (``data._resume``); only
the step numbering and the count of the first epoch change here.

Recorded as ``"resume-position"`` in the compat registry; ``TFDP_NO_KERAS_PATCHES=1`` keeps it
off, and then ``PreemptionCheckpoint`` refuses to resume mid-epoch with a message that says so.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

from tfdp_utils.compat._registry import REGISTRY, RuntimeChange, change_of, replace_method
from tfdp_utils.compat._switch import disabled

CHANGE = RuntimeChange(
    name="resume-position",
    kind="process",
    changes="Keras 3's EpochIterator (its constructor and epoch enumeration) or tf_keras' "
    "Model._maybe_load_initial_counters_from_ckpt wrapped",
    why="a job preempted mid-epoch resumes at the step it saved: Keras starts every epoch at "
    "its first batch. Acts only inside a fit that PreemptionCheckpoint resumes; every other "
    "fit runs Keras' own code. TFDP_NO_KERAS_PATCHES=1 keeps it off (resuming then refuses "
    "to start mid-epoch)",
    undoable=True,
)

_PENDING: contextvars.ContextVar[int] = contextvars.ContextVar("tfdp_first_step", default=0)
_ATTRIBUTE = "_tfdp_first_step"


@contextlib.contextmanager
def first_epoch_starts_at(step: int) -> Iterator[None]:
    """Inside this block, the next ``fit`` training loop starts its first epoch at ``step``."""
    token = _PENDING.set(step)
    try:
        yield
    finally:
        _PENDING.reset(token)


def _take_pending() -> int:
    step = _PENDING.get()
    if step:
        _PENDING.set(0)  # the training loop's; evaluation loops that follow start at 0
    return step


def _keras3_init(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        setattr(self, _ATTRIBUTE, _take_pending())

    return __init__


def _keras3_enumerate(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _enumerate_iterator(self: Any) -> Iterator[Any]:
        first = getattr(self, _ATTRIBUTE, 0)
        if not first or not self.steps_per_epoch:
            yield from original(self)
            return
        steps = self.steps_per_epoch
        self.steps_per_epoch = steps - first
        completed = False
        try:
            for begin, end, iterator in original(self):
                yield begin + first, end + first, iterator
            completed = True
        finally:
            self.steps_per_epoch = steps
            # Keras 3 peeks at one batch before training (its symbolic build) through an
            # enumeration it breaks off; the first step holds until an epoch runs to its end.
            if completed:
                setattr(self, _ATTRIBUTE, 0)

    return _enumerate_iterator


def _tf_keras_counters(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _maybe_load_initial_counters_from_ckpt(
        self: Any, steps_per_epoch: Any, initial_epoch: Any, *args: Any, **kwargs: Any
    ) -> Any:
        epoch, step = original(self, steps_per_epoch, initial_epoch, *args, **kwargs)
        first = _take_pending()
        return (epoch, first) if first else (epoch, step)

    return _maybe_load_initial_counters_from_ckpt


def _targets() -> list[tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
    from tfdp_utils._tf import IS_KERAS3

    if IS_KERAS3:
        from keras.src.trainers import epoch_iterator

        cls = epoch_iterator.EpochIterator
        return [(cls, "__init__", _keras3_init), (cls, "_enumerate_iterator", _keras3_enumerate)]
    from tfdp_utils._tf import keras

    return [(keras.Model, "_maybe_load_initial_counters_from_ckpt", _tf_keras_counters)]


def installed() -> bool:
    """Whether the training loops of the active Keras take a first step."""
    return all(change_of(getattr(owner, name)) == CHANGE.name for owner, name, _ in _targets())


def install(*, applied_by: str) -> bool:
    """Wrap the active Keras' training loop once; False when ``TFDP_NO_KERAS_PATCHES=1``."""
    with REGISTRY.lock:
        if installed():
            return True
        if disabled():
            return False
        patches = [
            replace_method(owner, name, wrap(getattr(owner, name)), change=CHANGE.name)
            for owner, name, wrap in _targets()
            if change_of(getattr(owner, name)) != CHANGE.name
        ]
        REGISTRY.record(CHANGE, applied_by=applied_by, patches=patches)
        return True
