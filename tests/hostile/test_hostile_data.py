"""Hostile-input campaign: the builder's newer arguments, accumulation, mixed precision, splits.

Each row is one case: what is called, and either the clear error it must raise (its type and a
fragment of the message that names what was received or expected) or a documented acceptance.
The first rows are issue 21's "accepted against the docs" cases (``repeat="epochs"`` quietly
becoming ``True``, ``repeat=1`` meaning forever, a ``mixed_float16`` layer trained without loss
scaling, ``worker_backup_dir(strategy="mirrored")``, a string taken for a model); the rest
extend the campaign over ``element=``, ``service=``, ``service_mode=``, ``cache=``,
``reader=``, ``map_fn=``, ``repeat=``, gradient accumulation, mixed precision and
``split_for_validation``. docs/errors.md counts every table of ``tests/hostile/``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.hostile import Accepts, Case, Raises, check_case, parametrize

import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf

X = np.arange(20, dtype="float32").reshape(10, 2)
Y = np.arange(10)
SERVICE = "grpc://127.0.0.1:5050"  # never contacted: every case here fails before that


def _strategy() -> Any:
    return tdu.auto_strategy(devices=["/cpu:0", "/cpu:1"])


def _build(source: Any = None, **kwargs: Any) -> Any:
    kwargs.setdefault("global_batch_size", 4)
    return tdu.build_distributed_dataset(
        np.arange(10) if source is None else source, strategy=_strategy(), **kwargs
    )


def _generator() -> Any:
    def gen() -> Any:
        yield from range(10)

    return tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec((), tf.int64))


def _text_file() -> str:
    path = Path(__file__).parent / "test_hostile_data.py"  # any file: only its size is read
    return str(path)


def _batching_fn(*, known: bool = True) -> Callable[[Any], Any]:
    def dataset_fn(context: Any) -> Any:
        dataset = tf.data.Dataset.range(10)
        if not known:
            dataset = dataset.filter(lambda i: i >= 0)
        return dataset.batch(context.get_per_replica_batch_size(4))

    return dataset_fn


def _step(model: Any, optimizer: Any, **kwargs: Any) -> Any:
    return tdu.make_distributed_train_step(
        model,
        loss=keras.losses.MeanSquaredError(reduction="none"),
        optimizer=optimizer,
        strategy=kwargs.pop("strategy"),
        **kwargs,
    )


def _with_layers(layers: Callable[[], list[Any]], *, scaled: bool = False, **kwargs: Any) -> Any:
    """A step over a float32 model holding ``layers()``, with a plain or loss-scaling optimizer."""
    strategy = _strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), *layers(), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.1)
        if scaled:
            optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    return _step(model, optimizer, strategy=strategy, **kwargs)


def _nested_float16() -> list[Any]:
    return [keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, dtype="mixed_float16")])]


def _dense(dtype: str) -> Callable[[], list[Any]]:
    return lambda: [keras.layers.Dense(3, dtype=dtype)]


def _model() -> Any:
    strategy = _strategy()
    with strategy.scope():
        return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])


def _plain_step(**kwargs: Any) -> Any:
    strategy = _strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        optimizer = kwargs.pop("optimizer", None) or keras.optimizers.SGD(0.1)
    return _step(model, optimizer, strategy=strategy, **kwargs)


def _split(source: Any = X, **kwargs: Any) -> Any:
    kwargs.setdefault("validation_split", 0.2)
    kwargs.setdefault("global_batch_size", 4)
    return tdu.split_for_validation(source, strategy=_strategy(), **kwargs)


NOT_A_COUNT = r"is not supported; expected False, True .* repeat takes no count"

REGRESSIONS: list[Case] = [
    # Issue 21, item 4: accepted against the docs.
    (
        "build(repeat='epochs') on a generator",
        lambda: _build(_generator(), repeat="epochs"),
        Raises(ValueError, r"does not know the dataset's size.*assert_cardinality\(N\)"),
    ),
    ("build(repeat=1)", lambda: _build(repeat=1), Raises(ValueError, "repeat=1 " + NOT_A_COUNT)),
    ("build(repeat=0)", lambda: _build(repeat=0), Raises(ValueError, "repeat=0 " + NOT_A_COUNT)),
    ("build(repeat=2)", lambda: _build(repeat=2), Raises(ValueError, "repeat=2 " + NOT_A_COUNT)),
    (
        "build(repeat=np.int64(1))",
        lambda: _build(repeat=np.int64(1)),
        Raises(ValueError, NOT_A_COUNT),
    ),
    (
        "build(repeat='True')",
        lambda: _build(repeat="True"),
        Raises(ValueError, "Strings other than 'epochs' are not read as booleans"),
    ),
    (
        "build(repeat=np.bool_(True))",
        lambda: _build(repeat=np.bool_(True)),
        Accepts("a NumPy bool is a bool, as for every flag of the builder"),
    ),
    (
        "make_distributed_train_step with a mixed_float16 layer, plain optimizer",
        lambda: _with_layers(_dense("mixed_float16")),
        Raises(ValueError, r"has layers that compute in float16 \('dense.*LossScaleOptimizer"),
    ),
    (
        "worker_backup_dir(strategy='mirrored')",
        lambda: tdu.worker_backup_dir("b", strategy="mirrored"),
        Raises(TypeError, "strategy must be a tf.distribute.Strategy.*received 'mirrored'"),
    ),
    (
        "enable_gradient_accumulation('model', 2)",
        lambda: tdu.enable_gradient_accumulation("model", 2),
        Raises(TypeError, r"model must be a .*model \(keras\.Model\), but received 'model'"),
    ),
]

CASES: list[Case] = [
    # repeat='epochs' where epochs cannot be aligned: refused, with a fix that exists.
    (
        "build(repeat='epochs') on an infinite dataset",
        lambda: _build(tf.data.Dataset.range(5).repeat(), repeat="epochs"),
        Raises(ValueError, "infinite: it has no epoch to repeat"),
    ),
    (
        "build(repeat='epochs') on uncounted files",
        lambda: _build(_text_file(), reader=tf.data.TextLineDataset, repeat="epochs"),
        Raises(ValueError, "Pass count_examples=True"),
    ),
    (
        "build(repeat='epochs') on sparse elements",
        lambda: _build(repeat="epochs", map_fn=lambda x: tf.sparse.from_dense(tf.reshape(x, [1]))),
        Raises(ValueError, "sparse or ragged.*tf.sparse.to_dense"),
    ),
    (
        "build(repeat='epochs', service_mode='distributed_epoch')",
        lambda: _build(service=SERVICE, service_mode="distributed_epoch", repeat="epochs"),
        Raises(ValueError, "hands the data out dynamically.*service_mode='synchronous'"),
    ),
    (
        "build(repeat='epochs') on a self-batching fn of unknown size",
        lambda: _build(_batching_fn(known=False), global_batch_size=None, repeat="epochs"),
        Raises(ValueError, "needs the number of batches the source function returns"),
    ),
    (
        "build(repeat='epochs') on a fn of examples",
        lambda: _build(lambda context: tf.data.Dataset.range(10), repeat="epochs"),
        Raises(ValueError, "does not count the examples a fn"),
    ),
    # element=
    (
        "build(element='batches')",
        lambda: _build(element="batches"),
        Raises(ValueError, "element='batches' is not supported; expected 'auto'"),
    ),
    (
        "build(element='batch') on arrays",
        lambda: _build(element="batch"),
        Raises(ValueError, "element='batch' applies to a tf.data.Dataset"),
    ),
    # service=, service_mode=, service_timeout=
    (
        "build(service='localhost')",
        lambda: _build(service="localhost"),
        Raises(ValueError, "service='localhost' is not a tf.data service dispatcher address"),
    ),
    (
        "build(service=5050)",
        lambda: _build(service=5050),
        Raises(TypeError, "service must be a string, but received 5050"),
    ),
    (
        "build(service_mode='dynamic')",
        lambda: _build(service=SERVICE, service_mode="dynamic"),
        Raises(ValueError, "service_mode='dynamic' is not a tf.data service mode"),
    ),
    (
        "build(service_timeout='5')",
        lambda: _build(service=SERVICE, service_timeout="5"),
        Raises(TypeError, "service_timeout must be a number of seconds, but received '5'"),
    ),
    (
        "build(service=..., cache=True)",
        lambda: _build(service=SERVICE, cache=True),
        Raises(ValueError, "later epochs would not use the service"),
    ),
    # cache=, reader=, map_fn=
    (
        "build(cache=None)",
        lambda: _build(cache=None),
        Raises(TypeError, "cache must be True .* but received None"),
    ),
    (
        "build(reader='TFRecordDataset')",
        lambda: _build(_text_file(), reader="TFRecordDataset"),
        Raises(TypeError, "reader must be a function path -> tf.data.Dataset.*not a string"),
    ),
    (
        "build(reader returning a list)",
        lambda: _build(_text_file(), reader=lambda path: [1, 2]),
        Raises(TypeError, r"reader\('.*'\) returned list; expected a tf.data.Dataset"),
    ),
    (
        "build(map_fn='parse')",
        lambda: _build(map_fn="parse"),
        Raises(TypeError, "map_fn='parse' is not callable"),
    ),
    (
        "build(map_fn of one argument on (x, y))",
        lambda: _build((X, Y), map_fn=lambda pair: pair),
        Raises(ValueError, r"cannot take the dataset's elements.*2 positional argument"),
    ),
    # fn(input_context) sources
    (
        "build(a source function of no argument)",
        lambda: _build(lambda: tf.data.Dataset.range(3)),
        Raises(TypeError, "cannot take an input context.*fn\\(input_context\\)"),
    ),
    (
        "build(a source function returning a list)",
        lambda: _build(lambda context: [1, 2]),
        Raises(TypeError, "the source function returned list; expected a tf.data.Dataset"),
    ),
    (
        "build(a self-batching fn with map_fn=)",
        lambda: _build(_batching_fn(), global_batch_size=None, map_fn=lambda x: x),
        Raises(ValueError, "cannot apply to a source function that batches itself"),
    ),
    (
        "build(a self-batching fn, global_batch_size of another size)",
        lambda: _build(_batching_fn(), global_batch_size=8),
        Raises(ValueError, r"global_batch_size=8 gives 4 .* batches 2 per replica"),
    ),
    # mixed precision
    (
        "make_distributed_train_step with a nested mixed_float16 layer",
        lambda: _with_layers(_nested_float16),
        Raises(ValueError, "has layers that compute in float16"),
    ),
    (
        "make_distributed_train_step with a mixed_bfloat16 layer, plain optimizer",
        lambda: _with_layers(_dense("mixed_bfloat16")),
        Accepts("bfloat16 keeps float32's exponent range: no loss scaling is needed"),
    ),
    (
        "make_distributed_train_step with a mixed_float16 layer, LossScaleOptimizer",
        lambda: _with_layers(_dense("mixed_float16"), scaled=True),
        Accepts("a float16 layer with a LossScaleOptimizer is the documented set-up"),
    ),
    # gradient accumulation
    (
        "enable_gradient_accumulation(model, 2.0)",
        lambda: tdu.enable_gradient_accumulation(_model(), 2.0),
        Raises(TypeError, "accumulation_steps must be an integer.*Pass accumulation_steps=2"),
    ),
    (
        "enable_gradient_accumulation(model, True)",
        lambda: tdu.enable_gradient_accumulation(_model(), True),
        Raises(TypeError, "accumulation_steps must be an integer, but received True"),
    ),
    (
        "enable_gradient_accumulation(None, 2)",
        lambda: tdu.enable_gradient_accumulation(None, 2),
        Raises(TypeError, "model must be a .*but received None"),
    ),
    (
        "make_distributed_train_step(accumulation_steps='2')",
        lambda: _plain_step(accumulation_steps="2"),
        Raises(TypeError, "accumulation_steps must be an integer, but received '2'"),
    ),
    (
        "make_distributed_train_step(accumulation_steps=0)",
        lambda: _plain_step(accumulation_steps=0),
        Raises(ValueError, "accumulation_steps must be a positive integer"),
    ),
    # split_for_validation
    (
        "split_for_validation(batch_size=4)",
        lambda: _split(global_batch_size=None, batch_size=4),
        Raises(TypeError, "received batch_size=.*calls it global_batch_size="),
    ),
    (
        "split_for_validation(shufle_buffer_size=8)",
        lambda: _split(shufle_buffer_size=8),
        Raises(TypeError, "received shufle_buffer_size=.*did you mean shuffle_buffer_size="),
    ),
    (
        "split_for_validation(validation_split='0.2')",
        lambda: _split(validation_split="0.2"),
        Raises(TypeError, "validation_split must be a number, but received '0.2'"),
    ),
    (
        "split_for_validation(validation_split=1)",
        lambda: _split(validation_split=1),
        Raises(ValueError, "validation_split must be a fraction between 0 and 1"),
    ),
    (
        "split_for_validation(validation_split=nan)",
        lambda: _split(validation_split=float("nan")),
        Raises(ValueError, "validation_split must be a positive finite number"),
    ),
    (
        "split_for_validation(a shuffled dataset)",
        lambda: _split(tf.data.Dataset.range(10).shuffle(10)),
        Raises(ValueError, "shuffled before the split"),
    ),
    (
        "split_for_validation(a source function)",
        lambda: _split(lambda context: tf.data.Dataset.range(10)),
        Raises(TypeError, "received a fn\\(input_context\\) source"),
    ),
    (
        "split_for_validation(repeat=1)",
        lambda: _split(repeat=1),
        Raises(ValueError, "repeat=1 " + NOT_A_COUNT),
    ),
    # worker_backup_dir
    (
        "worker_backup_dir('')",
        lambda: tdu.worker_backup_dir(""),
        Raises(ValueError, "backup_dir='' is empty"),
    ),
]

ALL_CASES: list[Case] = REGRESSIONS + CASES


@pytest.fixture(autouse=True)
def _float32_policy() -> Any:
    # A failing case must not leave a global policy behind for the next one.
    yield
    keras.mixed_precision.set_global_policy("float32")


@parametrize(ALL_CASES)
@pytest.mark.keras
def test_hostile_input(call: Callable[[], Any], outcome: Raises | Accepts) -> None:
    check_case(call, outcome)
