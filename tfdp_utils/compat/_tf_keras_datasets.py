"""tf_keras: ``fit`` and ``evaluate`` take a dataset from the builder without ``steps``.

tf_keras refuses every distributed dataset that comes without ``steps_per_epoch`` / ``steps``
("When providing a distributed dataset, you must specify the number of steps to run") and,
given them, keeps one iterator for all epochs: a ``tf.distribute.DistributedDataset`` has no
cardinality to infer an epoch from. A dataset from
:func:`tfdp_utils.build_distributed_dataset` that does not repeat ends each epoch, and this
teaches tf_keras's ``DatasetAdapter`` and ``DataHandler`` what they already do for a finite
``tf.data.Dataset``, so that ``fit(dist, epochs=E)`` trains as on Keras 3:

* of known size (``dataset.tfdp_info.steps_per_epoch``): take the epoch's steps from the
  dataset, and start a fresh pass each epoch;
* of unknown size (a generator, a ``filter``, files not counted): start a fresh pass each
  epoch and read it to its end (``OutOfRangeError``), as tf_keras reads a ``tf.data.Dataset``
  of unknown size in its first epoch. tf_keras would keep the first epoch's step count for
  the later ones (cutting a longer epoch short, stopping training at a shorter one); here
  every epoch, and every ``evaluate`` of ``validation_data``, ends with its data (Keras 3
  too keeps its first epoch's count, ``EpochIterator._num_batches``, so a source that grows
  between epochs is exact on tf_keras only). Over several workers TensorFlow's distributed
  iterator ends the epoch on the same step on every worker (the workers that ran out first
  get empty batches). tf_keras can end an epoch only between executions, so
  ``steps_per_execution > 1`` is refused there before the first step, with the fixes
  (tf_keras's own error names none).

Every other input keeps tf_keras's behaviour, and so does a call that passes ``steps``
different from the dataset's own (then tf_keras's one-iterator rule applies, as documented).
Over several workers (MultiWorkerMirroredStrategy) every worker takes the same steps from
the dataset, which the builder makes equal. Keras 3 needs nothing of the kind (it iterates a
distributed dataset to its end each epoch), so this is installed on tf_keras only. Verified on
tf_keras 2.21.

Recorded as ``"tf_keras-datasets"`` in the compat registry: :func:`tfdp_utils.compat.undo`
takes it back out, and ``TFDP_NO_KERAS_PATCHES=1`` keeps it off.
"""

from __future__ import annotations

from typing import Any

from tfdp_utils._dataset_info import info_of
from tfdp_utils._tf import IS_KERAS3, KERAS_VERSION
from tfdp_utils.compat import _learned_steps as learned_steps
from tfdp_utils.compat._registry import REGISTRY, RuntimeChange, replace_method
from tfdp_utils.compat._switch import logger

SUMMARY = (
    "tf_keras needs steps_per_epoch for a distributed dataset and keeps one iterator for all epochs"
)

CHANGE = RuntimeChange(
    name="tf_keras-datasets",
    kind="process",
    changes="tf_keras DatasetAdapter._validate_args/get_size/should_recreate_iterator and "
    "DataHandler.enumerate_epochs/_validate_data_handler wrapped (tf_keras only)",
    why=f"{SUMMARY}; for a builder dataset that ends each epoch, fit/evaluate start a fresh "
    "pass each epoch, as Keras 3 does, and take the epoch's steps from dataset.tfdp_info, or "
    "read an epoch of unknown size to its end (every epoch: tf_keras would keep the first "
    "epoch's count); steps_per_execution > 1 on an epoch of unknown size, which tf_keras can "
    "end only between executions, is refused with the fixes. Every other input keeps "
    "tf_keras's behaviour. TFDP_NO_KERAS_PATCHES=1 keeps it off (then pass steps_per_epoch=)",
    undoable=True,
)


def exact_steps(dataset: Any) -> int | None:
    """Steps in one epoch (on every worker) of a builder dataset that ends each epoch, else None."""
    info = info_of(dataset)
    if info is None or info.repeat or info.steps_per_epoch is None:
        return None
    return int(info.steps_per_epoch)


def ends_by_data(dataset: Any) -> bool:
    """Whether ``dataset`` is a builder dataset that ends each epoch where its data ends, at a
    step nobody knows beforehand (a source of unknown size)."""
    info = info_of(dataset)
    return info is not None and not info.repeat and info.steps_per_epoch is None


def unknown_size_execution_error(steps_per_execution: int) -> ValueError:
    """The error for ``steps_per_execution > 1`` over a builder dataset of unknown size."""
    return ValueError(
        "tf_keras received a dataset from build_distributed_dataset of unknown size (a "
        "generator, a filter, files not counted) and steps_per_execution="
        f"{steps_per_execution}, but tf_keras can end an epoch only between executions, so "
        "the epoch's last execution would train past the end of the data uncounted; an epoch "
        "of unknown size needs steps_per_execution=1 on tf_keras. Compile with "
        "steps_per_execution=1, or give the dataset a known size (files: count_examples=True; "
        "a tf.data.Dataset of N examples: "
        "source.apply(tf.data.experimental.assert_cardinality(N))) and keep "
        f"steps_per_execution={steps_per_execution}."
    )


