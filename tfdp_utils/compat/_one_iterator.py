"""One distributed iterator for a whole ``fit`` over a builder dataset.

Keras iterates a dataset that ends each epoch through a new iterator every epoch, and
destroying a tf.distribute iterator can stall for a large part of a second (0.27-0.93 s in 6 of
16 epochs on the tf.data guide's latency-bound fixture, ``benchmarks/reads.py``; the same
pipeline as a plain ``tf.data.Dataset`` never stalls). Keras keeps one iterator when it is given
``steps_per_epoch`` and data that does not end. So the ``fit`` wrapper
(:mod:`._fit_binding`) hands a ``fit`` over a builder dataset the same data as one stream of
whole epochs, with ``steps_per_epoch`` set to the epoch's steps
(:meth:`~tfdp_utils.data._positioned.Resumable.epochs_from`, the stream ``PreemptionCheckpoint``
resumes from):

* every epoch of the stream is one pass over the data, padded with empty batches to the same
  steps on every worker, so each Keras epoch trains every example once, as before;
* each epoch is shuffled with its own seed (the dataset's seed, or one drawn for this ``fit``,
  plus the epoch), so the order still changes every epoch;
* callbacks still receive the dataset the user passed (``ThroughputLogger`` counts with its
  ``tfdp.info``: the stream's epochs have the same steps and partial last step).

Only where the swap changes nothing else: ``fit`` (not ``evaluate``/``predict``: one pass per
call) over two or more epochs, on a builder dataset that ends each epoch and whose epochs can
be aligned (a sized source of dense elements, no tf.data service), without the user's own
``steps_per_epoch``, and with ``steps_per_execution`` dividing the epoch's steps. Everything
else, ``validation_data`` included, reaches Keras as given.

A builder dataset of unknown size has no epoch steps to give before training: ``fit`` learns
them in its first epoch, which Keras reads to its end, and reads the later epochs through one
iterator (:mod:`._learned_steps`, where that applies: ``steps_per_execution=1``, dense
elements, no ``drop_remainder``). Where it does not, Keras reads every epoch to its end (a
new iterator each), as before. Keras 3 warns "Your input ran out of data" at every such end
although that end is the epoch's, as Keras documents for data without a step count; the
wrappers filter that one warning out for such calls (:func:`quiet_end_of_data`).

On Keras 3 one more change keeps ``fit`` at one iterator: before training, Keras'
``TensorFlowTrainer._maybe_symbolic_build`` takes one batch from an iterator it throws away
(the model is built from its shapes). For the stream, the model is built from the stream's
element spec (the first replica's, as :mod:`._keras_20585` builds from the first replica's
batch) and no iterator is made.

Recorded as ``"fit-one-iterator"`` in the compat registry: :func:`tfdp_utils.compat.undo` takes
it out (Keras then makes a new iterator each epoch), and ``TFDP_NO_KERAS_PATCHES=1`` keeps it
off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import warnings
from collections.abc import Callable
from typing import Any

from tfdp_utils._dataset_info import DatasetInfo, carry, info_of, position_of_stream, record_of
from tfdp_utils._tf import IS_KERAS3
from tfdp_utils.compat import _learned_steps as learned_steps
from tfdp_utils.compat._registry import (
    REGISTRY,
    RuntimeChange,
    change_of,
    keras3_trainer_class,
    keras3_trainer_module,
    replace_method,
)
from tfdp_utils.compat._switch import disabled

CHANGE = RuntimeChange(
    name="fit-one-iterator",
    kind="process",
    changes="fit() on a builder dataset that ends each epoch, over 2 or more epochs and "
    "without steps_per_epoch, trains on the same data as one stream of whole epochs with "
    "steps_per_epoch set to the epoch's steps (in the fit-binding wrapper); on Keras 3 "
    "TensorFlowTrainer._maybe_symbolic_build builds the model from that stream's element "
    "spec instead of a batch of a throw-away iterator; over a builder dataset of unknown size "
    "fit learns the epoch's steps in its first epoch and reads the later ones as one stream "
    "of epochs padded to those steps through one iterator (Keras 3: the fit's "
    "TFEpochIterator gets its own _enumerate_iterator; tf_keras: DataHandler.enumerate_epochs "
    "of the tf_keras-datasets change); and Keras 3's 'Your input ran out of "
    "data' warning is filtered out during fit/evaluate/predict on a builder dataset of "
    "unknown size without a step count (its epochs end with the data, as documented)",
    why="destroying a tf.distribute iterator can stall 0.3-0.9 s, and Keras destroys one at "
    "every epoch's end; with one iterator for the job every epoch still trains each example "
    "once, with equal steps on every worker, reshuffled with the epoch's own seed, and the "
    "callbacks still receive the dataset passed. validation_data, evaluate and predict are "
    "unchanged. TFDP_NO_KERAS_PATCHES=1 keeps it off (a new iterator every epoch, as Keras "
    "does)",
    undoable=True,
)


def installed() -> bool:
    """Whether ``fit`` swaps builder datasets for their stream of epochs in this process."""
    return REGISTRY.get(CHANGE.name) is not None


def install(*, applied_by: str) -> bool:
    """Turn the swap on once per process (on Keras 3 with its symbolic-build change).

    Args:
        applied_by: what asks for it, e.g. ``"build_distributed_dataset()"``.

    Returns:
        Whether the swap is on; False with ``TFDP_NO_KERAS_PATCHES=1``.
    """
    with REGISTRY.lock:
        if installed():
            return True
        if disabled():
            return False
        patches = []
        trainer = keras3_trainer_module() if IS_KERAS3 else None
        owner = keras3_trainer_class(trainer)
        method = getattr(owner, "_maybe_symbolic_build", None)
        if owner is not None and method is not None and change_of(method) != CHANGE.name:
            replacement = _build_from_spec(method)
            patches.append(
                replace_method(owner, "_maybe_symbolic_build", replacement, change=CHANGE.name)
            )
        REGISTRY.record(CHANGE, applied_by=applied_by, patches=patches)
        return True


def whole_job_steps(
    info: DatasetInfo,
    *,
    steps_per_epoch: Any,
    epochs: int,
    initial_epoch: int,
    steps_per_execution: int | None,
) -> int | None:
    """The ``steps_per_epoch`` to train a builder dataset as one stream, or None to leave
    the call as it is. Pure.

    Args:
        info: the dataset's info.
        steps_per_epoch: the call's own, or None.
        epochs: ``fit``'s ``epochs``.
        initial_epoch: ``fit``'s ``initial_epoch``.
        steps_per_execution: the model's, or None when it is tuned while training
            (``"auto"``).
    """
    steps = info.steps_per_epoch
    if steps_per_epoch is not None or info.repeat or not info.exact or not steps:
        return None
    if epochs - initial_epoch < 2:
        return None  # one epoch: one iterator either way
    if steps_per_execution is None or steps % steps_per_execution:
        return None  # an execution would run across an epoch's end
    return steps


def _steps_per_execution(model: Any) -> int | None:
    """The model's steps per execution (1 before compile); None when tuned (``"auto"``)."""
    if getattr(model, "_autotune_steps_per_execution", False):
        return None
    value: Any = getattr(model, "_steps_per_execution", None)  # tf_keras: a variable
    if value is None or IS_KERAS3:
        value = getattr(model, "steps_per_execution", None) or 1
    try:
        return max(1, int(value.numpy() if hasattr(value, "numpy") else value))
    except (TypeError, ValueError):
        return None


