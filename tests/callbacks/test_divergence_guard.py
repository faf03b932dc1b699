"""DivergenceGuard on 2 in-process replicas: a planted inf is named, never applied, and skipped
exactly as a run without that batch; an overflowing layer is named; replicas that disagree are
named at the first step. References are runs of the same strategy without the guard."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from support.guard_loop import guarded_loop

import tfdp_utils as tdu
from tfdp_utils import compat
from tfdp_utils._tf import IS_KERAS3, keras
from tfdp_utils.callbacks import DivergenceGuard
from tfdp_utils.training import _mixed_precision as mixed_precision

pytestmark = pytest.mark.keras


@pytest.fixture(autouse=True, scope="module")
def _op_determinism() -> Any:
    """Op determinism for this module's runs (bit-equal references), and off again after it:
    the tests that share this process draw unseeded random ops."""
    from tensorflow.python.framework import config as tf_config

    tf.config.experimental.enable_op_determinism()
    yield
    tf_config.disable_op_determinism()


BATCH = 8  # global: replica 0 gets examples 0..3 of each batch, replica 1 examples 4..7
STEPS = 8
BAD_BATCH = 3
BAD_EXAMPLE = BAD_BATCH * BATCH + 5  # in replica 1's half of batch 3


@pytest.fixture
def strategy() -> Any:
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def data(*, plant: bool = True) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.randn(STEPS * BATCH, 4).astype("float32")
    y = rng.randn(STEPS * BATCH, 1).astype("float32")
    if plant:
        x[BAD_EXAMPLE, 2] = np.inf
    return x, y


def build(strategy: Any, layers: list[Any] | None = None) -> Any:
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,))]
            + (layers or [keras.layers.Dense(3, name="d1")])
            + [keras.layers.Dense(1, name="d2")]
        )
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def fit(model: Any, x: np.ndarray, y: np.ndarray, **kwargs: Any) -> Any:
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    return model.fit(dataset, verbose=0, shuffle=False, **kwargs)


def assert_same_weights(model: Any, reference: Any) -> None:
    for got, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def all_finite(model: Any) -> bool:
    return all(np.isfinite(w).all() for w in model.get_weights())


def test_stop_names_the_step_and_replica_and_keeps_the_last_finite_weights(
    strategy: Any, caplog: pytest.LogCaptureFixture
) -> None:
    x, y = data()
    model = build(strategy)
    guard = DivergenceGuard()
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        history = fit(model, x, y, epochs=3, callbacks=[guard])
    found = guard.divergence
    assert found is not None
    assert (found.epoch, found.batch, found.step) == (0, BAD_BATCH, BAD_BATCH + 1)
    assert found.replicas == (1,) and found.workers == (0,) and found.loss_replicas == (1,)
    assert len(history.history["loss"]) == 1  # stopped at the first read, the epoch's end
    assert guard.summary()["stopped"] and all_finite(model)
    assert "batch 3 (step 4 of this fit) on replica 1 on worker 0" in caplog.text
    assert found.examples == () and "build_distributed_dataset()" in found.examples_unknown
    # The weights are those of the same run on the batches before the bad one.
    reference = build(strategy)
    fit(reference, x[: BAD_BATCH * BATCH], y[: BAD_BATCH * BATCH], epochs=1)
    assert_same_weights(model, reference)


def test_skip_ends_with_the_weights_of_a_run_without_that_batch(strategy: Any) -> None:
    x, y = data()
    model = build(strategy)
    guard = DivergenceGuard(policy="skip", check_every_n_steps=2)
    history = fit(model, x, y, epochs=2, callbacks=[guard])
    assert len(history.history["loss"]) == 2
    summary = guard.summary()
    assert summary["skipped_steps"] == 2 and not summary["stopped"]  # once per epoch
    assert summary["steps"] == 2 * STEPS
    assert summary["divergence"].step == BAD_BATCH + 1
    assert summary["divergence"].replicas == (1,)
    keep = np.ones(len(x), bool)
    keep[BAD_BATCH * BATCH : (BAD_BATCH + 1) * BATCH] = False
    reference = build(strategy)
    x_clean, y_clean = x[keep], y[keep]
    # The same global batches without batch 3, epoch after epoch.
    fit(reference, x_clean, y_clean, epochs=2)
    assert_same_weights(model, reference)
    assert all_finite(model)


def skipped_scalars(log_dir: Path) -> list[tuple[int, float]]:
    """The guard's skipped-steps scalar, read back from the event files of the run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir / "global"), size_guidance={"tensors": 0})
    accumulator.Reload()
    return [
        (event.step, float(tf.make_ndarray(event.tensor_proto)))
        for event in accumulator.Tensors("divergence/skipped_steps")
    ]


