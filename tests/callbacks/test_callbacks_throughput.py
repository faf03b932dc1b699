"""ThroughputLogger under real tf.distribute strategies on logical CPUs, event files read back."""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from support.graph import sleeping
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tfdp_utils import compat
from tfdp_utils._dataset_info import DatasetInfo
from tfdp_utils._tf import IS_KERAS3, keras
from tfdp_utils.callbacks import ThroughputLogger
from tfdp_utils.throughput import _tags as tags

pytestmark = pytest.mark.keras

EXAMPLES = 1203  # 150 full steps of 8 and a partial step of 3 per epoch
BATCH = 8
EPOCHS = 3
WARMUP = 10
EVERY = 40
STEP_SLEEP = 0.004  # windows of 40 steps last 160 ms or more


def read_run(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of one run, as (step, value) pairs, through TensorBoard's reader."""
    acc = EventAccumulator(str(path), size_guidance={"tensors": 0})
    acc.Reload()
    out: dict[str, list[tuple[int, float]]] = {}
    for tag in acc.Tags()["tensors"]:
        events = acc.Tensors(tag)
        if tag in tags.TAGS:
            out[tag] = [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events]
    return out


def description(path: Path, tag: str) -> str:
    acc = EventAccumulator(str(path), size_guidance={"tensors": 0})
    acc.Reload()
    return str(acc.SummaryMetadata(tag).summary_description)


class Sleep(keras.layers.Layer):  # type: ignore[misc]
    """A step of at least STEP_SLEEP per replica: the timer and the logger read the time in
    two hooks one after the other, and a scheduler's pause between them (10-20 ms on a loaded
    machine) must stay a small part of a window."""

    def call(self, x: Any) -> Any:
        return sleeping(x, STEP_SLEEP)


def make_model(strategy: Any, steps_per_execution: int, sleep: bool = False) -> Any:
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(256, activation="relu"),
                *([Sleep()] if sleep else []),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.001),
            loss="mse",
            steps_per_execution=steps_per_execution,
        )
    return model


def make_dataset() -> Any:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 32)).astype("float32")
    y = rng.normal(size=(EXAMPLES, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


class StepTimer(keras.callbacks.Callback):  # type: ignore[misc]
    """An independent clock: host time at the end of each batch, by global step.

    It declares itself async safe, so Keras 3 keeps dispatching batch ends off the training
    thread (as it does for the logger alone); tf_keras calls them on the training thread.
    Listed before the logger, it samples each step's end just before the logger's own hook.
    """

    async_safe = True

    def __init__(self) -> None:
        super().__init__()
        self.points: list[tuple[int, float]] = [(0, 0.0)]
        self.epoch_starts: list[int] = []  # global step at which each epoch began
        self._epoch_start = 0

    def on_train_begin(self, logs: Any = None) -> None:
        self.points = [(0, time.perf_counter())]

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch_start = epoch * self.params["steps"]
        self.epoch_starts.append(self._epoch_start)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        step = self._epoch_start + min(batch + 1, self.params["steps"])
        self.points.append((step, time.perf_counter()))

    def time_at(self, step: int) -> float:
        steps = [s for s, _ in self.points]
        i = bisect.bisect_left(steps, step)
        if steps[i] == step:
            return self.points[i][1]
        (s0, t0), (s1, t1) = self.points[i - 1], self.points[i]
        return t0 + (t1 - t0) * (step - s0) / (s1 - s0)

    def boundaries(self, previous: int, step: int) -> list[tuple[int, int]]:
        """The epoch boundaries inside (previous, step]: (last step of the old epoch, end of
        the new epoch's first batch), as the docs define them."""
        found = []
        steps = [s for s, _ in self.points]
        for start in self.epoch_starts[1:]:
            first_end = steps[bisect.bisect_right(steps, start)]
            if previous <= start and first_end <= step:
                found.append((start, first_end))
        return found


def counted_replica_sizes(strategy: Any) -> list[tuple[int, ...]]:
    """Examples each replica receives in each step of one epoch, counted by iterating."""
    dist = strategy.experimental_distribute_dataset(make_dataset())
    return [tuple(int(t.shape[0]) for t in strategy.experimental_local_results(x)) for x, _ in dist]


def expected_cumulative(sizes: list[tuple[int, ...]], step: int) -> tuple[int, ...]:
    per_epoch = len(sizes)
    full, rest = divmod(step, per_epoch)
    totals = np.array([0] * len(sizes[0]))
    for i, s in enumerate(sizes):
        totals += np.array(s) * (full + (1 if i < rest else 0))
    return tuple(int(v) for v in totals)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[int, int], Any]]:
    yield {}