def _as_int(value: Any, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def swap_for_stream(model: Any, arguments: dict[str, Any]) -> bool:
    """Give ``fit`` the stream of whole epochs of its builder dataset, where it applies.

    Changes ``arguments`` (the call's bound arguments): ``x`` becomes the stream and
    ``steps_per_epoch`` the epoch's steps.

    Returns:
        Whether the call was changed.
    """
    from tfdp_utils._tf import tf

    x = arguments.get("x")
    info = info_of(x)
    if not installed() or info is None or isinstance(x, tf.data.Dataset):
        return False
    if position_of_stream(x) is not None or _replaced(x) is not None:
        return False  # already a stream (PreemptionCheckpoint's, or this change's)
    initial_epoch = _as_int(arguments.get("initial_epoch"), 0)
    steps = whole_job_steps(
        info,
        steps_per_epoch=arguments.get("steps_per_epoch"),
        epochs=_as_int(arguments.get("epochs"), 1),
        initial_epoch=initial_epoch,
        steps_per_execution=_steps_per_execution(model),
    )
    record = record_of(x)
    factory = None if record is None else record.resumable
    if record is None or steps is None or not callable(factory) or initial_epoch < 0:
        return False
    resumable = factory()
    if resumable is None or resumable.steps_per_epoch != steps:
        return False
    seed = resumable.recipe.seed
    if seed is None and resumable.shuffles:
        seed = random.randrange(2**31)  # as the dataset, a new order every run
    stream = resumable.epochs_from(initial_epoch, seed)
    own = record_of(stream)
    if own is not None:  # always: the stream is attached as the builder's datasets are
        # Its waits for input count on the dataset the callbacks receive (ThroughputLogger,
        # the stuck-worker diagnosis read that dataset's clock).
        clock = own.input_clock if record.input_clock is None else record.input_clock
        carry(stream, dataclasses.replace(own, input_clock=clock, replaces=x))
    arguments["x"] = stream
    arguments["steps_per_epoch"] = steps
    return True


def learning_steps(model: Any, arguments: dict[str, Any]) -> Any:
    """A context in which a ``fit`` over a builder dataset of unknown size learns its epoch's
    steps in the first epoch and reads the later ones through one iterator
    (:mod:`._learned_steps`), where that applies; a no-op context for every other call."""
    if not installed():
        return contextlib.nullcontext()
    learned = learned_steps.learning_for(
        arguments,
        epochs=_as_int(arguments.get("epochs"), 1),
        initial_epoch=_as_int(arguments.get("initial_epoch"), 0),
        steps_per_execution=_steps_per_execution(model),
    )
    return contextlib.nullcontext() if learned is None else learned_steps.learning_in(learned)


_END_OF_DATA = "Your input ran out of data"  # Keras 3's EpochIterator._interrupted_warning
_DATA_AND_STEPS = {
    "fit": (("x", "steps_per_epoch"), ("validation_data", "validation_steps")),
    "evaluate": (("x", "steps"),),
    "predict": (("x", "steps"),),
}


def ends_by_data(method: str, arguments: dict[str, Any]) -> bool:
    """Whether the call reads a builder dataset of unknown size to its end (no step count).

    Its one-iterator stream needs the epoch's steps, which nobody knows; Keras 3 then ends
    each epoch (or ``evaluate``/``predict``) at the end of the data, as documented, but warns
    "Your input ran out of data" each time as if a count had been missed.
    """
    for data_argument, steps_argument in _DATA_AND_STEPS[method]:
        info = info_of(arguments.get(data_argument))
        if info is None or info.repeat or info.steps_per_epoch is not None:
            continue
        if arguments.get(steps_argument) is None:
            return True
    return False


def quiet_end_of_data(method: str, arguments: dict[str, Any]) -> Any:
    """A context in which Keras 3 does not warn at the end of a builder dataset of unknown
    size (see :func:`ends_by_data`); a no-op context for every other call."""
    if not IS_KERAS3 or not installed() or not ends_by_data(method, arguments):
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.filterwarnings("ignore", message=_END_OF_DATA, category=UserWarning)
    return stack


def _replaced(dataset: Any) -> Any:
    """The dataset a stream made for a ``fit`` stands in for (the one the user passed), or
    None for any other dataset."""
    record = record_of(dataset)
    return None if record is None else record.replaces


def spec_batch(epoch_iterator: Any) -> Any:
    """One replica's element spec of the stream Keras 3's ``epoch_iterator`` reads (this
    change's, or the one ``PreemptionCheckpoint`` resumes from), or None when it reads
    anything else.

    Keras 3 otherwise builds the model from a batch of an iterator made for it and thrown
    away: on a resume, the whole positioned pipeline started and its first batch read twice
    (the build took 0.41-0.51 s instead of 0.10-0.11 s, ``benchmarks/README.md``)."""
    dataset: Any = getattr(epoch_iterator, "_distributed_dataset", None)
    stream = _replaced(dataset) is not None or position_of_stream(dataset) is not None
    if not stream and not learned_steps.is_target(dataset):
        return None
    from tfdp_utils._tf import tf

    def first_replica(spec: Any) -> Any:
        parts = getattr(spec, "_value_specs", None)  # a PerReplicaSpec
        return parts[0] if parts else spec

    return tf.nest.map_structure(first_replica, dataset.element_spec)


def _build_from_spec(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        if iterator is not None and data_batch is None:
            dataset = getattr(iterator, "_distributed_dataset", None)
            learned = learned_steps.claim(dataset)
            if learned is not None:
                learned_steps.drive_keras3(iterator, learned)
            spec = spec_batch(iterator)
            if spec is not None:
                # The shapes of a batch, without an iterator made and thrown away for it.
                return original(self, iterator=None, data_batch=spec)
        return original(self, iterator=iterator, data_batch=data_batch)

    return _maybe_symbolic_build
