"""Real localhost workers (TF_CONFIG + MultiWorkerMirroredStrategy) iterate one epoch of every
source kind and report the example ids each replica received; the test checks coverage is
disjoint and complete, and that every worker ran the same number of steps.

One launch per cluster size runs every case, because each process pays the TensorFlow import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.processes import free_port, result_line, start_python, tf_config, wait_all
from support.two_worker_cluster import phase_results

from tfdp_utils._tf import IS_KERAS3

pytestmark = pytest.mark.slow

GLOBAL_BATCH_PER_WORKER = 4
# Case name -> (number of examples, how the files are laid out if the source is files).
UNEVEN_SIZES = (60, 6, 6, 6)  # 10x different file sizes


def _cases(num_workers: int) -> dict[str, dict[str, Any]]:
    fewer = num_workers - 1  # files < workers
    return {
        "tensor_slices": {"n": 23},
        "numpy_shuffled": {"n": 37},
        "files_equal": {"sizes": (10,) * (2 * num_workers)},
        "files_uneven": {"sizes": UNEVEN_SIZES},
        "files_fewer": {"sizes": tuple(7 + i for i in range(fewer))},
        "generator": {"n": 19},
        "input_fn": {"n": 29},
        "partial_last_batch": {"n": 4 * num_workers * 3 + 1},
        "data_on_files": {"sizes": (5, 9, 13, 4)},
        "dataset_reads_files": {"sizes": (8, 3, 11, 6, 2, 9)},
        "hint": {"n": 21},
        "repeat_epochs": {"n": 4 * num_workers * 2 + 3},
        "files_uneven_counted": {"sizes": UNEVEN_SIZES},
        # The input tutorial's dataset_fn (batches itself): 2 workers hold 4 batches each,
        # 3 workers 4, 4 and 3 (the builder counts every worker's batches the same).
        "self_batched": {"n": 4 * num_workers * 3 + 5},
    }


WORKER = r"""
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import tfdp_utils.data as tdd

data_dir = sys.argv[1]
spec = json.loads(sys.argv[2])
options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=90)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
worker = strategy.cluster_resolver.task_id
local = strategy.num_replicas_in_sync // len(spec["workers"])
G = spec["global_batch"]

def parse_text(line):
    return {"id": tf.strings.to_number(line, tf.int64)}

def parse_record(record):
    return {"id": tf.strings.to_number(record, tf.int64)}

def files(name):
    folder = os.path.join(data_dir, name)
    return sorted(os.path.join(folder, f) for f in os.listdir(folder))

def source(name, case):
    n = case.get("n")
    if name == "tensor_slices":
        return dict(source=tf.data.Dataset.range(n).map(lambda i: {"id": i}))
    if name in ("numpy_shuffled", "partial_last_batch"):
        return dict(source={"id": np.arange(n)}, shuffle_buffer_size=8)
    if name == "files_equal":
        return dict(source=os.path.join(data_dir, name, "*.tfrecord"), map_fn=parse_record,
                    shuffle_buffer_size=4)
    if name == "files_uneven_counted":
        return dict(source=files(name), reader=tf.data.TextLineDataset, map_fn=parse_text,
                    shuffle_buffer_size=16, count_examples=True)
    if name in ("files_uneven", "files_fewer"):
        return dict(source=files(name), reader=tf.data.TextLineDataset, map_fn=parse_text,
                    shuffle_buffer_size=16)
    if name == "data_on_files":
        return dict(source=files(name), reader=tf.data.TextLineDataset, map_fn=parse_text,
                    shard_policy="data", shuffle_buffer_size=5, seed=7)
    if name == "dataset_reads_files":
        pattern = os.path.join(data_dir, name, "*.txt")
        names = tf.data.Dataset.list_files(pattern, shuffle=False)
        reads = names.interleave(tf.data.TextLineDataset, cycle_length=2).map(parse_text)
        return dict(source=reads, shard_policy="file")
    if name == "hint":
        hint = tf.data.experimental.SHARD_HINT
        return dict(source=tf.data.Dataset.range(n).shard(hint, hint).map(lambda i: {"id": i}),
                    shard_policy="hint")
    if name == "repeat_epochs":
        return dict(source={"id": np.arange(n)}, shuffle_buffer_size=n, repeat="epochs")
    if name == "generator":
        def gen():
            for i in range(n):
                yield {"id": i}
        sig = {"id": tf.TensorSpec([], tf.int64)}
        return dict(source=tf.data.Dataset.from_generator(gen, output_signature=sig))
    if name == "self_batched":
        def batched(context):
            ds = tf.data.Dataset.range(n).map(lambda i: {"id": i})
            ds = ds.batch(context.get_per_replica_batch_size(G))
            return ds.shard(context.num_input_pipelines, context.input_pipeline_id)
        return dict(source=batched)
    if name == "input_fn":
        def fn(context):
            ds = tf.data.Dataset.range(n)
            ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
            return ds.map(lambda i: {"id": i})
        return dict(source=fn)
    raise KeyError(name)