def train(
    replicas: int, steps_per_execution: int, log_dir: Path, runs: dict[tuple[int, int], Any]
) -> Any:
    key = (replicas, steps_per_execution)
    if key in runs:
        return runs[key]
    if replicas == 1:
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    else:
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    sizes = counted_replica_sizes(strategy)
    # What the dataset builder would attach: written by hand from the dataset's shape.
    per_replica = BATCH // replicas
    tail = ((3,),) if replicas == 1 else ((2, 1),)
    info = DatasetInfo(
        global_batch_size=BATCH,
        per_replica_batch_size=per_replica,
        num_replicas_in_sync=replicas,
        examples_per_epoch=EXAMPLES,
        steps_per_epoch=151,
        full_steps=150,
        tail=tail,
    )
    model = make_model(strategy, steps_per_execution, sleep=True)
    logger = ThroughputLogger(log_dir, dataset=info, log_every_n_steps=EVERY, warmup_steps=WARMUP)
    timer = StepTimer()
    patch = IS_KERAS3 and replicas > 1 and steps_per_execution > 1
    newly = patch and "keras#19246" not in compat.applied()
    if patch:
        compat.apply(["keras#19246"])
    try:
        model.fit(make_dataset(), epochs=EPOCHS, verbose=0, callbacks=[timer, logger])
    finally:
        if newly:
            compat.undo("keras#19246")  # leave Keras as other tests expect it
    result = (logger, timer, sizes, log_dir, model)
    runs[key] = result
    return result


CONFIGS = [
    pytest.param(2, 1, id="2rep-spe1"),
    pytest.param(1, 4, id="1rep-spe4"),
    # On Keras 3 this runs with tfdp_utils.compat's keras#19246 workaround.
    pytest.param(2, 4, id="2rep-spe4"),
]


@pytest.mark.timing
@pytest.mark.parametrize(("replicas", "spe"), CONFIGS)
def test_logged_rate_agrees_with_an_independent_timer(
    replicas: int, spe: int, tmp_path: Path, runs: dict[tuple[int, int], Any]
) -> None:
    logger, timer, sizes, log_dir, _ = train(replicas, spe, tmp_path, runs)
    scalars = read_run(log_dir / tags.GLOBAL_RUN)
    counts = dict(scalars[tags.EXAMPLES])
    rates = scalars[tags.EXAMPLES_PER_SEC]
    assert len(rates) >= 6
    log_steps = sorted(counts)
    ratios = []

    def examples(first: int, last: int) -> int:
        return sum(expected_cumulative(sizes, last)) - sum(expected_cumulative(sizes, first))

    for step, logged in rates:
        assert step > WARMUP
        previous = log_steps[log_steps.index(step) - 1]
        if step == EPOCHS * 151 and step - previous < EVERY:
            continue  # the short last window at train end (test_every_fit_ends_with_its_total)
        # Epoch boundaries (an epoch's last step's end to the end of the next epoch's first
        # batch) are left out of the rates and logged apart: out of the timer's figure too.
        trained = examples(previous, step)
        seconds = timer.time_at(step) - timer.time_at(previous)
        for last, first_end in timer.boundaries(previous, step):
            trained -= examples(last, first_end)
            seconds -= timer.time_at(first_end) - timer.time_at(last)
        ratios.append(logged / (trained / seconds))
    assert all(0.9 <= r <= 1.1 for r in ratios), ratios
    summary = logger.summary()
    assert summary["steps_trained"] == EPOCHS * 151


