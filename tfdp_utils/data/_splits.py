"""``validation_split`` for datasets: the source split as Keras splits arrays, then built twice.

Keras' ``fit(validation_split=...)`` takes the last fraction of the *arrays* it is given, before
shuffling, and refuses datasets. :func:`split_for_validation` does the same to a builder source
(arrays, or a ``tf.data.Dataset`` whose size is known) and builds the two parts with the
builder: the training part as asked (shuffled, repeated, ...), the validation part in order, once
per epoch, with the same batch size. Both have exact counts.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import math
from typing import Any

from tfdp_utils import _tf
from tfdp_utils._public import public
from tfdp_utils._tf import tf
from tfdp_utils._validate import positive_float
from tfdp_utils.data import _elements as element_kinds
from tfdp_utils.data._sources import array_length, cardinality, source_kind

logger = logging.getLogger("tfdp_utils")

# Builder arguments that shape the validation dataset too; the others (shuffle_buffer_size,
# seed, repeat, cache, drop_remainder) apply to training only, as in Keras.
_SHARED = (
    "strategy",
    "global_batch_size",
    "per_replica_batch_size",
    "shard_policy",
    "map_fn",
    "prefetch",
    "options",
)
_SHUFFLE_CLASSES = frozenset({"_ShuffleDataset", "ShuffleDataset"})


def split_point(num_examples: int, validation_split: float) -> int:
    """Where Keras splits ``num_examples`` arrays: ``floor(n * (1 - validation_split))``. Pure.

    Raises:
        ValueError: a part would be empty (Keras refuses the same).
    """
    split_at = math.floor(num_examples * (1.0 - validation_split))
    if split_at in (0, num_examples):
        raise ValueError(
            f"the source holds {num_examples} examples, too few to split into training and "
            f"validation parts with validation_split={validation_split}: one part would be "
            "empty. Provide more data, or another validation_split."
        )
    return split_at


def _check_fraction(validation_split: Any) -> float:
    value = positive_float(
        validation_split, "validation_split", hint="Pass a fraction such as 0.2."
    )
    if value >= 1:
        raise ValueError(
            f"validation_split must be a fraction between 0 and 1, but received "
            f"validation_split={validation_split!r}. Pass e.g. validation_split=0.2 (the last "
            "20% of the examples)."
        )
    return value


def _check_not_reshuffled(dataset: Any) -> None:
    for name, _node in _tf.dataset_chain(dataset):
        if name in _SHUFFLE_CLASSES:
            raise ValueError(
                "the source dataset is shuffled before the split, so the last fraction would "
                "hold other examples every epoch and the validation examples would leak into "
                "training. Remove the .shuffle(...) from the source and pass "
                "shuffle_buffer_size= (and seed=) to split_for_validation: the training part "
                "is shuffled after the split, as Keras does."
            )


def _split_source(
    source: Any, validation_split: float, element: str, kwargs: dict[str, Any]
) -> tuple[Any, Any, int, int, str]:
    """``(train_source, validation_source, n_train, n_validation, element for both)``.

    A dataset of batches is split by example; without a batch size in ``kwargs`` its static
    batch size becomes ``kwargs["global_batch_size"]``, as the builder would take it.
    """
    kind = source_kind(source)
    if kind == "arrays":
        total = array_length(source)
        split_at = split_point(total, validation_split)
        train = tf.nest.map_structure(lambda a: a[:split_at], source)
        validation = tf.nest.map_structure(lambda a: a[split_at:], source)
        return train, validation, split_at, total - split_at, element
    if kind != "dataset":
        what = "files" if kind == "files" else "a fn(input_context) source"
        raise TypeError(
            f"split_for_validation needs a source whose examples it can count and cut, but "
            f"received {what}. Pass arrays or a tf.data.Dataset of known size, or build the "
            "validation data yourself (e.g. separate validation files) and pass it as "
            "validation_data=."
        )
    elements = element_kinds.classify(source, element, what="source", source_kind="dataset")
    examples = element_kinds.examples_of(source, elements)
    kwargs["global_batch_size"] = element_kinds.batch_size_of_batches(
        elements, kwargs.get("global_batch_size"), kwargs.get("per_replica_batch_size")
    )
    _check_not_reshuffled(examples)
    known = cardinality(examples)
    if known is None or known < 0:
        raise ValueError(
            f"split_for_validation needs the number of examples, but the source dataset's "
            f"size is {'infinite' if known == -1 else 'unknown'} to tf.data (a filter, a "
            "generator, batches of unknown size). Pass arrays, add "
            ".apply(tf.data.experimental.assert_cardinality(n)) to the source, or split it "
            "yourself with .take(n_train) and .skip(n_train)."
        )
    total = known
    split_at = split_point(total, validation_split)
    # The parts are examples now; a window with a leading dimension stays one example.
    return examples.take(split_at), examples.skip(split_at), split_at, total - split_at, "example"


# Keras' names for what the builder calls otherwise, and fit()'s own arguments.
_KERAS_NAMES = {
    "batch_size": "the builder calls it global_batch_size=",
    "shuffle": "the builder shuffles with shuffle_buffer_size=",
    "validation_data": "that is fit()'s argument: split_for_validation returns it",
    "epochs": "that is fit()'s argument",
    "steps_per_epoch": "that is fit()'s argument",
}


def check_builder_arguments(kwargs: dict[str, Any], builder: Any) -> None:
    """Refuse keyword arguments the builder does not take, before anything is split.

    Raises:
        TypeError: a name that is not an argument of ``build_distributed_dataset``, with the
            builder's name for it (``batch_size`` -> ``global_batch_size``) where one exists.
    """
    accepted = set(inspect.signature(builder).parameters) - {"source", "element"}
    for name in kwargs:
        if name in accepted:
            continue
        if name in ("source", "element"):
            hint = f"pass {name} once, as split_for_validation's own argument"
        elif name in _KERAS_NAMES:
            hint = _KERAS_NAMES[name]
        else:
            close = difflib.get_close_matches(name, sorted(accepted), n=1)
            hint = f"did you mean {close[0]}=?" if close else "see build_distributed_dataset"
        raise TypeError(
            f"split_for_validation() received {name}=, which is not an argument of "
            f"build_distributed_dataset ({hint}). It takes validation_split=, element= and the "
            f"builder's arguments: {', '.join(sorted(accepted))}."
        )


@public("tfdp_utils")
def split_for_validation(
    source: Any, *, validation_split: float, element: str = "auto", **kwargs: Any
) -> tuple[Any, Any]:
    """Training and validation datasets from one source, split as Keras splits arrays.

    ``model.fit(x, y, validation_split=0.2)`` takes the last 20% of the arrays, before
    shuffling, as validation data, but refuses a dataset. This takes the same last fraction
    (``floor(n * (1 - validation_split))`` examples train) of arrays or of a
    ``tf.data.Dataset`` whose size tf.data knows, and builds both parts with
    :func:`~tfdp_utils.build_distributed_dataset`: the training part with every argument
    given, the validation part in order, once per epoch, with the same strategy, batch size,
    ``shard_policy``, ``map_fn``, ``prefetch`` and ``options``. Both count exactly: every
    example is in exactly one part and seen once per epoch.

    Args:
        source: numpy arrays (or a tuple/dict of them), or a ``tf.data.Dataset`` of known
            cardinality that is not shuffled before the split (pass ``shuffle_buffer_size=``
            here instead).
        validation_split: the fraction (between 0 and 1) of the examples, taken from the end,
            to validate on.
        element: as for the builder (examples or batches, for a dataset). Defaults to `"auto"`.
        **kwargs: arguments of :func:`~tfdp_utils.build_distributed_dataset` for the training
            part (``strategy``, ``global_batch_size``, ``shuffle_buffer_size``, ...).

    Returns:
        ``(train, validation)``: two builder datasets, for
        ``model.fit(train, validation_data=validation)``.

    Raises:
        ValueError: ``validation_split`` outside (0, 1), a part that would be empty, a dataset
            of unknown size or shuffled before the split.
        TypeError: files or a ``fn(input_context)`` source (their examples are not counted
            here), or an unsupported source.

    Examples:
        >>> import numpy as np
        >>> import tfdp_utils as tdu
        >>> train, val = tdu.split_for_validation(
        ...     np.arange(10), validation_split=0.2, global_batch_size=4
        ... )
        >>> train.tfdp_info.examples_per_epoch, val.tfdp_info.examples_per_epoch
        (8, 2)
    """
    from tfdp_utils.data._builder import build_distributed_dataset

    check_builder_arguments(kwargs, build_distributed_dataset)
    fraction = _check_fraction(validation_split)
    element = element_kinds.check_element(element)
    train_source, validation_source, n_train, n_validation, element = _split_source(
        source, fraction, element, kwargs
    )
    logger.info(
        "tfdp_utils: validation_split=%s: the first %d examples train, the last %d validate.",
        validation_split,
        n_train,
        n_validation,
    )
    train = build_distributed_dataset(train_source, element=element, **kwargs)
    shared = {name: kwargs[name] for name in _SHARED if name in kwargs}
    validation = build_distributed_dataset(validation_source, element=element, **shared)
    return train, validation
