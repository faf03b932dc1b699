"""PreemptionCheckpoint end to end: real processes, real signals, a one-run reference.

Each job trains a small model for 3 epochs on a builder dataset of 45 examples (6 steps of 8
per epoch, the last one partial), with op determinism and a seeded shuffle. A layer inside the
model counts the example ids each epoch trains on (independently of the callback). A run that
is stopped (SIGTERM to one worker, or SIGKILL) and then run again must end with the weights of
the uninterrupted run, and the interrupted epoch's ids must each be trained once.

Every stopped run is a process of its own (what the tests check is the process's stop and exit
status). The reruns of one cluster shape then train one after the other in one job (the first is
its process's first run), followed by the uninterrupted references of every setting of that
shape, each from its own seed and folders: a process start buys them nothing. The stopped runs
whose goodput is checked against the test's clock start as ``python -c`` (their start-up
includes TensorFlow's import, which goodput must count); the other jobs are forked from a
process that imported TensorFlow already (``support.preloaded``: about 2 s of CPU instead of 6).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from support.processes import free_port, start_python, tf_config, wait_all

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
import tfdp_utils as tdu
from tfdp_utils._tf import keras

out, directory = sys.argv[1], sys.argv[2]
N, EPOCHS = 45, 3
# A worker killed without notice: its peer's collective ends within the bound, not never.
strategy = tdu.auto_strategy(
    verbose=False, collective_timeout=float(os.environ.get("JOB_COLLECTIVE_TIMEOUT", "30"))
)
x = np.stack([np.arange(N), np.linspace(-1, 1, N), np.cos(np.arange(N))], 1).astype("float32")
y = (x[:, 1:2] * 3 + 1).astype("float32")
seen = None  # the run's id counts (a replica-local SUM variable, outside the model)


def local_counts():  # this worker's replicas' counts: read without a collective
    return np.sum([v.numpy() for v in strategy.experimental_local_results(seen)], axis=0).tolist()


class Count(keras.layers.Layer):  # counts the ids each replica trains on
    def call(self, inputs, training=None):
        if training:
            ids = tf.cast(inputs[:, 0], tf.int32)
            seen.assign_add(tf.math.bincount(ids, minlength=N, maxlength=N, dtype=tf.float32))
        return inputs[:, 1:]


class Record(keras.callbacks.Callback):
    def __init__(self, log, signal_at):
        super().__init__()
        self.log, self.signal_at = log, signal_at

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        seen.assign(tf.zeros([N]))

    def on_epoch_end(self, epoch, logs=None):
        self.log["epochs"][str(epoch)] = local_counts()

    def on_train_batch_end(self, batch, logs=None):
        self.log["batches"].append([self.epoch, batch])
        if self.signal_at and [self.epoch, batch] == self.signal_at[:2]:
            os.kill(os.getpid(), getattr(signal, self.signal_at[2]))


def custom_loop(model, dist, checkpoint, log, signal_at):  # the same with a custom step
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


def build_model(settings):
    accumulation = int(settings.get("JOB_ACCUMULATION", "1"))
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
        options = {"gradient_accumulation_steps": accumulation} if accumulation > 1 else {}
        if options and not hasattr(keras.optimizers.Adam(), "gradient_accumulation_steps"):
            options = {}  # tf_keras: tdu.enable_gradient_accumulation below
        model.compile(keras.optimizers.Adam(schedule, **options), "mse")
    if accumulation > 1 and not options:
        tdu.enable_gradient_accumulation(model, accumulation)
    return model


def train(settings, directory, tb, log):
    # Every setting's global state is set here, for each run of the process.
    global seen
    keras.utils.set_random_seed(int(settings.get("JOB_GLOBAL_SEED", "1")))
    mixed = settings.get("JOB_MIXED")
    keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
    signal_at = json.loads(settings.get("JOB_SIGNAL_AT", "null"))  # [epoch, batch, signal]
    every = json.loads(settings.get("JOB_EVERY", "null"))
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
    model = build_model(settings)
    checkpoint = tdu.callbacks.PreemptionCheckpoint(directory, every_steps=every)
    logger = tdu.callbacks.ThroughputLogger(tb, log_every_n_steps=2)
    backups = (
        [keras.callbacks.BackupAndRestore(tdu.worker_backup_dir(directory + "-backup", strategy))]
        if settings.get("JOB_BACKUP")
        else []
    )
    try:
        if settings.get("JOB_LOOP"):
            custom_loop(model, dist, checkpoint, log, signal_at)
        else:
            model.fit(
                dist,
                epochs=EPOCHS,
                verbose=0,
                callbacks=[*backups, logger, Record(log, signal_at), checkpoint],
            )
        log["weights"] = [w.tolist() for w in model.get_weights()]
    finally:
        log["ended_at"] = time.time()  # after fit returned (or stopped): the test's clock
        log["iterations"] = int(model.optimizer.iterations.numpy())
        log["partial"] = local_counts()
        log["resumed_from"] = checkpoint.resumed_from


# One run of the JOB_* variables, or (JOB_RUNS) one run of each setting in turn, each in its
# own folder (its JOB_DIR and JOB_TB, else numbered ones): the resumed runs and the
# uninterrupted references of one cluster shape, which need no process of their own.
runs = json.loads(os.environ.get("JOB_RUNS", "null"))
if runs is None:
    runs = [{k: v for k, v in os.environ.items() if k.startswith("JOB_")}]
    folders = [(directory, os.environ["JOB_TB"])]
else:
    folders = [
        (run.get("JOB_DIR", f"{directory}-{i}"), run.get("JOB_TB", f"{os.environ['JOB_TB']}-{i}"))
        for i, run in enumerate(runs)
    ]
logs = []
try:
    for settings, (run_directory, tb) in zip(runs, folders):
        logs.append({"epochs": {}, "batches": []})
        train(settings, run_directory, tb, logs[-1])
finally:
    with open(out, "w") as handle:
        json.dump(logs, handle)
"""