@pytest.mark.parametrize(("replicas", "spe"), CONFIGS)
def test_cumulative_counts_are_exact_globally_and_per_replica(
    replicas: int, spe: int, tmp_path: Path, runs: dict[tuple[int, int], Any]
) -> None:
    logger, _, sizes, log_dir, model = train(replicas, spe, tmp_path, runs)
    assert {p.name for p in log_dir.iterdir()} == {tags.GLOBAL_RUN} | {
        tags.replica_run(k) for k in range(replicas)
    }
    global_counts = read_run(log_dir / tags.GLOBAL_RUN)[tags.EXAMPLES]
    assert global_counts, "no counts logged"
    for step, value in global_counts:
        assert value == sum(expected_cumulative(sizes, step)), step
    for k in range(replicas):
        replica = read_run(log_dir / tags.replica_run(k))
        for step, value in replica[tags.EXAMPLES]:
            assert value == expected_cumulative(sizes, step)[k], (k, step)
        assert tags.MEMORY_CURRENT_BYTES not in replica  # the CPU reports no memory
    summary = logger.summary()
    assert summary["examples"] == EXAMPLES * EPOCHS
    assert summary["replica_examples"] == list(expected_cumulative(sizes, EPOCHS * 151))
    assert sum(summary["replica_examples"]) == summary["examples"]
    assert summary["step"] == int(model.optimizer.iterations.numpy())


@pytest.mark.parametrize(("replicas", "spe"), CONFIGS)
def test_warmup_is_excluded_and_windows_have_the_asked_length(
    replicas: int, spe: int, tmp_path: Path, runs: dict[tuple[int, int], Any]
) -> None:
    _, _, _, log_dir, _ = train(replicas, spe, tmp_path, runs)
    scalars = read_run(log_dir / tags.GLOBAL_RUN)
    count_steps = [s for s, _ in scalars[tags.EXAMPLES]]
    rate_steps = [s for s, _ in scalars[tags.STEPS_PER_SEC]]
    # Counts at train begin, then at the end of warm-up (no rate), then every window.
    assert count_steps[0] == 0
    assert count_steps[1] >= WARMUP and count_steps[1] < WARMUP + spe
    assert rate_steps == count_steps[2:]
    windows = np.diff(count_steps[1:])
    # Windows cover log_every_n_steps, rounded up to a whole execution of spe steps; the
    # last one ends at the fit's final step and may be shorter.
    assert count_steps[-1] == EPOCHS * 151
    assert all(EVERY <= w < EVERY + spe for w in windows[:-1]), windows
    assert 0 < windows[-1] < EVERY + spe, windows
    for k in range(replicas):
        rates = read_run(log_dir / tags.replica_run(k))[tags.EXAMPLES_PER_SEC]
        assert [s for s, _ in rates] == rate_steps
    # Replica rates add up to the global rate.
    global_rates = dict(scalars[tags.EXAMPLES_PER_SEC])
    replica_rates = [
        dict(read_run(log_dir / tags.replica_run(k))[tags.EXAMPLES_PER_SEC])
        for k in range(replicas)
    ]
    for step, value in global_rates.items():
        assert sum(r[step] for r in replica_rates) == pytest.approx(value, rel=1e-5)


def test_descriptions_say_measured_or_derived_and_layout_is_written(
    tmp_path: Path, runs: dict[tuple[int, int], Any]
) -> None:
    _, _, _, log_dir, _ = train(2, 1, tmp_path, runs)
    global_run, replica_0 = log_dir / tags.GLOBAL_RUN, log_dir / tags.replica_run(0)
    assert description(global_run, tags.EXAMPLES_PER_SEC).startswith("Measured")
    assert description(global_run, tags.STEPS_PER_SEC).startswith("Measured")
    assert description(replica_0, tags.EXAMPLES_PER_SEC).startswith("Derived")
    assert description(global_run, tags.EXAMPLES).startswith("Exact count")
    acc = EventAccumulator(str(global_run), size_guidance={"tensors": 0})
    acc.Reload()
    assert tags.LAYOUT_TAG in acc.Tags()["tensors"]


