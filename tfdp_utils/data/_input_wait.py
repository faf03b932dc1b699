"""How long the training loop waits for its next batch, measured inside the training step.

A builder dataset carries an :class:`InputClock` (``dataset.tfdp.input_clock``) and its
iterators time each fetch of this worker's next batch in the graph: a timestamp before the
fetch, one after the batch has arrived, and the difference added to a host variable, with two
counters of fetches started and completed. That costs two timestamps and three variable
updates per step inside the function Keras runs anyway: no Python per step, no
``py_function``, no host sync. The variables are read only where a reader asks
(``ThroughputLogger``'s log points, the watchdog naming a stuck worker).

What is timed is the *local* fetch, from this worker's prefetch buffers: the time the step
stood still because this worker's pipeline had no batch ready. Waiting for the other workers
(the collectives, including the one tf.distribute runs to agree that every worker still has
data) is not in it, so a worker whose input is slow shows a high share and the workers that
wait for it in the collectives do not.

The timing goes in where tf.distribute's distributed iterator asks each worker's iterator
for its batch (``get_next_as_list`` / ``get_next_as_optional_list``). The iterator a builder
dataset returns is a same-named subclass of TensorFlow's whose type spec carries the clock, so
that the copy of the iterator a ``tf.function`` traces with (rebuilt from its components) times
its fetches too.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import Any, TypeVar

from tfdp_utils import _dataset_info as dataset_info
from tfdp_utils import _tf
from tfdp_utils._tf import tf

T = TypeVar("T")

_FETCHES = ("get_next_as_list", "get_next_as_optional_list")
_ids = itertools.count()


@dataclasses.dataclass(frozen=True)
class InputProgress:
    """What an :class:`InputClock` has counted so far (on this worker).

    Attributes:
        requested: fetches of a next batch the training loop started.
        received: fetches that completed (the batch arrived).
        waited_seconds: total seconds the loop waited in those fetches.
    """

    requested: int
    received: int
    waited_seconds: float

    @property
    def waiting(self) -> bool:
        """Whether a fetch has started and not completed: the loop waits for input now."""
        return self.requested > self.received


class InputClock:
    """Time the training loop spent waiting for this worker's next batch, kept on the host.

    Args:
        device: the worker's host device to keep the counters on.
    """

    def __init__(self, device: str | None = None) -> None:
        self.id = next(_ids)
        self.untimed: str | None = None  # why fetches are counted but not timed
        # Plain resource variables, made outside any strategy's variable creator (a
        # tf.Variable made under strategy.scope() would be a mirrored one): one set per
        # worker, never synchronised.
        with tf.init_scope(), tf.device(device):
            self._waited = _local_variable(0.0, tf.float64, "tfdp_input_waited")
            self._requested = _local_variable(0, tf.int64, "tfdp_input_requested")
            self._received = _local_variable(0, tf.int64, "tfdp_input_received")

    def timed(self, fetch: Callable[[], T]) -> T:
        """``fetch()``, with the time until its result has arrived added to the clock.

        Inside a ``tf.function`` the timestamps are ordered around the fetch by control
        dependencies; eagerly the ops simply run in order. Under op determinism
        (``tf.config.experimental.enable_op_determinism()``), which refuses timestamps, only the
        fetches are counted, and :attr:`untimed` says why the seconds stay 0.
        """
        timing = not determinism_enabled()
        if not timing:
            self.untimed = UNTIMED_UNDER_DETERMINISM
        start = tf.timestamp() if timing else None
        with tf.control_dependencies([start] if start is not None else []):
            started = self._requested.assign_add(1, read_value=False)
        with tf.control_dependencies([started] if started is not None else []):
            value = fetch()
        arrived = [
            t for t in tf.nest.flatten(value, expand_composites=True) if isinstance(t, tf.Tensor)
        ]
        with tf.control_dependencies(arrived):
            if start is not None:
                self._waited.assign_add(tf.timestamp() - start, read_value=False)
            self._received.assign_add(1, read_value=False)
        return value

    def waited_seconds(self) -> float:
        """Seconds waited so far (a host read of one variable; safe from any thread)."""
        with tf.init_scope():
            return float(_tf.read_variable(self._waited))

    def progress(self) -> InputProgress:
        """The counts so far (a host read of three variables; safe from any thread)."""
        with tf.init_scope():
            return InputProgress(
                requested=int(self._requested.numpy()),
                received=int(self._received.numpy()),
                waited_seconds=float(self._waited.numpy()),
            )


UNTIMED_UNDER_DETERMINISM = (
    "op determinism is on (tf.config.experimental.enable_op_determinism()), which refuses "
    "tf.timestamp, the timer of each fetch of the next batch"
)


def determinism_enabled() -> bool:
    """Whether ``tf.config.experimental.enable_op_determinism()`` is in force (TensorFlow has
    no public reader of it)."""
    from tensorflow.python.framework import config

    return bool(config.is_op_determinism_enabled())


def _local_variable(value: Any, dtype: Any, name: str) -> Any:
    from tensorflow.python.ops import resource_variable_ops

    # The class itself, not tf.Variable: a strategy's variable creator scope applies to
    # tf.Variable(...) only.
    return resource_variable_ops.ResourceVariable(value, dtype=dtype, name=name, trainable=False)


def can_time(dataset_class: type) -> bool:
    """Whether the iterators of ``dataset_class`` can be timed: tf.distribute's distributed
    datasets, whose iterators are ``DistributedIterator`` s. A plain ``tf.data.Dataset`` (the
    builder's one-device form) is left alone: Keras iterates it its own way."""
    from tensorflow.python.distribute import input_lib

    return issubclass(
        dataset_class, (input_lib.DistributedDataset, input_lib.DistributedDatasetsFromFunction)
    )


def clock_of(dataset: Any) -> InputClock | None:
    """The :class:`InputClock` of a builder dataset, or None."""
    record = dataset_info.record_of(dataset)
    clock = None if record is None else record.input_clock
    return clock if isinstance(clock, InputClock) else None


# ----------------------------------------------------------------------- iterators


def _instrument(iterator: Any, clock: InputClock) -> Any:
    """Time every per-worker fetch of ``iterator`` (a tf.distribute DistributedIterator).

    Each worker's iterator gets a same-named subclass whose fetches read the clock from the
    instance: no reference from an iterator to itself, so it is freed (and its input
    pipeline's threads stopped) as soon as the loop drops it, as before.
    """
    iterator._tfdp_clock = clock
    for worker_iterator in getattr(iterator, "_iterators", None) or ():
        worker_iterator._tfdp_clock = clock
        worker_iterator.__class__ = _timed_worker_class(type(worker_iterator))
    return iterator


_WORKER_CLASSES: dict[type, type] = {}


def _timed_worker_class(base: type) -> type:
    """A same-named subclass of a per-worker iterator class whose fetches are timed."""
    if getattr(base, "_tfdp_timed", False):
        return base
    cls = _WORKER_CLASSES.get(base)
    if cls is None:
        namespace: dict[str, Any] = {"__module__": __name__, "_tfdp_timed": True}
        for name in _FETCHES:
            fetch = getattr(base, name, None)
            if callable(fetch):
                namespace[name] = _timed_method(fetch)
        cls = type(base.__name__, (base,), namespace)
        _WORKER_CLASSES[base] = cls
    return cls


def _timed_method(fetch: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(fetch)
    def timed(self: Any, *args: Any, **kwargs: Any) -> T:
        clock: InputClock | None = getattr(self, "_tfdp_clock", None)
        if clock is None:
            return fetch(self, *args, **kwargs)
        return clock.timed(lambda: fetch(self, *args, **kwargs))

    return timed


_TIMED_CLASSES: dict[type, tuple[type, type]] = {}


def _timed_classes(iterator_class: type) -> tuple[type, type]:
    """A same-named subclass of ``iterator_class`` whose type spec carries the clock, and
    that spec's class."""
    classes = _TIMED_CLASSES.get(iterator_class)
    if classes is not None:
        return classes
    from tensorflow.python.distribute import input_lib

    base_spec = input_lib.DistributedIteratorSpec

    class TimedIteratorSpec(base_spec):  # type: ignore[misc, valid-type]
        _tfdp_clock: InputClock | None = None

        @property
        def value_type(self) -> type:
            return timed_class

        def _serialize(self) -> Any:
            clock = self._tfdp_clock
            return (*super()._serialize(), None if clock is None else clock.id)

        def _from_components(self, components: Any) -> Any:
            iterator = super()._from_components(components)
            iterator.__class__ = timed_class
            if self._tfdp_clock is not None:
                _instrument(iterator, self._tfdp_clock)
            return iterator

        def _with_clock(self, spec: Any) -> Any:
            if spec is not None:
                spec._tfdp_clock = self._tfdp_clock
            return spec

        def most_specific_common_supertype(self, others: Any) -> Any:
            return self._with_clock(super().most_specific_common_supertype(others))

        def _with_tensor_ranks_only(self) -> Any:
            return self._with_clock(super()._with_tensor_ranks_only())

        def _without_tensor_names(self) -> Any:
            return self._with_clock(super()._without_tensor_names())

    def _type_spec(self: Any) -> Any:
        spec = TimedIteratorSpec(
            self._input_workers,
            self._element_spec,
            self._strategy,
            self._options,
            self._cardinality,
            self._enable_get_next_as_optional,
            self._replica_order,
        )
        spec._tfdp_clock = getattr(self, "_tfdp_clock", None)
        return spec

    timed_class = type(
        iterator_class.__name__,
        (iterator_class,),
        {"_type_spec": property(_type_spec), "__module__": __name__},
    )
    TimedIteratorSpec.__name__ = TimedIteratorSpec.__qualname__ = base_spec.__name__
    _TIMED_CLASSES[iterator_class] = (timed_class, TimedIteratorSpec)
    return timed_class, TimedIteratorSpec


def timed_iterator(iterator: Any, clock: InputClock) -> Any:
    """``iterator`` (from a builder dataset's ``__iter__``) timing its fetches with ``clock``.

    Iterators of other kinds than tf.distribute's ``DistributedIterator`` are returned as
    they are (their waits stay unknown).
    """
    from tensorflow.python.distribute import input_lib

    if type(iterator) is not input_lib.DistributedIterator:
        return iterator
    iterator.__class__ = _timed_classes(type(iterator))[0]
    return _instrument(iterator, clock)