def test_skip_stops_after_more_than_max_skipped_steps(
    strategy: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    x, y = data()
    x[[5, 13, 21, 37], 0] = np.nan  # batches 0, 1, 2 and 4; batch 3 holds the planted inf
    model = build(strategy)
    guard = DivergenceGuard(
        policy="skip", max_skipped_steps=3, check_every_n_steps=1, log_dir=str(tmp_path)
    )
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        fit(model, x, y, epochs=3, callbacks=[guard])
    summary = guard.summary()
    assert summary["stopped"] and summary["skipped_steps"] == 4
    assert summary["divergence"].step == 1 and summary["divergence"].replicas == (1,)
    assert all_finite(model)
    # The stop says why and the report names the first non-finite step.
    assert "stops training: more than max_skipped_steps=3 steps were skipped" in caplog.text
    assert "batch 0 (step 1 of this fit) on replica 1" in caplog.text
    # In TensorBoard: 0 at the start, rising with the reads (on Keras 3 a read may come a step
    # late, off the training thread), and at the last step the count summary() gives.
    points = skipped_scalars(tmp_path)
    assert points[0] == (0, 0.0) and points[-1] == (summary["steps"], 4.0)
    assert [value for _, value in points] == sorted({value for _, value in points})


class Overflow(keras.layers.Layer):  # type: ignore[misc]
    """The identity forward; backward, the gradient times 1e30 twice: inf in float32."""

    def call(self, inputs: Any) -> Any:
        @tf.custom_gradient
        def identity(value: Any) -> Any:
            return tf.identity(value), lambda upstream: upstream * 1e30 * 1e30

        return identity(inputs)


def test_an_overflowing_gradient_names_its_layer(strategy: Any) -> None:
    x, y = data(plant=False)
    model = build(strategy, [keras.layers.Dense(3, name="d1"), Overflow(name="boom")])
    guard = DivergenceGuard(check_every_n_steps=1)
    fit(model, x, y, epochs=1, callbacks=[guard])
    found = guard.divergence
    assert found is not None and found.step == 1 and found.loss_replicas == ()
    assert found.replicas == (0, 1)
    # d1 lies below the overflowing layer: its gradient went non-finite; d2's stayed finite.
    assert found.variable is not None and "d1" in found.variable and "bias" in found.variable
    assert all_finite(model)


def test_a_replica_with_other_weights_is_named_at_the_first_step(strategy: Any) -> None:
    x, y = data(plant=False)
    model = build(strategy)
    kernel = model.layers[0].kernel
    kernel = kernel.value if IS_KERAS3 else kernel
    replica_one = kernel.values[1]
    replica_one.assign(replica_one + 0.5)
    guard = DivergenceGuard()
    fit(model, x, y, epochs=2, callbacks=[guard])
    found = guard.summary()["disagreement"]
    assert found is not None and found.step == 1 and found.replicas == (1,)
    variable = model.layers[0].kernel
    assert [d.variable for d in found.differences] == [getattr(variable, "path", variable.name)]
    difference = found.differences[0]
    assert difference.sum_difference == pytest.approx(0.5 * 12, rel=1e-5)
    assert guard.summary()["stopped"]


def test_agreeing_replicas_and_finite_steps_report_nothing(strategy: Any) -> None:
    x, y = data(plant=False)
    model = build(strategy)
    guard = DivergenceGuard(check_replicas_every=3, check_every_n_steps=1)
    fit(model, x, y, epochs=2, callbacks=[guard])
    summary = guard.summary()
    assert summary["divergence"] is None and summary["disagreement"] is None
    assert summary["skipped_steps"] == 0 and not summary["stopped"]
    assert summary["checked_at_step"] == 16  # step 16 of 16: the last multiple of 3, plus one
    reference = build(strategy)
    fit(reference, x, y, epochs=2)
    assert_same_weights(model, reference)
    listed = {s.issue: s for s in compat.status()}["divergence-guard"]
    assert listed.applied and listed.applied_by == "DivergenceGuard()"


def build_mixed(strategy: Any) -> Any:
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(3, name="d1", dtype="mixed_float16"),
                keras.layers.Dense(1, name="d2", dtype="float32"),
            ]
        )
        # A scale of 2**40 overflows float16 at once: the optimizer skips and lowers it.
        optimizer = keras.mixed_precision.LossScaleOptimizer(
            keras.optimizers.Adam(0.01), initial_scale=2.0**40
        )
        model.compile(optimizer=optimizer, loss="mse")
    return model


