"""build_distributed_dataset(service=...) on real tf.data service servers on 127.0.0.1.

Example ids are counted by the trainers, apart from the builder's own bookkeeping: every
epoch must hold each example exactly once (the synchronous mode's guarantee) and every
trainer the same number of steps. Servers start and stop inside the tests (in this process,
or as ``tfdp-utils data-service`` processes), every wait has a hard bound.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from support.processes import Process, free_port, result_line, start_python, tf_config, wait_all

import tfdp_utils as tdu
from tfdp_utils.data._pipeline import reader_threads
from tfdp_utils.data._sharding import MAX_PARALLEL_FILES, ShardingPlan, parallel_reads
from tfdp_utils.data.service import _modes as service_lib

pytestmark = pytest.mark.slow
svc = tf.data.experimental.service


@pytest.fixture(scope="module")
def service() -> Any:
    """1 dispatcher + 2 workers in this process, on free ports; stopped at the end."""
    dispatcher = svc.DispatchServer(svc.DispatcherConfig(port=free_port()))
    address = dispatcher.target.split("://")[1]
    workers = [
        svc.WorkerServer(svc.WorkerConfig(dispatcher_address=address, port=free_port()))
        for _ in range(2)
    ]
    deadline = time.monotonic() + 30
    while dispatcher._num_workers() < 2:
        assert time.monotonic() < deadline, "service workers did not register within 30 s"
        time.sleep(0.1)
    yield f"grpc://127.0.0.1:{address.rsplit(':', 1)[1]}"
    for worker in workers:
        worker.stop()
    dispatcher.stop()


def _epoch(strategy: Any, dist: Any, key: str | None = "id") -> tuple[list[int], list[list[int]]]:
    ids: list[int] = []
    rows = []
    for batch in dist:
        parts = strategy.experimental_local_results(batch[key] if key else batch)
        rows.append([int(p.shape[0]) for p in parts])
        for part in parts:
            ids.extend(part.numpy().tolist())
    return ids, rows


def test_reads_sized_by_latency_not_cores() -> None:
    assert [parallel_reads(n) for n in (0, 1, 8, 40)] == [1, 1, 8, MAX_PARALLEL_FILES]
    plan = ShardingPlan("file", "", 2, "files", files_per_worker=(("a",) * 8, ("b",) * 7))
    assert reader_threads(plan, cores=2) == 8 + 2  # a thread per read in flight + per core
    assert reader_threads(plan, cores=8) is None  # the reads fit the cores: tf.data's default
    assert reader_threads(ShardingPlan("data", "", 1, "arrays"), cores=2) is None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"service": 5050}, TypeError, "service must be a string"),
        ({"service": "http://h:1"}, ValueError, "'grpc://host:port'"),
        ({"service": "grpc://h:99999"}, ValueError, "outside 1..65535"),
        ({"service": "grpc://h:1", "service_mode": "coordinated"}, ValueError, "service mode"),
        ({"service": "grpc://h:1", "service_timeout": 0}, ValueError, "service_timeout"),
        ({"service": "grpc://h:1", "cache": True}, ValueError, "later epochs would not"),
    ],
)
def test_bad_service_arguments(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        tdu.build_distributed_dataset(np.arange(8), global_batch_size=4, **kwargs)


def test_missing_dispatcher_is_a_clear_error_within_the_bound() -> None:
    port = free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(service_lib.ServiceTimeoutError, match="service_timeout=2 s") as caught:
        tdu.build_distributed_dataset(
            np.arange(8),
            global_batch_size=4,
            service=f"grpc://127.0.0.1:{port}",
            service_timeout=2,
        )
    assert time.monotonic() - start < 10
    assert "TFDP_SERVICE_TIMEOUT" in str(caught.value)
    assert "tfdp-utils data-service dispatcher" in str(caught.value)


def test_distributed_epoch_refused_under_several_trainers() -> None:
    config = service_lib.check_service("grpc://127.0.0.1:1", "distributed_epoch", 1)
    assert config is not None
    plan = ShardingPlan("data", "", 2, "arrays", examples_per_worker=(5, 5))
    with pytest.raises(ValueError, match="would hang at the end of the epoch"):
        service_lib.service_plan(plan, config)


def test_one_trainer_two_replicas_two_service_workers(service: str) -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    n = 45

    def double(element: Any) -> Any:
        return {"id": element["id"], "twice": 2 * element["id"]}

    dist = tdu.build_distributed_dataset(
        {"id": np.arange(n)},
        strategy=strategy,
        global_batch_size=8,
        service=service,
        map_fn=double,
        shuffle_buffer_size=16,
    )
    plan = tdu.plan_sharding({"id": np.arange(n)}, strategy=strategy, service=service)
    assert "each example read by exactly one of them per epoch" in plan.reason
    assert "synchronous" in dist.tfdp_plan.reason
    for _ in range(2):  # each epoch: every example exactly once, rows as the info says
        ids, rows = _epoch(strategy, dist)
        assert sorted(ids) == list(range(n))
        info = dist.tfdp_info
        assert info.steps_per_epoch == len(rows)
        assert [list(info.examples_in_step(s)) for s in range(len(rows))] == rows

    dist = tdu.build_distributed_dataset(
        np.arange(n),
        strategy=strategy,
        global_batch_size=8,
        service=service,
        service_mode="distributed_epoch",
    )
    ids, rows = _epoch(strategy, dist, key=None)
    assert sorted(ids) == list(range(n))  # once each; the step count is up to the service
    assert dist.tfdp_info.steps_per_epoch is None
    assert "counts derived" in dist.tfdp_plan.reason


TRAINER = r"""
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import tfdp_utils as tdu

