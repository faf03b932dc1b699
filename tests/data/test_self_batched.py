"""A ``fn(input_context)`` that batches itself: the builder counts what can be counted.

The input tutorial's pattern (range -> map -> batch(per_replica) -> shard) has a dataset of
known size: the builder reads its steps and each batch's size, on every worker, so ``fit``
runs exactly the function's steps (issue 21: Keras warned "Your input ran out of data" and
the optimizer counted an extra update per epoch). Every count here is checked against an
independent one: the batches of the function's own dataset, iterated; the example ids that
reach the model (metrics inside the step); the per-replica shapes the replicas receive.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import pytest
import tensorflow as tf
from support.id_metrics import id_metrics

import tfdp_utils as tdu
from tfdp_utils.data._elements import batch_sizes, classify
from tfdp_utils.data._self_batched import count_function_batches, function_findings
from tfdp_utils.errors import EndlessEpochError


def _mirrored(n: int) -> Any:
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])


def _iterated_sizes(dataset: Any) -> list[int]:
    """Each element's leading size, by iterating (the independent count)."""
    return [int(tf.nest.flatten(element)[0].shape[0]) for element in dataset]


def tutorial_fn(n: int, global_batch: int) -> Any:
    """The tf.distribute input tutorial's dataset_fn: range -> map -> batch -> shard."""

    def dataset_fn(input_context: Any) -> Any:
        batch_size = input_context.get_per_replica_batch_size(global_batch)
        dataset = tf.data.Dataset.range(n).map(lambda i: (tf.cast([i], tf.float32), i))
        dataset = dataset.batch(batch_size)
        return dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)

    return dataset_fn


# ------------------------------------------------------------- each batch's size, read


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("batch", lambda: tf.data.Dataset.range(10).batch(4)),
        ("drop", lambda: tf.data.Dataset.range(10).batch(4, drop_remainder=True)),
        (
            "map-batch-shard",
            lambda: tf.data.Dataset.range(10).map(lambda i: i).batch(4).shard(2, 1),
        ),
        ("shard-0", lambda: tf.data.Dataset.range(10).batch(4).shard(2, 0)),
        ("prefetch", lambda: tf.data.Dataset.range(10).batch(4).prefetch(2)),
        ("take", lambda: tf.data.Dataset.range(10).batch(4).take(2)),
        ("skip", lambda: tf.data.Dataset.range(10).batch(4).skip(1)),
        ("cache", lambda: tf.data.Dataset.range(9).batch(3).cache()),
        ("batch-of-shard", lambda: tf.data.Dataset.range(11).shard(3, 2).batch(2)),
    ],
)
def test_batch_sizes_are_the_sizes_iteration_gives(name: str, make: Any) -> None:
    dataset = make()
    assert batch_sizes(dataset) == _iterated_sizes(dataset), name


@pytest.mark.parametrize(
    "make",
    [
        lambda: tf.data.Dataset.range(10).batch(4).map(lambda b: b[:-1]),  # may change sizes
        lambda: tf.data.Dataset.range(10).filter(lambda i: i > 2).batch(4),  # input unknown
        lambda: tf.data.Dataset.range(10).batch(4).filter(lambda b: True),
        lambda: tf.data.Dataset.range(10),  # not batched
        lambda: tf.data.Dataset.range(10).batch(4).repeat(),
    ],
)
def test_batch_sizes_unknown_where_they_cannot_be_read(make: Any) -> None:
    assert batch_sizes(make()) is None


# --------------------------------------------------- every worker counts the same steps


@pytest.mark.parametrize(("n", "workers", "local"), [(48, 2, 1), (41, 3, 1), (29, 2, 2)])
def test_every_worker_counts_the_same_batches_and_they_are_the_real_ones(
    n: int, workers: int, local: int
) -> None:
    # Each worker calls the function with its own input context; every worker must count
    # every worker's batches the same, and they are what the function's datasets hold.
    replicas = workers * local
    function = tutorial_fn(n, 4 * replicas)
    own_context = tf.distribute.InputContext(workers, 0, replicas)
    elements = classify(function(own_context), "auto", what="f", source_kind="function")
    counted = [
        count_function_batches(
            function,
            elements,
            per_replica=4,
            replicas=replicas,
            num_workers=workers,
            worker_index=index,
            shard=False,
        )
        for index in range(workers)
    ]
    assert all(result == counted[0] for result in counted)
    real = [
        _iterated_sizes(function(tf.distribute.InputContext(workers, index, replicas)))
        for index in range(workers)
    ]
    first = counted[0]
    assert first.batches_per_worker == tuple(len(sizes) for sizes in real)
    assert first.steps == max(math.ceil(len(sizes) / local) for sizes in real)
    assert first.examples_per_worker == tuple(sum(sizes) for sizes in real)
    assert first.layout is not None and first.layout.examples == n