def installed() -> bool:
    """Whether the tf_keras adapter is patched in this process."""
    return REGISTRY.get(CHANGE.name) is not None


def _tf_keras_classes() -> tuple[Any, Any] | None:
    """tf_keras's ``(DatasetAdapter, DataHandler)`` when they have every method the patch
    wraps, else None (logged)."""
    try:
        from tf_keras.src.engine import data_adapter

        adapter = data_adapter.DatasetAdapter
        for name in ("_validate_args", "get_size", "should_recreate_iterator"):
            getattr(adapter, name)
        handler = data_adapter.DataHandler
        for name in ("enumerate_epochs", "_validate_data_handler"):
            getattr(handler, name)
    except (ImportError, AttributeError) as exc:
        logger.warning(
            "tfdp_utils: tf_keras %s has no DatasetAdapter to teach (%s: %s); pass "
            "steps_per_epoch=dataset.tfdp_info.steps_per_epoch to fit",
            KERAS_VERSION,
            type(exc).__name__,
            exc,
        )
        return None
    return adapter, handler


def _adapter_replacements(adapter: Any) -> dict[str, Any]:
    """``DatasetAdapter`` method name -> its replacement, each a closure over the original."""
    validate = adapter._validate_args
    get_size = adapter.get_size
    recreate = adapter.should_recreate_iterator

    def _validate_args(
        self: Any, y: Any, sample_weights: Any, steps: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if steps is None:
            steps = exact_steps(self._dataset)
        if steps is None and ends_by_data(self._dataset):
            # The checks of y and sample_weight only: the epoch ends with the data.
            steps = -1
        return validate(self, y, sample_weights, steps, *args, **kwargs)

    def _get_size(self: Any) -> Any:
        own = exact_steps(self._dataset)
        if own is not None and self._user_steps is None:
            return own
        return get_size(self)

    def _should_recreate_iterator(self: Any) -> Any:
        own = exact_steps(self._dataset)
        if own is not None and self._user_steps in (None, own):
            return True
        if self._user_steps is None and ends_by_data(self._dataset):
            return True
        return recreate(self)

    return {
        "_validate_args": _validate_args,
        "get_size": _get_size,
        "should_recreate_iterator": _should_recreate_iterator,
    }


def _reads_to_end(data_handler: Any) -> bool:
    """Whether a ``DataHandler`` reads each epoch of a builder dataset to the data's end."""
    own = getattr(data_handler._adapter, "_dataset", None)
    return data_handler._steps_per_epoch is None and ends_by_data(own)


def _handler_replacements(handler: Any) -> dict[str, Any]:
    """``DataHandler`` method name -> its replacement, each a closure over the original."""
    enumerate_epochs = handler.enumerate_epochs
    validate_handler = handler._validate_data_handler

    def _enumerate_epochs(self: Any) -> Any:
        epochs = enumerate_epochs(self)
        learned = None
        if self._epochs - self._initial_epoch >= 2 and _reads_to_end(self):
            learned = learned_steps.claim(getattr(self._adapter, "_dataset", None))
        if learned is not None:
            # One iterator from the second epoch on, with the steps of the first.
            epochs.close()
            yield from learned_steps.drive_tf_keras(self, learned)
            return
        reads_to_end = _reads_to_end(self)
        try:
            for epoch, iterator in epochs:
                if reads_to_end:
                    # tf_keras keeps the step count it learnt at the end of the first
                    # epoch; each epoch of unknown size ends with its own data instead.
                    self._inferred_steps = None
                yield epoch, iterator
        finally:
            epochs.close()

    def _validate_data_handler(self: Any) -> Any:
        spe = int(self._steps_per_execution.numpy().item())
        if spe > 1 and self._inferred_steps is None and _reads_to_end(self):
            raise unknown_size_execution_error(spe)
        return validate_handler(self)

    return {
        "enumerate_epochs": _enumerate_epochs,
        "_validate_data_handler": _validate_data_handler,
    }


def install(*, applied_by: str) -> bool:
    """Patch tf_keras's ``DatasetAdapter`` once per process; False where it does not apply.

    Does nothing on Keras 3, or when this tf_keras lacks the adapter methods the patch wraps
    (logged once; fit then needs ``steps_per_epoch`` as tf_keras documents). The kill switch
    is the caller's to check (:func:`tfdp_utils.compat.apply_for_datasets`).

    Args:
        applied_by: what asks for it, e.g. ``"build_distributed_dataset()"``.
    """
    with REGISTRY.lock:
        if installed():
            return True
        if IS_KERAS3:
            return False
        classes = _tf_keras_classes()
        if classes is None:
            return False
        adapter, handler = classes
        replacements = [
            (owner, name, replacement)
            for owner, table in (
                (adapter, _adapter_replacements(adapter)),
                (handler, _handler_replacements(handler)),
            )
            for name, replacement in table.items()
        ]
        patches = [
            replace_method(owner, name, replacement, change=CHANGE.name)
            for owner, name, replacement in replacements
        ]
        REGISTRY.record(CHANGE, applied_by=applied_by, patches=patches)
        logger.info(
            "tfdp_utils: tf_keras %s: %s; fit/evaluate now take the steps of datasets from "
            "build_distributed_dataset themselves (asked for by %s)",
            KERAS_VERSION,
            SUMMARY,
            applied_by,
        )
        return True
