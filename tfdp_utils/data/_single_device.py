"""The same data on one device: a builder dataset rebuilt as a plain ``tf.data.Dataset``.

A dataset from :func:`~tfdp_utils.build_distributed_dataset` yields one part of each step per
replica of the strategy it was built with, so only a model of that strategy (or one with as
many replicas) can take it; a model loaded or built outside the strategy's scope fails inside
Keras (``Only input tensors may be passed as positional arguments ... PerReplica``). The builder
keeps its call on the dataset (``tfdp.rebuild_on_one_device``, the call made for one device by
:func:`on_one_device`), and :func:`single_device_dataset` builds it again for one device: the
same source, ``map_fn``, shuffle and repeat, every example of every worker, in batches of the
same global size, as one ``tf.data.Dataset`` any model takes.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from tfdp_utils._dataset_info import DatasetInfo, record_of
from tfdp_utils._public import public

if TYPE_CHECKING:
    from tfdp_utils.data._arguments import BuilderCall


class _OneDevice:
    """What the builder asks of a strategy, for one replica on one worker, without one.

    TensorFlow's default strategy does the same, but inside another strategy's scope it is
    not the one in force; this stand-in returns the per-worker dataset itself.
    """

    num_replicas_in_sync = 1
    extended = None

    def distribute_datasets_from_function(self, dataset_fn: Any, options: Any = None) -> Any:
        from tfdp_utils._tf import tf

        return dataset_fn(tf.distribute.InputContext())

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        return dataset


ONE_DEVICE = _OneDevice()


def on_one_device(call: BuilderCall, info: DatasetInfo, *, self_batching: bool) -> BuilderCall:
    """``call`` for one device, to build its data again (:func:`single_device_dataset`): the
    strategy a stand-in for one replica, steps of the global batch size ``info`` holds.

    ``self_batching``: a source function that batches itself decides its batch size on one
    device too (from ``input_context``), so it is rebuilt with the sizes it was given.
    """
    if self_batching:
        return dataclasses.replace(call, strategy=ONE_DEVICE)
    return dataclasses.replace(
        call,
        strategy=ONE_DEVICE,
        global_batch_size=info.global_batch_size,
        per_replica_batch_size=None,
    )


@public("tfdp_utils")
def single_device_dataset(dataset: Any) -> Any:
    """The data of a builder dataset for one device: a plain, globally batched ``tf.data.Dataset``.

    Use it where a model without the dataset's strategy takes the data: a model saved after
    distributed training and evaluated by ``keras.models.load_model(path).evaluate(...)``
    outside the strategy's scope, a single-device baseline, plotting. It is built from the
    same arguments: the same source, ``map_fn``, ``element``, shuffle (same seed), ``repeat``
    and ``drop_remainder``, in steps of the same global batch size (a source function that
    batches itself is called with a one-replica ``input_context``). It holds every example
    of the source, on every worker (nothing is sharded), and carries ``tfdp_info`` for
    1 replica.

    Args:
        dataset: a dataset returned by :func:`~tfdp_utils.build_distributed_dataset` (or by
            :func:`~tfdp_utils.split_for_validation`).

    Returns:
        A ``tf.data.Dataset`` of global batches.

    Raises:
        TypeError: ``dataset`` does not come from the builder.

    Examples:
        >>> import numpy as np
        >>> import tfdp_utils as tdu
        >>> dist = tdu.build_distributed_dataset(np.arange(10), global_batch_size=4)
        >>> [int(b.shape[0]) for b in tdu.single_device_dataset(dist)]
        [4, 4, 2]
    """
    record = record_of(dataset)
    rebuild = None if record is None else record.rebuild_on_one_device
    if rebuild is None:
        raise TypeError(
            f"single_device_dataset() takes a dataset from build_distributed_dataset, but "
            f"received {type(dataset).__name__}. A tf.data.Dataset you built yourself already "
            "works on one device: pass it to the model directly."
        )
    return rebuild()
