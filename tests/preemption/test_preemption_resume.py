"""PreemptionCheckpoint end to end: real processes, real signals, a one-run reference.

Each job trains a small model for 3 epochs on a builder dataset of 45 examples (6 steps of 8
per epoch, the last one partial), with op determinism and a seeded shuffle. A layer inside the
model counts the example ids each epoch trains on (independently of the callback). A run that
is stopped (SIGTERM to one worker, or SIGKILL) and then run again must end with the weights of
the uninterrupted run, and the interrupted epoch's ids must each be trained once.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.processes import Process, free_port, start_python, tf_config, wait_all

from tfdp_utils.throughput import _tags as tags
from tfdp_utils.throughput._report import read_runs
from tfdp_utils.throughput._summary import summarize

pytestmark = pytest.mark.keras

PREEMPTED = 75  # tdu.preemption.PREEMPTED_EXIT_STATUS, checked against it below

JOB = r"""
import json, os, signal, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

REPLICAS = int(os.environ["JOB_REPLICAS"])
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
tf.config.experimental.enable_op_determinism()
tf.keras.utils.set_random_seed(int(os.environ.get("JOB_GLOBAL_SEED", "1")))
import tfdp_utils as tdu
from tfdp_utils._tf import keras

out, directory = sys.argv[1], sys.argv[2]
signal_at = json.loads(os.environ.get("JOB_SIGNAL_AT", "null"))  # [epoch, batch, signal name]
every = json.loads(os.environ.get("JOB_EVERY", "null"))
N, EPOCHS = 45, 3


def local_counts():  # this worker's replicas' counts: read without a collective
    return np.sum([v.numpy() for v in strategy.experimental_local_results(seen)], axis=0).tolist()

# A worker killed without notice: its peer's collective ends within the bound, not never.
strategy = tdu.auto_strategy(verbose=False, collective_timeout=30)
x = np.stack([np.arange(N), np.linspace(-1, 1, N), np.cos(np.arange(N))], 1).astype("float32")
y = (x[:, 1:2] * 3 + 1).astype("float32")
dist = tdu.build_distributed_dataset(
    (x, y), strategy=strategy, global_batch_size=8, shuffle_buffer_size=64, seed=5
)
with strategy.scope():
    seen = tf.Variable(
        tf.zeros([N]),
        trainable=False,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM,
    )


class Count(keras.layers.Layer):  # counts the ids each replica trains on
    def call(self, inputs, training=None):
        if training:
            ids = tf.cast(inputs[:, 0], tf.int32)
            seen.assign_add(tf.math.bincount(ids, minlength=N, maxlength=N, dtype=tf.float32))
        return inputs[:, 1:]


ACCUMULATION = int(os.environ.get("JOB_ACCUMULATION", "1"))
if os.environ.get("JOB_MIXED"):
    keras.mixed_precision.set_global_policy("mixed_float16")
with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((3,)),
            Count(dtype="float32"),
            keras.layers.Dense(4, activation="tanh"),
            keras.layers.Dense(1, dtype="float32"),
        ]
    )
    # A learning-rate schedule: a resume that restarted it would end on other weights.
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=4, decay_rate=0.8)
    options = {"gradient_accumulation_steps": ACCUMULATION} if ACCUMULATION > 1 else {}
    if options and not hasattr(keras.optimizers.Adam(), "gradient_accumulation_steps"):
        options = {}  # tf_keras: tdu.enable_gradient_accumulation below
    model.compile(keras.optimizers.Adam(schedule, **options), "mse")
if ACCUMULATION > 1 and not options:
    tdu.enable_gradient_accumulation(model, ACCUMULATION)

log = {"epochs": {}, "batches": []}


