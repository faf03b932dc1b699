"""The elastic-resume tests' training job, one script for every source, and its launcher.

A plain module (imported as ``support.elastic_job``); importing it imports no TensorFlow.
:data:`JOB` trains a small model (Dense 4 tanh, Dense 1; Adam with a decaying learning rate)
for 3 epochs of a global batch of 8 from a builder dataset of the ids 0..47, with op
determinism and a seeded shuffle; a layer inside the model counts the ids each replica trains
on. Its source (``JOB_SOURCE``):

* ``arrays``: in-memory arrays (DATA sharding);
* ``files-data``: the text files of ``JOB_FILES``, every worker reading every file
  (``shard_policy='data'``);
* ``files``: those files, ``shard_policy='auto'`` (FILE: each worker its own files where
  there are enough of them).

Other settings: ``JOB_REPLICAS`` (logical CPU replicas of the process), ``JOB_SIGNAL_AT``
(``[epoch, batch]``: the process sends itself a notice after that batch), ``JOB_SEED`` (the
builder's ``seed=``, JSON; ``null`` for none), ``JOB_TB`` (a ``ThroughputLogger`` log folder,
its log of a shape change printed), ``JOB_BACKUP`` (Keras' ``BackupAndRestore`` beside, each
worker its own folder; ``JOB_BACKUP_FREQ``: its ``save_freq`` in steps, else ``"epoch"``),
``JOB_EVERY`` (``PreemptionCheckpoint``'s ``every_steps``), ``JOB_DIE_AT`` (``[epoch, batch]``:
after that batch the process writes its log, with the ids counted after each of its steps, and
ends at once with status :data:`DIED`, a death without notice), ``JOB_MIXED`` (mixed
precision: compile wraps the optimizer in a ``LossScaleOptimizer``), ``JOB_BATCH`` (the global
batch, 8 unless set: 12 divides over 2 and 3 workers). The process writes its log
(JSON) to its first argument; the second is the ``PreemptionCheckpoint`` directory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from support.processes import Process, free_port, start_python, tf_config, wait_all

PREEMPTED = 75
DIED = 86
"""The status of a job process ended by ``JOB_DIE_AT`` (``os._exit``: nothing runs after it)."""
N, STEPS, EPOCHS = 48, 6, 3

JOB = r"""
import json, logging, os, signal, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

REPLICAS = int(os.environ["JOB_REPLICAS"])
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
tf.config.experimental.enable_op_determinism()
tf.keras.utils.set_random_seed(1)
import tfdp_utils as tdu
from tfdp_utils._tf import keras

out, directory = sys.argv[1], sys.argv[2]
source = os.environ["JOB_SOURCE"]
signal_at = json.loads(os.environ.get("JOB_SIGNAL_AT", "null"))  # [epoch, batch]
die_at = json.loads(os.environ.get("JOB_DIE_AT", "null"))  # [epoch, batch]
N, EPOCHS = 48, 3
BATCH = int(os.environ.get("JOB_BATCH", "8"))

strategy = tdu.auto_strategy(verbose=False, collective_timeout=30, resume_from=directory)
seed = json.loads(os.environ.get("JOB_SEED", "5"))
if source == "arrays":
    x = np.stack([np.arange(N), np.linspace(-1, 1, N), np.cos(np.arange(N))], 1).astype("float32")
    y = (x[:, 1:2] * 3 + 1).astype("float32")
    dist = tdu.build_distributed_dataset(
        (x, y), strategy=strategy, global_batch_size=BATCH, shuffle_buffer_size=64, seed=seed
    )
else:
    def parse(line):  # an id -> (id, a feature, another), a target
        i = tf.strings.to_number(line, tf.float32)
        x = tf.stack([i, i / 24.0 - 1.0, tf.cos(i)])
        return x, x[1:2] * 3.0 + 1.0

    folder = os.environ["JOB_FILES"]
    files = sorted(os.path.join(folder, name) for name in os.listdir(folder))
    dist = tdu.build_distributed_dataset(
        files, strategy=strategy, global_batch_size=BATCH, reader=tf.data.TextLineDataset,
        map_fn=parse, count_examples=True, shuffle_buffer_size=64, seed=seed,
        shard_policy="data" if source == "files-data" else "auto",
    )
with strategy.scope():
    seen = tf.Variable(
        tf.zeros([N]),
        trainable=False,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM,
    )


def local_counts():  # this worker's replicas' counts: read without a collective
    return np.sum([v.numpy() for v in strategy.experimental_local_results(seen)], axis=0).tolist()


class Count(keras.layers.Layer):  # counts the ids each replica trains on
    def call(self, inputs, training=None):
        if training:
            ids = tf.cast(inputs[:, 0], tf.int32)
            seen.assign_add(tf.math.bincount(ids, minlength=N, maxlength=N, dtype=tf.float32))
        return inputs[:, 1:]