def _launch(
    tmp: Path,
    tag: str,
    directory: Path,
    workers: int,
    told: dict[str, str],
    *,
    preloaded: bool = True,
    **env: str,
) -> list[list[dict[str, Any]]]:
    """``workers`` job processes, the last one also ``told`` (a notice only it receives): each
    worker's logs (one per run of the job), with its exit status and stderr. ``preloaded``:
    forked from a process that imported TensorFlow already; else started as ``python -c``."""
    started, ports = time.time(), [free_port() for _ in range(workers)]
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
        processes.append(
            start_python(JOB, env=worker_env, args=(out, str(directory)), preloaded=preloaded)
        )
    outcomes = wait_all(processes, timeout=420, check=False)
    results = []
    for index, outcome in enumerate(outcomes):
        path = tmp / f"{tag}-{index}.json"
        # A process killed (or failed) before its first log holds one empty log.
        logs: list[dict[str, Any]] = (json.loads(path.read_text()) if path.exists() else []) or [{}]
        for log in logs:
            log["status"], log["stderr"] = outcome.returncode, outcome.stderr
            log["popen_at"] = started
        results.append(logs)
    return results


USERS_SETTINGS = [
    {"JOB_GLOBAL_SEED": "0", "JOB_MIXED": "1", "JOB_BACKUP": "1"},
    {"JOB_ACCUMULATION": "2", "JOB_MIXED": "1"},
    {"JOB_GLOBAL_SEED": "0", "JOB_ACCUMULATION": "2", "JOB_BACKUP": "1"},
]
"""The interaction matrix's 2-worker cells: global seed 0, mixed precision, gradient
accumulation and BackupAndRestore, crossed pairwise."""

USERS_IDS = ["seed0-mixed-backup", "accumulation-mixed", "seed0-accumulation-backup"]

