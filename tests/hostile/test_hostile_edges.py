"""Hostile-input campaign: what users meet at a job's edges.

Each row is one case (see ``tests/hostile/test_hostile_inputs.py`` for the vocabulary):

* the environment variables tfdp-utils reads, each read by the function that reads it when it
  is used (the exit guard's ``grace``, the exit barrier's ``bound``, the collective and cluster
  timeout resolvers) with an explicit environment, and by the check ``auto_strategy()``,
  ``tfdp-utils env`` and ``doctor`` share: one verdict, in the same words;
* ``ThroughputLogger``'s arguments not in ``test_hostile_throughput.py``;
* ``PreemptionCheckpoint`` where ``fit`` (or its custom loop) starts, on 2 logical CPUs;
* ``tfdp-utils report`` on paths that hold no run, in this process;
* ``diagnose_input`` on data the model does not take, and ``worker_backup_dir``'s paths;
* a few signals sent to real processes (:data:`PROCESS_CASES`, marked slow).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import pathlib
import signal
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from support.hostile import Accepts, Case, Raises, check_case, parametrize, scratch_folder
from support.processes import run_python

import tfdp_utils as tdu
from tfdp_utils import _exit_barrier, _exit_guard
from tfdp_utils._tf import IS_KERAS3, keras
from tfdp_utils.callbacks import ThroughputLogger
from tfdp_utils.strategy._build import DEFAULT_CLUSTER_TIMEOUT, resolve_cluster_timeout
from tfdp_utils.strategy._collective_bound import (
    DEFAULT_COLLECTIVE_TIMEOUT,
    resolve_collective_timeout,
)
from tfdp_utils.strategy._environment_check import check_environment, raise_first_problem

pytestmark = pytest.mark.keras

_FOLDER = scratch_folder("tfdp-hostile-edges-")
X = np.arange(64, dtype="float32").reshape(32, 2)
Y = X[:, :1]


# ------------------------------------------------------------------ environment variables

_READERS: dict[str, Callable[[dict[str, str]], Any]] = {
    "TFDP_EXIT_GRACE": _exit_guard.grace,
    "TFDP_EXIT_BARRIER": _exit_barrier.bound,
    "TFDP_COLLECTIVE_TIMEOUT": lambda env: resolve_collective_timeout(
        DEFAULT_COLLECTIVE_TIMEOUT, env
    ),
    "TFDP_CLUSTER_TIMEOUT": lambda env: resolve_cluster_timeout(DEFAULT_CLUSTER_TIMEOUT, env),
}
_UNREAD = object()


def _env(variable: str, value: str, reads: Any = _UNREAD) -> Callable[[], None]:
    """Read ``variable=value`` as the job would, and check that the shared environment check
    (auto_strategy(), env, doctor) gives the same verdict in the same words; an accepted value
    must read as ``reads``."""

    def call() -> None:
        environ = {variable: value}
        problems = [(p.variable, p.message) for p in check_environment(environ)]
        read = _READERS.get(variable, raise_first_problem)
        try:
            got = read(environ)
        except ValueError as exc:
            assert problems == [(variable, str(exc))], problems
            raise
        assert problems == [], problems
        if reads is not _UNREAD:
            assert got == reads, (got, reads)

    return call


def _exit_guard_stays_on() -> None:
    assert _exit_guard.wanted({"TFDP_EXIT_GUARD": "abc"})
    assert check_environment({"TFDP_EXIT_GUARD": "abc"}) == ()


ENVIRONMENT_CASES: list[Case] = [
    (
        "env: TFDP_EXIT_GRACE=1e10",
        _env("TFDP_EXIT_GRACE", "1e10"),
        Raises(
            ValueError,
            r"TFDP_EXIT_GRACE must be at most 1e\+09 seconds .*but received "
            r"TFDP_EXIT_GRACE='1e10'\. Set it to e\.g\. 8, or 0 to turn the backstop off\.",
        ),
    ),
    (
        "env: TFDP_EXIT_GRACE=99999999999999999999",
        _env("TFDP_EXIT_GRACE", "99999999999999999999"),
        Raises(ValueError, r"at most 1e\+09 seconds .*TFDP_EXIT_GRACE='99999999999999999999'"),
    ),
    (
        "env: TFDP_EXIT_GRACE=inf",
        _env("TFDP_EXIT_GRACE", "inf"),
        Raises(
            ValueError,
            r"TFDP_EXIT_GRACE must be a number of seconds >= 0, but received "
            r"TFDP_EXIT_GRACE='inf'\. Set it to e\.g\. 8",
        ),
    ),
    (
        "env: TFDP_EXIT_GRACE=nan",
        _env("TFDP_EXIT_GRACE", "nan"),
        Raises(ValueError, r"TFDP_EXIT_GRACE must be a number of seconds >= 0.*'nan'"),
    ),
    (
        "env: TFDP_EXIT_GRACE=5s",
        _env("TFDP_EXIT_GRACE", "5s"),
        Raises(
            ValueError,
            r"TFDP_EXIT_GRACE must be a number of seconds, but received TFDP_EXIT_GRACE='5s'\. "
            r"Set it to e\.g\. 8\.",
        ),
    ),
    (
        "env: TFDP_EXIT_GRACE=off",
        _env("TFDP_EXIT_GRACE", "off", reads=None),
        Accepts("'off' (or 0, none, no, false) turns the exit guard's backstop off"),
    ),
    (
        "env: TFDP_EXIT_GRACE=None",
        _env("TFDP_EXIT_GRACE", "None", reads=None),
        Accepts("'off' (or 0, none, no, false) turns the exit guard's backstop off"),
    ),
    (
        "env: TFDP_EXIT_GRACE=' 5 '",
        _env("TFDP_EXIT_GRACE", " 5 ", reads=5.0),
        Accepts("spaces around a number of seconds are ignored"),
    ),
    (
        "env: TFDP_EXIT_GRACE=١٢ (Arabic-Indic digits)",
        _env("TFDP_EXIT_GRACE", "١٢", reads=12.0),
        Accepts("digits of any script are read as the number they write, as Python's float does"),
    ),
    (
        "env: TFDP_EXIT_BARRIER=inf",
        _env("TFDP_EXIT_BARRIER", "inf"),
        Raises(
            ValueError,
            r"TFDP_EXIT_BARRIER must be a finite number of seconds >= 0, but received "
            r"TFDP_EXIT_BARRIER='inf'\. Set it to e\.g\. 60, or 0 to let each worker exit",
        ),
    ),
    (
        "env: TFDP_EXIT_BARRIER=1e400",
        _env("TFDP_EXIT_BARRIER", "1e400"),
        Raises(ValueError, r"finite number of seconds >= 0, .*TFDP_EXIT_BARRIER='1e400'"),
    ),
    (
        "env: TFDP_EXIT_BARRIER=-0.5",
        _env("TFDP_EXIT_BARRIER", "-0.5"),
        Raises(ValueError, r"TFDP_EXIT_BARRIER must be a finite number .*'-0\.5'\. Set it to"),
    ),
    (
        "env: TFDP_EXIT_BARRIER=0x10",
        _env("TFDP_EXIT_BARRIER", "0x10"),
        Raises(
            ValueError,
            r"TFDP_EXIT_BARRIER must be a number of seconds, but received "
            r"TFDP_EXIT_BARRIER='0x10'\. Set it to e\.g\. 60\.",
        ),
    ),
    (
        "env: TFDP_EXIT_BARRIER=None",
        _env("TFDP_EXIT_BARRIER", "None", reads=None),
        Accepts("'none' is an off word, as 'off' and 0 are: each worker exits on its own"),
    ),
    (
        "env: TFDP_EXIT_BARRIER=''",
        _env("TFDP_EXIT_BARRIER", "", reads=_exit_barrier.DEFAULT_BOUND),
        Accepts("an empty TFDP_EXIT_BARRIER counts as unset: the barrier's default bound"),
    ),
    (
        "env: TFDP_EXIT_BARRIER=1e300",
        _env("TFDP_EXIT_BARRIER", "1e300", reads=1e300),
        Accepts("a very large barrier bound waits until every peer has exited or is gone"),
    ),
    (
        "env: TFDP_COLLECTIVE_TIMEOUT=abc",
        _env("TFDP_COLLECTIVE_TIMEOUT", "abc"),
        Raises(
            ValueError,
            r"TFDP_COLLECTIVE_TIMEOUT='abc' is not a number of seconds; set it to e\.g\. 600, "
            r"or 0 to wait without a bound\.",
        ),
    ),
    (
        "env: TFDP_COLLECTIVE_TIMEOUT=-inf",
        _env("TFDP_COLLECTIVE_TIMEOUT", "-inf"),
        Raises(ValueError, r"TFDP_COLLECTIVE_TIMEOUT=-inf must be a positive number of seconds"),
    ),
    (
        "env: TFDP_COLLECTIVE_TIMEOUT=None",
        _env("TFDP_COLLECTIVE_TIMEOUT", "None", reads=None),
        Accepts("'off' (or 0, none, no, false) turns the bound off, as documented"),
    ),
    (
        "env: TFDP_COLLECTIVE_TIMEOUT=inf",
        _env("TFDP_COLLECTIVE_TIMEOUT", "inf", reads=None),  # no bound, as 0 and off
        Accepts("an infinite collective bound is no bound, as 0 and off: nothing is aborted"),
    ),
    (
        "env: TFDP_COLLECTIVE_TIMEOUT=1e3",
        _env("TFDP_COLLECTIVE_TIMEOUT", "1e3", reads=1000.0),
        Accepts("a number of seconds may be written with an exponent"),
    ),
    (
        "env: TFDP_CLUSTER_TIMEOUT=off",
        _env("TFDP_CLUSTER_TIMEOUT", "off"),
        Raises(
            ValueError,
            r"TFDP_CLUSTER_TIMEOUT must be a number of seconds, but received "
            r"TFDP_CLUSTER_TIMEOUT='off'\. Set it to e\.g\. 300\.",
        ),
    ),
    (
        "env: TFDP_SERVICE_TIMEOUT=None",
        _env("TFDP_SERVICE_TIMEOUT", "None"),
        Raises(
            ValueError,
            r"TFDP_SERVICE_TIMEOUT must be a number of seconds, but received "
            r"TFDP_SERVICE_TIMEOUT='None'\. Set it to e\.g\. 300\.",
        ),
    ),
    (
        "env: TFDP_SLURM_PORT_BASE=1e3",
        _env("TFDP_SLURM_PORT_BASE", "1e3"),
        Raises(ValueError, r"TFDP_SLURM_PORT_BASE='1e3' is not a usable port: .*1\.\.65535"),
    ),
    (
        "env: TFDP_STRATEGY=off",
        _env("TFDP_STRATEGY", "off"),
        Raises(ValueError, r"TFDP_STRATEGY='off' is not a strategy choice; expected one of"),
    ),
    (
        "env: TFDP_EXIT_GUARD=abc",
        _exit_guard_stays_on,
        Accepts("only 0/false/no/off/none turn the exit guard off; other values leave it on"),
    ),
]


# ------------------------------------------------------------------- the throughput logger


def _strategy() -> Any:
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _model(strategy: Any, **compile_args: Any) -> Any:
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse", **compile_args)
    return model


def _logged_fit(logger: Any) -> None:
    """One epoch of 4 steps on plain batches of 8, with ``logger``."""
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)
    _model(_strategy()).fit(data, epochs=1, verbose=0, callbacks=[logger])


@contextlib.contextmanager
def _warnings() -> Iterator[list[str]]:
    """The WARNINGs tfdp-utils logs inside the block."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep(logging.WARNING)
    logging.getLogger("tfdp_utils").addHandler(handler)
    try:
        yield lines
    finally:
        logging.getLogger("tfdp_utils").removeHandler(handler)


