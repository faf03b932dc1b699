"""The sharding plan against tf.data, bad inputs, and in-process distributed datasets on
logical CPUs.

Counts are checked against the example ids each replica actually received. The pure decision
tables (policy, files, epoch layout) are in test_sharding.py.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from support.id_metrics import id_metrics

import tfdp_utils as tdu
from tfdp_utils import _dataset_info as dataset_info
from tfdp_utils.data import build_distributed_dataset, plan_sharding
from tfdp_utils.data._sharding import (
    split_examples,
)


def _mirrored(n: int) -> Any:
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])


def _run_epoch(
    dist: Any, strategy: Any, key: str = "id"
) -> tuple[list[list[int]], list[list[int]]]:
    """Per step, the examples each replica got; and all ids each replica got."""
    per_step: list[list[int]] = []
    ids: list[list[int]] = [[] for _ in range(strategy.num_replicas_in_sync)]
    for batch in dist:
        values = strategy.experimental_local_results(batch[key] if key else batch)
        row = []
        for replica, value in enumerate(values):
            got = value.numpy().tolist()
            ids[replica].extend(got)
            row.append(len(got))
        per_step.append(row)
    return per_step, ids


def _write_text_files(folder: Path, sizes: list[int]) -> list[str]:
    paths, next_id = [], 0
    for index, size in enumerate(sizes):
        path = folder / f"part-{index:02d}.txt"
        path.write_text("".join(f"{i}\n" for i in range(next_id, next_id + size)))
        next_id += size
        paths.append(str(path))
    return paths


def _parse_line(line: Any) -> dict[str, Any]:
    return {"id": tf.strings.to_number(line, tf.int64)}


# -------------------------------------------------------- the pure split against tf.data


@pytest.mark.parametrize(("n", "workers"), [(0, 2), (1, 3), (10, 3), (11, 2), (12, 4)])
def test_split_examples_matches_tf_shard(n: int, workers: int) -> None:
    counted = tuple(
        int(tf.data.Dataset.range(n).shard(workers, i).reduce(0, lambda c, _: c + 1))
        for i in range(workers)
    )
    assert split_examples(n, workers) == counted


# ----------------------------------------------------------- exact counts vs counted ids


@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 7, 12, 25])
def test_every_example_once_and_info_matches_counts(replicas: int, n: int) -> None:
    strategy = _mirrored(replicas)
    dist = build_distributed_dataset(
        {"id": np.arange(n)}, strategy=strategy, per_replica_batch_size=3, shuffle_buffer_size=4
    )
    per_step, ids = _run_epoch(dist, strategy)
    flat = [i for replica in ids for i in replica]
    assert sorted(flat) == list(range(n))
    info = dist.tfdp_info
    assert info.steps_per_epoch == len(per_step)
    assert [list(info.examples_in_step(s)) for s in range(len(per_step))] == per_step
    assert list(info.examples_in_steps(0, len(per_step))) == [len(r) for r in ids]
    assert info.examples_per_epoch == n
    assert info.global_batch_size == 3 * replicas and info.num_workers == 1


def test_drop_remainder_keeps_only_full_steps_and_logs_the_loss(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = _mirrored(2)
    with caplog.at_level(logging.INFO, logger="tfdp_utils"):
        dist = build_distributed_dataset(
            tf.data.Dataset.range(23), strategy=strategy, global_batch_size=4, drop_remainder=True
        )
    per_step, ids = _run_epoch(dist, strategy, key="")
    assert per_step == [[2, 2]] * 5
    assert len({i for r in ids for i in r}) == 20
    assert "drops 3 of 23 examples each epoch" in caplog.text
    assert dist.tfdp_info.tail == () and dist.tfdp_info.full_steps == 5


def test_file_source_uneven_sizes_in_process(tmp_path: Path) -> None:
    paths = _write_text_files(tmp_path, [40, 4, 4])
    strategy = _mirrored(2)
    dist = build_distributed_dataset(
        str(tmp_path / "*.txt"),
        strategy=strategy,
        global_batch_size=6,
        reader=tf.data.TextLineDataset,
        map_fn=_parse_line,
        shuffle_buffer_size=10,
    )
    _, ids = _run_epoch(dist, strategy)
    assert sorted(i for r in ids for i in r) == list(range(48))
    plan = dist.tfdp_plan
    assert plan.policy == "off" and plan.files_per_worker == (tuple(paths),)
    assert dist.tfdp_info.steps_per_epoch is None  # file sizes are not example counts


@pytest.mark.parametrize("repeat", [False, "epochs"])
def test_counted_files_give_exact_counts(tmp_path: Path, repeat: Any) -> None:
    paths = _write_text_files(tmp_path, [40, 4, 7])
    strategy = _mirrored(3)
    dist = build_distributed_dataset(
        paths,
        strategy=strategy,
        per_replica_batch_size=4,
        reader=tf.data.TextLineDataset,
        map_fn=_parse_line,
        count_examples=True,
        repeat=repeat,
    )
    info = dist.tfdp_info
    assert info.examples_per_epoch == 51 and info.steps_per_epoch == 5
    iterator = iter(dist)
    for _ in range(2 if repeat else 1):
        seen: list[int] = []
        for step in range(info.steps_per_epoch):
            values = strategy.experimental_local_results(next(iterator)["id"])
            assert tuple(int(v.shape[0]) for v in values) == info.examples_in_step(step)
            for value in values:
                seen.extend(value.numpy().tolist())
        assert sorted(seen) == list(range(51))
    if not repeat:
        with pytest.raises(StopIteration):
            next(iterator)
    assert plan_sharding(
        paths,
        num_workers=2,
        reader=tf.data.TextLineDataset,
        count_examples=True,
        global_batch_size=8,
    ).examples_per_worker == (40, 11)


def test_tfrecord_files_by_default(tmp_path: Path) -> None:
    for index in range(3):
        with tf.io.TFRecordWriter(str(tmp_path / f"{index}.tfrecord")) as writer:
            for i in range(index * 5, index * 5 + 5):
                writer.write(str(i).encode())
    strategy = _mirrored(2)
    dist = build_distributed_dataset(
        sorted(str(p) for p in tmp_path.iterdir()),
        strategy=strategy,
        global_batch_size=4,
        map_fn=lambda r: {"id": tf.strings.to_number(r, tf.int64)},
    )
    _, ids = _run_epoch(dist, strategy)
    assert sorted(i for r in ids for i in r) == list(range(15))


def test_file_policy_and_hint_on_a_dataset(tmp_path: Path) -> None:
    paths = _write_text_files(tmp_path, [5, 6])
    strategy = _mirrored(2)
    reads = tf.data.TextLineDataset(paths).map(_parse_line)
    dist = build_distributed_dataset(
        reads, strategy=strategy, global_batch_size=4, shard_policy="file"
    )
    _, ids = _run_epoch(dist, strategy)
    assert sorted(i for r in ids for i in r) == list(range(11))
    hinted = tf.data.Dataset.range(9).shard(
        tf.data.experimental.SHARD_HINT, tf.data.experimental.SHARD_HINT
    )
    dist = build_distributed_dataset(
        hinted, strategy=strategy, global_batch_size=4, shard_policy="hint"
    )
    _, ids = _run_epoch(dist, strategy, key="")
    assert sorted(i for r in ids for i in r) == list(range(9))


def test_input_fn_source_gets_the_input_context() -> None:
    strategy = _mirrored(2)
    contexts = []

    def fn(context: Any) -> Any:
        contexts.append((context.num_input_pipelines, context.input_pipeline_id))
        return tf.data.Dataset.range(10).map(lambda i: {"id": i})

    dist = build_distributed_dataset(fn, strategy=strategy, per_replica_batch_size=2)
    _, ids = _run_epoch(dist, strategy)
    assert contexts == [(1, 0)]
    assert sorted(i for r in ids for i in r) == list(range(10))


def test_generator_and_cache_and_map(tmp_path: Path) -> None:
    def gen() -> Any:
        yield from range(11)

    source = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec([], tf.int64))
    strategy = _mirrored(2)
    dist = build_distributed_dataset(
        source,
        strategy=strategy,
        global_batch_size=4,
        map_fn=lambda i: {"id": i * 10},
        cache=str(tmp_path / "cache"),
        shuffle_buffer_size=3,
        seed=1,
    )
    for _ in range(2):  # second epoch reads the cache, reshuffled
        _, ids = _run_epoch(dist, strategy)
        assert sorted(i for r in ids for i in r) == [i * 10 for i in range(11)]


def test_repeat_of_unknown_size_repeats_examples() -> None:
    strategy = _mirrored(2)
    source = tf.data.Dataset.range(5).filter(lambda i: True)  # cardinality unknown
    dist = build_distributed_dataset(source, strategy=strategy, global_batch_size=4, repeat=True)
    iterator = iter(dist)
    got: Counter[int] = Counter()
    for _ in range(5):  # 5 full steps of 4 = 20 examples = 4 passes over 5
        values = strategy.experimental_local_results(next(iterator))
        assert [int(v.shape[0]) for v in values] == [2, 2]
        for value in values:
            got.update(value.numpy().tolist())
    assert got == Counter({i: 4 for i in range(5)})
    info = dist.tfdp_info
    assert info.repeat and info.steps_per_epoch is None and info.examples_per_epoch is None


def test_repeat_true_keeps_every_step_full() -> None:
    strategy = _mirrored(2)
    dist = build_distributed_dataset(
        np.arange(5), strategy=strategy, global_batch_size=4, repeat=True
    )
    iterator = iter(dist)
    sizes = [
        [int(v.shape[0]) for v in strategy.experimental_local_results(next(iterator))]
        for _ in range(4)
    ]
    assert sizes == [[2, 2]] * 4
    assert dist.tfdp_info.repeat and dist.tfdp_info.steps_per_epoch is None
    with pytest.raises(ValueError, match="repeat='forever' is not supported"):
        build_distributed_dataset(
            np.arange(5), strategy=strategy, global_batch_size=4, repeat="forever"
        )


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_repeat_of_known_size_repeats_exact_epochs(drop_remainder: bool) -> None:
    strategy = _mirrored(3)
    n = 13
    dist = build_distributed_dataset(
        {"id": np.arange(n)},
        strategy=strategy,
        global_batch_size=6,
        repeat="epochs",
        shuffle_buffer_size=13,
        seed=3,
        drop_remainder=drop_remainder,
    )
    info = dist.tfdp_info
    steps = info.steps_per_epoch
    assert info.repeat and steps == (2 if drop_remainder else 3)
    iterator = iter(dist)
    epochs = []
    totals = [0, 0, 0]
    for _ in range(3):
        seen: list[int] = []
        for step in range(steps):
            values = strategy.experimental_local_results(next(iterator)["id"])
            counts = [int(v.shape[0]) for v in values]
            assert tuple(counts) == info.examples_in_step(step)
            totals = [t + c for t, c in zip(totals, counts, strict=True)]
            for value in values:
                seen.extend(value.numpy().tolist())
        assert len(seen) == len(set(seen)) == info.examples_per_epoch
        if not drop_remainder:
            assert sorted(seen) == list(range(n))
        epochs.append(seen)
    assert epochs[0] != epochs[1]  # reshuffled each epoch
    assert list(info.examples_in_steps(0, 3 * steps)) == totals


def test_infinite_source_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        build_distributed_dataset(
            tf.data.Dataset.range(3).repeat(), strategy=_mirrored(2), global_batch_size=2
        )
    assert "the source is infinite, so an epoch never ends" in caplog.text


def test_plan_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tfdp_utils"):
        build_distributed_dataset(np.arange(6), strategy=_mirrored(2), global_batch_size=2)
    plans = [r for r in caplog.records if "shard_policy=" in r.getMessage()]
    assert len(plans) == 1
    assert "a single worker: nothing to shard" in plans[0].getMessage()


def test_plan_sharding_public_api(tmp_path: Path) -> None:
    paths = _write_text_files(tmp_path, [30, 3, 3, 3])
    plan = plan_sharding(paths, num_workers=2)
    assert plan.policy == "file" and "4 files >= 2 workers" in plan.reason
    assert plan.files_per_worker == ((paths[0],), tuple(paths[1:]))
    plan = plan_sharding(np.arange(10), num_workers=3, global_batch_size=6)
    assert plan.policy == "data" and plan.examples_per_worker == (4, 3, 3)
    assert plan.steps_per_worker == 2 and plan.num_examples == 10
    assert plan_sharding(paths, num_workers=5).policy == "data"
    assert plan_sharding(np.arange(4), strategy=_mirrored(2)).policy == "off"
    assert "examples per worker" in plan.describe()


# --------------------------------------------------- what the throughput callbacks rely on


def test_info_is_attached_type_kept_and_fit_checks_installed() -> None:
    from tfdp_utils.compat import _fit_binding as fit_binding

    strategy = _mirrored(2)
    dist = build_distributed_dataset(np.arange(8), strategy=strategy, global_batch_size=4)
    assert isinstance(dist, tf.distribute.DistributedDataset)
    assert dataset_info.info_of(dist) is dist.tfdp_info
    # fit/evaluate/predict hand the dataset to their callbacks and check its steps; nothing
    # about which dataset was iterated is kept in the process.
    assert fit_binding.installed()
    assert not hasattr(dataset_info, "last_iterated")


def test_the_dataset_carries_one_record_and_the_documented_aliases() -> None:
    strategy = _mirrored(2)
    dist = build_distributed_dataset(np.arange(8), strategy=strategy, global_batch_size=4)
    record = dist.tfdp
    assert isinstance(record, dataset_info.DatasetRecord)
    assert record.info.steps_per_epoch == 2 and record.plan.policy == "off"
    # docs/data.md, docs/migrating.md and docs/scale-out.md name these three.
    assert dist.tfdp_info is record.info and dist.tfdp_plan is record.plan
    assert dist.tfdp_input_clock is record.input_clock is not None
    assert callable(record.resumable) and callable(record.rebuild_on_one_device)
    assert record.position is None and record.replaces is None
    # The loose attributes the record replaces are gone.
    for name in ("tfdp_resumable", "tfdp_position", "_tfdp_rebuild_on_one_device"):
        assert not hasattr(dist, name), name
    stream = record.resumable().at(1, 1, 3)
    assert stream.tfdp.position == dataset_info.StreamPosition(1, 1, built_from=record.info)
    assert stream.tfdp.resumable is None and stream.tfdp.rebuild_on_one_device is None


def test_cardinality_is_the_step_count() -> None:
    strategy = _mirrored(2)
    dist = build_distributed_dataset(np.arange(13), strategy=strategy, global_batch_size=6)
    assert int(dist.cardinality) == dist.tfdp_info.steps_per_epoch == len(list(dist)) == 3
    unknown = build_distributed_dataset(
        tf.data.Dataset.range(13).filter(lambda i: True), strategy=strategy, global_batch_size=6
    )
    assert int(unknown.cardinality) == tf.data.UNKNOWN_CARDINALITY
    epochs = build_distributed_dataset(
        np.arange(13), strategy=strategy, global_batch_size=6, repeat="epochs"
    )
    assert int(epochs.cardinality) == tf.data.INFINITE_CARDINALITY


def test_default_strategy_returns_a_dataset_with_info() -> None:
    dist = build_distributed_dataset(np.arange(10), global_batch_size=4)
    assert dist.tfdp_info.steps_per_epoch == 3
    assert [int(b.shape[0]) for b in dist] == [4, 4, 2]


def test_tf_function_loop_runs_every_step() -> None:
    strategy = _mirrored(2)
    dist = build_distributed_dataset(np.arange(11), strategy=strategy, global_batch_size=4)

    @tf.function
    def total(dataset: Any) -> Any:
        count = tf.constant(0, tf.int64)
        for batch in dataset:
            per_replica = strategy.run(lambda x: tf.reduce_sum(x), args=(batch,))
            count += strategy.reduce("SUM", per_replica, axis=None)
        return count

    assert int(total(dist)) == sum(range(11))


@pytest.mark.keras
def test_keras_fit_consumes_every_example() -> None:
    from tfdp_utils._tf import IS_KERAS3, keras

    strategy = _mirrored(2)
    n = 13
    x = np.arange(n, dtype="float32").reshape(-1, 1)
    # repeat="epochs" with steps_per_epoch, the form tf_keras takes without tfdp-utils'
    # dataset patch (exact epochs, as the size is known); Keras 3 re-iterates each epoch.
    dist = build_distributed_dataset(
        (x, x), strategy=strategy, global_batch_size=4, repeat=False if IS_KERAS3 else "epochs"
    )

    class Count(keras.callbacks.Callback):
        batches = 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            Count.batches += 1

    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    steps = None if IS_KERAS3 else dist.tfdp_info.steps_per_epoch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(dist, epochs=2, steps_per_epoch=steps, verbose=0, callbacks=[Count()])
    # The dataset reports its steps, not TF's per-worker batch count (7 here), to Keras 3.
    assert not [w for w in caught if "ran out of data" in str(w.message)]
    assert len(history.history["loss"]) == 2
    assert Count.batches == 8
    assert dist.tfdp_info.steps_per_epoch == 4


@pytest.mark.keras
@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_fit_and_evaluate_without_steps_see_every_example_once(steps_per_execution: int) -> None:
    # The same code on Keras 3 and tf_keras: no steps_per_epoch, no repeat. Ids are counted
    # by metrics inside the model's step, apart from the builder's own bookkeeping.
    from tfdp_utils._tf import keras

    n = 13  # batches of 4 on 2 replicas: a partial last step (1 example on one replica)
    strategy = tdu.auto_strategy(devices=["/cpu:0", "/cpu:1"])
    ids = np.arange(n, dtype="float32").reshape(-1, 1)
    dist = build_distributed_dataset(
        (ids, ids), strategy=strategy, global_batch_size=4, shuffle_buffer_size=n, seed=3
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(
            optimizer="sgd",
            loss="mse",
            metrics=id_metrics(n),
            steps_per_execution=steps_per_execution,
        )
    history = model.fit(dist, epochs=3, verbose=0)
    assert history.history["seen"] == [n, n, n]
    assert history.history["once"] == [n, n, n]
    assert int(model.optimizer.iterations.numpy()) == 3 * dist.tfdp_info.steps_per_epoch
    results = model.evaluate(dist, verbose=0, return_dict=True)
    assert results["seen"] == n and results["once"] == n


@pytest.mark.keras
def test_tf_keras_needs_the_dataset_steps_patch() -> None:
    from tfdp_utils import compat
    from tfdp_utils._tf import IS_KERAS3, keras
    from tfdp_utils.compat import _one_iterator as one_iterator
    from tfdp_utils.compat import _tf_keras_datasets as tf_keras_datasets

    strategy = _mirrored(2)
    x = np.ones((8, 1), "float32")
    dist = build_distributed_dataset((x, x), strategy=strategy, global_batch_size=4)
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    if IS_KERAS3:  # Keras 3 iterates a distributed dataset to its end: nothing to patch
        assert compat.apply_for_datasets() is False
        assert not tf_keras_datasets.installed()
        model.fit(dist, epochs=2, verbose=0)
        return
    assert tf_keras_datasets.installed()  # the builder applied it
    compat.undo("tf_keras-datasets")
    compat.undo("fit-one-iterator")  # it would hand fit the epoch's steps itself
    try:
        with pytest.raises(ValueError, match="must specify the number of steps"):
            model.fit(dist, epochs=2, verbose=0)
    finally:
        assert compat.apply_for_datasets() is True
        one_iterator.install(applied_by="test")
    model.fit(dist, epochs=2, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 4
    # A repeating dataset still needs steps_per_epoch (tfdp_utils.compat._fit_binding says so first,
    # with the count; tf_keras' own error names no number).
    endless = build_distributed_dataset((x, x), strategy=strategy, global_batch_size=4, repeat=True)
    with pytest.raises(ValueError, match=r"never ends .* Pass steps_per_epoch=2 "):
        model.fit(endless, epochs=1, verbose=0)


# ------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, "exactly one of global_batch_size and per_replica_batch_size.*neither"),
        (
            {"global_batch_size": 4, "per_replica_batch_size": 2},
            ValueError,
            "exactly one of.*both",
        ),
        ({"global_batch_size": 5}, ValueError, "not divisible by the 2 replicas.*4 or 6"),
        ({"global_batch_size": 1}, ValueError, "smaller than the 2 replicas"),
        ({"global_batch_size": 4.0}, TypeError, "must be an integer"),
        ({"global_batch_size": 4, "shard_policy": "rows"}, ValueError, "not a sharding policy"),
        ({"global_batch_size": 4, "shard_policy": "file"}, ValueError, "in-memory arrays"),
        ({"global_batch_size": 4, "shuffle_buffer_size": 0}, ValueError, "shuffle_buffer_size"),
        ({"global_batch_size": 4, "map_fn": lambda a, b: a}, ValueError, "map_fn.*single"),
        ({"global_batch_size": 4, "options": {"x": 1}}, TypeError, "tf.data.Options"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        build_distributed_dataset(np.arange(8), strategy=_mirrored(2), **kwargs)


def test_bad_sources(tmp_path: Path) -> None:
    strategy = _mirrored(2)

    def build(source: Any, **kwargs: Any) -> Any:
        return build_distributed_dataset(source, strategy=strategy, global_batch_size=4, **kwargs)

    with pytest.raises(ValueError, match="source=\\[\\] is an empty list"):
        build([])
    with pytest.raises(ValueError, match="matches no file"):
        build(str(tmp_path / "*.tfrecord"))
    with pytest.raises(ValueError, match="does not exist"):
        build(str(tmp_path / "missing.tfrecord"))
    with pytest.raises(ValueError, match="is a directory"):
        build(str(tmp_path))
    with pytest.raises(ValueError, match=r"followed by a map.*element='example'.*'batch'"):
        build(tf.data.Dataset.range(10).batch(2).map(lambda b: b * 2))
    with pytest.raises(ValueError, match="unknown inner shape"):
        build(tf.data.Dataset.range(10).map(lambda i: tf.range(i)).padded_batch(2))
    with pytest.raises(ValueError, match="tuple of 2 components"):
        build(tf.data.Dataset.from_tensor_slices((np.arange(4), np.arange(4))), map_fn=lambda x: x)
    with pytest.raises(ValueError, match="different lengths"):
        build({"a": np.arange(4), "b": np.arange(5)})
    with pytest.raises(TypeError, match="not supported"):
        build(42)
    with pytest.raises(ValueError, match="needs a source that reads files"):
        build(tf.data.Dataset.range(8), shard_policy="file")
    paths = _write_text_files(tmp_path, [3])
    with pytest.raises(TypeError, match=r"reader.*returned list"):
        build(paths, reader=lambda p: [p])
    with pytest.raises(ValueError, match="listed more than once"):
        build(paths + paths)


def test_unbatch_and_reducing_map_are_not_mistaken_for_batches() -> None:
    strategy = _mirrored(2)
    for source, expected in (
        (tf.data.Dataset.range(12).batch(3).unbatch().prefetch(2), list(range(12))),
        (tf.data.Dataset.range(12).batch(3).map(tf.reduce_sum), [3, 12, 21, 30]),
    ):
        dist = build_distributed_dataset(source, strategy=strategy, global_batch_size=2)
        _, ids = _run_epoch(dist, strategy, key="")
        assert sorted(i for r in ids for i in r) == expected


def test_function_batching_another_size_is_refused_before_training() -> None:
    with pytest.raises(ValueError, match=r"2 examples per replica.*batches 3 per replica"):
        build_distributed_dataset(
            lambda ctx: tf.data.Dataset.range(8).batch(3, drop_remainder=True),
            strategy=_mirrored(2),
            global_batch_size=4,
        )


def test_exported() -> None:
    assert tdu.build_distributed_dataset is build_distributed_dataset
    assert tdu.plan_sharding is plan_sharding
    assert tdu.ShardingPlan.__name__ == "ShardingPlan"


# ------------------------------------------- the last partial step, split over the replicas


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("n", [1500, 64 + 29, 64 + 2])
def test_last_step_is_split_evenly_over_the_replicas(
    replicas: int, n: int, logical_cpus: int
) -> None:
    assert replicas <= logical_cpus
    strategy = _mirrored(replicas)
    dist = build_distributed_dataset(
        {"id": np.arange(n)},
        strategy=strategy,
        global_batch_size=64,
        shuffle_buffer_size=256,
        seed=5,
    )
    per_step, ids = _run_epoch(dist, strategy)
    assert sorted(i for r in ids for i in r) == list(range(n))
    per_replica = 64 // replicas
    full_steps = n // 64
    assert per_step[:full_steps] == [[per_replica] * replicas] * full_steps
    (last_step,) = per_step[full_steps:]
    remainder = n % 64
    assert sum(last_step) == remainder
    assert max(last_step) - min(last_step) <= 1, last_step
    assert sorted(last_step, reverse=True) == last_step
    if min(last_step) == 0:
        assert remainder < replicas
    info = dist.tfdp_info
    assert info.full_steps == full_steps
    assert [list(row) for row in info.tail] == [last_step]
    assert list(info.examples_in_steps(0, len(per_step))) == [len(r) for r in ids]


def test_last_step_split_with_tuples_files_and_repeated_epochs(tmp_path: Path) -> None:
    strategy = _mirrored(4)
    paths = _write_text_files(tmp_path, [31, 9, 14])  # 54 = 3 steps of 16 + 6
    dist = build_distributed_dataset(
        paths,
        strategy=strategy,
        global_batch_size=16,
        reader=tf.data.TextLineDataset,
        map_fn=lambda line: (_parse_line(line)["id"], tf.strings.length(line)),
        count_examples=True,
        repeat="epochs",
        shuffle_buffer_size=8,
    )
    info = dist.tfdp_info
    assert info.tail == ((2, 2, 1, 1),)
    iterator = iter(dist)
    for _ in range(2):
        seen: list[int] = []
        for step in range(info.steps_per_epoch):
            ids, _lengths = next(iterator)
            values = strategy.experimental_local_results(ids)
            assert tuple(int(v.shape[0]) for v in values) == info.examples_in_step(step)
            for value in values:
                seen.extend(value.numpy().tolist())
        assert sorted(seen) == list(range(54))


def test_unknown_size_still_splits_the_last_step() -> None:
    def gen() -> Any:
        yield from range(93)

    source = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec([], tf.int64))
    strategy = _mirrored(2)
    dist = build_distributed_dataset(source, strategy=strategy, global_batch_size=64)
    per_step, ids = _run_epoch(dist, strategy, key="")
    assert per_step == [[32, 32], [15, 14]]
    assert sorted(i for r in ids for i in r) == list(range(93))
    assert dist.tfdp_info.steps_per_epoch is None and dist.tfdp_info.tail == ()


def test_sparse_elements_fill_replicas_in_order_and_info_says_so() -> None:
    n = 64 + 28
    sparse = tf.sparse.from_dense(np.eye(n, 3, dtype="float32"))
    source = tf.data.Dataset.from_tensor_slices({"id": np.arange(n), "s": sparse})
    strategy = _mirrored(2)
    dist = build_distributed_dataset(source, strategy=strategy, global_batch_size=64)
    per_step, ids = _run_epoch(dist, strategy)
    assert per_step == [[32, 32], [28, 0]]
    assert sorted(i for r in ids for i in r) == list(range(n))
    assert [list(row) for row in dist.tfdp_info.tail] == per_step[1:]


@pytest.mark.keras
def test_conv_model_trains_on_a_partial_last_step() -> None:
    from tfdp_utils._tf import IS_KERAS3, keras

    # 92 = 64 + 28: tf.data's own split of the last step is [28, 0] and Conv2D on CPU
    # (oneDNN) fails on the empty batch; the builder gives [14, 14].
    strategy = _mirrored(2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(92, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 3, size=(92,)).astype("int64")
    dist = build_distributed_dataset(
        (x, y), strategy=strategy, global_batch_size=64, repeat=False if IS_KERAS3 else "epochs"
    )
    assert dist.tfdp_info.tail == ((14, 14),)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Conv2D(4, 3, activation="relu"),
                keras.layers.Conv2D(8, 3),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(3),
            ]
        )
        model.compile(
            optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    steps = None if IS_KERAS3 else dist.tfdp_info.steps_per_epoch
    history = model.fit(dist, epochs=2, steps_per_epoch=steps, verbose=0)
    assert len(history.history["loss"]) == 2
    assert all(np.isfinite(history.history["loss"]))
    assert int(model.optimizer.iterations.numpy()) == 4


# ------------------------------------- strategy=None outside a scope after auto_strategy()


@pytest.fixture
def no_recorded_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dataset_info, "_strategy_ref", None)


def _default_strategy_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "default strategy" in r.getMessage()
    ]


@pytest.mark.usefixtures("no_recorded_strategy")
def test_strategy_none_outside_a_scope_warns_when_auto_strategy_built_replicas(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = _mirrored(2)
    dataset_info.record_strategy(strategy)
    assert dataset_info.last_strategy() is strategy
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        dist = build_distributed_dataset(np.arange(8), global_batch_size=4)
    (message,) = _default_strategy_warnings(caplog)
    assert "build_distributed_dataset(strategy=None) outside any strategy scope" in message
    assert "auto_strategy() built MirroredStrategy with 2 replicas" in message
    assert "Pass strategy=strategy" in message and "with strategy.scope():" in message
    # The documented rule still holds: the default strategy, one replica.
    assert dist.tfdp_info.num_replicas_in_sync == 1

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        with strategy.scope():
            scoped = build_distributed_dataset(np.arange(8), global_batch_size=4)
        passed = build_distributed_dataset(np.arange(8), strategy=strategy, global_batch_size=4)
        plan_sharding(np.arange(8), num_workers=2)
    assert _default_strategy_warnings(caplog) == []
    assert scoped.tfdp_info.num_replicas_in_sync == passed.tfdp_info.num_replicas_in_sync == 2

    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        plan_sharding(np.arange(8))
    (message,) = _default_strategy_warnings(caplog)
    assert message.startswith("tfdp_utils: plan_sharding(strategy=None)")


@pytest.mark.usefixtures("no_recorded_strategy")
def test_strategy_none_does_not_warn_without_a_multi_replica_strategy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        build_distributed_dataset(np.arange(8), global_batch_size=4)
        dataset_info.record_strategy(tf.distribute.OneDeviceStrategy("/cpu:0"))
        build_distributed_dataset(np.arange(8), global_batch_size=4)
    assert _default_strategy_warnings(caplog) == []


@pytest.mark.usefixtures("no_recorded_strategy")
def test_recorded_strategy_is_not_kept_alive() -> None:
    import gc

    class Strategy:
        num_replicas_in_sync = 2

    strategy = Strategy()
    dataset_info.record_strategy(strategy)
    assert dataset_info.last_strategy() is strategy
    del strategy
    gc.collect()
    assert dataset_info.last_strategy() is None