@tf.function
def global_count(batch):
    per_replica = strategy.run(lambda x: tf.shape(x, out_type=tf.int64)[0], args=(batch["id"],))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

out = {}
for name, case in spec["cases"].items():
    kwargs = source(name, case)
    dist = tdd.build_distributed_dataset(strategy=strategy, global_batch_size=G, **kwargs)
    ids = {worker * local + r: [] for r in range(local)}
    per_step = []
    totals = []
    epoch2 = []
    if name == "repeat_epochs":
        # Two whole epochs from one iterator: the first as the other cases, then the second.
        steps = dist.tfdp_info.steps_per_epoch
        iterator = iter(dist)
        batches = [next(iterator) for _ in range(steps)]
        for _ in range(steps):
            for value in strategy.experimental_local_results(next(iterator)["id"]):
                epoch2.extend(value.numpy().tolist())
    else:
        batches = dist
    for batch in batches:
        values = strategy.experimental_local_results(batch["id"])
        row = []
        for r, value in enumerate(values):
            got = value.numpy().tolist()
            ids[worker * local + r].extend(got)
            row.append(len(got))
        per_step.append(row)
        totals.append(int(global_count(batch)))
    info = dist.tfdp_info
    out[name] = {
        "policy": dist.tfdp_plan.policy,
        "files": [list(f) for f in dist.tfdp_plan.files_per_worker],
        "ids": ids,
        "per_step": per_step,
        "totals": totals,
        "epoch2": epoch2,
        "info_steps": info.steps_per_epoch,
        "info_examples": info.examples_per_epoch,
        "info_rows": None if info.steps_per_epoch is None else [
            list(info.examples_in_step(s)) for s in range(len(per_step))],
    }