def test_flops_give_mfu_labelled_derived(tmp_path: Path) -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    model = make_model(strategy, 1)
    logger = ThroughputLogger(
        tmp_path,
        global_batch_size=BATCH,
        log_every_n_steps=50,
        warmup_steps=5,
        flops_per_example=1e6,
        peak_flops_per_replica=1e10,
        per_replica=False,
    )
    model.fit(make_dataset(), epochs=1, verbose=0, callbacks=[logger])
    assert {p.name for p in tmp_path.iterdir()} == {tags.GLOBAL_RUN}
    scalars = read_run(tmp_path / tags.GLOBAL_RUN)
    rates = dict(scalars[tags.EXAMPLES_PER_SEC])
    mfu = dict(scalars[tags.MFU])
    assert mfu.keys() == rates.keys()
    for step, value in mfu.items():
        assert value == pytest.approx(rates[step] * 1e6 / (2 * 1e10), rel=1e-5)
    assert description(tmp_path / tags.GLOBAL_RUN, tags.MFU).startswith("Derived")
    assert logger.summary()["mfu"] > 0


def test_global_batch_size_counts_every_step_as_full(tmp_path: Path) -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    model = make_model(strategy, 1)
    logger = ThroughputLogger(tmp_path, global_batch_size=BATCH, log_every_n_steps=25)
    ds = make_dataset().take(100)  # 100 full steps
    model.fit(ds, epochs=2, verbose=0, callbacks=[logger])
    summary = logger.summary()
    assert summary["examples"] == 2 * 100 * BATCH
    assert summary["replica_examples"] == [800, 800]
    assert "split evenly" in summary["count_source"]
    # A second fit continues the cumulative count and the step axis.
    model.fit(ds, epochs=1, verbose=0, callbacks=[logger])
    assert logger.summary()["examples"] == 3 * 100 * BATCH
    counts = read_run(tmp_path / tags.GLOBAL_RUN)[tags.EXAMPLES]
    assert max(s for s, _ in counts) > 200


def test_validation_time_is_left_out_of_the_windows(tmp_path: Path) -> None:
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    model = make_model(strategy, 1)

    class SlowValidation(keras.callbacks.Callback):  # type: ignore[misc]
        def on_test_end(self, logs: Any = None) -> None:
            time.sleep(1.0)

    logger = ThroughputLogger(
        tmp_path, global_batch_size=BATCH, log_every_n_steps=100, warmup_steps=5
    )
    ds = make_dataset().take(60)
    started = time.perf_counter()
    model.fit(
        ds,
        epochs=4,
        verbose=0,
        validation_data=make_dataset().take(2),
        callbacks=[SlowValidation(), logger],
    )
    wall = time.perf_counter() - started
    summary = logger.summary()
    # Windows span epochs with a 1 s validation sleep at each end; none of it is counted.
    assert summary["windows"] >= 2
    assert summary["measured_seconds"] < wall - 2.5, (summary["measured_seconds"], wall)