def _a_file() -> str:
    path = _FOLDER / "a-file"
    path.write_text("not a directory\n")
    return str(path)


def _logger(**kwargs: Any) -> Callable[[], Any]:
    return lambda: ThroughputLogger(kwargs.pop("log_dir", str(_FOLDER / "logs")), **kwargs)


def _warm_up_past_the_fit() -> None:
    with _warnings() as said:
        _logged_fit(
            ThroughputLogger(tempfile.mkdtemp(dir=_FOLDER), global_batch_size=8, warmup_steps=50)
        )
    assert any("warmup_steps=50) leaves out all 4 steps of this fit" in s for s in said), said


THROUGHPUT_CASES: list[Case] = [
    (
        "ThroughputLogger(log_every_n_steps=2.5)",
        _logger(log_every_n_steps=2.5),
        Raises(TypeError, r"log_every_n_steps must be an integer, but received 2\.5 of type float"),
    ),
    (
        "ThroughputLogger(log_every_n_steps='100')",
        _logger(log_every_n_steps="100"),
        Raises(TypeError, r"log_every_n_steps must be an integer, but received '100' of type str"),
    ),
    (
        "ThroughputLogger(log_every_n_steps=True)",
        _logger(log_every_n_steps=True),
        Raises(TypeError, r"log_every_n_steps must be an integer, but received True of type bool"),
    ),
    (
        "ThroughputLogger(log_every_n_steps=-3)",
        _logger(log_every_n_steps=-3),
        Raises(
            ValueError,
            r"log_every_n_steps must be a positive integer, but received log_every_n_steps=-3\. "
            r"Pass the number of steps each measured window covers",
        ),
    ),
    (
        "ThroughputLogger(log_every_n_steps=np.int64(2))",
        _logger(log_every_n_steps=np.int64(2)),
        Accepts("a NumPy integer is an integer, as for every count tfdp-utils takes"),
    ),
    (
        "ThroughputLogger(warmup_steps=1.5)",
        _logger(warmup_steps=1.5),
        Raises(
            TypeError, r"warmup_steps must be an integer, but received 1\.5 .*Pass 0 to measure"
        ),
    ),
    (
        "ThroughputLogger(warmup_steps=0)",
        _logger(warmup_steps=0),
        Accepts("warmup_steps=0 measures from the first step, as documented"),
    ),
    (
        "ThroughputLogger(warmup_steps=50) on a fit of 4 steps",
        _warm_up_past_the_fit,
        Accepts("a warm-up longer than the fit trains; a WARNING says no window is measured"),
    ),
    (
        "ThroughputLogger(global_batch_size=0)",
        _logger(global_batch_size=0),
        Raises(
            ValueError,
            r"global_batch_size must be a positive integer, but received global_batch_size=0\. "
            r"Pass the examples per step summed over all replicas",
        ),
    ),
    (
        "ThroughputLogger(global_batch_size=8.0)",
        _logger(global_batch_size=8.0),
        Raises(TypeError, r"global_batch_size must be an integer, but received 8\.0 .*Pass "),
    ),
    (
        "ThroughputLogger(flops_per_example='1e9')",
        _logger(flops_per_example="1e9"),
        Raises(TypeError, r"flops_per_example must be a number, but received '1e9' of type str"),
    ),
    (
        "ThroughputLogger(peak_flops_per_replica=inf)",
        _logger(flops_per_example=1e9, peak_flops_per_replica=math.inf),
        Raises(
            ValueError,
            r"peak_flops_per_replica must be a positive finite number, but received "
            r"peak_flops_per_replica=inf\. Or pass None\.",
        ),
    ),
    (
        "ThroughputLogger(peak_flops_per_replica=...) without flops_per_example",
        _logger(peak_flops_per_replica=1e12),
        Raises(ValueError, r"peak_flops_per_replica was given without flops_per_example; .*Pass"),
    ),
    (
        "ThroughputLogger(per_replica=None)",
        _logger(per_replica=None),
        Raises(TypeError, r"per_replica must be True or False, but received None of type NoneType"),
    ),
    (
        "ThroughputLogger(epoch_logs='no')",
        _logger(epoch_logs="no"),
        Raises(TypeError, r"epoch_logs must be True or False, but received 'no' of type str"),
    ),
    (
        "ThroughputLogger(log_dir=b'logs')",
        _logger(log_dir=b"logs"),
        Raises(TypeError, r"log_dir=b'logs' is not a directory path; pass e\.g\. 'logs/run1'"),
    ),
    (
        "ThroughputLogger(log_dir=<a file>) at fit",
        lambda: _logged_fit(ThroughputLogger(_a_file(), global_batch_size=8)),
        Raises(OSError, r"cannot write its TensorBoard run to .*a-file.*Pass a log_dir this"),
    ),
    (
        "ThroughputLogger(log_dir=<a path under a file>) at fit",
        lambda: _logged_fit(ThroughputLogger(_a_file() + "/run1", global_batch_size=8)),
        Raises(OSError, r"cannot write .*a-file/run1.*a-file is not a directory\. Pass a log_dir"),
    ),
]


