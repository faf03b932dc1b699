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
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from tfdp_utils._tf import IS_KERAS3, KERAS_VERSION
from tfdp_utils.compat._registry import Patch, set_attribute
from tfdp_utils.data._info import info_of

SUMMARY = (
    "tf_keras needs steps_per_epoch for a distributed dataset and keeps one iterator for all epochs"
)

logger = logging.getLogger("tfdp_utils.compat")

_LOCK = threading.Lock()
_PATCHES: list[Patch] = []


def exact_steps(dataset: Any) -> int | None:
    """Steps in one epoch (on every worker) of a builder dataset that ends each epoch, else None."""
    info = info_of(dataset)
    if info is None or info.repeat or info.steps_per_epoch is None:
        return None
    return int(info.steps_per_epoch)


def installed() -> bool:
    """Whether the tf_keras adapter is patched in this process."""
    with _LOCK:
        return bool(_PATCHES)


def install() -> bool:
    """Patch tf_keras's ``DatasetAdapter`` once per process; False where it does not apply.

    Does nothing on Keras 3, or when this tf_keras lacks the adapter methods the patch wraps
    (logged once; fit then needs ``steps_per_epoch`` as tf_keras documents).
    """
    with _LOCK:
        if _PATCHES:
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

        _PATCHES.extend(
            [
                set_attribute(adapter, "_validate_args", _validate_args),
                set_attribute(adapter, "get_size", _get_size),
                set_attribute(adapter, "should_recreate_iterator", _should_recreate_iterator),
            ]
        )
        logger.info(
            "tfdp_utils: tf_keras %s: %s; fit/evaluate now take the steps of datasets from "
            "build_distributed_dataset themselves",
            KERAS_VERSION,
            SUMMARY,
        )
        return True


def uninstall() -> None:
    """Put tf_keras's own adapter methods back (for tests of tf_keras's behaviour)."""
    with _LOCK:
        for patch in reversed(_PATCHES):
            patch.undo()
        _PATCHES.clear()
