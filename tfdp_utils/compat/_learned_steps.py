"""One distributed iterator from the second epoch on, for a builder dataset of unknown size.

Part of the compat change ``"fit-one-iterator"`` (:mod:`._one_iterator`), for the datasets it
could not swap before training: a source whose size nobody knows (a generator, a ``filter``,
files not counted) has no epoch steps to give ``fit``, so Keras reads every epoch to its end
through a new iterator, whose destruction can stall for a large part of a second each epoch.

``fit`` learns the steps in its first epoch instead: Keras reads that epoch to its end as
before (TensorFlow's distributed iterator ends it on the same step on every worker, so every
worker learns the same count), and from the second epoch on reads
:meth:`~tfdp_utils.data._learned_epochs.Learnable.stream`, the same data as one stream of
whole epochs each padded to those steps, through one iterator:

* Keras 3: the ``TFEpochIterator`` of the ``fit`` call (seen by the patched
  ``_maybe_symbolic_build``, which Keras calls with it before training) gets its own
  ``_enumerate_iterator``: the first epoch as Keras' own, the later ones ``steps`` steps each
  from the stream's one iterator;
* tf_keras: the ``tf_keras-datasets`` change's ``DataHandler.enumerate_epochs`` yields the
  stream's one iterator for every epoch after the first, with the steps tf_keras learnt
  (``DataHandler._inferred_steps``).

The stream is built, its iterator made and its prefetching started on a thread of its own
once the first epoch's first step has run (:meth:`LearnedEpochs.start_stream`; the first
epoch's pass of the source is then the first): it reads while the first epoch trains, and
waits for the steps only where they decide
(:class:`~tfdp_utils.data._learned_epochs.LearnedSteps`), so the second epoch starts on
batches already read instead of building the stream and opening its files then. The fit's
end, whichever way it ends, gives up steps not yet learnt, so that no read waits past it.

Only for ``fit`` over two or more epochs, without ``steps_per_epoch``, with
``steps_per_execution=1`` (a count of executions is a count of steps), on a builder dataset
that can be streamed (dense elements, its own per-worker pipeline, no tf.data service, no
``drop_remainder``). The call's callbacks still receive the dataset passed; ``validation_data``
is read as before. The fit wrapper marks the call (:func:`learning_in`), and nothing is kept
once it returns.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import dataclasses
import random
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from tfdp_utils._dataset_info import carry, info_of, record_of
from tfdp_utils._waiting import Deadline, WaitProgress, join_within

_BUILD_TIMEOUT_S = 600.0  # the stream's build on its thread, waited for by the second epoch


@dataclasses.dataclass
class LearnedEpochs:
    """A ``fit`` call that learns its epoch's steps in its first epoch.

    Attributes:
        dataset: the builder dataset the call trains on (the one passed).
        learnable: its :class:`~tfdp_utils.data._learned_epochs.Learnable`.
        seed: the shuffle seed of the stream's epochs.
        initial_epoch: the call's ``initial_epoch`` (the stream's epochs are numbered on from
            it, for their seeds).
        epochs: the call's ``epochs`` (the stream ends with the last; None: endless).
        claimed: whether the call's training loop has taken it (once per call).
        iterator: the stream's one iterator, once made.
        steps: the steps the stream waits for, once it is started before they are known.
    """

    dataset: Any
    learnable: Any
    seed: int | None
    initial_epoch: int = 0
    epochs: int | None = None
    claimed: bool = False
    iterator: Any = None
    first_epoch: list[Any] = dataclasses.field(default_factory=list)
    steps: Any = None
    _builder: threading.Thread | None = None
    _built: list[Any] = dataclasses.field(default_factory=list)  # [iterator] or [error]
    _ended: bool = False
    _build_ended: bool = False  # the build thread has ended (its result, if any, in _built)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def release_first_epoch(self) -> None:
        """Let the first epoch's iterator go in a thread of its own.

        Destroying a tf.distribute iterator can stall for a large part of a second; the
        training loop holds the stream's iterator by now, so the last reference to the first
        epoch's goes in a thread and training does not wait for its destruction.
        """
        if self.first_epoch:
            held = list(self.first_epoch)
            self.first_epoch.clear()
            _release_apart(held)

    def end(self) -> None:
        """At the end of the call: what is still held goes in a thread of its own too, so
        that the call returns without waiting for a destruction (the interpreter's exit
        waits for every release started, bounded)."""
        self.drop_stream()
        held = list(self.first_epoch)
        self.first_epoch.clear()
        _release_apart(held)

    def drop_stream(self) -> None:
        """Give up the stream: steps not learnt are abandoned (a read waiting for them ends),
        its iterator goes in a thread of its own (a build still running lets it go so)."""
        if self.steps is not None:
            self.steps.abandon()
        with self._lock:
            self._ended = True
            held = [self.iterator, *self._built]
            self.iterator = None
            self._built.clear()
        _release_apart(held)

    def start_stream(self, first_epoch: int) -> None:
        """Build the stream of epochs from ``first_epoch`` on, make its iterator and start its
        prefetching, on a thread of its own, before the steps are known (once; they come to
        :meth:`stream_iterator`)."""
        if self._builder is not None or self.iterator is not None:
            return
        self.steps = self.learnable.steps_to_learn()
        self._builder = threading.Thread(
            target=self._build, args=(first_epoch,), daemon=True, name="tfdp-build-stream"
        )
        _start_apart(self._builder)  # joined at exit, as the releases

    def _build(self, first_epoch: int) -> None:
        built: Any = None
        try:
            built = self._make_iterator(first_epoch, self.steps, primed=True)
            if not self.learnable.prime(
                built
            ):  # not this structure: made again when the steps are known
                _release_apart([built])
                built = None
        except Exception as error:  # raised in the training thread by stream_iterator
            built = error
        with self._lock:
            if not self._ended:
                self._built.append(built)
                self._build_ended = True
                return
        _release_apart([built])

    def _make_iterator(self, first_epoch: int, steps: Any, *, primed: bool = False) -> Any:
        # Nothing is read past the call's last epoch: the iterator ends drained, and its
        # destruction at the end of the call waits for no read in flight.
        stream = self.learnable.stream(
            first_epoch, steps, self.seed, end_epoch=self.epochs, primed=primed
        )
        own, passed = record_of(stream), record_of(self.dataset)
        if own is not None and passed is not None and passed.input_clock is not None:
            # Its waits for input count on the dataset the callbacks receive.
            carry(stream, dataclasses.replace(own, input_clock=passed.input_clock))
        return iter(stream)

    def stream_iterator(self, first_epoch: int, steps: int) -> Any:
        """The one iterator of the stream of epochs from ``first_epoch`` on (made once; the
        one :meth:`start_stream` started, given its ``steps``, where it was started)."""
        if self.iterator is not None:
            return self.iterator
        if self._builder is None:
            self.iterator = self._make_iterator(first_epoch, steps)
            return self.iterator
        self.steps.learn(steps)
        builder = self._builder
        join_within(
            builder,
            deadline=Deadline(_BUILD_TIMEOUT_S),
            progress=WaitProgress(
                lambda: _building(builder),
                bound=_BUILD_TIMEOUT_S,
                change="tdu.compat.undo('fit-one-iterator') before fit (a new iterator per epoch)",
            ),
        )
        with self._lock:
            done, built = self._build_ended, (self._built.pop() if self._built else None)
        if done and built is None:  # not primed: made now, as without the thread
            self.iterator = self._make_iterator(first_epoch, steps)
            return self.iterator
        if built is None:
            raise TimeoutError(
                f"the stream of epochs of this fit (a dataset of unknown size read through "
                f"one iterator from its second epoch) was not built within "
                f"{_BUILD_TIMEOUT_S:.0f} s; undo the compat change fit-one-iterator before "
                "fit with tdu.compat.undo to read every epoch through a new iterator."
            )
        if isinstance(built, Exception):
            raise built
        self.iterator = built
        return self.iterator


def _building(thread: threading.Thread) -> str:
    """What the second epoch waits for: the stream's build, and where its thread is now."""
    frame = sys._current_frames().get(thread.ident or 0)
    where = ""
    if frame is not None:
        names: list[str] = []
        while frame is not None and len(names) < 3:  # the innermost calls past threading's
            if frame.f_code.co_filename != threading.__file__:
                names.append(frame.f_code.co_name)
            frame = frame.f_back
        where = f" (now in {' < '.join(names)})"
    return (
        f"the stream of this fit's epochs from its second on (a dataset of unknown size read "
        f"through one iterator) to be built on thread {thread.name}{where}"
    )


