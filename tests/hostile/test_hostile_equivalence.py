"""Hostile-input campaign: ``check_replica_equivalence``'s arguments.

Each row is one case (see ``tests/hostile/test_hostile_inputs.py`` for the vocabulary). Every
argument is checked before a model trains, so most rows end in milliseconds: a strategy of 1
replica (nothing would be compared), a model or a layer instead of a function, data that is
unbatched, unlabelled or does not split over the replicas. The last rows train: a run that
blows up is a divergence that names the step, the tensor and the run, never "the same".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from support.hostile import Accepts, Case, Raises, check_case, parametrize

import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf
from tfdp_utils.errors import ReplicaDivergenceError

pytestmark = pytest.mark.keras

X = np.random.default_rng(4).normal(size=(64, 6)).astype("float32")
Y = np.random.default_rng(4).integers(0, 3, size=64)


def _strategy() -> Any:
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _model() -> Any:
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _batches(batch: int = 16, *, n: int = 64, labels: bool = True) -> Any:
    data = (X[:n], Y[:n]) if labels else X[:n]
    return tf.data.Dataset.from_tensor_slices(data).batch(batch)


def _check(
    model_fn: Callable[[], Any] = lambda: _model,
    dataset: Any = None,
    strategy: Any = "two",
    **kwargs: Any,
) -> Callable[[], Any]:
    """A call of check_replica_equivalence, its arguments built when the case runs
    (``model_fn`` and ``dataset`` make the arguments; ``strategy`` is "two", an object, or a
    function that makes one)."""

    def call() -> Any:
        chosen = (
            _strategy() if strategy == "two" else strategy() if callable(strategy) else strategy
        )
        data = _batches() if dataset is None else dataset()
        return tdu.check_replica_equivalence(model_fn(), data, strategy=chosen, **kwargs)

    return call


def _same_model_twice() -> Callable[[], Any]:
    built = _model()
    return lambda: built


def _inside_scope() -> None:
    strategy = _strategy()
    with strategy.scope():
        tdu.check_replica_equivalence(_model, _batches(), strategy=strategy)


def _distributed_dataset() -> Any:
    return _strategy().experimental_distribute_dataset(_batches())


def _misaligned() -> Any:
    return tf.data.Dataset.zip(
        tf.data.Dataset.from_tensor_slices(X).batch(16),
        tf.data.Dataset.from_tensor_slices(Y).batch(8),
    )


def _exploding_model() -> Any:
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
    return model


def _exploding_data() -> Any:
    targets = 100 * np.random.default_rng(6).normal(size=(64, 3)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((100 * X, targets)).batch(16)


def _data_with_a_nan() -> Any:
    features = X.copy()
    features[3, 2] = np.nan
    return tf.data.Dataset.from_tensor_slices((features, Y)).batch(16)


ALL_CASES: list[Case] = [
    # model_fn: a function that builds and compiles a new model
    (
        "equivalence model_fn=<a built model>",
        _check(model_fn=lambda: _model()),
        Raises(TypeError, r"model_fn must be a function .*received a Keras model \(Sequential\)"),
    ),
    (
        "equivalence model_fn=<a layer>",
        _check(model_fn=lambda: keras.layers.Dense(3)),
        Raises(TypeError, r"received a Keras layer \(Dense\)"),
    ),
    (
        "equivalence model_fn='mlp'",
        _check(model_fn=lambda: "mlp"),
        Raises(TypeError, r"model_fn must be a function .*received 'mlp' of type str"),
    ),
    (
        "equivalence model_fn=None",
        _check(model_fn=lambda: None),
        Raises(TypeError, r"received None of type NoneType"),
    ),
    (
        "equivalence model_fn returns None",
        _check(model_fn=lambda: lambda: None),
        Raises(TypeError, r"must return a compiled Keras model, but its first call returned None"),
    ),
    (
        "equivalence model_fn returns a layer",
        _check(model_fn=lambda: lambda: keras.layers.Dense(3)),
        Raises(TypeError, r"must return a compiled Keras model, .* of type Dense"),
    ),
    (
        "equivalence model_fn returns an uncompiled model",
        _check(
            model_fn=lambda: lambda: keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        ),
        Raises(TypeError, r"call model\.compile\(\.\.\.\) inside model_fn.*Sequential"),
    ),
    (
        "equivalence model_fn=keras.Sequential (the class)",
        _check(model_fn=lambda: keras.Sequential),
        Raises(TypeError, r"call model\.compile\(\.\.\.\) inside model_fn"),
    ),
    (
        "equivalence model_fn returns one model twice",
        _check(model_fn=_same_model_twice),
        Raises(ValueError, r"build a new model on each call.*same Sequential object twice"),
    ),
    # strategy: 2 or more replicas, or nothing is compared
    (
        "equivalence under OneDeviceStrategy",
        _check(strategy=lambda: tf.distribute.OneDeviceStrategy("/cpu:0")),
        Raises(ValueError, r"OneDeviceStrategy with 1 replica: nothing would be compared"),
    ),
    (
        "equivalence under MirroredStrategy of 1 device",
        _check(strategy=lambda: tf.distribute.MirroredStrategy(["/cpu:0"])),
        Raises(ValueError, r"MirroredStrategy with 1 replica.*set_logical_device_configuration"),
    ),
    (
        "equivalence strategy='mirrored'",
        _check(strategy="mirrored"),
        Raises(TypeError, r"strategy must be a tf\.distribute\.Strategy.*'mirrored'"),
    ),
    ("equivalence inside strategy.scope()", _inside_scope, Raises(RuntimeError, "outside")),
    # dataset: global batches, labelled, that split evenly over the replicas
    (
        "equivalence dataset=(x, y) arrays",
        _check(dataset=lambda: (X, Y)),
        Raises(TypeError, r"dataset must be a tf\.data\.Dataset of global batches.*tuple"),
    ),
    (
        "equivalence on a distributed dataset",
        _check(dataset=_distributed_dataset),
        Raises(TypeError, r"distributed dataset cannot be replayed"),
    ),
    (
        "equivalence on an empty dataset",
        _check(dataset=lambda: _batches(n=0)),
        Raises(ValueError, "dataset gave no batch"),
    ),
    (
        "equivalence on unbatched (x, y)",
        _check(dataset=lambda: tf.data.Dataset.from_tensor_slices((X, Y))),
        Raises(ValueError, r"y is a scalar \(shape \(\)\).*looks unbatched"),
    ),
    (
        "equivalence on unbatched x with aligned targets",
        _check(dataset=lambda: tf.data.Dataset.from_tensor_slices((X, np.zeros_like(X)))),
        Raises(ValueError, r"x .* has shape \(6,\), one dimension fewer than the model's input"),
    ),
    (
        "equivalence on x batched by 16 zipped with y by 8",
        _check(dataset=_misaligned),
        Raises(ValueError, r"first dimensions x: 16, y: 8"),
    ),
    (
        "equivalence on batches without labels",
        _check(dataset=lambda: _batches(labels=False)),
        Raises(ValueError, r"batches hold x only \(no labels\)"),
    ),
    (
        "equivalence on a global batch of 15 over 2 replicas",
        _check(dataset=lambda: _batches(15)),
        Raises(ValueError, r"batch 1 has 15 examples, .*multiple of 2 \(e\.g\. 14 or 16\)"),
    ),
    (
        "equivalence on a global batch of 1 over 2 replicas",
        _check(dataset=lambda: _batches(1)),
        Raises(ValueError, r"batch 1 has 1 example, .*multiple of 2 \(e\.g\. 2\)"),
    ),
    (
        "equivalence on a partial last batch that does not split",
        _check(dataset=lambda: _batches(16, n=61)),
        Raises(ValueError, r"batch 4 has 13 examples.*drop_remainder=True, or pass steps=3"),
    ),
    # steps, tolerances, on_divergence
    (
        "equivalence steps=0",
        _check(steps=0),
        Raises(ValueError, r"steps must be a positive integer, but received steps=0"),
    ),
    (
        "equivalence steps=2.0",
        _check(steps=2.0),
        Raises(TypeError, r"steps must be an integer.*Pass steps=2\."),
    ),
    (
        "equivalence rtol=-1e-4",
        _check(rtol=-1e-4),
        Raises(ValueError, r"rtol must be a finite number >= 0"),
    ),
    (
        "equivalence atol=nan",
        _check(atol=float("nan")),
        Raises(ValueError, r"atol must be a finite number >= 0, but received atol=nan"),
    ),
    (
        "equivalence rtol='1e-4'",
        _check(rtol="1e-4"),
        Raises(TypeError, r"rtol must be a number, but received '1e-4'"),
    ),
    (
        "equivalence on_divergence=True",
        _check(on_divergence=True),
        Raises(ValueError, r"on_divergence must be 'raise', 'warn' or 'ignore'"),
    ),
    # training that blows up: a divergence that says where, never "the same"
    (
        "equivalence on training whose loss overflows",
        _check(model_fn=lambda: _exploding_model, dataset=_exploding_data),
        Raises(ReplicaDivergenceError, r"DIVERGED(.|\n)*training blew up"),
    ),
    (
        "equivalence on data holding a NaN",
        _check(dataset=_data_with_a_nan),
        Raises(ReplicaDivergenceError, r"on one device: step 1, .* = nan"),
    ),
]


@parametrize(ALL_CASES)
def test_hostile_input(call: Callable[[], Any], outcome: Raises | Accepts) -> None:
    check_case(call, outcome)