class Record(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        seen.assign(tf.zeros([N]))

    def on_epoch_end(self, epoch, logs=None):
        log["epochs"][str(epoch)] = local_counts()

    def on_train_batch_end(self, batch, logs=None):
        log["batches"].append([self.epoch, batch])
        if signal_at and [self.epoch, batch] == signal_at[:2]:
            os.kill(os.getpid(), getattr(signal, signal_at[2]))


def custom_loop():  # the same training with tdu.make_distributed_train_step
    def loss(y_true, y_pred):
        return tf.reduce_mean(tf.square(y_true - y_pred), axis=-1)

    train_step = tdu.make_distributed_train_step(
        model=model, loss=loss, optimizer=model.optimizer, strategy=strategy
    )
    current = None
    with checkpoint.loop(model, dist, epochs=EPOCHS) as batches:
        for epoch, step, batch in batches:
            if epoch != current:
                if current is not None:
                    log["epochs"][str(current)] = local_counts()
                current = epoch
                seen.assign(tf.zeros([N]))
            train_step(batch)
            log["batches"].append([epoch, step])
            if signal_at and [epoch, step] == signal_at[:2]:
                os.kill(os.getpid(), getattr(signal, signal_at[2]))
    log["epochs"][str(current)] = local_counts()


checkpoint = tdu.callbacks.PreemptionCheckpoint(directory, every_steps=every)
logger = tdu.callbacks.ThroughputLogger(os.environ["JOB_TB"], log_every_n_steps=2)
backups = (
    [keras.callbacks.BackupAndRestore(tdu.worker_backup_dir(directory + "-backup", strategy))]
    if os.environ.get("JOB_BACKUP")
    else []
)
try:
    if os.environ.get("JOB_LOOP"):
        custom_loop()
    else:
        model.fit(
            dist, epochs=EPOCHS, verbose=0, callbacks=[*backups, logger, Record(), checkpoint]
        )
    log["weights"] = [w.tolist() for w in model.get_weights()]
finally:
    log["ended_at"] = time.time()  # after fit returned (or stopped): the test's clock
    log["iterations"] = int(model.optimizer.iterations.numpy())
    log["partial"] = local_counts()
    log["resumed_from"] = checkpoint.resumed_from
    with open(out, "w") as handle:
        json.dump(log, handle)
"""


def _start(
    tmp: Path, tag: str, directory: Path, workers: int, env: dict[str, str], told: dict[str, str]
) -> list[Process]:
    """``workers`` job processes; the last one also gets ``told`` (a notice only it receives)."""
    ports = [free_port() for _ in range(workers)]
    processes = []
    for index in range(workers):
        worker_env: dict[str, str | None] = {
            "JOB_REPLICAS": "2" if workers == 1 else "1",
            "TF_CONFIG": tf_config(ports, index) if workers > 1 else None,
            "JOB_TB": str(tmp / f"tb-{directory.name}"),
            **env,
            **(told if index == workers - 1 else {}),
        }
        out = str(tmp / f"{tag}-{index}.json")
        processes.append(start_python(JOB, env=worker_env, args=(out, str(directory))))
    return processes


def _run(
    tmp: Path,
    tag: str,
    directory: Path,
    workers: int,
    told: dict[str, str] | None = None,
    **env: str,
) -> list[dict[str, Any]]:
    started = time.time()
    processes = _start(tmp, tag, directory, workers, env, told or {})
    outcomes = wait_all(processes, timeout=420, check=False)
    results = []
    for index, outcome in enumerate(outcomes):
        path = tmp / f"{tag}-{index}.json"
        log: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        log["status"], log["stderr"] = outcome.returncode, outcome.stderr
        log["popen_at"] = started
        results.append(log)
    return results


_REFERENCES: dict[tuple[int, tuple[tuple[str, str], ...]], list[dict[str, Any]]] = {}


def _reference(factory: pytest.TempPathFactory, workers: int, **env: str) -> list[dict[str, Any]]:
    """The uninterrupted run of these settings, run once per module and shared by its tests:
    with op determinism and seeded shuffles, a rerun is bit-identical."""
    key = (workers, tuple(sorted(env.items())))
    if key not in _REFERENCES:
        folder = factory.mktemp("reference")
        runs = _run(folder, "reference", folder / "job", workers, **env)
        for log in runs:
            assert log["status"] == 0, log["stderr"][-4000:]
        _REFERENCES[key] = runs
    return _REFERENCES[key]


def _epoch_2_ids(stopped: list[dict[str, Any]], resumed: list[dict[str, Any]]) -> list[float]:
    """How often each id of epoch 2 was trained, over both runs and every worker."""
    # A resumed run that starts epoch 3 (stopped at epoch 2's end) trains none of epoch 2.
    parts = [log["partial"] for log in stopped]
    parts += [log["epochs"].get("1", [0.0] * 45) for log in resumed]
    counts: list[float] = np.sum(parts, axis=0).tolist()
    return counts


def _max_diff(a: list[Any], b: list[Any]) -> float:
    return max(float(np.max(np.abs(np.array(x) - np.array(y)))) for x, y in zip(a, b, strict=True))


def test_the_exit_status_is_the_documented_one() -> None:
    import tfdp_utils as tdu

    assert tdu.callbacks.PreemptionCheckpoint.EXIT_STATUS == PREEMPTED


@pytest.mark.parametrize(
    ("workers", "batch"),
    [(1, 1), (1, 4), (2, 4)],
    ids=["1x2-replicas", "1x2-replicas-last-step", "2-workers-next-epoch"],
)
def test_a_notice_to_one_worker_stops_all_at_one_step_and_the_rerun_resumes_exactly(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, workers: int, batch: int
) -> None:
    reference = _reference(tmp_path_factory, workers)
    # Told after step `batch` of epoch 2: one process saves there (4: the resumed epoch starts
    # with its partial last step, cut 2 + 3 over the replicas); 2 workers after the next step
    # (4: at the end of the epoch, so that the resumed run starts epoch 3).
    # The notice reaches the last worker only (one VM reclaimed).
    told = {"JOB_SIGNAL_AT": json.dumps([1, batch, "SIGTERM"])}
    stopped = _run(tmp_path, "stopped", tmp_path / "job", workers, told)
    for log in stopped:
        assert log["status"] == PREEMPTED, log["stderr"][-4000:]
    # Every worker ended after the same step: the one after the notice's, where they agreed.
    last = {tuple(log["batches"][-1]) for log in stopped}
    assert len(last) == 1, last
    assert [p.name for p in (tmp_path / "job").iterdir()] == [
        f"ckpt-{stopped[0]['iterations']:012d}"
    ]

    resumed = _run(tmp_path, "resumed", tmp_path / "job", workers)
    for before, log, ref in zip(stopped, resumed, reference, strict=True):
        assert log["status"] == 0, log["stderr"][-4000:]
        assert log["resumed_from"] and log["resumed_from"].endswith(
            f"ckpt-{before['iterations']:012d}"
        )
        assert _max_diff(log["weights"], ref["weights"]) <= 1e-6
        assert log["iterations"] == ref["iterations"] == 18
        epoch, batch = before["batches"][-1]
        following = [epoch, batch + 1] if batch + 1 < 6 else [epoch + 1, 0]
        assert log["batches"][0] == following  # Keras' step numbers go on
    # Epoch 2's ids over the two runs, counted on every replica of every worker: each once.
    assert _epoch_2_ids(stopped, resumed) == [1.0] * 45
    # TensorBoard, read back over both runs: the step axis goes on without a repeated or a
    # missing stretch, and the last count is every example of the 3 epochs.
    examples = read_runs(str(tmp_path / "tb-job"))["global"].series[tags.EXAMPLES]
    steps = [step for step, _ in examples]
    assert steps == sorted(set(steps)), steps
    assert stopped[0]["iterations"] in steps  # the stopped run's last point
    assert examples[-1] == (18, 3 * 45)
    counts = [value for _, value in examples]
    assert counts == sorted(counts)
    _check_goodput(str(tmp_path / "tb-job"), stopped, resumed)


def _check_goodput(
    log_dir: str, stopped: list[dict[str, Any]], resumed: list[dict[str, Any]]
) -> None:
    """The job's goodput over its two runs against the test's own clock: the runs' starts
    (before each Popen) and the chief's ``ended_at`` (after its fit returned)."""
    job = summarize(read_runs(log_dir))["goodput"]
    assert job is not None and job["fits"] == 2, job
    assert not any("killed" in note for note in job["notes"])  # both runs wrote their ledger
    span = resumed[0]["ended_at"] - stopped[0]["popen_at"]
    assert span - 3.0 <= job["wall_seconds"] <= span, (job["wall_seconds"], span)
    # The restart: from the stopped chief's fit end (before its ended_at) to the resumed
    # chief's process start (after its Popen).
    gap = job["losses"]["restarts"]["seconds"]
    assert resumed[0]["popen_at"] - stopped[0]["ended_at"] - 0.05 <= gap
    assert gap <= resumed[0]["popen_at"] - stopped[0]["popen_at"]
    assert 0 < job["goodput"] < 1 and job["productive_seconds"] > 0


def test_a_killed_job_resumes_exactly_from_its_last_periodic_checkpoint(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    reference = _reference(tmp_path_factory, 1)
    killed = _run(
        tmp_path,
        "killed",
        tmp_path / "job",
        1,
        {"JOB_SIGNAL_AT": json.dumps([1, 3, "SIGKILL"])},
        JOB_EVERY="4",
    )
    assert killed[0]["status"] == -signal.SIGKILL
    names = sorted(p.name for p in (tmp_path / "job").iterdir())
    assert names == ["ckpt-000000000004", "ckpt-000000000008"]  # steps 4 and 8; killed at 10
    resumed = _run(tmp_path, "resumed", tmp_path / "job", 1, JOB_EVERY="4")
    log = resumed[0]
    assert log["status"] == 0, log["stderr"][-4000:]
    assert log["resumed_from"].endswith("ckpt-000000000008")
    assert log["batches"][0] == [1, 2]  # step 8 = epoch 2, 2 steps done
    assert _max_diff(log["weights"], reference[0]["weights"]) <= 1e-6


@pytest.mark.parametrize("workers", [1, 2], ids=["1x2-replicas", "2-workers"])
def test_a_custom_loop_stops_and_resumes_exactly_too(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, workers: int
) -> None:
    reference = _reference(tmp_path_factory, workers, JOB_LOOP="1")
    for epoch in "012":  # each id once an epoch, over every worker
        assert np.sum([log["epochs"][epoch] for log in reference], axis=0).tolist() == [1.0] * 45
    told = {"JOB_SIGNAL_AT": json.dumps([1, 2, "SIGTERM"])}
    stopped = _run(tmp_path, "stopped", tmp_path / "job", workers, told, JOB_LOOP="1")
    # One process stops after the step it was told at; several after the step that follows,
    # all of them, where they agreed.
    last = 2 if workers == 1 else 3
    for log in stopped:
        assert log["status"] == PREEMPTED, log["stderr"][-4000:]
        assert log["batches"][-1] == [1, last]
    resumed = _run(tmp_path, "resumed", tmp_path / "job", workers, JOB_LOOP="1")
    for log, ref in zip(resumed, reference, strict=True):
        assert log["status"] == 0, log["stderr"][-4000:]
        assert log["batches"][0] == [1, last + 1]
        assert _max_diff(log["weights"], ref["weights"]) <= 1e-6
        assert log["iterations"] == ref["iterations"] == 18
    assert _epoch_2_ids(stopped, resumed) == [1.0] * 45


def test_one_worker_killed_without_notice_resumes_exactly_from_the_last_periodic_save(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    reference = _reference(tmp_path_factory, 2)
    killed = _run(
        tmp_path,
        "killed",
        tmp_path / "job",
        2,
        {"JOB_SIGNAL_AT": json.dumps([1, 3, "SIGKILL"])},  # worker 1 dies after step 10
        JOB_EVERY="4",
    )
    assert killed[1]["status"] == -signal.SIGKILL
    assert killed[0]["status"] not in (0, PREEMPTED)  # its peer failed: nothing was saved
    names = sorted(p.name for p in (tmp_path / "job").iterdir())
    assert names == ["ckpt-000000000004", "ckpt-000000000008"]
    resumed = _run(tmp_path, "resumed", tmp_path / "job", 2, JOB_EVERY="4")
    for log, ref in zip(resumed, reference, strict=True):
        assert log["status"] == 0, log["stderr"][-4000:]
        assert log["resumed_from"].endswith("ckpt-000000000008")
        assert log["batches"][0] == [1, 2]
        assert _max_diff(log["weights"], ref["weights"]) <= 1e-6
        assert log["iterations"] == 18


@pytest.mark.parametrize(
    "settings",
    [
        {"JOB_GLOBAL_SEED": "0", "JOB_MIXED": "1", "JOB_BACKUP": "1"},
        {"JOB_ACCUMULATION": "2", "JOB_MIXED": "1"},
        {"JOB_GLOBAL_SEED": "0", "JOB_ACCUMULATION": "2", "JOB_BACKUP": "1"},
    ],
    ids=["seed0-mixed-backup", "accumulation-mixed", "seed0-accumulation-backup"],
)
def test_two_workers_resume_exactly_under_users_settings(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, settings: dict[str, str]
) -> None:
    # The interaction matrix's 2-worker cells (tests/interactions/ runs 1 process): global
    # seed 0, mixed precision, gradient accumulation and BackupAndRestore, crossed pairwise.
    reference = _reference(tmp_path_factory, 2, **settings)
    told = {"JOB_SIGNAL_AT": json.dumps([1, 1, "SIGTERM"])}
    stopped = _run(tmp_path, "stopped", tmp_path / "job", 2, told, **settings)
    for log in stopped:
        assert log["status"] == PREEMPTED, log["stderr"][-4000:]
    assert len({tuple(log["batches"][-1]) for log in stopped}) == 1  # one agreed step
    resumed = _run(tmp_path, "resumed", tmp_path / "job", 2, **settings)
    for log, ref in zip(resumed, reference, strict=True):
        assert log["status"] == 0, log["stderr"][-4000:]
        assert log["resumed_from"] and "ckpt-" in log["resumed_from"]
        assert log["iterations"] == ref["iterations"]
        assert _max_diff(log["weights"], ref["weights"]) <= 1e-6
    assert _epoch_2_ids(stopped, resumed) == [1.0] * 45