# ----------------------------------------------------------- PreemptionCheckpoint at fit time


def _model_and_data(**compile_args: Any) -> tuple[Any, Any, Any]:
    """2 replicas, a builder dataset of 32 examples in global batches of 8: 4 steps an epoch."""
    strategy = _strategy()
    dist = tdu.build_distributed_dataset(
        (X, Y), strategy=strategy, global_batch_size=8, shuffle_buffer_size=32, seed=1
    )
    return strategy, _model(strategy, **compile_args), dist


def _checkpoint(directory: Any = None, **kwargs: Any) -> Any:
    return tdu.callbacks.PreemptionCheckpoint(
        directory if directory is not None else tempfile.mkdtemp(dir=_FOLDER), exit=False, **kwargs
    )


def _fit(data: str = "builder", *, directory: Any = None, **fit_args: Any) -> Callable[[], Any]:
    """One epoch of ``fit`` with a PreemptionCheckpoint (in ``directory``) over ``data``: the
    builder dataset, or the same data as arrays, a tf.data.Dataset or a distributed one."""

    def call() -> Any:
        strategy, model, dist = _model_and_data()
        plain = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)
        arguments: dict[str, Any] = {
            "builder": {"x": dist},
            "arrays": {"x": X, "y": Y, "batch_size": 8},
            "dataset": {"x": plain},
            "distributed": {
                "x": strategy.experimental_distribute_dataset(plain),
                "steps_per_epoch": 4,
            },
        }[data]
        arguments = {"epochs": 1, "verbose": 0, **arguments, **fit_args}
        arguments.setdefault("callbacks", [_checkpoint(directory)])
        return model.fit(**arguments)

    return call