def test_the_fits_ledger_agrees_with_the_tests_own_clocks(tmp_path: Path) -> None:
    """The goodput ledger's figures bracketed by clocks of the test: callbacks listed before
    and after the logger note when each hook ran (time.time()), so every ledger figure must
    fall between what they saw, however loaded the machine is."""
    from tfdp_utils.throughput._events import read_runs
    from tfdp_utils.throughput._goodput import FitLedger
    from tfdp_utils.throughput._summary import summarize

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    model = make_model(strategy, 1)

    class Seen(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self, sleep: float = 0.0) -> None:
            super().__init__()
            self.sleep, self.tests, self.ends = sleep, [], []

        def on_train_begin(self, logs: Any = None) -> None:
            self.train_begin = time.time()

        def on_test_begin(self, logs: Any = None) -> None:
            self.tests.append([time.time()])

        def on_test_end(self, logs: Any = None) -> None:
            time.sleep(self.sleep)
            self.tests[-1].append(time.time())

        def on_train_end(self, logs: Any = None) -> None:
            time.sleep(self.sleep)
            self.ends.append(time.time())

    first, last = Seen(sleep=0.3), Seen()
    logger = ThroughputLogger(tmp_path, global_batch_size=BATCH, log_every_n_steps=20)
    before = time.time()
    model.fit(
        make_dataset().take(30),
        epochs=3,
        verbose=0,
        validation_data=make_dataset().take(2),
        callbacks=[first, logger, last],
    )
    after = time.time()
    run = read_runs(str(tmp_path))["global"]
    assert len(run.ledgers) == 1 and run.ledgers[0] is not None
    ledger = FitLedger.from_json(run.ledgers[0])
    assert ledger is not None
    # The fit's call (tfdp-utils' fit binding sees it) comes before every on_train_begin...
    assert before <= ledger.fit_begin <= first.train_begin <= ledger.train_begin
    assert ledger.train_begin is not None and ledger.train_begin <= last.train_begin
    # ...and its end is the logger's on_train_end, between the two others'.
    assert first.ends[0] <= ledger.fit_end <= last.ends[0] <= after
    assert ledger.process_start is not None and ledger.process_start < before
    assert ledger.first_step == 0 and ledger.last_step == 90
    assert len(ledger.epoch_start_seconds) == 3
    # Validation: three evaluations, each inside [first's begin, last's end] and holding
    # [last's begin, first's end] (the 0.3 s sleep).
    assert len(first.tests) == len(last.tests) == 3
    pairs = list(zip(first.tests, last.tests, strict=True))
    inner = sum(f_end - l_begin for (_, f_end), (l_begin, _) in pairs)
    outer = sum(l_end - f_begin for (f_begin, _), (_, l_end) in pairs)
    assert 3 * 0.3 <= inner <= ledger.validation_seconds <= outer
    # After the last step: at least first's 0.3 s sleep in on_train_end, inside the fit.
    assert 0.3 <= ledger.after_last_step_seconds <= ledger.fit_end - ledger.train_begin
    # The parts, measured apart (two clocks), fit inside the fit's span.
    parts = (
        ledger.step_seconds
        + sum(ledger.epoch_start_seconds)
        + ledger.validation_seconds
        + ledger.after_last_step_seconds
    )
    assert parts <= (ledger.fit_end - ledger.fit_begin) + 0.05
    # The report and summary() give the same job's goodput.
    job = summarize(read_runs(str(tmp_path)))["goodput"]
    assert job is not None and job["fits"] == 1
    assert job["goodput"] == pytest.approx(logger.summary()["goodput"]["goodput"])
    assert 0 < job["goodput"] < 1


def test_missing_batch_size_fails_at_train_begin(tmp_path: Path) -> None:
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    model = make_model(strategy, 1)
    with pytest.raises(ValueError, match=r"cannot count examples.*global_batch_size"):
        model.fit(make_dataset(), epochs=1, verbose=0, callbacks=[ThroughputLogger(tmp_path)])
    assert int(model.optimizer.iterations.numpy()) == 0


def test_replica_mismatch_fails_at_train_begin(tmp_path: Path) -> None:
    info = DatasetInfo(global_batch_size=8, per_replica_batch_size=2, num_replicas_in_sync=4)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    model = make_model(strategy, 1)
    with pytest.raises(ValueError, match="built for 4 replicas but the model trains on 2"):
        model.fit(
            make_dataset(),
            epochs=1,
            verbose=0,
            callbacks=[ThroughputLogger(tmp_path, dataset=info)],
        )