def test_a_loss_scale_optimizers_own_skips_are_not_divergence(strategy: Any) -> None:
    x, y = data(plant=False)
    model = build_mixed(strategy)
    guard = DivergenceGuard(check_every_n_steps=1)
    fit(model, x, y, epochs=2, callbacks=[guard])
    summary = guard.summary()
    assert summary["divergence"] is None and not summary["stopped"]
    assert summary["skipped_steps"] == 0 and summary["steps"] == 2 * STEPS
    # The loss scale went down, so the optimizer did skip steps of its own.
    assert mixed_precision.current_loss_scale(model.optimizer) < 2.0**40
    assert all_finite(model)


def test_a_non_finite_loss_under_loss_scaling_is_divergence(strategy: Any) -> None:
    x, y = data()
    model = build_mixed(strategy)
    guard = DivergenceGuard(policy="skip", check_every_n_steps=1)
    fit(model, x, y, epochs=1, callbacks=[guard])
    found = guard.summary()["divergence"]
    assert found is not None and found.step == BAD_BATCH + 1 and found.loss_replicas == (1,)
    assert guard.summary()["skipped_steps"] == 1 and all_finite(model)


def test_one_device_without_a_strategy_is_guarded_too() -> None:
    x, y = data()
    model = build(tf.distribute.get_strategy())
    guard = DivergenceGuard(policy="skip", check_every_n_steps=1)
    fit(model, x, y, epochs=1, callbacks=[guard])
    found = guard.summary()["divergence"]
    assert found is not None and found.step == BAD_BATCH + 1 and found.replicas == (0,)
    assert guard.summary()["skipped_steps"] == 1 and all_finite(model)


def custom_loop(
    strategy: Any, x: np.ndarray, y: np.ndarray, guard: Any = None, *, builder: bool = False
) -> tuple[Any, int]:
    """The guarded custom loop (support.guard_loop): the model and the batches trained."""
    model, _, trained = guarded_loop(strategy, x, y, guard, builder=builder)
    return model, trained


def test_a_custom_loop_is_guarded_and_told_to_stop(strategy: Any) -> None:
    x, y = data()
    guard = DivergenceGuard(check_every_n_steps=1)
    model, trained = custom_loop(strategy, x, y, guard)
    assert trained == BAD_BATCH + 1  # check() said stop right after the bad step
    found = guard.divergence
    assert found is not None and found.step == BAD_BATCH + 1 and found.replicas == (1,)
    reference, _ = custom_loop(strategy, x[: BAD_BATCH * BATCH], y[: BAD_BATCH * BATCH])
    assert_same_weights(model, reference)


def test_a_custom_loop_under_skip_equals_a_loop_without_that_batch(strategy: Any) -> None:
    x, y = data()
    guard = DivergenceGuard(policy="skip")
    model, trained = custom_loop(strategy, x, y, guard)
    assert trained == STEPS and guard.summary()["skipped_steps"] == 1
    keep = np.ones(len(x), bool)
    keep[BAD_BATCH * BATCH : (BAD_BATCH + 1) * BATCH] = False
    reference, _ = custom_loop(strategy, x[keep], y[keep])
    assert_same_weights(model, reference)
    assert all_finite(model)