REFERENCE_SETTINGS: dict[int, list[dict[str, str]]] = {
    1: [{}, {"JOB_LOOP": "1"}],
    2: [{}, {"JOB_LOOP": "1"}, *USERS_SETTINGS],
}
"""Every setting a test compares with, by number of workers."""


class Scenario(NamedTuple):
    """One stop of a job and its rerun."""

    told: list[Any]  # [epoch, batch, signal]: the notice only the last worker receives
    env: dict[str, str] = {}  # the job's settings, in both runs
    stop_env: dict[str, str] = {}  # settings of the stopped run only


SCENARIOS: dict[int, dict[str, Scenario]] = {
    1: {
        # Told after batch 1 or 4 of epoch 2: one process saves there (4: the resumed epoch
        # starts with its partial last step, cut 2 + 3 over the replicas).
        "notice-1": Scenario([1, 1, "SIGTERM"]),
        "notice-4": Scenario([1, 4, "SIGTERM"]),
        "killed": Scenario([1, 3, "SIGKILL"], {"JOB_EVERY": "4"}),
        "loop": Scenario([1, 2, "SIGTERM"], {"JOB_LOOP": "1"}),
    },
    2: {
        # Told after batch 4 of epoch 2: 2 workers stop after the next step, at the end of
        # the epoch, so that the resumed run starts epoch 3.
        "notice-4": Scenario([1, 4, "SIGTERM"]),
        "loop": Scenario([1, 2, "SIGTERM"], {"JOB_LOOP": "1"}),
        # Worker 1 dies after step 10. Its peer waits in the next step's collective until the
        # bound ends it: 10 s, not the 30 s of the other jobs, whose bound is never reached.
        "killed": Scenario([1, 3, "SIGKILL"], {"JOB_EVERY": "4"}, {"JOB_COLLECTIVE_TIMEOUT": "10"}),
        **{
            name: Scenario([1, 1, "SIGTERM"], settings)
            for name, settings in zip(USERS_IDS, USERS_SETTINGS, strict=True)
        },
    },
}
"""Every stop a test checks, by number of workers. The first one's rerun is the first run of
its process; the reruns after it run in the same process (see :func:`_jobs`)."""


class Jobs(NamedTuple):
    """Every run of one cluster shape: each worker's log per run."""

    folder: Path
    stopped: dict[str, list[dict[str, Any]]]
    saved: dict[str, list[str]]  # the checkpoints each stopped run left, listed before its rerun
    resumed: dict[str, list[dict[str, Any]]]
    references: list[list[dict[str, Any]]]  # REFERENCE_SETTINGS' order


_JOBS: dict[int, Jobs] = {}


def _jobs(factory: pytest.TempPathFactory, workers: int) -> Jobs:
    """Every scenario of ``workers`` workers stopped, then rerun, once per module.

    Each stopped run is a process of its own (what the tests check is its stop and exit
    status). The reruns then run one after the other in one job, each in its stopped run's
    folders and from its own seed, precision policy and settings, followed by the
    uninterrupted references: with op determinism and seeded shuffles a run is bit-identical
    wherever it runs, so a process start buys them nothing (the first rerun, a notice's, is
    still its process's first run)."""
    if workers in _JOBS:
        return _JOBS[workers]
    folder = factory.mktemp(f"{workers}-workers")
    scenarios = SCENARIOS[workers]
    stopped, saved = {}, {}
    for name, scenario in scenarios.items():
        told = {"JOB_SIGNAL_AT": json.dumps(scenario.told)}
        env = {**scenario.env, **scenario.stop_env}
        # A notice's stop starts the job whose goodput is checked: its start-up holds the import.
        fresh = name.startswith("notice-")
        launched = _launch(
            folder, f"stopped-{name}", folder / name, workers, told, preloaded=not fresh, **env
        )
        stopped[name] = [logs[0] for logs in launched]
        saved[name] = sorted(p.name for p in (folder / name).iterdir())
    runs = [
        {**scenario.env, "JOB_DIR": str(folder / name), "JOB_TB": str(folder / f"tb-{name}")}
        for name, scenario in scenarios.items()
    ]
    runs += REFERENCE_SETTINGS[workers]
    launched = _launch(
        folder, "reruns", folder / "reference", workers, {}, JOB_RUNS=json.dumps(runs)
    )
    # A run that failed ends its job: it and the runs after it show the job's status and stderr.
    by_run = [
        [logs[i] if i < len(logs) else {**logs[-1], "missing": True} for logs in launched]
        for i in range(len(runs))
    ]
    _JOBS[workers] = Jobs(
        folder, stopped, saved, dict(zip(scenarios, by_run, strict=False)), by_run[len(scenarios) :]
    )
    return _JOBS[workers]


