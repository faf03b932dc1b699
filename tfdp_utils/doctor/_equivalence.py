"""``check_replica_equivalence``: does the user's model train the same on N replicas as on one?

Distributed training that goes wrong rarely crashes: it trains *differently*. This builds the
user's model twice from ``model_fn`` (on one device, and under the strategy), gives both the
same initial weights, trains both through ``fit`` (so the user's own ``train_step``, loss and
metrics run) on the same global batches, and compares the logged loss and metrics and every
weight after every step (every execution under ``steps_per_execution``).

The arguments are checked before any model is built or trained: a strategy of 1 replica (which
would compare one device with itself), a built model instead of a function, unbatched or
unlabelled data and a global batch that does not split evenly over the replicas are refused
with a message that says how to fix them.

Two values agree when both are finite and within ``OVERFLOW_BOUND`` and
``|a - b| <= atol + rtol * min(|a|, |b|)``: the rule is symmetric, and neither run's size widens
the tolerance. A NaN, an inf or a value beyond ``OVERFLOW_BOUND`` in either run is a divergence
whatever the other run holds; the report names the first step, the tensor and the run.

A model that draws random numbers in training (Dropout, noise layers) cannot follow the same
trajectory on one device and on N replicas; for such a model the trajectory is reported but
not judged, and a probe checks instead that the replicas do not all draw the *same* random
numbers (a layer with a fixed op seed does: every replica gets the first replica's noise).

The comparison is pure NumPy (:mod:`tfdp_utils.doctor._comparison`); only
:func:`check_replica_equivalence` touches TensorFlow.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

import numpy as np

from tfdp_utils._public import public
from tfdp_utils._validate import positive_float, positive_int
from tfdp_utils.doctor._comparison import (
    EquivalenceReport,
    StepRecord,
    compare_records,
)
from tfdp_utils.errors import ReplicaDivergenceError, ReplicaDivergenceWarning

OnDivergence = Literal["raise", "warn", "ignore"]

# ------------------------------------------------------------------- the arguments, first

_MODEL_FN_EXAMPLE = (
    "def model_fn(): model = keras.Sequential([...]); model.compile(...); return model"
)


def _check_model_fn(model_fn: Any) -> None:
    instance = not isinstance(model_fn, type)  # a model class is a function that builds one
    if instance and hasattr(model_fn, "get_weights") and hasattr(model_fn, "trainable_weights"):
        kind = "model" if hasattr(model_fn, "fit") else "layer"
        raise TypeError(
            "model_fn must be a function that builds and compiles a new model, but received "
            f"a Keras {kind} ({type(model_fn).__name__}). The model is built twice, once "
            "inside each run's strategy scope, so pass the code that builds it, not a built "
            f"model: {_MODEL_FN_EXAMPLE}."
        )
    if not callable(model_fn):
        raise TypeError(
            "model_fn must be a function that builds and compiles a new model, but received "
            f"{model_fn!r} of type {type(model_fn).__name__}. Pass e.g. {_MODEL_FN_EXAMPLE}."
        )


def _check_replicas(strategy: Any, *, chosen: bool) -> None:
    replicas = int(strategy.num_replicas_in_sync)
    if replicas >= 2:
        return
    source = "strategy=None chose" if chosen else "received"
    raise ValueError(
        "check_replica_equivalence needs a strategy with 2 or more replicas, but "
        f"{source} {type(strategy).__name__} with {replicas} replica: nothing would be "
        "compared (one device against one device), so it gives no verdict. Give TensorFlow 2 "
        "devices: without 2 GPUs, split the CPU into 2 logical devices before TensorFlow "
        "initialises, first thing in the program (tf.config.set_logical_device_configuration("
        "tf.config.list_physical_devices('CPU')[0], [tf.config.LogicalDeviceConfiguration()] "
        "* 2), then strategy = tdu.auto_strategy()), or run `tfdp-utils doctor`, whose "
        "self-tests train 2 logical CPUs against one device."
    )


def _components(batch: Any) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` for every tensor of a batch: ``x``, ``y[0]``, ``sample_weight``."""
    from tfdp_utils._tf import tf

    parts = batch if isinstance(batch, tuple) else (batch,)
    for index, part in enumerate(parts):
        label = ("x", "y", "sample_weight")[index] if index < 3 else f"element[{index}]"
        flat = tf.nest.flatten(part)
        for position, tensor in enumerate(flat):
            yield (label if len(flat) == 1 else f"{label}[{position}]"), tensor