if os.environ.get("JOB_MIXED"):  # compile wraps the optimizer in a LossScaleOptimizer
    keras.mixed_precision.set_global_policy("mixed_float16")
with strategy.scope():
    layers = [keras.Input((3,)), Count(), keras.layers.Dense(4, activation="tanh")]
    model = keras.Sequential([*layers, keras.layers.Dense(1)])
    # A learning-rate schedule: a resume that restarted it would end on other weights.
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=4, decay_rate=0.8)
    model.compile(keras.optimizers.Adam(schedule), "mse")

log = {
    "epochs": {}, "weights_at": {}, "batches": [], "begun": [], "counts": [],
    "reason": tdu.strategy.explain(strategy).reason, "policy": dist.tfdp.plan.policy,
    "optimizer": type(model.optimizer).__name__,
}


class Record(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        log["begun"].append(epoch)
        seen.assign(tf.zeros([N]))

    def on_epoch_end(self, epoch, logs=None):
        log["epochs"][str(epoch)] = local_counts()
        log["weights_at"][str(epoch)] = [w.tolist() for w in model.get_weights()]

    def on_train_batch_end(self, batch, logs=None):
        log["batches"].append([self.epoch, batch])
        if signal_at and [self.epoch, batch] == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        if die_at:  # the ids of the epoch counted after each step, then a death without notice
            log["counts"].append(local_counts())
            if [self.epoch, batch] == die_at:
                with open(out, "w") as handle:
                    json.dump(log, handle)
                os._exit(86)


every = json.loads(os.environ.get("JOB_EVERY", "null"))
checkpoint = tdu.callbacks.PreemptionCheckpoint(directory, every_steps=every)
extra = []
if os.environ.get("JOB_BACKUP"):  # Keras' own backups, each worker its own folder
    backup = tdu.worker_backup_dir(directory + "-backup", strategy)
    freq = json.loads(os.environ.get("JOB_BACKUP_FREQ", '"epoch"'))
    extra.append(keras.callbacks.BackupAndRestore(backup, save_freq=freq))
logger = None
if os.environ.get("JOB_TB"):
    logging.getLogger("tfdp_utils").setLevel(logging.INFO)  # its log of a shape change
    logging.getLogger("tfdp_utils").addHandler(logging.StreamHandler())
    logger = tdu.callbacks.ThroughputLogger(os.environ["JOB_TB"], log_every_n_steps=2)
    extra.append(logger)
try:
    model.fit(dist, epochs=EPOCHS, verbose=0, callbacks=[*extra, Record(), checkpoint])
    log["weights"] = [w.tolist() for w in model.get_weights()]
finally:
    log["iterations"] = int(model.optimizer.iterations.numpy())
    log["partial"] = local_counts()
    log["resumed_from"] = checkpoint.resumed_from
    if logger is not None:
        log["shape_change"] = logger.summary().get("shape_change")
    with open(out, "w") as handle:
        json.dump(log, handle)
"""


def write_files(folder: Path, sizes: Sequence[int]) -> Path:
    """Text files of the ids 0..sum(sizes) - 1 in order, ``sizes[i]`` lines in file ``i``."""
    folder.mkdir()
    first = 0
    for index, size in enumerate(sizes):
        lines = "".join(f"{i}\n" for i in range(first, first + size))
        (folder / f"part-{index}.txt").write_text(lines)
        first += size
    return folder


def run_job(
    tmp: Path,
    tag: str,
    directory: Path,
    shape: tuple[int, int],
    signal_at: list[int] | None = None,
    **settings: str,
) -> list[dict[str, Any]]:
    """The job on ``shape`` (workers, replicas each) with ``settings`` (``JOB_SOURCE`` ...);
    the last worker alone gets the notice. Each worker's log, with its exit status and stderr."""
    workers, replicas = shape
    ports = [free_port() for _ in range(workers)]
    processes: list[Process] = []
    for index in range(workers):
        env: dict[str, str | None] = {
            "JOB_REPLICAS": str(replicas),
            "TF_CONFIG": tf_config(ports, index) if workers > 1 else None,
            **settings,
        }
        if signal_at is not None and index == workers - 1:
            env["JOB_SIGNAL_AT"] = json.dumps(signal_at)
        out = str(tmp / f"{tag}-{index}.json")
        # Forked after TensorFlow's import (support.preloaded): nothing here times the start-up.
        processes.append(start_python(JOB, env=env, args=(out, str(directory)), preloaded=True))
    outcomes = wait_all(processes, timeout=420, check=False)
    results = []
    for index, outcome in enumerate(outcomes):
        path = tmp / f"{tag}-{index}.json"
        log: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        log["status"], log["stderr"] = outcome.returncode, outcome.stderr
        results.append(log)
    return results