address, folder = sys.argv[1], sys.argv[2]
options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=90)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)

def parse(line):
    return {"id": tf.strings.to_number(line, tf.int64)}

files = sorted(os.path.join(folder, f) for f in os.listdir(folder))
out = {}
for name, kwargs in (
    ("arrays", dict(source={"id": np.arange(37)}, shuffle_buffer_size=8)),
    ("files", dict(source=files, reader=tf.data.TextLineDataset, map_fn=parse)),
):
    dist = tdu.build_distributed_dataset(
        strategy=strategy, global_batch_size=4, service=address, **kwargs)
    epochs = []
    for _ in range(2):
        ids, steps = [], 0
        for batch in dist:
            steps += 1
            for part in strategy.experimental_local_results(batch["id"]):
                ids.extend(part.numpy().tolist())
        epochs.append({"ids": ids, "steps": steps})
    out[name] = {"epochs": epochs, "policy": dist.tfdp_plan.policy}
print("RESULT " + json.dumps(out), flush=True)
"""


def test_two_trainer_workers_multi_worker_mirrored(service: str, tmp_path: Path) -> None:
    sizes = (9, 4, 7, 5)  # uneven files: FILE sharding gives the trainers unequal shares
    first = 1000
    for index, size in enumerate(sizes):
        ids = range(first, first + size)
        first += size
        (tmp_path / f"part-{index}.txt").write_text("".join(f"{i}\n" for i in ids))
    ports = [free_port() for _ in range(2)]
    processes = [
        start_python(
            TRAINER,
            args=[service, str(tmp_path)],
            env={"TF_CONFIG": tf_config(ports, index)},
            preloaded=True,
        )
        for index in range(2)
    ]
    results = [result_line(outcome) for outcome in wait_all(processes, timeout=240)]
    expected = {"arrays": list(range(37)), "files": list(range(1000, 1000 + sum(sizes)))}
    for name, want in expected.items():
        assert [r[name]["policy"] for r in results] == ["data" if name == "arrays" else "file"] * 2
        for epoch in range(2):
            seen = [i for r in results for i in r[name]["epochs"][epoch]["ids"]]
            assert sorted(seen) == want, (name, epoch)  # exactly once over both trainers
            steps = [r[name]["epochs"][epoch]["steps"] for r in results]
            assert steps[0] == steps[1], (name, epoch, steps)


SLOW_TRAINER = r"""
import os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
from tensorflow.python.data.experimental.ops import testing
import tfdp_utils as tdu

def slow(context):  # 0.02 s per example on the service workers
    return tf.data.Dataset.range(300).apply(testing.sleep(20000))

dist = tdu.build_distributed_dataset(
    slow, global_batch_size=4, service=sys.argv[1], service_timeout=float(sys.argv[2]))
seen = 0
for batch in dist:
    seen += int(batch.shape[0])
    if seen % 40 == 0:
        print("SEEN", seen, flush=True)
print("RESULT", seen, flush=True)
"""


def _cli(*args: str) -> Process:
    return Process([sys.executable, "-m", "tfdp_utils.cli", "data-service", *args])


def _wait_for(process: Process, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in process.stdout():
        assert process.poll() is None, process.tail()
        assert time.monotonic() < deadline, f"no {text!r} within {timeout} s:\n{process.tail()}"
        time.sleep(0.1)


def test_cli_servers_and_a_service_worker_killed_mid_epoch() -> None:
    """The trainer ends within service_timeout with the reason, instead of hanging.

    TensorFlow's own client waits forever for the dead worker's part of the epoch.
    """
    port = free_port()
    bound = 5
    # The servers start at once (each imports TensorFlow): the workers wait, within their
    # bound, for the dispatcher. The trainer's short bound covers its start-up check too, so
    # it starts once they are up.
    processes = [_cli("dispatcher", "--port", str(port), "--worker-timeout", "2")]
    processes += [_cli("worker", "--dispatcher", f"127.0.0.1:{port}") for _ in range(2)]
    trainer = None
    try:
        _wait_for(processes[0], f"service='grpc://127.0.0.1:{port}'", 90)
        assert "unauthenticated" in processes[0].stderr()
        for process in processes[1:]:
            _wait_for(process, "registered with the dispatcher", 90)
        trainer = start_python(
            SLOW_TRAINER, args=[f"grpc://127.0.0.1:{port}", str(bound)], preloaded=True
        )
        _wait_for(trainer, "SEEN 80", 90)
        processes[2].kill()  # one service worker dies holding part of the epoch
        killed = time.monotonic()
        # The trainer first takes what the other worker still holds (at most 300 examples
        # of 0.02 s), then waits; at most `bound` seconds later it ends.
        deadline = killed + 6 + bound + 60
        while trainer.poll() is None:
            assert time.monotonic() < deadline, trainer.tail()
            time.sleep(0.2)
        waited = time.monotonic() - killed
        assert trainer.poll() == 1, trainer.tail()
        assert f"beyond service_timeout={bound} s" in trainer.stderr(), trainer.tail()
        assert "RESULT" not in trainer.stdout()
        assert waited < 6 + bound + 60
    finally:
        for process in [*processes, *([trainer] if trainer else [])]:
            process.close()


def test_cli_worker_without_dispatcher_ends_within_its_bound() -> None:
    worker = _cli("worker", "--dispatcher", f"127.0.0.1:{free_port()}", "--dispatcher-timeout", "2")
    outcome = wait_all([worker], timeout=60, check=False)[0]
    assert outcome.returncode == 1
    assert "did not answer within 2 s" in outcome.stderr
