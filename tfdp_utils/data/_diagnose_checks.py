"""What :func:`~tfdp_utils.diagnose_input` refuses before it times anything: a model that is
not a compiled Keras model, a dataset that is not one (or gives single examples), and a model
or dataset of another strategy than the model's, each with the fix.

TensorFlow glue; the messages follow the one form of :mod:`tfdp_utils._validate` (received,
expected, fix).
"""

from __future__ import annotations

from typing import Any

from tfdp_utils import _tf
from tfdp_utils._dataset_info import info_of
from tfdp_utils._tf import tf
from tfdp_utils.data._elements import BATCH_CLASSES
from tfdp_utils.errors import StrategyMismatchError


def check_model(model: Any) -> Any:
    """The model's strategy, after checking ``model`` is a compiled Keras model."""
    if not hasattr(model, "fit") or not hasattr(model, "distribute_strategy"):
        raise TypeError(
            f"model must be a compiled Keras model, but received {model!r:.80} of type "
            f"{type(model).__name__}. Pass the model you train, e.g. "
            "tdu.diagnose_input(model, dataset) after model.compile(...)."
        )
    compiled = getattr(model, "compiled", None)  # Keras 3; tf_keras has no such flag
    if not isinstance(compiled, bool):
        compiled = getattr(model, "optimizer", None) is not None
    if not compiled:
        raise ValueError(
            f"model must be compiled, but {type(model).__name__} {getattr(model, 'name', '')!r} "
            "has no optimizer and loss yet: diagnose_input times its train step. Call "
            "model.compile(optimizer=..., loss=...) first (inside the strategy's scope)."
        )
    return model.distribute_strategy


def _variable_strategy(model: Any) -> Any | None:
    """The strategy that made the model's weights (None: plain variables, no strategy)."""
    try:
        weights = model.weights
    except ValueError:  # tf_keras: a model not built yet has no weights to ask for
        return None
    return _tf.variable_strategy(weights[0]) if weights else None


def strategy_name(strategy: Any) -> str:
    """The strategy's class name, in words for TensorFlow's default strategy."""
    name = type(strategy).__name__
    return "no strategy (TensorFlow's default)" if name == "_DefaultDistributionStrategy" else name


def check_strategies(model: Any, strategy: Any, dataset: Any, distributed: bool) -> None:
    """Refuse a model whose weights, or a dataset that was distributed or built, for another
    strategy than ``strategy`` (the model's)."""
    made_by = _variable_strategy(model)
    replicas = int(strategy.num_replicas_in_sync)
    if made_by is None and replicas > 1 and getattr(model, "built", False):
        raise StrategyMismatchError(
            f"the model's weights were made without a strategy, but the model reports "
            f"{strategy_name(strategy)} with {replicas} replicas (called inside its scope?). "
            "Build and compile the model inside `with strategy.scope():` of the strategy "
            "that trains, then call diagnose_input."
        )
    if made_by is not None and made_by is not strategy:
        raise StrategyMismatchError(
            f"the model's weights belong to {strategy_name(made_by)}, but the model reports "
            f"{strategy_name(strategy)}. Call diagnose_input outside other strategies' scopes."
        )
    info = info_of(dataset)
    if distributed:
        owner = _tf.distributed_strategy(dataset)
        if owner is not None and owner is not strategy:
            raise StrategyMismatchError(
                "dataset was distributed by another strategy than the model's: "
                f"{strategy_name(owner)} with {owner.num_replicas_in_sync} replica(s), the "
                f"model's {strategy_name(strategy)} with {replicas}. Build the dataset with "
                "the strategy the model was compiled under "
                "(tdu.build_distributed_dataset(..., strategy=model.distribute_strategy)), or "
                "pass the tf.data.Dataset before distribution."
            )
    if info is not None and distributed and info.num_replicas_in_sync != replicas:
        raise StrategyMismatchError(
            f"dataset was built for {info.num_replicas_in_sync} replicas but the model "
            f"trains on {replicas}. Build it with strategy=model.distribute_strategy."
        )


_BATCH_IT = (
    "Batch it as you do for fit, e.g. dataset.batch(64) (or build it with "
    "tdu.build_distributed_dataset(..., global_batch_size=64))."
)


def check_batched(model: Any, dataset: Any) -> None:
    """Refuse a plain dataset whose elements are single examples."""
    if any(name in BATCH_CLASSES for name, _ in _tf.dataset_chain(dataset)):
        return
    specs = tf.nest.flatten(dataset.element_spec)
    scalar = [spec for spec in specs if getattr(getattr(spec, "shape", None), "rank", 1) == 0]
    if scalar:
        raise ValueError(
            "dataset must give batches, but it has no batch transformation and its elements "
            f"hold scalars ({dataset.element_spec}): it looks unbatched. {_BATCH_IT}"
        )
    try:
        inputs = list(getattr(model, "inputs", None) or [])
    except (AttributeError, ValueError):
        inputs = []
    x_spec = tf.nest.flatten(dataset.element_spec)[0]
    rank = getattr(getattr(x_spec, "shape", None), "rank", None)
    if len(inputs) == 1 and rank is not None and rank == len(inputs[0].shape) - 1:
        raise ValueError(
            f"dataset must give batches, but its x has shape {x_spec.shape}, one dimension "
            f"fewer than the model's input {tuple(inputs[0].shape)} with its batch dimension: "
            f"it looks unbatched. {_BATCH_IT}"
        )


def is_distributed(dataset: Any) -> bool:
    """Whether ``dataset`` is a distributed dataset (not a ``tf.data.Dataset``)."""
    return isinstance(dataset, tf.distribute.DistributedDataset)


def check_dataset(dataset: Any) -> None:
    """Refuse anything but a ``tf.data.Dataset`` or a distributed dataset."""
    if isinstance(dataset, tf.data.Dataset) or is_distributed(dataset):
        return
    raise TypeError(
        "dataset must be a batched tf.data.Dataset or a distributed dataset from "
        f"tdu.build_distributed_dataset, but received {type(dataset).__name__}. For arrays, "
        "pass tf.data.Dataset.from_tensor_slices((x, y)).batch(64)."
    )