def _reference(jobs: Jobs, workers: int, **env: str) -> list[dict[str, Any]]:
    reference = jobs.references[REFERENCE_SETTINGS[workers].index(env)]
    for log in reference:
        _ended_well(log)
    return reference


def _epoch_2_ids(stopped: list[dict[str, Any]], resumed: list[dict[str, Any]]) -> list[float]:
    """How often each id of epoch 2 was trained, over both runs and every worker."""
    # A resumed run that starts epoch 3 (stopped at epoch 2's end) trains none of epoch 2.
    parts = [log["partial"] for log in stopped]
    parts += [log["epochs"].get("1", [0.0] * 45) for log in resumed]
    counts: list[float] = np.sum(parts, axis=0).tolist()
    return counts


def _max_diff(a: list[Any], b: list[Any]) -> float:
    return max(float(np.max(np.abs(np.array(x) - np.array(y)))) for x, y in zip(a, b, strict=True))


def _ended_well(log: dict[str, Any]) -> None:
    assert log["status"] == 0 and "missing" not in log, log["stderr"][-4000:]


def test_the_exit_status_is_the_documented_one() -> None:
    import tfdp_utils as tdu

    assert tdu.callbacks.PreemptionCheckpoint.EXIT_STATUS == PREEMPTED


@pytest.mark.parametrize(
    ("workers", "batch"),
    [(1, 1), (1, 4), (2, 4)],
    ids=["1x2-replicas", "1x2-replicas-last-step", "2-workers-next-epoch"],
)
def test_a_notice_to_one_worker_stops_all_at_one_step_and_the_rerun_resumes_exactly(
    tmp_path_factory: pytest.TempPathFactory, workers: int, batch: int
) -> None:
    jobs = _jobs(tmp_path_factory, workers)
    reference = _reference(jobs, workers)
    # Told after step `batch` of epoch 2 (SCENARIOS): one process saves there; 2 workers after
    # the next step. The notice reaches the last worker only (one VM reclaimed).
    name = f"notice-{batch}"
    stopped, resumed = jobs.stopped[name], jobs.resumed[name]
    for log in stopped:
        assert log["status"] == PREEMPTED, log["stderr"][-4000:]
    # Every worker ended after the same step: the one after the notice's, where they agreed.
    last = {tuple(log["batches"][-1]) for log in stopped}
    assert len(last) == 1, last
    assert jobs.saved[name] == [f"ckpt-{stopped[0]['iterations']:012d}"]

    for before, log, ref in zip(stopped, resumed, reference, strict=True):
        _ended_well(log)
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
    log_dir = str(jobs.folder / f"tb-{name}")
    examples = read_runs(log_dir)["global"].series[tags.EXAMPLES]
    steps = [step for step, _ in examples]
    assert steps == sorted(set(steps)), steps
    assert stopped[0]["iterations"] in steps  # the stopped run's last point
    assert examples[-1] == (18, 3 * 45)
    counts = [value for _, value in examples]
    assert counts == sorted(counts)
    _check_goodput(log_dir, stopped, resumed)


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
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    jobs = _jobs(tmp_path_factory, 1)
    reference = _reference(jobs, 1)
    killed, resumed = jobs.stopped["killed"], jobs.resumed["killed"]  # every 4 steps
    assert killed[0]["status"] == -signal.SIGKILL
    assert jobs.saved["killed"] == ["ckpt-000000000004", "ckpt-000000000008"]  # killed at 10
    log = resumed[0]
    _ended_well(log)
    assert log["resumed_from"].endswith("ckpt-000000000008")
    assert log["batches"][0] == [1, 2]  # step 8 = epoch 2, 2 steps done
    assert _max_diff(log["weights"], reference[0]["weights"]) <= 1e-6