def test_unwritable_log_dir_fails_at_train_begin(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the log directory should be")
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    model = make_model(strategy, 1)
    logger = ThroughputLogger(blocker / "logs", global_batch_size=BATCH)
    with pytest.raises(OSError, match="cannot write its TensorBoard run"):
        model.fit(make_dataset(), epochs=1, verbose=0, callbacks=[logger])
    assert int(model.optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"log_every_n_steps": 0},
            ValueError,
            "log_every_n_steps must be a positive integer, but received log_every_n_steps=0",
        ),
        (
            {"log_every_n_steps": 2.5},
            TypeError,
            r"log_every_n_steps must be an integer, but received 2\.5 of type float",
        ),
        (
            {"warmup_steps": -1},
            ValueError,
            "warmup_steps must be an integer >= 0, but received warmup_steps=-1",
        ),
        (
            {"global_batch_size": 0},
            ValueError,
            "global_batch_size must be a positive integer, but received global_batch_size=0",
        ),
        ({"peak_flops_per_replica": 1e12}, ValueError, "without flops_per_example"),
        ({"dataset": "train.tfrecord"}, TypeError, "carries no DatasetInfo"),
    ],
)
def test_bad_arguments_are_explained(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ThroughputLogger("logs", **kwargs)


def test_plain_dataset_as_dataset_argument_is_rejected() -> None:
    with pytest.raises(TypeError, match="pass global_batch_size= instead"):
        ThroughputLogger("logs", dataset=make_dataset())


def test_async_safe_on_a_single_worker() -> None:
    assert ThroughputLogger("logs", global_batch_size=8).async_safe is True
    assert os.environ.get("TF_CONFIG") is None


TWO_WORKERS = '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker"}}'
CHIEF_ONLY = '{"cluster": {"chief": ["127.0.0.1:1"]}, "task": {"type": "chief", "index": 0}}'


@pytest.mark.parametrize(
    ("tf_config", "safe"),
    [
        pytest.param(TWO_WORKERS, False, id="two-workers"),
        pytest.param(CHIEF_ONLY, True, id="one-worker"),
        # Malformed: it fails where the cluster is built; a property only reads it.
        pytest.param("{not json", True, id="malformed"),
    ],
)
def test_async_safe_follows_the_workers_in_tf_config(
    tf_config: str, safe: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_CONFIG", tf_config)
    assert ThroughputLogger("logs", global_batch_size=8).async_safe is safe


def test_builder_dataset_needs_no_batch_size_and_counts_partial_steps(tmp_path: Path) -> None:
    from tfdp_utils import build_distributed_dataset

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(1)
    x = rng.normal(size=(EXAMPLES, 32)).astype("float32")
    y = rng.normal(size=(EXAMPLES, 1)).astype("float32")
    # tf_keras keeps one iterator across epochs and needs steps_per_epoch for a distributed
    # dataset, so it trains on a repeated one; Keras 3 iterates the dataset once per epoch.
    dist = build_distributed_dataset(
        (x, y), strategy=strategy, global_batch_size=BATCH, repeat=not IS_KERAS3
    )
    steps_per_epoch = None if IS_KERAS3 else 151
    epochs = 2

    # Count what each replica receives, step by step, iterating the way fit does.
    def replica_sizes(batch: Any) -> tuple[int, ...]:
        return tuple(int(t.shape[0]) for t in strategy.experimental_local_results(batch[0]))

    if IS_KERAS3:
        epoch_sizes = [[replica_sizes(b) for b in dist] for _ in range(epochs)]
    else:
        iterator = iter(dist)
        epoch_sizes = [[replica_sizes(next(iterator)) for _ in range(151)] for _ in range(epochs)]

    class EpochStarts(keras.callbacks.Callback):  # type: ignore[misc]
        starts: list[int] = []

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.starts.append(int(self.model.optimizer.iterations.numpy()))

    def expected(step: int, k: int) -> int:
        total = 0
        for start, sizes in zip(EpochStarts.starts, epoch_sizes, strict=False):
            total += sum(s[k] for s in sizes[: max(0, step - start)])
        return total

    model = make_model(strategy, 1)
    logger = ThroughputLogger(tmp_path, log_every_n_steps=EVERY, warmup_steps=WARMUP)
    model.fit(
        dist,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        verbose=0,
        callbacks=[EpochStarts(), logger],
    )
    summary = logger.summary()
    assert "build_distributed_dataset" in summary["count_source"]
    final = summary["step"]
    assert summary["replica_examples"] == [expected(final, k) for k in range(2)]
    if IS_KERAS3:
        assert summary["examples"] == epochs * EXAMPLES
    for k in range(2):
        for step, value in read_run(tmp_path / tags.replica_run(k))[tags.EXAMPLES]:
            assert value == expected(step, k), (k, step)


def test_without_any_strategy(tmp_path: Path) -> None:
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    logger = ThroughputLogger(tmp_path, global_batch_size=BATCH, log_every_n_steps=30)
    model.fit(make_dataset(), epochs=1, verbose=0, callbacks=[logger])
    summary = logger.summary()
    assert summary["num_replicas"] == 1 and summary["local_replicas"] == [0]
    assert summary["examples"] == 151 * BATCH  # global_batch_size counts the partial step full
    assert {p.name for p in tmp_path.iterdir()} == {tags.GLOBAL_RUN, tags.replica_run(0)}


class EpochBoundaryTimer(keras.callbacks.Callback):  # type: ignore[misc]
    """A second clock over each epoch boundary, as the docs define it: from the end of an
    epoch's last step (or train begin) to the end of the next epoch's first batch."""

    def __init__(self, pause: float = 0.0) -> None:
        super().__init__()
        self.pause, self.started, self.gaps = pause, None, []  # type: ignore[var-annotated]

    def on_train_begin(self, logs: Any = None) -> None:
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if batch + 1 == self.params["steps"]:  # listed after the logger: starts after it
            self.started = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        time.sleep(self.pause)  # epoch-end work of a callback

    def stopper(self) -> Any:
        """A callback that stops this clock at the first batch's end; list it before the logger."""
        timer = self

        class Stop(keras.callbacks.Callback):  # type: ignore[misc]
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if batch == 0 and timer.started is not None:
                    timer.gaps.append(time.perf_counter() - timer.started)
                    timer.started = None

        return Stop()


def test_epoch_starts_are_measured_and_left_out_of_the_rates(tmp_path: Path) -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    model = make_model(strategy, 1)
    logger = ThroughputLogger(
        tmp_path, global_batch_size=BATCH, log_every_n_steps=25, warmup_steps=5
    )
    timer = EpochBoundaryTimer(pause=0.4)
    data = make_dataset().take(50)
    started = time.perf_counter()
    # The timer after the logger starts after the logger's boundary starts; its stopper runs
    # before the logger at the first batch's end, so the second clock's span lies inside the
    # logger's. The epoch-end sleep (in on_epoch_end, after the epoch's last step, as Keras'
    # iterator rebuild and other callbacks' epoch-end work) is inside both.
    model.fit(data, epochs=4, verbose=0, callbacks=[timer.stopper(), logger, timer])
    wall = time.perf_counter() - started
    summary = logger.summary()
    starts = summary["epoch_start_seconds"]
    assert len(starts) == 4 == len(timer.gaps)
    # Each epoch start agrees with the second clock (which starts a moment later and stops a
    # moment earlier, so the logger's is at least as long).
    for ours, theirs in zip(starts, timer.gaps, strict=True):
        assert theirs - 0.005 <= ours <= theirs + 0.05, (starts, timer.gaps)
    assert all(s >= 0.4 for s in starts[1:]), starts
    # Three boundaries of >= 0.4 s are in the wall time, and in no window.
    assert summary["measured_seconds"] < wall - 3 * 0.4, (summary["measured_seconds"], wall)
    events = read_run(tmp_path / tags.GLOBAL_RUN)[tags.EPOCH_START_SECONDS]
    assert [step for step, _ in events] == [0, 50, 100, 150]
    assert [v for _, v in events] == pytest.approx(starts, abs=1e-6)


@pytest.mark.parametrize(("steps", "epochs"), [(4, 1), (20, 1), (10, 3)])
def test_short_jobs_show_a_curve_and_their_total_with_the_defaults(
    steps: int, epochs: int, tmp_path: Path
) -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    model = make_model(strategy, 1)
    logger = ThroughputLogger(tmp_path, global_batch_size=BATCH)
    model.fit(make_dataset().take(steps), epochs=epochs, verbose=0, callbacks=[logger])
    total = steps * epochs
    scalars = read_run(tmp_path / tags.GLOBAL_RUN)
    assert scalars[tags.EXAMPLES][-1] == (total, float(total * BATCH))
    rates = scalars[tags.EXAMPLES_PER_SEC]
    assert len(rates) >= min(3, total - 1), rates  # a curve, not a lone point
    assert rates[-1][0] == total
    summary = logger.summary()
    assert summary["windows"] == len(rates)
    assert summary["log_every_n_steps"] <= max(1, total // 8)