def _executions(per_execution: int) -> Callable[[], None]:
    """A fit compiled with ``steps_per_execution``, 4 steps an epoch. Keras 3 runs executions
    whole, so one that does not divide the epoch is refused; tf_keras cuts it at the epoch's
    end, exactly (tests/interactions/test_preemption_matrix.py), so that row is Keras 3's."""

    def call() -> None:
        if not IS_KERAS3 and 4 % per_execution:
            pytest.skip("tf_keras cuts an execution at the epoch's end: exact, not refused")
        strategy, model, dist = _model_and_data(steps_per_execution=per_execution)
        tdu.compat.apply_for_strategy(strategy)  # keras#19246, as auto_strategy() applies it
        model.fit(dist, epochs=1, verbose=0, callbacks=[_checkpoint()])

    return call


def _two_checkpoints() -> None:
    _fit(callbacks=[_checkpoint(), _checkpoint()])()


def _other_files_left_alone() -> None:
    folder = pathlib.Path(tempfile.mkdtemp(dir=_FOLDER))
    (folder / "ckpt-abc").mkdir()
    (folder / "notes.txt").write_text("the job's notes\n")
    checkpoint = _checkpoint(folder, every_steps=2)
    _fit(callbacks=[checkpoint])()
    assert checkpoint.resumed_from is None
    assert {"ckpt-abc", "notes.txt", "ckpt-000000000004"} <= {p.name for p in folder.iterdir()}