_BATCH_IT = (
    "Batch it before passing it: e.g. tf.data.Dataset.from_tensor_slices((x, y)).batch(64), "
    "the global batches fit would train on."
)


def _check_batched(batches: list[Any]) -> list[int]:
    """Every tensor of every batch has a first (batch) dimension, the same across tensors.

    Returns:
        Each batch's number of examples.
    """
    found: list[int] = []
    for number, batch in enumerate(batches, 1):
        sizes: dict[str, int] = {}
        for name, tensor in _components(batch):
            shape = tuple(tensor.shape)
            if not shape:
                raise ValueError(
                    "dataset must give batches of examples, but in its batch "
                    f"{number} {name} is a scalar (shape ()), with no batch dimension: the "
                    f"dataset looks unbatched. {_BATCH_IT}"
                )
            sizes[name] = int(shape[0])
        if len(set(sizes.values())) > 1:
            shown = ", ".join(f"{name}: {size}" for name, size in sizes.items())
            raise ValueError(
                "dataset must give batches whose tensors all have the number of examples as "
                f"their first dimension, but its batch {number} has first dimensions {shown}: "
                "the dataset looks unbatched (each element one example), or its tensors are "
                f"not aligned. {_BATCH_IT}"
            )
        found.extend(set(sizes.values()))
    return found


def _check_split(sizes: list[int], strategy: Any) -> None:
    """Every batch (of ``sizes`` examples) splits evenly over the replicas."""
    replicas = int(strategy.num_replicas_in_sync)
    for number, size in enumerate(sizes, 1):
        if size % replicas == 0:
            continue
        lower = size // replicas * replicas
        upper = lower + replicas
        multiples = f"{lower} or {upper}" if lower else f"{upper}"
        fix = f"Use a global batch that is a multiple of {replicas} (e.g. {multiples})."
        if number > 1 and number == len(sizes) and size < sizes[0]:
            fix = (
                "It is a partial last batch: batch with drop_remainder=True, or pass "
                f"steps={number - 1}."
            )
        elif number > 1:
            fix = f"Give every batch a multiple of {replicas} examples."
        raise ValueError(
            f"dataset's batch {number} has {size} example{'' if size == 1 else 's'}, which "
            "does not split evenly over "
            f"the {replicas} replicas of {type(strategy).__name__}: the replicas would train "
            "on different numbers of examples (tf_keras then weights them unequally, Keras 3 "
            f"fails), so the runs could not be compared. {fix}"
        )


def _check_model(model: Any, call: str) -> None:
    if not hasattr(model, "fit"):
        raise TypeError(
            f"model_fn must return a compiled Keras model, but its {call} call returned "
            f"{model!r:.80} of type {type(model).__name__}. End model_fn with `return model`: "
            f"{_MODEL_FN_EXAMPLE}."
        )
    compiled = getattr(model, "compiled", None)  # Keras 3; tf_keras has no such flag
    if not isinstance(compiled, bool):
        compiled = getattr(model, "optimizer", None) is not None
    if not compiled:
        raise TypeError(
            "model_fn must return a compiled Keras model (call model.compile(...) inside "
            f"model_fn), but it returned {type(model).__name__} without an optimizer."
        )