def test_a_later_fit_without_the_guard_trains_and_still_applies_no_inf(strategy: Any) -> None:
    x, y = data()
    model = build(strategy)
    guard = DivergenceGuard()
    fit(model, x, y, epochs=1, callbacks=[guard])
    assert guard.summary()["stopped"]
    before = model.get_weights()
    fit(model, x, y, epochs=1)  # the step keeps the guard's check, but holds nothing still
    after = model.get_weights()
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert all_finite(model)


def builder_data() -> tuple[np.ndarray, np.ndarray, int]:
    """64 examples, an inf planted in example 45; returns the arrays and that index."""
    x, y = data(plant=False)
    x[45, 1] = np.inf
    return x, y, 45


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_builder_dataset_names_the_examples_of_the_bad_step(
    strategy: Any, shuffled: bool, caplog: pytest.LogCaptureFixture
) -> None:
    x, y, bad = builder_data()
    ids = np.arange(len(x), dtype="float32")[:, None]
    options: dict[str, Any] = {"shuffle_buffer_size": 64, "seed": 3} if shuffled else {}
    dist = tdu.build_distributed_dataset(
        (x, y), strategy=strategy, global_batch_size=BATCH, **options
    )
    model = build(strategy)
    guard = DivergenceGuard(policy="skip", check_every_n_steps=1)
    with caplog.at_level(logging.INFO, logger="tfdp_utils"):
        model.fit(dist, epochs=2, verbose=0, callbacks=[guard])
    found = guard.summary()["divergence"]
    assert found is not None and found.examples_unknown == ""
    # Where example 45 went, counted independently: the same dataset over the examples' ids
    # (as labels), iterated step by step through the strategy's own iterator. Over two epochs
    # fit trains on the stream of whole epochs (each shuffled with its own seed): that one.
    seen = tdu.build_distributed_dataset(
        (ids, ids), strategy=strategy, global_batch_size=BATCH, **options
    )
    if shuffled:
        seen = seen.tfdp.resumable().epochs_from(0, 3)
    where = None
    for step, (_, labels) in enumerate(seen):
        for replica, part in enumerate(strategy.experimental_local_results(labels)):
            if bad in part.numpy().reshape(-1).astype(int):
                where = (step, replica, tuple(part.numpy().reshape(-1).astype(int)))
        if where:
            break
    assert where is not None
    step, replica, indices = where
    assert (found.epoch, found.batch, found.step) == (0, step, step + 1)
    assert found.replicas == (replica,)
    assert [(e.replica, e.indices, e.non_finite) for e in found.examples] == [
        (replica, indices, (bad,))
    ]
    assert found.non_finite_examples == (bad,)
    assert f"non-finite values in examples [{bad}]" in caplog.text
    assert guard.summary()["skipped_steps"] == 2 and all_finite(model)


def test_a_shuffled_dataset_iterated_anew_each_epoch_says_why_its_examples_are_not_named(
    strategy: Any,
) -> None:
    x, y, _ = builder_data()
    dist = tdu.build_distributed_dataset(
        (x, y), strategy=strategy, global_batch_size=BATCH, shuffle_buffer_size=64, seed=3
    )
    model = build(strategy)
    guard = DivergenceGuard(check_every_n_steps=1)
    model.fit(dist, epochs=1, verbose=0, callbacks=[guard])  # one epoch: no stream
    found = guard.divergence
    assert found is not None and found.examples == ()
    assert "shuffles each pass over it anew" in found.examples_unknown


def test_a_custom_loop_over_a_builder_dataset_names_the_examples(strategy: Any) -> None:
    x, y = data()  # the inf in example 29: batch 3, replica 1's half (examples 28..31)
    guard = DivergenceGuard(check_every_n_steps=1)
    _, trained = custom_loop(strategy, x, y, guard, builder=True)
    found = guard.divergence
    assert trained == BAD_BATCH + 1 and found is not None and found.replicas == (1,)
    assert [(e.replica, e.indices, e.non_finite) for e in found.examples] == [
        (1, (28, 29, 30, 31), (BAD_EXAMPLE,))
    ]