def _made_with_its_parents() -> None:
    folder = pathlib.Path(tempfile.mkdtemp(dir=_FOLDER)) / "new" / "deeper"
    _fit(callbacks=[_checkpoint(folder, every_steps=4)])()
    assert (folder / "ckpt-000000000004" / "state.json").is_file()


def _loop(dataset: str = "builder", **kwargs: Any) -> Callable[[], None]:
    def call() -> None:
        _, model, dist = _model_and_data()
        data = {
            "builder": dist,
            "arrays": X,
            "dataset": tf.data.Dataset.from_tensor_slices((X, Y)).batch(8),
        }[dataset]
        model = kwargs.pop("model", model)
        with _checkpoint().loop(model, data, **{"epochs": 1, **kwargs}) as batches:
            for _ in batches:
                pass

    return call


CHECKPOINT_CASES: list[Case] = [
    (
        "fit(arrays) with PreemptionCheckpoint",
        _fit("arrays"),
        Raises(
            TypeError,
            r"resumes a dataset from tdu\.build_distributed_dataset\(\), but fit received "
            r"ndarray\. Build the training data with .*keras\.callbacks\.BackupAndRestore",
        ),
    ),
    (
        "fit(tf.data.Dataset) with PreemptionCheckpoint",
        _fit("dataset"),
        Raises(TypeError, r"but fit received _?BatchDataset\. Build .*BackupAndRestore"),
    ),
    (
        "fit(strategy.experimental_distribute_dataset(...)) with PreemptionCheckpoint",
        _fit("distributed"),
        Raises(TypeError, r"but fit received DistributedDataset\. Build .*BackupAndRestore"),
    ),
    (
        "fit(steps_per_epoch=3) on an epoch of 4 with PreemptionCheckpoint",
        _fit(steps_per_epoch=3),
        Raises(
            ValueError,
            r"steps_per_epoch=3 differs from the dataset's epoch of 4 steps; .*Leave "
            r"steps_per_epoch out\.",
        ),
    ),
    (
        "fit(steps_per_epoch=8) on an epoch of 4 with PreemptionCheckpoint",
        _fit(steps_per_epoch=8),
        Raises(ValueError, r"steps_per_epoch=8 differs from the dataset's epoch of 4 steps"),
    ),
    (
        "fit(steps_per_epoch='4') with PreemptionCheckpoint",
        _fit(steps_per_epoch="4"),
        Raises(
            TypeError,
            r"steps_per_epoch must be a number of steps, but received '4' of type str\. Leave "
            r"steps_per_epoch out: .*epoch of 4 steps",
        ),
    ),
    (
        "fit(steps_per_epoch=4) on an epoch of 4 with PreemptionCheckpoint",
        _fit(steps_per_epoch=4),
        Accepts("steps_per_epoch equal to the builder dataset's epoch changes nothing"),
    ),
    (
        "fit(initial_epoch=-1) with PreemptionCheckpoint",
        _fit(initial_epoch=-1, epochs=2),
        Raises(
            ValueError,
            r"initial_epoch must be an integer >= 0, but received initial_epoch=-1\. Pass the "
            r"epoch a job without a checkpoint starts at",
        ),
    ),
    (
        "fit(initial_epoch='1') with PreemptionCheckpoint",
        _fit(initial_epoch="1", epochs=2),
        Raises(TypeError, r"initial_epoch must be an integer, but received '1' of type str"),
    ),
    (
        "fit with two PreemptionCheckpoints",
        _two_checkpoints,
        Raises(
            ValueError,
            r"fit received 2 PreemptionCheckpoint callbacks \(directories .*\); .*Pass one "
            r"PreemptionCheckpoint",
        ),
    ),
    (
        "PreemptionCheckpoint(<a file>) at fit",
        lambda: _fit(directory=_a_file())(),
        Raises(NotADirectoryError, r"directory='.*a-file' is a file, not a folder; pass a folder"),
    ),
    (
        "PreemptionCheckpoint(<a path under a file>) at fit",
        lambda: _fit(directory=_a_file() + "/ckpt")(),
        Raises(
            NotADirectoryError,
            r"directory='.*a-file/ckpt' cannot be made: '.*a-file' on its path is a file, not a "
            r"folder\. Pass another folder path",
        ),
    ),
    (
        "PreemptionCheckpoint('gs://bucket/ckpt') at fit",
        _fit(directory="gs://bucket/ckpt"),
        Raises(ValueError, r"directory='gs://bucket/ckpt' is a URL; .*Mount the bucket"),
    ),
    (
        "PreemptionCheckpoint('   ')",
        lambda: _checkpoint("   "),
        Raises(TypeError, r"directory must be a folder path, but received '   '\. Pass a folder"),
    ),
    (
        "PreemptionCheckpoint(' /mnt/ckpt')",
        lambda: _checkpoint(" /mnt/ckpt"),
        Raises(
            ValueError,
            r"directory=' /mnt/ckpt' begins or ends with whitespace, .*working directory\)\. "
            r"Pass directory='/mnt/ckpt'\.",
        ),
    ),
    (
        "fit(steps_per_execution=3) on an epoch of 4 with PreemptionCheckpoint (Keras 3)",
        _executions(3),
        Raises(
            ValueError,
            r"compiled with steps_per_execution=3, which does not divide the dataset's epoch of "
            r"4 steps: .*Compile with a steps_per_execution that divides 4 \(1, 2, 4\)",
        ),
    ),
    (
        "fit(steps_per_execution=2) on an epoch of 4 with PreemptionCheckpoint",
        _executions(2),
        Accepts("a steps_per_execution that divides the epoch trains"),
    ),
    (
        "PreemptionCheckpoint beside files that are not checkpoints",
        _other_files_left_alone,
        Accepts("files and folders in directory= that are not checkpoints are left alone"),
    ),
    (
        "PreemptionCheckpoint(pathlib.Path(<new nested folder>))",
        _made_with_its_parents,
        Accepts("a pathlib.Path directory is made, with its parents, when fit starts"),
    ),
    (
        "loop(model, <arrays>)",
        _loop("arrays"),
        Raises(TypeError, r"but loop\(\) received ndarray\. Build the training data with"),
    ),
    (
        "loop(model, <tf.data.Dataset>)",
        _loop("dataset"),
        Raises(TypeError, r"but loop\(\) received _?BatchDataset\. .*BackupAndRestore"),
    ),
    (
        "loop(model, dist, optimizer='sgd')",
        _loop(optimizer="sgd"),
        Raises(
            TypeError,
            r"optimizer must be a Keras optimizer object, but received 'sgd' of type str\. Pass "
            r"the optimizer object the step applies",
        ),
    ),
    (
        "loop('model', dist)",
        _loop(model="model"),
        Raises(TypeError, r"model must be a Keras model, but received 'model' of type str\. Pass"),
    ),
    (
        "loop(model, dist, initial_epoch=1.5)",
        _loop(epochs=2, initial_epoch=1.5),
        Raises(TypeError, r"initial_epoch must be an integer, but received 1\.5 of type float"),
    ),
]