_RELEASE_TIMEOUT_S = 60.0  # a destruction that takes longer is left to the interpreter
_RELEASING: list[threading.Thread] = []  # the release threads started, until they end
_RELEASING_LOCK = threading.Lock()
_EXIT_WAITS: list[Any] = []  # join_releases, once registered with atexit


def _release(held: list[Any]) -> None:
    for item in held:
        close = getattr(item, "close", None)
        if callable(close):
            close()  # a generator of Keras' that holds the iterator in its frame
    held.clear()


def _release_apart(held: list[Any]) -> None:
    """Drop the last references to ``held`` in a thread of its own (joined at exit)."""
    thread = threading.Thread(
        target=_release, args=(held,), daemon=True, name="tfdp-release-iterator"
    )
    _start_apart(thread)


def _start_apart(thread: threading.Thread) -> None:
    """Start ``thread``, which :func:`join_releases` waits for (at the interpreter's exit)."""
    with _RELEASING_LOCK:
        if not _EXIT_WAITS:  # once per process
            atexit.register(join_releases)
            _EXIT_WAITS.append(join_releases)
        _RELEASING[:] = [t for t in _RELEASING if t.is_alive()]
        thread.start()  # before join_releases can see it
        _RELEASING.append(thread)


def join_releases(timeout: float = _RELEASE_TIMEOUT_S) -> None:
    """Wait (at most ``timeout`` seconds in all) for the streams built and the iterators
    released apart (a build that ends after its fit releases its iterator so too): at the
    interpreter's exit, so that no build or destruction runs on while it exits."""
    deadline = time.monotonic() + timeout
    while True:
        with _RELEASING_LOCK:
            _RELEASING[:] = [t for t in _RELEASING if t.is_alive()]
            threads = list(_RELEASING)
        if not threads or time.monotonic() >= deadline:
            return
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