print("RESULT " + json.dumps(out), flush=True)
"""


def _write_files(root: Path, cases: dict[str, dict[str, Any]]) -> None:
    import tensorflow as tf

    next_id = 0
    for name, case in cases.items():
        sizes = case.get("sizes")
        if sizes is None:
            continue
        folder = root / name
        folder.mkdir()
        for index, size in enumerate(sizes):
            ids = range(next_id, next_id + size)
            next_id += size
            if name == "files_equal":
                with tf.io.TFRecordWriter(str(folder / f"part-{index:02d}.tfrecord")) as writer:
                    for i in ids:
                        writer.write(str(i).encode())
            else:
                (folder / f"part-{index:02d}.txt").write_text("".join(f"{i}\n" for i in ids))
        case["expected"] = list(range(next_id - sum(sizes), next_id))


def _launch(
    num_workers: int, tmp_path: Path
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    cases = _cases(num_workers)
    _write_files(tmp_path, cases)
    for case in cases.values():
        case.setdefault("expected", list(range(case.get("n", 0))))
    ports = [free_port() for _ in range(num_workers)]
    addresses = [f"127.0.0.1:{p}" for p in ports]
    spec = {
        "workers": addresses,
        "global_batch": GLOBAL_BATCH_PER_WORKER * num_workers,
        "cases": {k: {"n": v.get("n")} for k, v in cases.items()},
    }
    processes = [
        start_python(
            WORKER,
            args=[str(tmp_path), json.dumps(spec)],
            env={"TF_CONFIG": tf_config(ports, index)},
            preloaded=True,
        )
        for index in range(num_workers)
    ]
    results = [result_line(outcome) for outcome in wait_all(processes, timeout=420)]
    return cases, results


@pytest.fixture(scope="module", params=[2, 3], ids=["2-workers", "3-workers"])
def cluster_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    num_workers = request.param
    tmp_path = tmp_path_factory.mktemp(f"data-{num_workers}w")
    cases, results = _launch(num_workers, tmp_path)
    return num_workers, cases, results


CASES = list(_cases(2))
KNOWN_COUNTS = {
    "tensor_slices",
    "numpy_shuffled",
    "partial_last_batch",
    "repeat_epochs",
    "files_uneven_counted",
    "self_batched",
}


@pytest.mark.parametrize("case", CASES)
def test_every_example_exactly_once_and_equal_steps(cluster_run: Any, case: str) -> None:
    _, cases, results = cluster_run
    expected = cases[case]["expected"]
    per_worker = [r[case] for r in results]

    seen: list[int] = []
    for result in per_worker:
        for ids in result["ids"].values():
            seen.extend(ids)
    duplicates = sorted({i for i in seen if seen.count(i) > 1})
    assert not duplicates, f"{case}: examples seen more than once: {duplicates}"
    assert sorted(seen) == sorted(expected), (
        f"{case}: missing {sorted(set(expected) - set(seen))}, "
        f"extra {sorted(set(seen) - set(expected))}"
    )
    steps = [len(result["per_step"]) for result in per_worker]
    assert len(set(steps)) == 1, f"{case}: steps per worker differ: {steps}"
    # The all-reduced count of each step equals what the workers saw in it.
    for step in range(steps[0]):
        seen_in_step = sum(sum(result["per_step"][step]) for result in per_worker)
        assert all(result["totals"][step] == seen_in_step for result in per_worker)


@pytest.mark.parametrize("case", CASES)
def test_dataset_info_matches_counted_examples(cluster_run: Any, case: str) -> None:
    _, cases, results = cluster_run
    per_worker = [r[case] for r in results]
    first = per_worker[0]
    if case not in KNOWN_COUNTS:
        # Files, generators and input functions are not counted up front: the info says so.
        assert first["info_steps"] is None and first["info_examples"] is None
        assert first["info_rows"] is None
        return
    counted = [
        [count for result in per_worker for count in result["per_step"][step]]
        for step in range(len(first["per_step"]))
    ]
    assert first["info_rows"] == counted
    assert first["info_steps"] == len(counted)
    assert first["info_examples"] == len(cases[case]["expected"])


def test_policies_chosen(cluster_run: Any) -> None:
    _, cases, results = cluster_run
    policies = {name: results[0][name]["policy"] for name in cases}
    assert policies == {
        "tensor_slices": "data",
        "numpy_shuffled": "data",
        "files_equal": "file",
        "files_uneven": "file",
        "files_fewer": "data",
        "generator": "data",
        "input_fn": "off",
        "partial_last_batch": "data",
        "data_on_files": "data",
        "dataset_reads_files": "file",
        "hint": "hint",
        "repeat_epochs": "data",
        "files_uneven_counted": "file",
        "self_batched": "off",
    }
    # FILE: each worker reads a disjoint set of files that together are all of them.
    for name in ("files_equal", "files_uneven"):
        assigned = results[0][name]["files"]
        flat = [f for files in assigned for f in files]
        assert len(flat) == len(set(flat)) == len(cases[name]["sizes"])
        assert all(files for files in assigned)


def test_repeat_epochs_second_epoch_is_exact_too(cluster_run: Any) -> None:
    _, cases, results = cluster_run
    second = [i for result in results for i in result["repeat_epochs"]["epoch2"]]
    assert sorted(second) == cases["repeat_epochs"]["expected"]


@pytest.mark.keras
def test_fit_and_evaluate_without_steps_over_two_workers(
    two_worker_phases: dict[str, Any],
) -> None:
    """``model.fit(dist, epochs=3)`` as written on one machine, over two real workers.

    Example ids are counted inside the model's step (metrics), apart from the builder's own
    bookkeeping: every epoch, and ``evaluate``, must see each example exactly once, and both
    workers must run the same number of steps. On tf_keras this needs the dataset adapter
    that ``build_distributed_dataset`` applies; on Keras 3 the keras#20585 workarounds.
    """
    reports = phase_results(two_worker_phases, "fit_ids")  # tests/two_worker_cluster.py
    for report in reports:
        assert report["keras3"] == IS_KERAS3
        for name, policy in (("arrays", "data"), ("files_uneven", "file")):
            case = report[name]
            n = case["n"]
            assert case["policy"] == policy
            assert case["seen"] == [n, n, n], name
            assert case["once"] == [n, n, n], name
            assert case["evaluate"] == [n, n], name
            assert case["iterations"] == 3 * case["steps_per_epoch"], name
    assert reports[0] == reports[1]