def test_stop_saves_the_last_good_step_with_a_preemption_checkpoint_and_resumes_there(
    strategy: Any, tmp_path: Path
) -> None:
    x, y = data()  # the inf in batch 3: steps 1..3 are good
    fixed = x.copy()
    fixed[BAD_EXAMPLE, 2] = 0.0  # the user's fix: the same data without the inf

    def run(inputs: np.ndarray, directory: Path, guard: Any = None) -> Any:
        model = build(strategy)
        dist = tdu.build_distributed_dataset(
            (inputs, y), strategy=strategy, global_batch_size=BATCH
        )
        # Periodic saves at steps 2 and 4: the one at 4 comes after the bad step (the guard
        # reads every 3 batches) and must not be the one a resume starts from.
        saver = tdu.callbacks.PreemptionCheckpoint(directory, exit=False, every_steps=2)
        model.fit(dist, epochs=2, verbose=0, callbacks=[saver] + ([guard] if guard else []))
        return model

    guard = DivergenceGuard(check_every_n_steps=3)
    stopped = run(x, tmp_path / "job", guard)
    assert guard.summary()["stopped"] and all_finite(stopped)
    assert guard.summary()["checkpoint"] == str(tmp_path / "job" / "ckpt-000000000003")
    saved = sorted(p.name for p in (tmp_path / "job").iterdir() if p.name.startswith("ckpt"))
    assert saved == ["ckpt-000000000002", "ckpt-000000000003"]
    # Running the job again (on the fixed data) resumes at step 3, and ends with the weights
    # of a job that trained on the fixed data from the start.
    resumed = run(fixed, tmp_path / "job")
    reference = run(fixed, tmp_path / "reference")
    assert_same_weights(resumed, reference)


def test_directory_saves_the_step_and_replay_step_reproduces_it_on_one_device(
    strategy: Any, tmp_path: Path
) -> None:
    x, y = data()  # the inf in example 29: batch 3, replica 1 (examples 28..31)
    model = build(strategy)
    guard = DivergenceGuard(policy="skip", directory=tmp_path)
    dist = tdu.build_distributed_dataset((x, y), strategy=strategy, global_batch_size=BATCH)
    model.fit(dist, epochs=2, verbose=0, callbacks=[guard])
    saved = guard.summary()["saved_to"]
    assert saved == str(tmp_path / f"step-{BAD_BATCH + 1}")
    # The weights saved are those before the step (training went on after it, under "skip"):
    # a run on the 3 batches before it ends on them.
    reference = build(strategy)
    fit(reference, x[: BAD_BATCH * BATCH], y[: BAD_BATCH * BATCH], epochs=1)
    with np.load(Path(saved) / "weights.npz") as weights:
        for i, want in enumerate(v.numpy() for v in reference.trainable_variables):
            np.testing.assert_array_equal(weights[f"w_{i}"], want)
    assert any(
        not np.array_equal(a.numpy(), b.numpy())
        for a, b in zip(model.trainable_variables, reference.trainable_variables, strict=True)
    )
    # On one device, without a strategy: the same non-finite loss and gradients.
    one_device = build(tf.distribute.get_strategy())
    replayed = tdu.replay_step(saved, one_device)
    assert replayed.reproduced and not replayed.loss_finite
    assert len(replayed.non_finite_gradients) == len(one_device.trainable_variables)
    assert replayed.report["step"] == BAD_BATCH + 1 and replayed.report["replica_saved"] == 1
    # With that example's inf replaced, the same files give a finite loss: the inf was it.
    with np.load(Path(saved) / "batch.npz") as batch:
        np.testing.assert_array_equal(batch["leaf_0"], x[28:32])
        leaves = {name: batch[name] for name in batch.files}
    leaves["leaf_0"][1, 2] = 0.0
    np.savez(Path(saved) / "batch.npz", **leaves)
    fixed = tdu.replay_step(saved, build(tf.distribute.get_strategy()))
    assert fixed.loss_finite and not fixed.reproduced