_CURRENT: contextvars.ContextVar[LearnedEpochs | None] = contextvars.ContextVar(
    "tfdp_utils_learned_epochs", default=None
)


def _dense(dataset: Any) -> bool:
    from tfdp_utils._tf import tf

    try:
        specs = tf.nest.flatten(dataset.element_spec, expand_composites=False)
    except (AttributeError, TypeError, ValueError):
        return False

    def dense(spec: Any) -> bool:
        parts = getattr(spec, "_value_specs", None)  # a PerReplicaSpec
        return all(type(part) is tf.TensorSpec for part in (parts or (spec,)))

    return all(dense(spec) for spec in specs)


def learning_for(
    arguments: dict[str, Any], *, epochs: int, initial_epoch: int, steps_per_execution: int | None
) -> LearnedEpochs | None:
    """The :class:`LearnedEpochs` of a ``fit`` call where it applies, else None.

    Args:
        arguments: the call's bound arguments.
        epochs: ``fit``'s ``epochs``.
        initial_epoch: ``fit``'s ``initial_epoch``.
        steps_per_execution: the model's, or None when tuned (``"auto"``).
    """
    from tfdp_utils._tf import tf

    x = arguments.get("x")
    info, record = info_of(x), record_of(x)
    if info is None or record is None or isinstance(x, tf.data.Dataset):
        return None
    if info.repeat or info.steps_per_epoch is not None or record.replaces is not None:
        return None
    if arguments.get("steps_per_epoch") is not None or epochs - initial_epoch < 2:
        return None
    if steps_per_execution != 1 or not callable(record.learnable) or not _dense(x):
        return None
    learnable = record.learnable()
    if learnable is None:
        return None
    seed = learnable.seed
    if seed is None and learnable.shuffles:
        seed = random.randrange(2**31)  # as the dataset, a new order every run
    return LearnedEpochs(x, learnable, seed, initial_epoch, epochs)


@contextlib.contextmanager
def learning_in(learned: LearnedEpochs | None) -> Iterator[None]:
    """Mark the ``fit`` call running inside as one that learns its steps (None: does not)."""
    token = _CURRENT.set(learned)
    try:
        yield
    finally:
        _CURRENT.reset(token)
        if learned is not None:
            learned.end()


