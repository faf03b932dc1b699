"""keras#20585: Keras 3 ``fit``/``evaluate`` under MultiWorkerMirroredStrategy fail before training.

``TensorFlowTrainer._maybe_symbolic_build`` takes the first distributed batch and calls
``strategy.reduce("MEAN", batch, axis=None)`` on the whole ``(x, y, ...)`` structure. With
two or more workers, MultiWorkerMirroredStrategy cannot reduce a nest of PerReplica values
and raises ``ValueError: Attempt to convert a value (PerReplica:{...}) ... to a Tensor``.
The batch is only needed for its shapes, so the workaround builds the model from the first
local replica's component instead, which has the same shapes as the mean and needs no
cross-worker collective.

Verified on Keras 3.15.1 (TensorFlow 2.21); the code is unchanged on Keras master (3.16.0.dev).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from tfdp_utils._tf import tf
from tfdp_utils.cluster._topology import is_multi_worker
from tfdp_utils.compat import _one_iterator as one_iterator
from tfdp_utils.compat._registry import (
    Patch,
    Workaround,
    first_local_value,
    replace_method,
    trainer_class,
)

ISSUE = "keras#20585"


class _LocalValues(tf.distribute.DistributedValues):  # type: ignore[misc]
    """A distributed value of one replica, built without a strategy."""

    def __init__(self, component: Any) -> None:
        self.values = (component,)


class _RecordingStrategy:
    """Stands in for a multi-worker strategy and records what Keras asks it to reduce."""

    def __init__(self) -> None:
        self.reduced: list[Any] = []

    def reduce(self, reduce_op: Any, value: Any, axis: Any = None) -> Any:
        self.reduced.append(value)
        return tf.nest.map_structure(lambda v: first_local_value(self, v), value)

    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        return tuple(value.values)

    def scope(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class _RecordingModel:
    def __init__(self, strategy: _RecordingStrategy) -> None:
        self._distribute_strategy = strategy
        self.distribute_strategy = strategy
        self.built_with: list[Any] = []

    def _symbolic_build(self, data_batch: Any = None) -> None:
        self.built_with.append(data_batch)


def probe(trainer: ModuleType) -> bool:
    """True when Keras hands ``strategy.reduce`` a whole nest of per-replica values.

    Runs Keras' own ``_maybe_symbolic_build`` on a one-batch iterator of
    ``tf.distribute.DistributedValues`` with a recording strategy: no cluster needed.
    MultiWorkerMirroredStrategy cannot reduce a nest (only single values), so a nest
    reaching ``reduce`` is the bug.
    """
    method = getattr(trainer_class(trainer), "_maybe_symbolic_build", None)
    if method is None:
        return False  # the code path is gone; nothing to work around
    # Keras >= 3.11 iterates (begin_step, end_step, iterator) here, Keras <= 3.10
    # (step, iterator): try the current shape first, then the older one.
    items: tuple[Callable[[Any], tuple[Any, ...]], ...] = (
        lambda it: (0, 0, it),
        lambda it: (0, it),
    )
    for make_item in items:
        strategy = _RecordingStrategy()
        model = _RecordingModel(strategy)
        batch = (_LocalValues(tf.zeros((2, 3))), _LocalValues(tf.zeros((2, 1))))
        try:
            method(model, iterator=[make_item(iter([batch]))])
        except ValueError as exc:
            if "unpack" not in str(exc):
                raise
            continue
        return any(isinstance(value, (tuple, list, dict)) for value in strategy.reduced)
    raise ValueError("Keras' _maybe_symbolic_build takes neither iterator item shape")


def _replicas_differ(strategy: Any, batch: Any) -> bool:
    """Whether the local replicas' parts of ``batch`` differ in shape (an uneven step)."""
    for value in tf.nest.flatten(batch):
        if isinstance(value, tf.distribute.DistributedValues):
            shapes = {tuple(part.shape) for part in strategy.experimental_local_results(value)}
            if len(shapes) > 1:
                return True
    return False


def install(trainer: ModuleType) -> tuple[str, list[Patch]]:
    """Replace ``TensorFlowTrainer._maybe_symbolic_build``: multi-worker strategies, and a first
    batch cut unevenly over the replicas, build from the first local replica's batch; every
    other build is Keras' own."""
    cls = trainer_class(trainer)
    original = cls._maybe_symbolic_build

    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        strategy = self._distribute_strategy
        if strategy is None or iterator is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        spec = one_iterator.spec_batch(iterator) if data_batch is None else None
        if spec is not None:  # a fit's stream of epochs: built without a batch (see there)
            return original(self, iterator=None, data_batch=spec)
        for item in iterator:  # (begin, end, iterator) on Keras >= 3.11, (step, iterator) before
            batch = next(item[-1])
            if not is_multi_worker(strategy) and not _replicas_differ(strategy, batch):
                # Keras' own build, from the batch it would have taken.
                peeked = (*item[:-1], iter([batch]))
                return original(self, iterator=[peeked], data_batch=data_batch)
            # keras#20585: build from the first local replica's batch (same shapes as the
            # mean Keras computes) instead of reducing the whole (x, y, ...) nest across
            # workers; the same where the replicas' batches differ in size (a partial step
            # cut unevenly, e.g. the first step of a resumed epoch), which Keras' mean
            # cannot add up.
            data_batch = tf.nest.map_structure(lambda v: first_local_value(strategy, v), batch)
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)
        return None

    return "fix", [
        replace_method(cls, "_maybe_symbolic_build", _maybe_symbolic_build, change=ISSUE)
    ]


WORKAROUND = Workaround(
    issue=ISSUE,
    verified_on=("3.15.1",),
    changes="keras TensorFlowTrainer._maybe_symbolic_build replaced (multi-worker strategies, "
    "and first batches cut unevenly over the replicas, build the model from the first local "
    "replica's batch)",
    probe=probe,
    install=install,
)