def test_uneven_workers_are_said_and_counted_with_the_busiest_steps() -> None:
    function = tutorial_fn(41, 12)  # 11 batches of 4 over 3 workers: 4, 4, 3
    elements = classify(
        function(tf.distribute.InputContext(3, 0, 3)), "auto", what="f", source_kind="function"
    )
    counted = count_function_batches(
        function, elements, per_replica=4, replicas=3, num_workers=3, worker_index=2, shard=False
    )
    assert counted.batches_per_worker == (4, 4, 3) and counted.steps == 4 and counted.uneven
    assert counted.layout is not None
    assert counted.layout.tail == ((4, 1, 0),)  # worker 2 feeds an empty batch in step 4
    warnings_said = [
        f.message for f in function_findings(elements, 4, counted, exact=True) if f.level >= 30
    ]
    assert len(warnings_said) == 1
    assert "different numbers of batches on the workers (4, 4, 3" in warnings_said[0]
    assert "every worker runs 4 steps per epoch" in warnings_said[0]


def test_a_function_of_unknown_size_is_not_counted() -> None:
    def function(context: Any) -> Any:
        return tf.data.Dataset.range(10).filter(lambda i: i > 2).batch(4)

    elements = classify(
        function(tf.distribute.InputContext()), "auto", what="f", source_kind="function"
    )
    counted = count_function_batches(
        function, elements, per_replica=4, replicas=1, num_workers=1, worker_index=0, shard=False
    )
    assert counted.steps is None and counted.layout is None
    assert "tf.data does not know the size" in counted.unknown


# ------------------------------------------------------------------- the builder's info


@pytest.mark.parametrize("replicas", [1, 2])
def test_info_is_the_function_batches_as_the_replicas_receive_them(replicas: int) -> None:
    strategy = _mirrored(replicas)
    n = 12 * 4 * replicas + 3  # a partial last batch
    dist = tdu.build_distributed_dataset(tutorial_fn(n, 4 * replicas), strategy=strategy)
    info = dist.tfdp_info
    received = [
        tuple(int(part[0].shape[0]) for part in strategy.experimental_local_results(step))
        for step in dist
    ]
    assert info.exact and info.steps_per_epoch == len(received) == 13
    assert info.examples_per_epoch == n
    assert tuple(info.examples_in_step(s) for s in range(len(received))) == tuple(received)
    assert dist.tfdp_plan.steps_per_worker == 13


def test_static_full_batches_are_counted_without_reading_the_chain() -> None:
    strategy = _mirrored(2)

    def function(context: Any) -> Any:
        size = context.get_per_replica_batch_size(8)
        dataset = tf.data.Dataset.range(100).filter(lambda i: i < 50)  # size unknown
        dataset = dataset.batch(size, drop_remainder=True)
        return dataset.apply(tf.data.experimental.assert_cardinality(12))

    dist = tdu.build_distributed_dataset(function, strategy=strategy)
    info = dist.tfdp_info
    assert (info.steps_per_epoch, info.full_steps, info.exact) == (6, 6, True)
    assert sum(1 for _ in dist) == 6


def test_known_steps_but_unknown_sizes_are_said_inexact(caplog: pytest.LogCaptureFixture) -> None:
    strategy = _mirrored(2)

    def function(context: Any) -> Any:
        dataset = tf.data.Dataset.range(30).filter(lambda i: i % 3 > 0)  # 20 examples
        dataset = dataset.batch(context.get_per_replica_batch_size(8))
        return dataset.apply(tf.data.experimental.assert_cardinality(5))

    with caplog.at_level(logging.INFO, logger="tfdp_utils"):
        dist = tdu.build_distributed_dataset(function, strategy=strategy)
    info = dist.tfdp_info
    assert info.steps_per_epoch == 3 == sum(1 for _ in dist)
    assert not info.exact and info.full_steps is None and info.examples_per_epoch is None
    assert "the 3 steps per epoch are counted" in caplog.text
    assert "tfdp_info.exact is False" in caplog.text