@pytest.mark.parametrize("workers", [1, 2], ids=["1x2-replicas", "2-workers"])
def test_a_custom_loop_stops_and_resumes_exactly_too(
    tmp_path_factory: pytest.TempPathFactory, workers: int
) -> None:
    jobs = _jobs(tmp_path_factory, workers)
    reference = _reference(jobs, workers, JOB_LOOP="1")
    for epoch in "012":  # each id once an epoch, over every worker
        assert np.sum([log["epochs"][epoch] for log in reference], axis=0).tolist() == [1.0] * 45
    stopped, resumed = jobs.stopped["loop"], jobs.resumed["loop"]  # told after step 3 of epoch 2
    # One process stops after the step it was told at; several after the step that follows,
    # all of them, where they agreed.
    last = 2 if workers == 1 else 3
    for log in stopped:
        assert log["status"] == PREEMPTED, log["stderr"][-4000:]
        assert log["batches"][-1] == [1, last]
    for log, ref in zip(resumed, reference, strict=True):
        _ended_well(log)
        assert log["batches"][0] == [1, last + 1]
        assert _max_diff(log["weights"], ref["weights"]) <= 1e-6
        assert log["iterations"] == ref["iterations"] == 18
    assert _epoch_2_ids(stopped, resumed) == [1.0] * 45


def test_one_worker_killed_without_notice_resumes_exactly_from_the_last_periodic_save(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    jobs = _jobs(tmp_path_factory, 2)
    reference = _reference(jobs, 2)
    killed, resumed = jobs.stopped["killed"], jobs.resumed["killed"]  # worker 1, after step 10
    assert killed[1]["status"] == -signal.SIGKILL
    assert killed[0]["status"] not in (0, PREEMPTED)  # its peer failed: nothing was saved
    assert jobs.saved["killed"] == ["ckpt-000000000004", "ckpt-000000000008"]
    for log, ref in zip(resumed, reference, strict=True):
        _ended_well(log)
        assert log["resumed_from"].endswith("ckpt-000000000008")
        assert log["batches"][0] == [1, 2]
        assert _max_diff(log["weights"], ref["weights"]) <= 1e-6
        assert log["iterations"] == 18


@pytest.mark.parametrize("name", USERS_IDS)
def test_two_workers_resume_exactly_under_users_settings(
    tmp_path_factory: pytest.TempPathFactory, name: str
) -> None:
    # The interaction matrix's 2-worker cells (tests/interactions/ runs 1 process).
    jobs = _jobs(tmp_path_factory, 2)
    reference = _reference(jobs, 2, **USERS_SETTINGS[USERS_IDS.index(name)])
    stopped, resumed = jobs.stopped[name], jobs.resumed[name]  # told after step 2 of epoch 2
    for log in stopped:
        assert log["status"] == PREEMPTED, log["stderr"][-4000:]
    assert len({tuple(log["batches"][-1]) for log in stopped}) == 1  # one agreed step
    for log, ref in zip(resumed, reference, strict=True):
        _ended_well(log)
        assert log["resumed_from"] and "ckpt-" in log["resumed_from"]
        assert log["iterations"] == ref["iterations"]
        assert _max_diff(log["weights"], ref["weights"]) <= 1e-6
    assert _epoch_2_ids(stopped, resumed) == [1.0] * 45