# ------------------------------------------------------------------- tfdp-utils report


class CliRefused(Exception):
    """``tfdp-utils report`` refused its arguments: one line on stderr, nothing on stdout, 2."""


class CliFoundNothing(Exception):
    """``tfdp-utils report`` found no run: its lines on stderr, nothing on stdout, exit 1."""


def _report(*arguments: str) -> Callable[[], None]:
    def call() -> None:
        from tfdp_utils.cli import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["report", *arguments])
        lines = err.getvalue().strip().splitlines()
        assert not out.getvalue(), out.getvalue()  # --json too: no half-made JSON
        if status == 2:
            assert len(lines) == 1, lines
            raise CliRefused(lines[0])
        if status == 1:
            raise CliFoundNothing(" | ".join(lines))
        raise AssertionError(f"status {status}: {lines}")

    return call


def _folder_with(files: dict[str, bytes]) -> str:
    folder = pathlib.Path(tempfile.mkdtemp(dir=_FOLDER))
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return str(folder)


REPORT_CASES: list[Case] = [
    (
        "report <a missing directory>",
        _report("/nonexistent-tfdp/logs"),
        Raises(
            CliRefused,
            r"LOGDIR '/nonexistent-tfdp/logs' is not a directory: nothing exists at that path\. "
            r"Pass the log_dir given to ThroughputLogger",
        ),
    ),
    (
        "report <a missing directory> --json",
        _report("/nonexistent-tfdp/logs", "--json"),
        Raises(CliRefused, r"LOGDIR '/nonexistent-tfdp/logs' is not a directory: nothing exists"),
    ),
    (
        "report <a file>",
        lambda: _report(_a_file())(),
        Raises(
            CliRefused,
            r"LOGDIR '.*a-file' is not a directory but a file\. Pass the log_dir given to "
            r"ThroughputLogger: the folder that holds its runs",
        ),
    ),
    (
        "report <an empty directory>",
        lambda: _report(tempfile.mkdtemp(dir=_FOLDER))(),
        Raises(
            CliFoundNothing,
            r"no throughput runs under '.*'; expected the log_dir of a ThroughputLogger \(runs "
            r"such as 'global' and 'replica_0'\)",
        ),
    ),
    (
        "report <an empty directory> --json",
        lambda: _report(tempfile.mkdtemp(dir=_FOLDER), "--json")(),
        Raises(CliFoundNothing, r"no throughput runs under '.*'; expected the log_dir"),
    ),
    (
        "report <a directory without event files>",
        lambda: _report(_folder_with({"notes.txt": b"x", "global/readme": b"y"}))(),
        Raises(CliFoundNothing, r"no throughput runs under '.*'; expected the log_dir"),
    ),
    (
        "report <a directory whose event file is not one> --json",
        lambda: _report(
            _folder_with({"global/events.out.tfevents.1.h": b"garbage here, not a record"}),
            "--json",
        )(),
        Raises(
            CliFoundNothing,
            r"global/events\.out\.tfevents\.1\.h: corrupt: record 1 at byte 0 .* \| .*no "
            r"throughput runs under",
        ),
    ),
]


