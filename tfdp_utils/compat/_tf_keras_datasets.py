"""tf_keras: ``fit`` and ``evaluate`` take a dataset from the builder without ``steps``.

tf_keras refuses every distributed dataset that comes without ``steps_per_epoch`` / ``steps``
("When providing a distributed dataset, you must specify the number of steps to run") and,
given them, keeps one iterator for all epochs: a ``tf.distribute.DistributedDataset`` has no
cardinality to infer an epoch from. A dataset from
:func:`tfdp_utils.build_distributed_dataset` knows its exact steps per epoch
(``dataset.tfdp_info``). For such a dataset, one that does not repeat and whose steps are
known, this teaches tf_keras's ``DatasetAdapter`` what it already does for a
finite ``tf.data.Dataset``: take the epoch's steps from the dataset, and start a fresh pass
each epoch. Keras 3 needs nothing of the kind (it iterates a distributed dataset to its end each
epoch), so this is installed on tf_keras only.

Every other input keeps tf_keras's behaviour, and so does a call that passes ``steps``
different from the dataset's own (then tf_keras's one-iterator rule applies, as documented).
Over several workers (MultiWorkerMirroredStrategy) every worker takes the same steps from
the dataset, which the builder makes equal. Verified on tf_keras 2.21.

Recorded as ``"tf_keras-datasets"`` in the compat registry: :func:`tfdp_utils.compat.undo`
takes it back out, and ``TFDP_NO_KERAS_PATCHES=1`` keeps it off.
"""

from __future__ import annotations

from typing import Any

from tfdp_utils._tf import IS_KERAS3, KERAS_VERSION
from tfdp_utils.compat._registry import REGISTRY, RuntimeChange, replace_method
from tfdp_utils.compat._switch import logger
from tfdp_utils.data._info import info_of

SUMMARY = (
    "tf_keras needs steps_per_epoch for a distributed dataset and keeps one iterator for all epochs"
)

CHANGE = RuntimeChange(
    name="tf_keras-datasets",
    kind="process",
    changes="tf_keras DatasetAdapter._validate_args/get_size/should_recreate_iterator wrapped "
    "(tf_keras only)",
    why=f"{SUMMARY}; for a builder dataset that ends each epoch, fit/evaluate take the "
    "epoch's steps from dataset.tfdp_info and start a fresh pass each epoch, as Keras 3 does. "
    "Every other input keeps tf_keras's behaviour. TFDP_NO_KERAS_PATCHES=1 keeps it off "
    "(then pass steps_per_epoch=)",
    undoable=True,
)


def exact_steps(dataset: Any) -> int | None:
    """Steps in one epoch (on every worker) of a builder dataset that ends each epoch, else None."""
    info = info_of(dataset)
    if info is None or info.repeat or info.steps_per_epoch is None:
        return None
    return int(info.steps_per_epoch)


def installed() -> bool:
    """Whether the tf_keras adapter is patched in this process."""
    return REGISTRY.get(CHANGE.name) is not None


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
        try:
            from tf_keras.src.engine import data_adapter

            adapter = data_adapter.DatasetAdapter
            validate = adapter._validate_args
            get_size = adapter.get_size
            recreate = adapter.should_recreate_iterator
        except (ImportError, AttributeError) as exc:
            logger.warning(
                "tfdp_utils: tf_keras %s has no DatasetAdapter to teach (%s: %s); pass "
                "steps_per_epoch=dataset.tfdp_info.steps_per_epoch to fit",
                KERAS_VERSION,
                type(exc).__name__,
                exc,
            )
            return False

        def _validate_args(
            self: Any, y: Any, sample_weights: Any, steps: Any, *args: Any, **kwargs: Any
        ) -> Any:
            if steps is None:
                steps = exact_steps(self._dataset)
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
            return recreate(self)

        replacements = {
            "_validate_args": _validate_args,
            "get_size": _get_size,
            "should_recreate_iterator": _should_recreate_iterator,
        }
        patches = [
            replace_method(adapter, name, replacement, change=CHANGE.name)
            for name, replacement in replacements.items()
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
