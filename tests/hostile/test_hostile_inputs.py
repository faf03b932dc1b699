"""Hostile-input campaign: every public argument and environment variable, given wrong input.

Each row is one case: what is called, and either the clear error it must raise (its type and a
fragment of the message that names what was received or expected) or a documented acceptance
(the input is legitimate, and the row says why). A case never hangs: the whole table runs in
one process. docs/errors.md states the campaign's counts over every table of
``tests/hostile/``; ``test_hostile_counts.py`` keeps them true.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.hostile import Accepts, Case, Raises, check_case, parametrize

import tfdp_utils as tdu
from tfdp_utils._tf import keras
from tfdp_utils.cluster._config import parse_tf_config
from tfdp_utils.cluster._slurm import parse_slurm
from tfdp_utils.strategy._collective_bound import resolve_collective_timeout


def _strategy() -> Any:
    return tdu.auto_strategy(devices=["/cpu:0", "/cpu:1"])


def _model(strategy: Any) -> Any:
    with strategy.scope():
        return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])


def _compile(**kwargs: Any) -> Any:
    """Compile under a 2-replica strategy (whose Keras workarounds are then applied)."""
    strategy = _strategy()
    model = _model(strategy)
    with strategy.scope():
        model.compile("sgd", "mse", **kwargs)
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0)
    return model


X = np.arange(20, dtype="float32").reshape(10, 2)
Y = np.arange(10)


SLURM = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "n[1-2]"}

CASES: list[tuple[str, Callable[[], Any], Raises | Accepts]] = [
    # auto_strategy / choose_strategy / detect_environment
    ("prefer=3", lambda: tdu.auto_strategy(prefer=3), Raises(ValueError, r"prefer=3 .*'auto'")),
    ("prefer='gpus'", lambda: tdu.auto_strategy("gpus"), Raises(ValueError, r"prefer='gpus'")),
    ("devices='cpu'", lambda: tdu.auto_strategy(devices="cpu"), Raises(TypeError, "a list")),
    ("devices=[3]", lambda: tdu.auto_strategy(devices=[3]), Raises(TypeError, "device must be")),
    ("devices=[]", lambda: tdu.auto_strategy(devices=[]), Raises(ValueError, "names no device")),
    (
        "devices=['/gpu:7']",
        lambda: tdu.auto_strategy(devices=["/gpu:7"]),
        Raises(ValueError, "not visible"),
    ),
    (
        "devices=['banana']",
        lambda: tdu.auto_strategy(devices=["banana"]),
        Raises(ValueError, "not a device name"),
    ),
    (
        "devices twice",
        lambda: tdu.auto_strategy(devices=["/cpu:0", "/cpu:0"]),
        Raises(ValueError, "names a device twice"),
    ),
    ("tpu=5", lambda: tdu.auto_strategy(tpu=5), Raises(TypeError, "tpu must be a string")),
    ("probe_timeout=0", lambda: tdu.auto_strategy(probe_timeout=0), Raises(ValueError, "=0")),
    (
        "probe_timeout='5'",
        lambda: tdu.auto_strategy(probe_timeout="5"),
        Raises(TypeError, "probe_timeout must be a number of seconds"),
    ),
    (
        "cluster_timeout='abc'",
        lambda: tdu.auto_strategy(cluster_timeout="abc"),
        Raises(TypeError, "cluster_timeout must be a number of seconds"),
    ),
    (
        "cluster_timeout=-1",
        lambda: tdu.auto_strategy(cluster_timeout=-1),
        Raises(ValueError, "cluster_timeout=-1"),
    ),
    (
        "collective_timeout='x'",
        lambda: tdu.auto_strategy(collective_timeout="x"),
        Raises(ValueError, "collective_timeout='x' must be a positive number of seconds"),
    ),
    (
        "collective_timeout=-1",
        lambda: tdu.auto_strategy(collective_timeout=-1),
        Raises(ValueError, "collective_timeout=-1"),
    ),
    (
        "collective_timeout=None",
        lambda: resolve_collective_timeout(None),
        Accepts("None (or 0) turns the collective bound off, as documented"),
    ),
    (
        "choose_strategy(env=3)",
        lambda: tdu.choose_strategy(3),
        Raises(TypeError, "env must be an Environment"),
    ),
    (
        "detect_environment(tpu=3)",
        lambda: tdu.detect_environment(tpu=3),
        Raises(TypeError, "tpu must be a string"),
    ),
    (
        "detect_environment(environ=3)",
        lambda: tdu.detect_environment(environ=3),
        Raises(TypeError, "environ must be a mapping"),
    ),
    (
        "cluster_task_type(environ=3)",
        lambda: tdu.cluster_task_type(3),
        Raises(TypeError, "environ must be a mapping"),
    ),
    # batch sizes, learning rates, steps
    (
        "global_batch_size(0)",
        lambda: tdu.global_batch_size(0),
        Raises(ValueError, "per_replica_batch_size must be a positive integer"),
    ),
    (
        "global_batch_size('8')",
        lambda: tdu.global_batch_size("8"),
        Raises(TypeError, "per_replica_batch_size must be an integer"),
    ),
    (
        "global_batch_size(strategy='mirrored')",
        lambda: tdu.global_batch_size(8, strategy="mirrored"),
        Raises(TypeError, "strategy must be a tf.distribute.Strategy.*'mirrored'"),
    ),
    (
        "per_replica_batch_size(7) on 2 replicas",
        lambda: tdu.per_replica_batch_size(7, strategy=_strategy()),
        Raises(ValueError, r"global_batch_size=7 is not divisible by the 2 replicas"),
    ),
    (
        "per_replica_batch_size(8.0)",
        lambda: tdu.per_replica_batch_size(8.0),
        Raises(TypeError, r"Pass global_batch_size=8\."),
    ),
    (
        "num_replicas_in_sync('x')",
        lambda: tdu.num_replicas_in_sync("x"),
        Raises(TypeError, "strategy must be a tf.distribute.Strategy"),
    ),
    (
        "scale_learning_rate(-1)",
        lambda: tdu.scale_learning_rate(-1, base_batch_size=256, global_batch_size=512),
        Raises(ValueError, "base_learning_rate=-1"),
    ),
    (
        "scale_learning_rate(nan)",
        lambda: tdu.scale_learning_rate(float("nan"), base_batch_size=256, global_batch_size=512),
        Raises(ValueError, "base_learning_rate=nan"),
    ),
    (
        "scale_learning_rate('0.1')",
        lambda: tdu.scale_learning_rate("0.1", base_batch_size=256, global_batch_size=512),
        Raises(TypeError, "base_learning_rate must be a number"),
    ),
    (
        "scale_learning_rate(rule='cubic')",
        lambda: tdu.scale_learning_rate(
            0.1, base_batch_size=256, global_batch_size=512, rule="cubic"
        ),
        Raises(ValueError, "rule='cubic'"),
    ),
    (
        "scale_learning_rate(base_batch_size=0)",
        lambda: tdu.scale_learning_rate(0.1, base_batch_size=0, global_batch_size=512),
        Raises(ValueError, "base_batch_size must be a positive integer"),
    ),
    (
        "steps_per_epoch(-1, 8)",
        lambda: tdu.steps_per_epoch(-1, 8),
        Raises(ValueError, "num_examples=-1"),
    ),
    (
        "steps_per_epoch(10, 0)",
        lambda: tdu.steps_per_epoch(10, 0),
        Raises(ValueError, "global_batch_size=0"),
    ),
    (
        "steps_per_epoch(drop_remainder='yes')",
        lambda: tdu.steps_per_epoch(10, 8, drop_remainder="yes"),
        Raises(TypeError, "drop_remainder must be True or False"),
    ),
    (
        "steps_per_epoch(0, 8)",
        lambda: tdu.steps_per_epoch(0, 8),
        Accepts("an empty dataset has 0 steps"),
    ),
    # WarmupSchedule
    (
        "WarmupSchedule('a', 5)",
        lambda: tdu.WarmupSchedule("a", 5),
        Raises(TypeError, "target_learning_rate must be a number"),
    ),
    (
        "WarmupSchedule(0.1, 0)",
        lambda: tdu.WarmupSchedule(0.1, 0),
        Raises(ValueError, "warmup_steps=0"),
    ),
    (
        "WarmupSchedule(0.1, 2.5)",
        lambda: tdu.WarmupSchedule(0.1, 2.5),
        Raises(TypeError, "warmup_steps must be an integer"),
    ),
    (
        "WarmupSchedule(initial_learning_rate=-1)",
        lambda: tdu.WarmupSchedule(0.1, 5, initial_learning_rate=-1),
        Raises(ValueError, "initial_learning_rate=-1"),
    ),
    (
        "WarmupSchedule(after='cosine')",
        lambda: tdu.WarmupSchedule(0.1, 5, after="cosine"),
        Raises(TypeError, "after must be a"),
    ),
    (
        "WarmupSchedule(target=0)",
        lambda: tdu.WarmupSchedule(0.0, 5),
        Accepts("a target rate of 0 is a valid (frozen) schedule"),
    ),
    # ThroughputMeter
    (
        "ThroughputMeter(num_replicas='2')",
        lambda: tdu.ThroughputMeter(num_replicas="2"),
        Raises(TypeError, "num_replicas must be an integer"),
    ),
    (
        "ThroughputMeter(num_replicas=0)",
        lambda: tdu.ThroughputMeter(num_replicas=0),
        Raises(ValueError, "num_replicas=0"),
    ),
    (
        "ThroughputMeter(flops_per_example=-3.0)",
        lambda: tdu.ThroughputMeter(flops_per_example=-3.0),
        Raises(ValueError, "flops_per_example=-3.0"),
    ),
    (
        "ThroughputMeter.update(step='a')",
        lambda: tdu.ThroughputMeter().update(step="a", time=0.0, replica_examples=[1]),
        Raises(TypeError, "step='a'"),
    ),
    (
        "ThroughputMeter.update(time='a')",
        lambda: tdu.ThroughputMeter().update(step=1, time="a", replica_examples=[1]),
        Raises(TypeError, "time='a'"),
    ),
    (
        "ThroughputMeter.update(replica_examples=5)",
        lambda: tdu.ThroughputMeter().update(step=1, time=0.0, replica_examples=5),
        Raises(TypeError, "replica_examples=5"),
    ),
    # ThroughputLogger construction
    (
        "ThroughputLogger(3)",
        lambda: tdu.callbacks.ThroughputLogger(3),
        Raises(TypeError, "log_dir=3"),
    ),
    (
        "ThroughputLogger(log_every_n_steps=0)",
        lambda: tdu.callbacks.ThroughputLogger("logs", log_every_n_steps=0),
        Raises(ValueError, "log_every_n_steps"),
    ),
    (
        "ThroughputLogger(warmup_steps=-1)",
        lambda: tdu.callbacks.ThroughputLogger("logs", warmup_steps=-1),
        Raises(ValueError, "warmup_steps"),
    ),
    (
        "ThroughputLogger(global_batch_size='64')",
        lambda: tdu.callbacks.ThroughputLogger("logs", global_batch_size="64"),
        Raises(TypeError, "global_batch_size"),
    ),
    (
        "ThroughputLogger(flops_per_example=-1)",
        lambda: tdu.callbacks.ThroughputLogger("logs", flops_per_example=-1),
        Raises(ValueError, "flops_per_example=-1"),
    ),
    (
        "ThroughputLogger(dataset=[1, 2])",
        lambda: tdu.callbacks.ThroughputLogger("logs", dataset=[1, 2]),
        Raises(TypeError, "carries no DatasetInfo"),
    ),
    # build_distributed_dataset / plan_sharding
    (
        "build(source=None)",
        lambda: tdu.build_distributed_dataset(None, strategy=_strategy(), global_batch_size=4),
        Raises(TypeError, "source of type NoneType is not supported"),
    ),
    (
        "build(source=3)",
        lambda: tdu.build_distributed_dataset(3, strategy=_strategy(), global_batch_size=4),
        Raises(TypeError, "source of type int is not supported"),
    ),
    (
        "build(global_batch_size=0)",
        lambda: tdu.build_distributed_dataset((X, Y), strategy=_strategy(), global_batch_size=0),
        Raises(ValueError, "global_batch_size=0"),
    ),
    (
        "build(global_batch_size=3) on 2 replicas",
        lambda: tdu.build_distributed_dataset((X, Y), strategy=_strategy(), global_batch_size=3),
        Raises(ValueError, "global_batch_size=3 is not divisible"),
    ),
    (
        "build(no batch size)",
        lambda: tdu.build_distributed_dataset((X, Y), strategy=_strategy()),
        Raises(ValueError, "received neither"),
    ),
    (
        "build(both batch sizes)",
        lambda: tdu.build_distributed_dataset(
            (X, Y), strategy=_strategy(), global_batch_size=4, per_replica_batch_size=2
        ),
        Raises(ValueError, "received both"),
    ),
    (
        "build(shuffle_buffer_size=-1)",
        lambda: tdu.build_distributed_dataset(
            (X, Y), strategy=_strategy(), global_batch_size=4, shuffle_buffer_size=-1
        ),
        Raises(ValueError, "shuffle_buffer_size=-1"),
    ),
    (
        "build(shard_policy='x')",
        lambda: tdu.build_distributed_dataset(
            (X, Y), strategy=_strategy(), global_batch_size=4, shard_policy="x"
        ),
        Raises(ValueError, "shard_policy='x'"),
    ),
    (
        "build(map_fn=3)",
        lambda: tdu.build_distributed_dataset(
            (X, Y), strategy=_strategy(), global_batch_size=4, map_fn=3
        ),
        Raises(TypeError, "map_fn=3 is not callable"),
    ),
    (
        "build(repeat='often')",
        lambda: tdu.build_distributed_dataset(
            (X, Y), strategy=_strategy(), global_batch_size=4, repeat="often"
        ),
        Raises(ValueError, "repeat='often'"),
    ),
    (
        "build(glob matches nothing)",
        lambda: tdu.build_distributed_dataset(
            "/nonexistent/*.tfrecord", strategy=_strategy(), global_batch_size=4
        ),
        Raises(ValueError, "matches no file"),
    ),
    (
        "build(arrays of different lengths)",
        lambda: tdu.build_distributed_dataset(
            (X, Y[:5]), strategy=_strategy(), global_batch_size=4
        ),
        Raises(ValueError, "different lengths"),
    ),
    (
        "build(options=3)",
        lambda: tdu.build_distributed_dataset(
            (X, Y), strategy=_strategy(), global_batch_size=4, options=3
        ),
        Raises(TypeError, "options of type int"),
    ),
    (
        "build(strategy='mirrored')",
        lambda: tdu.build_distributed_dataset((X, Y), strategy="mirrored", global_batch_size=4),
        Raises(TypeError, "strategy must be a tf.distribute.Strategy .*received 'mirrored'"),
    ),
    (
        "build(seed='abc')",
        lambda: tdu.build_distributed_dataset(
            (X, Y), strategy=_strategy(), global_batch_size=4, shuffle_buffer_size=4, seed="abc"
        ),
        Raises(TypeError, "seed must be an integer, but received 'abc'"),
    ),
    (
        "build(drop_remainder='no')",
        lambda: tdu.build_distributed_dataset(
            (X, Y), strategy=_strategy(), global_batch_size=4, drop_remainder="no"
        ),
        Raises(TypeError, "drop_remainder must be True or False, but received 'no'"),
    ),
    (
        "build(cache=123)",
        lambda: tdu.build_distributed_dataset(
            (X, Y), strategy=_strategy(), global_batch_size=4, cache=123
        ),
        Raises(TypeError, "cache must be True .* but received 123"),
    ),
    (
        "build(cache='')",
        lambda: tdu.build_distributed_dataset(
            (X, Y), strategy=_strategy(), global_batch_size=4, cache=""
        ),
        Raises(TypeError, "a file prefix .* but received ''"),
    ),
    (
        "build(cache=Path)",
        lambda: tdu.build_distributed_dataset(
            (X, Y), strategy=_strategy(), global_batch_size=4, cache=Path("unused-cache-prefix")
        ),
        Accepts("a pathlib.Path is a file prefix, as a str is (not 'in memory')"),
    ),
    (
        "build(drop_remainder, fewer examples than a step)",
        lambda: tdu.build_distributed_dataset(
            (X[:3], Y[:3]), strategy=_strategy(), global_batch_size=4, drop_remainder=True
        ),
        Raises(ValueError, "drop_remainder=True drops every example: 3 examples"),
    ),
    (
        "ThroughputLogger(per_replica='yes')",
        lambda: tdu.callbacks.ThroughputLogger("logs", per_replica="yes"),
        Raises(TypeError, "per_replica must be True or False, but received 'yes'"),
    ),
    (
        "ThroughputLogger(memory=1)",
        lambda: tdu.callbacks.ThroughputLogger("logs", memory=1),
        Raises(TypeError, "memory must be True or False, but received 1"),
    ),
    (
        "plan_sharding(source=3)",
        lambda: tdu.plan_sharding(3, strategy=_strategy()),
        Raises(TypeError, "source of type int"),
    ),
    # make_distributed_train_step, compile (keras#19246's loop owns steps_per_execution)
    (
        "make_distributed_train_step(optimizer='adam')",
        lambda: tdu.make_distributed_train_step(
            _model(_strategy()), loss="mse", optimizer="adam", strategy=_strategy()
        ),
        Raises(TypeError, "optimizer must be a Keras optimizer object, but received 'adam'"),
    ),
    (
        "make_distributed_train_step(model='resnet')",
        lambda: tdu.make_distributed_train_step("resnet", loss="mse", optimizer=None),
        Raises(TypeError, "model must be a Keras model, but received 'resnet'"),
    ),
    (
        "make_distributed_train_step(strategy='mirrored')",
        lambda: tdu.make_distributed_train_step(
            _model(_strategy()), loss="mse", optimizer=None, strategy="mirrored"
        ),
        Raises(TypeError, "strategy must be a tf.distribute.Strategy"),
    ),
    (
        "compile(steps_per_execution=0)",
        lambda: _compile(steps_per_execution=0),
        Raises(ValueError, "steps_per_execution must be a positive integer, but received .*=0"),
    ),
    (
        "compile(steps_per_execution=-1)",
        lambda: _compile(steps_per_execution=-1),
        Raises(ValueError, "steps_per_execution must be a positive integer, but received .*=-1"),
    ),
    (
        "compile(steps_per_execution=2.5)",
        lambda: _compile(steps_per_execution=2.5),
        Raises(TypeError, "steps_per_execution must be an integer, but received 2.5"),
    ),
    (
        "compile(steps_per_execution='auto')",
        lambda: _compile(steps_per_execution="auto"),
        Raises(TypeError, "steps_per_execution must be an integer, but received 'auto'"),
    ),
    (
        "compile(steps_per_execution=4)",
        lambda: _compile(steps_per_execution=4),
        Accepts("steps_per_execution=4 on 2 replicas trains (keras#19246 worked around)"),
    ),
    # faults, compat
    (
        "worker_backup_dir(3)",
        lambda: tdu.worker_backup_dir(3),
        Raises(TypeError, "backup_dir must be a directory path"),
    ),
    (
        "compat.apply(['nope'])",
        lambda: tdu.compat.apply(["nope"]),
        Raises(ValueError, r"unknown upstream issue\(s\) \['nope'\]"),
    ),
    (
        "compat.apply('keras#19246')",
        lambda: tdu.compat.apply("keras#19246"),
        Raises(TypeError, "is a string; pass a list"),
    ),
]


def _env_case(
    name: str, variables: dict[str, str], call: Callable[[], Any], outcome: Raises | Accepts
) -> tuple[str, Callable[[], Any], Raises | Accepts]:
    def run() -> Any:
        with pytest.MonkeyPatch.context() as patch:
            for key, value in variables.items():
                patch.setenv(key, value)
            return call()

    return (name, run, outcome)


ENV_CASES = [
    _env_case(
        "TFDP_STRATEGY=bogus",
        {"TFDP_STRATEGY": "bogus"},
        tdu.auto_strategy,
        Raises(ValueError, "TFDP_STRATEGY"),
    ),
    _env_case(
        "TFDP_CLUSTER_TIMEOUT=soon",
        {"TFDP_CLUSTER_TIMEOUT": "soon"},
        tdu.auto_strategy,
        Raises(ValueError, "TFDP_CLUSTER_TIMEOUT must be a number of seconds.*'soon'"),
    ),
    _env_case(
        "TFDP_CLUSTER_TIMEOUT=-5",
        {"TFDP_CLUSTER_TIMEOUT": "-5"},
        tdu.auto_strategy,
        Raises(ValueError, "TFDP_CLUSTER_TIMEOUT=-5"),
    ),
    _env_case(
        "TFDP_COLLECTIVE_TIMEOUT=abc",
        {"TFDP_COLLECTIVE_TIMEOUT": "abc"},
        lambda: resolve_collective_timeout(600.0),
        Raises(ValueError, "TFDP_COLLECTIVE_TIMEOUT='abc' is not a number of seconds"),
    ),
    _env_case(
        "TFDP_COLLECTIVE_TIMEOUT=off",
        {"TFDP_COLLECTIVE_TIMEOUT": "off"},
        lambda: resolve_collective_timeout(600.0),
        Accepts("'off' (or 0, none, no, false) turns the bound off, as documented"),
    ),
    _env_case(
        "TF_CONFIG='['",
        {"TF_CONFIG": "["},
        tdu.auto_strategy,
        Raises(ValueError, "TF_CONFIG is invalid: it is not valid JSON"),
    ),
    _env_case(
        "TF_CONFIG index out of range",
        {
            "TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", '
            '"index": 3}}'
        },
        tdu.auto_strategy,
        Raises(ValueError, "task index 3 is out of range"),
    ),
    _env_case(
        "TF_CONFIG without a task",
        {"TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:1"]}}'},
        tdu.auto_strategy,
        Raises(ValueError, "'task' is None"),
    ),
    _env_case(
        "TF_CONFIG bad address",
        {"TF_CONFIG": '{"cluster": {"worker": ["nohost"]}, "task": {"type": "worker"}}'},
        tdu.auto_strategy,
        Raises(ValueError, "expected 'host:port'"),
    ),
    (
        "TF_CONFIG with an empty cluster",
        lambda: parse_tf_config('{"cluster": {}}'),
        Accepts("no cluster: trains alone, with a WARNING saying so"),
    ),
    (
        "SLURM_STEP_NUM_TASKS=abc",
        lambda: parse_slurm({**SLURM, "SLURM_STEP_NUM_TASKS": "abc"}),
        Raises(ValueError, "SLURM_STEP_NUM_TASKS must be a whole number.*'abc'"),
    ),
    (
        "SLURM_PROCID=abc",
        lambda: parse_slurm({**SLURM, "SLURM_PROCID": "abc"}),
        Raises(ValueError, "SLURM_PROCID must be a whole number.*'abc'"),
    ),
    (
        "SLURM_PROCID=5 of 2",
        lambda: parse_slurm({**SLURM, "SLURM_PROCID": "5"}),
        Raises(ValueError, "SLURM_PROCID=5 is outside 0..1"),
    ),
    (
        "TFDP_SLURM_PORT_BASE=abc",
        lambda: parse_slurm({**SLURM, "TFDP_SLURM_PORT_BASE": "abc"}),
        Raises(ValueError, "TFDP_SLURM_PORT_BASE='abc' is not a usable port"),
    ),
    (
        "SLURM tasks-per-node that do not add up",
        lambda: parse_slurm({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "3(x2)"}),
        Raises(ValueError, "adds up to 6 tasks"),
    ),
    _env_case(
        "TFDP_NO_KERAS_PATCHES=maybe",
        {"TFDP_NO_KERAS_PATCHES": "maybe"},
        tdu.compat.disabled,
        Accepts("only 1/true/yes/on turn the workarounds off; other values leave them on"),
    ),
]

ALL_CASES: list[Case] = CASES + ENV_CASES


@parametrize(ALL_CASES)
def test_hostile_input(call: Callable[[], Any], outcome: Raises | Accepts) -> None:
    check_case(call, outcome)