# ---------------------------------------------------- diagnose_input and worker_backup_dir


def _diagnose(make: Callable[[], Any]) -> Callable[[], None]:
    def call() -> None:
        _, model, _ = _model_and_data()
        # Each case fails at the first batch, long before the budget; the budget only has to
        # let the first batch come under load (its share of 10 s was once too short, and the
        # empty dataset got the undetermined verdict instead of its error).
        tdu.diagnose_input(model, make(), steps=2, max_seconds=60.0)

    return call


def _batches(x: Any, y: Any = None) -> Any:
    source = (x, y) if y is not None else x
    return tf.data.Dataset.from_tensor_slices(source).batch(8)


_WORDS = np.array([["a", "b"], ["c", "d"]] * 16)

DIAGNOSE_CASES: list[Case] = [
    (
        "diagnose_input(<x of 3 features> on a model of 2)",
        _diagnose(lambda: _batches(np.zeros((32, 3), "float32"), Y)),
        Raises(
            ValueError,
            r"dataset's elements do not fit the model: the dataset gives \(TensorSpec\(shape="
            r"\(None, 3\).*the model takes x of shape \(None, 2\) .*keras\.Input\(shape=\(3,\)\)",
        ),
    ),
    (
        "diagnose_input(<an empty dataset>)",
        _diagnose(lambda: _batches(np.zeros((0, 2), "float32"), np.zeros((0, 1), "float32"))),
        Raises(ValueError, r"dataset gave no batch: it is empty .*Pass the dataset you train on"),
    ),
    (
        "diagnose_input(<strings of the model's shape>)",
        _diagnose(lambda: _batches(_WORDS, Y)),
        Raises(
            ValueError,
            r"the dataset gives \(TensorSpec\(shape=\(None, 2\), dtype=tf\.string.*whose x holds "
            r"strings, but the model takes x of dtype float32 and shape \(None, 2\); .*Turn the "
            r"strings into numbers",
        ),
    ),
    (
        "diagnose_input(<a dataset of strings>)",
        _diagnose(lambda: _batches(np.array(["a b", "c d"] * 16))),
        Raises(ValueError, r"dtype=tf\.string.*whose x holds strings, .*StringLookup"),
    ),
    (
        "diagnose_input(<x without targets>)",
        _diagnose(lambda: _batches(X)),
        Raises(
            ValueError,
            r"the dataset gives TensorSpec\(shape=\(None, 2\), .*x alone without targets, but "
            r"the model was compiled with loss='mse'.*Make the dataset give \(x, y\) pairs",
        ),
    ),
    (
        "worker_backup_dir(pathlib.Path)",
        lambda: tdu.worker_backup_dir(pathlib.Path("/tmp/backup"), _strategy()),
        Accepts("a pathlib.Path backup_dir is a directory path, as a str is"),
    ),
    (
        "worker_backup_dir('gs://bucket/x')",
        lambda: tdu.worker_backup_dir("gs://bucket/x", _strategy()),
        Accepts(
            "a URL backup_dir is kept as given: BackupAndRestore writes it through tf.io.gfile"
        ),
    ),
    (
        "worker_backup_dir('   ')",
        lambda: tdu.worker_backup_dir("   ", _strategy()),
        Raises(ValueError, r"backup_dir='   ' is empty; expected the job's backup directory"),
    ),
]