def test_a_function_that_repeats_itself_is_endless_and_fit_says_so() -> None:
    from tfdp_utils._tf import keras

    strategy = _mirrored(2)

    def function(context: Any) -> Any:
        size = context.get_per_replica_batch_size(4)
        return (
            tf.data.Dataset.range(8)
            .map(lambda i: (tf.cast([i], tf.float32), i))
            .batch(size, drop_remainder=True)
            .repeat()
        )

    dist = tdu.build_distributed_dataset(function, strategy=strategy)
    assert dist.tfdp_info.repeat and dist.tfdp_info.exact
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    with pytest.raises(EndlessEpochError, match="steps_per_epoch"):
        model.fit(dist, epochs=1, verbose=0)


# ------------------------------------------------------------- fit, counted in the model


def _model(strategy: Any, n: int) -> Any:
    from tfdp_utils._tf import keras

    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.0), "mse", metrics=id_metrics(n))
    return model


def _fit_quietly(
    model: Any, dist: Any, caplog: pytest.LogCaptureFixture, **kwargs: Any
) -> tuple[Any, list[str]]:
    """``model.fit`` with every warning and WARNING log kept, to look for "ran out of data"."""
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        history = model.fit(dist, verbose=0, **kwargs)
    said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    return history, said


@pytest.mark.keras
@pytest.mark.parametrize("replicas", [1, 2])
def test_the_input_tutorials_function_fits_its_own_steps_exactly(
    replicas: int, caplog: pytest.LogCaptureFixture
) -> None:
    # No steps_per_epoch and no repeat, on Keras 3 and tf_keras alike: the function's steps.
    n = 12 * 4 * replicas + 3
    strategy = _mirrored(replicas)
    function = tutorial_fn(n, 4 * replicas)
    batches = _iterated_sizes(function(tf.distribute.InputContext(1, 0, replicas)))
    real_steps = math.ceil(len(batches) / replicas)  # the replicas take batches in turn
    dist = tdu.build_distributed_dataset(function, strategy=strategy)
    model = _model(strategy, n)
    history, said = _fit_quietly(model, dist, caplog, epochs=2)
    assert not [text for text in said if "ran out of data" in text]
    assert int(model.optimizer.iterations.numpy()) == 2 * real_steps
    assert history.history["seen"] == [n, n] and history.history["once"] == [n, n]


@pytest.mark.keras
@pytest.mark.parametrize("replicas", [1, 2])
def test_repeat_epochs_on_a_function_pads_each_epoch_to_the_same_steps(
    replicas: int, caplog: pytest.LogCaptureFixture
) -> None:
    n = 5 * 4 * replicas + 4 + 2  # a last step with fewer batches than replicas
    strategy = _mirrored(replicas)
    function = tutorial_fn(n, 4 * replicas)
    real_steps = math.ceil(
        len(_iterated_sizes(function(tf.distribute.InputContext(1, 0, replicas)))) / replicas
    )
    dist = tdu.build_distributed_dataset(function, strategy=strategy, repeat="epochs")
    info = dist.tfdp_info
    assert info.repeat and info.steps_per_epoch == real_steps and info.exact
    model = _model(strategy, n)
    history, said = _fit_quietly(model, dist, caplog, epochs=3, steps_per_epoch=real_steps)
    assert not [text for text in said if "ran out of data" in text]
    assert int(model.optimizer.iterations.numpy()) == 3 * real_steps
    assert history.history["seen"] == [n] * 3 and history.history["once"] == [n] * 3


def test_repeat_epochs_on_an_uncounted_function_is_refused_and_the_fix_works() -> None:
    strategy = _mirrored(2)

    def uncounted(context: Any) -> Any:
        dataset = tf.data.Dataset.range(30).filter(lambda i: i % 3 > 0)  # 20 examples
        return dataset.batch(context.get_per_replica_batch_size(8))

    with pytest.raises(ValueError, match=r"needs the number of batches.*assert_cardinality"):
        tdu.build_distributed_dataset(uncounted, strategy=strategy, repeat="epochs")

    def declared(context: Any) -> Any:  # the message's fix: 20 examples in batches of 4
        return uncounted(context).apply(tf.data.experimental.assert_cardinality(5))

    dist = tdu.build_distributed_dataset(declared, strategy=strategy, repeat="epochs")
    assert dist.tfdp_info.steps_per_epoch == 3
    iterator = iter(dist)
    for _ in range(2):  # two epochs of 3 steps from one iterator: each sees the 20 once
        seen = [
            i
            for _ in range(3)
            for part in strategy.experimental_local_results(next(iterator))
            for i in part.numpy().tolist()
        ]
        assert sorted(seen) == [i for i in range(30) if i % 3 > 0]