def _check_labels(model: Any, batch: Any) -> None:
    """Refuse batches without labels for a model whose compiled loss needs them."""
    from tfdp_utils._tf import keras

    if isinstance(batch, tuple) and len(batch) >= 2:
        return
    own = [  # a train_step or compute_loss of the user's may do without labels
        getattr(type(model), name, None) is not getattr(keras.Model, name, None)
        for name in ("train_step", "compute_loss")
    ]
    loss = getattr(model, "loss", None)
    if not any(own) and loss:
        raise ValueError(
            "dataset must give (x, y) batches for a model compiled with a loss, but its "
            "batches hold x only (no labels), and the loss "
            f"{getattr(loss, 'name', loss)!r} compares predictions with labels. Give the "
            "labels: e.g. tf.data.Dataset.from_tensor_slices((x, y)).batch(64); a model that "
            "needs no labels overrides train_step (or compute_loss) or adds its loss with add_loss."
        )


def _check_rank(model: Any, batch: Any) -> None:
    """Refuse x one dimension short of the model's declared input (an unbatched dataset)."""
    x = batch[0] if isinstance(batch, tuple) else batch
    try:
        inputs = list(getattr(model, "inputs", None) or [])
    except (AttributeError, ValueError):
        return
    if len(inputs) != 1 or not hasattr(x, "shape") or not hasattr(inputs[0], "shape"):
        return
    expected = tuple(inputs[0].shape)
    if len(tuple(x.shape)) == len(expected) - 1:
        raise ValueError(
            "dataset must give batches of examples, but x in its batch 1 has shape "
            f"{tuple(x.shape)}, one dimension fewer than the model's input {expected} with "
            f"its batch dimension: the dataset looks unbatched. {_BATCH_IT}"
        )


# ------------------------------------------------------------------------ TensorFlow part


def _batches(dataset: Any, steps: int) -> list[Any]:
    """The first ``steps`` global batches of ``dataset``, materialised so both runs see them."""
    from tfdp_utils._tf import tf

    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"dataset must be a tf.data.Dataset of global batches, such as "
            f"tf.data.Dataset.from_tensor_slices((x, y)).batch(64), but received "
            f"{type(dataset).__name__}. A distributed dataset cannot be replayed on one "
            "device: pass the dataset before distribution."
        )
    batches = list(dataset.take(steps))
    if not batches:
        raise ValueError("dataset gave no batch; pass a dataset with at least one batch.")
    return batches


def _replay(batches: list[Any]) -> Any:
    from tfdp_utils._tf import tf

    replay = tf.data.Dataset.from_tensors(batches[0])
    for batch in batches[1:]:
        replay = replay.concatenate(tf.data.Dataset.from_tensors(batch))
    return replay


def _compared(model: Any) -> list[int]:
    """Indices in ``model.weights`` of the model's own weights: not metric state (tf_keras
    lists a subclassed model's metric variables among its weights)."""
    metric_variables = {id(v) for m in getattr(model, "metrics", []) for v in m.variables}
    return [i for i, v in enumerate(model.weights) if id(v) not in metric_variables]


def _weight_names(model: Any) -> list[str]:
    names: list[str] = []
    for index in _compared(model):
        variable = model.weights[index]
        name = str(getattr(variable, "path", None) or variable.name)
        names.append(name if name not in names else f"{name}#{index}")
    return names


def _weight_values(model: Any) -> list[np.ndarray]:
    values = model.get_weights()
    return [values[i] for i in _compared(model)]