# ------------------------------------------------------------------- signals to processes

JOB = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as started from a terminal
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tfdp_utils as tdu
from tfdp_utils._tf import keras

folder, when = sys.argv[1], sys.argv[2]
strategy = tdu.auto_strategy(verbose=False)
x = np.arange(64, dtype="float32").reshape(32, 2)
dist = tdu.build_distributed_dataset(
    (x, x[:, :1]), strategy=strategy, global_batch_size=8, shuffle_buffer_size=32, seed=1
)
with strategy.scope():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
if when == "term-twice":
    write = tf.train.Checkpoint.write

    def write_on_a_second_notice(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's second SIGTERM, mid-save
        return write(self, *args, **kwargs)

    tf.train.Checkpoint.write = write_on_a_second_notice


class Signal(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            os.kill(os.getpid(), signal.SIGINT if when == "interrupt" else signal.SIGTERM)


checkpoint = tdu.callbacks.PreemptionCheckpoint(folder, every_steps=3)
model.fit(dist, epochs=2, verbose=0, callbacks=[Signal(), checkpoint])
print("TRAINED")
"""


class ProcessEnded(Exception):
    """The job's process ended: its status and the last line of its stderr."""


def _job(when: str, env: dict[str, str | None] | None = None) -> tuple[int, str, pathlib.Path]:
    folder = pathlib.Path(tempfile.mkdtemp(dir=_FOLDER))
    # Forked after TensorFlow's import: what is checked is the callback's answer to the signal
    # (status, last line, saves); a fresh process's Ctrl-C teardown is tests/test_crash_exits.py's.
    done = run_python(JOB, args=[str(folder), when], env=env, timeout=240, preloaded=True)
    assert "TRAINED" not in done.stdout, done.stderr[-3000:]
    return done.returncode, done.stderr, folder


def _last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1] if stderr.strip() else ""


def _sigterm_twice_during_the_save() -> None:
    status, stderr, folder = _job("term-twice")
    assert status == 75, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert _last_line(stderr).endswith("Exiting with status 75: run the same command to resume."), (
        stderr[-3000:]
    )
    assert "notice SIGTERM; saved" in _last_line(stderr) and "epoch 1, step 2 of 4" in stderr
    assert [p.name for p in folder.glob("ckpt-*")] == ["ckpt-000000000002"]
    assert (folder / "ckpt-000000000002" / "state.json").is_file()


def _sigint_during_fit() -> None:
    status, stderr, folder = _job("interrupt")
    assert status == -signal.SIGINT, stderr[-3000:]
    assert _last_line(stderr) == "KeyboardInterrupt", stderr[-3000:]
    assert not any(folder.glob("ckpt-*"))  # Ctrl-C is no notice: nothing is saved


def _grace_too_long() -> None:
    status, stderr, _ = _job("term", env={"TFDP_EXIT_GRACE": "1e10"})
    raise ProcessEnded(f"exit status {status}: {_last_line(stderr)}")


PROCESS_CASES: list[Case] = [
    (
        "process: SIGTERM twice, the second during PreemptionCheckpoint's save",
        _sigterm_twice_during_the_save,
        Accepts("a second SIGTERM during the save is noted once: the save ends, the job exits 75"),
    ),
    (
        "process: SIGINT during fit with PreemptionCheckpoint",
        _sigint_during_fit,
        Accepts("Ctrl-C during fit stops at once, without a save (status 130, -2 to a parent)"),
    ),
    (
        "process: TFDP_EXIT_GRACE=1e10 in a job",
        _grace_too_long,
        Raises(
            ProcessEnded,
            r"exit status 1: ValueError: TFDP_EXIT_GRACE must be at most 1e\+09 seconds",
        ),
    ),
]

CASES: list[Case] = (
    ENVIRONMENT_CASES + THROUGHPUT_CASES + CHECKPOINT_CASES + REPORT_CASES + DIAGNOSE_CASES
)
ALL_CASES: list[Case] = CASES + PROCESS_CASES


@parametrize(CASES)
def test_hostile_input(call: Callable[[], Any], outcome: Raises | Accepts) -> None:
    check_case(call, outcome)


@pytest.mark.slow
@parametrize(PROCESS_CASES)
def test_hostile_signal(call: Callable[[], Any], outcome: Raises | Accepts) -> None:
    check_case(call, outcome)