def claim(dataset: Any) -> LearnedEpochs | None:
    """The running call's :class:`LearnedEpochs` when ``dataset`` is the one it trains on and
    no training loop has taken it yet (validation and later loops read as before)."""
    learned = _CURRENT.get()
    if learned is None or learned.claimed or dataset is None or dataset is not learned.dataset:
        return None
    learned.claimed = True
    return learned


def is_target(dataset: Any) -> bool:
    """Whether ``dataset`` is the one the running call learns its steps on."""
    learned = _CURRENT.get()
    return learned is not None and dataset is not None and dataset is learned.dataset


# --------------------------------------------------------------------------- Keras 3


def drive_keras3(epoch_iterator: Any, learned: LearnedEpochs) -> None:
    """Give Keras 3's ``TFEpochIterator`` of a ``fit`` call the learned epochs (see the module
    docstring): an instance attribute replaces its ``_enumerate_iterator``."""
    original = epoch_iterator._enumerate_iterator
    state = {"executions": 0, "epochs": 0}

    def _enumerate_iterator() -> Any:
        state["epochs"] += 1
        if state["epochs"] == 1:
            first = original()
            learned.first_epoch.append(first)  # released apart (see Retired)
            for item in first:  # read to the end of the data, as Keras does
                state["executions"] += 1
                yield item
                if state["executions"] == 1:  # the first step has run
                    learned.start_stream(learned.initial_epoch + 1)
            return
        # The last execution of the first epoch found no data (steps_per_execution is 1).
        steps = state["executions"] - 1
        if steps < 1 or epoch_iterator._num_batches != state["executions"]:
            learned.drop_stream()
            learned.release_first_epoch()
            yield from original()  # not what was learnt: Keras' own, a new iterator
            return
        iterator = learned.stream_iterator(learned.initial_epoch + 1, steps)
        epoch_iterator.data_adapter.on_epoch_begin()
        for step in range(steps):
            epoch_iterator._steps_seen = step + 1
            yield step, step, iterator
            if step == 0 and state["epochs"] == 2:
                # Keras holds the stream's iterator now, not the first epoch's.
                learned.release_first_epoch()
        epoch_iterator.data_adapter.on_epoch_end()

    epoch_iterator._enumerate_iterator = _enumerate_iterator


# --------------------------------------------------------------------------- tf_keras


def drive_tf_keras(handler: Any, learned: LearnedEpochs) -> Iterator[Any]:
    """tf_keras's ``DataHandler.enumerate_epochs`` for a call that learns its steps: the first
    epoch read to its end through its own iterator (tf_keras's own makes a second one before
    it), then the stream's one iterator for the later ones, with the steps tf_keras learnt.
    Its ``steps_per_execution`` is 1, so no execution is truncated to the epoch."""
    first = handler._initial_epoch
    handler._inferred_steps = None  # the first epoch ends with its data
    learned.first_epoch.append(iter(handler._dataset))
    handler.steps = _starting_stream(handler.steps, learned, first + 1)
    try:
        yield first, learned.first_epoch[-1]
    finally:
        del handler.steps  # the class's own again
    handler._adapter.on_epoch_end()
    steps = handler._inferred_steps
    learnt = not handler._insufficient_data and isinstance(steps, int) and steps >= 1
    if not learnt:
        learned.drop_stream()
    for epoch in range(first + 1, handler._epochs):
        if handler._insufficient_data:
            break
        if epoch > first + 1 or not learnt:
            # tf_keras's loop holds the epoch's iterator by now, not the first epoch's.
            learned.release_first_epoch()
        if learnt:
            yield epoch, learned.stream_iterator(first + 1, steps)
        else:  # not what was learnt: a new pass each epoch, read to its end
            handler._inferred_steps = None
            yield epoch, iter(handler._dataset)
        handler._adapter.on_epoch_end()


def _starting_stream(steps: Any, learned: LearnedEpochs, first_epoch: int) -> Any:
    """tf_keras's ``DataHandler.steps`` for the first epoch: once its first step has run, the
    stream of the later epochs starts (:meth:`LearnedEpochs.start_stream`)."""

    def first_epoch_steps() -> Iterator[Any]:
        for index, step in enumerate(steps()):
            yield step
            if index == 0:
                learned.start_stream(first_epoch)

    return first_epoch_steps