def _recorder(records: list[StepRecord], names: list[str], last_step: int) -> Any:
    from tfdp_utils._tf import keras

    class _Recorder(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
            values = {k: float(np.asarray(v)) for k, v in (logs or {}).items()}
            weights = dict(zip(names, _weight_values(self.model), strict=True))
            # Keras numbers a short last execution as if it were whole: cap at the steps run.
            step = min(int(batch) + 1, last_step)
            records.append(StepRecord(step=step, logs=values, weights=weights))

    return _Recorder()


def _make(model_fn: Callable[[], Any], strategy: Any, call: str) -> Any:
    with strategy.scope():
        model = model_fn()
    _check_model(model, call)
    return model


def _ensure_built(model: Any, strategy: Any, first_x: Any) -> None:
    if not model.built:
        with strategy.scope():
            model(first_x)


def _train(model: Any, batches: list[Any], names: list[str]) -> list[StepRecord]:
    records: list[StepRecord] = []
    callbacks = [_recorder(records, names, len(batches))]
    model.fit(_replay(batches), epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    return records


def _random_draws(model: Any, strategy: Any, x: Any) -> tuple[bool, bool]:
    """(random in training, every replica drew the same numbers) for ``model`` on ``x``.

    Every replica gets the same input; a model that is random in training must then give
    different outputs on different replicas.
    """
    from tfdp_utils._tf import tf

    @tf.function  # type: ignore[untyped-decorator]
    def forward(inputs: Any) -> Any:
        return strategy.run(lambda t: model(t, training=True), args=(inputs,))

    def flat(outputs: Any) -> list[np.ndarray]:
        per_replica = strategy.experimental_local_results(outputs)
        return [np.concatenate([np.ravel(t) for t in tf.nest.flatten(r)]) for r in per_replica]

    first, second = flat(forward(x)), flat(forward(x))
    random = not np.array_equal(first[0], second[0])
    same = len(first) > 1 and all(np.array_equal(first[0], other) for other in first[1:])
    return random, random and same


def _reference_strategy(strategy: Any) -> Any:
    from tfdp_utils._tf import tf

    try:
        device = str(strategy.extended.worker_devices[0])
    except (AttributeError, IndexError, RuntimeError, NotImplementedError):
        device = "/cpu:0"
    if "TPU" in device.upper():
        device = "/cpu:0"  # one TPU core is not a plain device; the CPU is the reference
    return tf.distribute.OneDeviceStrategy(device)


def _resolve_strategy(strategy: Any) -> Any:
    from tfdp_utils import _validate
    from tfdp_utils._tf import tf

    if tf.distribute.has_strategy():
        raise RuntimeError(
            "check_replica_equivalence builds its own models under a one-device strategy and "
            "under the strategy to check; call it outside strategy.scope() and pass "
            "strategy=strategy."
        )
    if strategy is not None:
        return _validate.strategy(strategy)
    from tfdp_utils.strategy._choice import auto_strategy

    return auto_strategy(verbose=False)


@public("tfdp_utils")
def check_replica_equivalence(
    model_fn: Callable[[], Any],
    dataset: Any,
    *,
    strategy: Any = None,
    steps: int = 5,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    on_divergence: OnDivergence = "raise",
) -> EquivalenceReport:
    """Check that ``model_fn``'s model trains the same under ``strategy`` as on one device.

    Builds the model twice (under a one-device strategy on the strategy's first device, and
    under ``strategy``), copies the first model's initial weights into the second, trains both
    with ``fit`` on the same first ``steps`` global batches of ``dataset`` and compares the
    logged loss and metrics and every weight after each step (each execution when the model
    was compiled with ``steps_per_execution``). Catches a ``train_step`` that averages the loss
    over the per-replica batch, metrics aggregated wrongly across replicas, NaNs that appear
    only under the strategy, and layers that draw the same random numbers on every replica.

    Two values agree when both are finite and within ``OVERFLOW_BOUND`` (about 1.8e19) and
    ``|a - b| <= atol + rtol * min(|a|, |b|)``. A NaN, inf or overflowing value in either run
    is a divergence, whatever the other run holds.

    The arguments are checked before any training: the strategy must have 2 or more replicas
    (with 1 nothing would be compared), ``model_fn`` must be a function (not a built model),
    and the batches must be batched, labelled when the model's compiled loss needs labels, and
    split evenly over the replicas.

    Use the optimizer you train with, and keep ``steps`` small: every weight is kept for every
    step. Adam-like optimizers hide a gradient scaled by a constant (the update is scale-free),
    so that bug shows only in the logged loss or with SGD.

    Args:
        model_fn: builds and compiles a fresh model; called once per run, inside the run's
            strategy scope.
        dataset: a ``tf.data.Dataset`` of global batches, as ``fit`` takes them.
        strategy: the strategy to check, with 2 or more replicas. Defaults to `None`
            (``tdu.auto_strategy()``).
        steps: global batches to train on. Defaults to `5`.
        rtol: relative tolerance. Defaults to `1e-4`.
        atol: absolute tolerance. Defaults to `1e-5`.
        on_divergence: ``"raise"`` a :class:`ReplicaDivergenceError`, ``"warn"`` with a
            :class:`ReplicaDivergenceWarning`, or ``"ignore"``. Defaults to `"raise"`.

    Returns:
        An :class:`EquivalenceReport`; ``report.ok`` says whether the runs agreed.

    Raises:
        ReplicaDivergenceError: the runs diverged and ``on_divergence="raise"``.
        TypeError: ``model_fn`` is not a function (e.g. a built model) or does not return a
            compiled model, or ``dataset`` is not a ``tf.data.Dataset``.
        ValueError: the strategy has 1 replica; the dataset is unbatched, has no labels for
            a compiled loss, or has a batch that does not split evenly over the replicas.
        RuntimeError: called inside a strategy scope.

    Examples:
    ```python
    def model_fn():
        model = tdu.demo.build_model("mlp")
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        return model

    report = tdu.check_replica_equivalence(model_fn, dataset, strategy=strategy)
    print(report.summary())
    ```
    """
    _check_model_fn(model_fn)
    steps = positive_int(steps, "steps", hint="Pass the number of global batches, e.g. 5.")
    rtol = positive_float(rtol, "rtol", allow_zero=True)
    atol = positive_float(atol, "atol", allow_zero=True)
    if on_divergence not in ("raise", "warn", "ignore"):
        raise ValueError(
            f"on_divergence must be 'raise', 'warn' or 'ignore', but received {on_divergence!r}."
        )
    chosen = strategy is None
    strategy = _resolve_strategy(strategy)
    _check_replicas(strategy, chosen=chosen)
    batches = _batches(dataset, steps)
    sizes = _check_batched(batches)
    first_x = batches[0][0] if isinstance(batches[0], tuple) else batches[0]
    one_device = _reference_strategy(strategy)
    reference = _make(model_fn, one_device, "first")
    _check_rank(reference, batches[0])
    _check_labels(reference, batches[0])
    _check_split(sizes, strategy)
    _ensure_built(reference, one_device, first_x)
    distributed = _make(model_fn, strategy, "second")
    if distributed is reference:
        raise ValueError(
            "model_fn must build a new model on each call, but it returned the same "
            f"{type(reference).__name__} object twice: the two runs would share one model. "
            f"Build the model inside model_fn: {_MODEL_FN_EXAMPLE}."
        )
    _ensure_built(distributed, strategy, first_x)
    names = _weight_names(reference)  # the two builds' auto-names differ (dense, dense_1)
    if len(_compared(distributed)) != len(names):
        raise ValueError(
            f"model_fn built a model with {len(names)} weights on one device and "
            f"{len(_compared(distributed))} under the strategy; it must build the same model."
        )
    distributed.set_weights(reference.get_weights())
    reference_records = _train(reference, batches, names)
    distributed_records = _train(distributed, batches, names)
    random, shared = _random_draws(distributed, strategy, first_x)
    report = EquivalenceReport(
        strategy=type(strategy).__name__,
        num_replicas=int(strategy.num_replicas_in_sync),
        steps=len(batches),
        random_in_training=random,
        replicas_share_random_numbers=shared,
        trajectory_compared=not random,
        rtol=rtol,
        atol=atol,
        **compare_records(reference_records, distributed_records, rtol=rtol, atol=atol),
    )
    if not report.ok and on_divergence == "raise":
        raise ReplicaDivergenceError(report)
    if not report.ok and on_divergence == "warn":
        warnings.warn(report.summary(), ReplicaDivergenceWarning, stacklevel=2)
    return report
