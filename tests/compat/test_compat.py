"""tfdp_utils.compat in-process: probes, apply-once semantics, the off switch, spe=4 training.

Upstream failures with the workarounds off are reproduced in fresh processes
(test_compat_upstream.py, test_compat_multiworker.py); here the patch state is reset around
each test that needs it, with :func:`tfdp_utils.compat.undo`.
"""

from __future__ import annotations

import inspect
import logging
import threading
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import tfdp_utils as tdu
from tfdp_utils import compat
from tfdp_utils._tf import IS_KERAS3, keras, tf
from tfdp_utils.compat import _keras_19246 as keras_19246
from tfdp_utils.compat import _keras_20582 as keras_20582
from tfdp_utils.compat import _keras_20585 as keras_20585
from tfdp_utils.compat import _keras_lso_replicas as keras_lso_replicas
from tfdp_utils.compat import _switch
from tfdp_utils.compat import _tf_72388 as tf_72388
from tfdp_utils.compat._registry import (
    REGISTRY,
    Patch,
    change_of,
    keras3_trainer_class,
    keras3_trainer_module,
)

ISSUES = (
    "keras#20585",
    "tensorflow#72388",
    "keras#19246",
    "keras#20582",
    "keras-lso-replicas",
)


@pytest.fixture(autouse=True)
def patches_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests decide themselves when the off switch is set."""
    monkeypatch.delenv("TFDP_NO_KERAS_PATCHES", raising=False)


@pytest.fixture
def fresh() -> Iterator[None]:
    """No workaround applied and nothing logged yet; the previous state is restored after."""
    before = compat.applied()
    for issue in before:
        compat.undo(issue)
    logged = set(_switch._LOGGED)
    _switch._LOGGED.clear()
    yield
    for issue in compat.applied():
        compat.undo(issue)
    _switch._LOGGED.clear()
    _switch._LOGGED.update(logged)
    if before:
        compat.apply(before)


@pytest.fixture(scope="module")
def two_cpus() -> Any:
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


# ------------------------------------------------------------------ probes (no Keras needed)


class _FakeStrategy:
    def __init__(self) -> None:
        self.reduced: list[Any] = []

    def reduce(self, op: Any, value: Any, axis: Any) -> Any:
        self.reduced.append(value)
        return value

    def scope(self) -> Any:
        import contextlib

        return contextlib.nullcontext()


class _UpstreamTrainer:
    """Keras 3.15.1's logic for the first batch: one reduce of the whole nest."""

    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> None:
        for _, _, it in iterator:
            batch = next(it)
            data_batch = self.distribute_strategy.reduce("MEAN", batch, axis=None)
            break
        self._symbolic_build(data_batch=data_batch)


class _FixedTrainer:
    """A fixed Keras: one reduce per tensor, which MultiWorkerMirroredStrategy supports."""

    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> None:
        for _, _, it in iterator:
            batch = next(it)
            data_batch = tf.nest.map_structure(
                lambda v: self.distribute_strategy.reduce("MEAN", v, axis=None), batch
            )
            break
        self._symbolic_build(data_batch=data_batch)


@pytest.mark.parametrize("class_name", ["TensorFlowTrainer", "Trainer"])
def test_20585_probe_tells_fixed_from_buggy_code(class_name: str) -> None:
    # Keras <= 3.15 names the class TensorFlowTrainer; the 3.16 nightlies name it Trainer.
    buggy = types.SimpleNamespace(**{class_name: _UpstreamTrainer})
    fixed = types.SimpleNamespace(**{class_name: _FixedTrainer})
    assert keras_20585.probe(buggy) is True
    assert keras_20585.probe(fixed) is False
    assert keras_20585.probe(types.SimpleNamespace()) is False  # code path gone


def test_the_trainer_class_is_found_by_either_name() -> None:
    from tfdp_utils.compat._registry import keras3_trainer_class

    assert keras3_trainer_class(types.SimpleNamespace(TensorFlowTrainer=_UpstreamTrainer)) is (
        _UpstreamTrainer
    )
    assert keras3_trainer_class(types.SimpleNamespace(Trainer=_FixedTrainer)) is _FixedTrainer
    assert keras3_trainer_class(types.SimpleNamespace(Trainer="not a class")) is None
    assert keras3_trainer_class(None) is None
    trainer = keras3_trainer_module()
    if trainer is not None:  # the installed Keras 3: its class, whatever its name
        assert keras3_trainer_class(trainer) is not None


def test_the_trainer_class_is_found_under_its_keras_nightly_name() -> None:
    # keras-nightly 3.16.0.dev (TensorFlow 2.22) renamed TensorFlowTrainer to Trainer: the
    # probes read the same code under the new name instead of finding no trainer at all.
    renamed = types.SimpleNamespace(Trainer=_UpstreamTrainer)
    assert keras3_trainer_class(renamed) is _UpstreamTrainer
    assert keras_20585.probe(renamed) is True
    both = types.SimpleNamespace(TensorFlowTrainer=_FixedTrainer, Trainer=_UpstreamTrainer)
    assert (
        keras3_trainer_class(both) is _FixedTrainer
    )  # Keras <= 3.15: TensorFlowTrainer is the class
    assert keras3_trainer_class(types.SimpleNamespace(Trainer="not a class")) is None


def _upstream_reduce(values: Any, strategy: Any, reduction: Any) -> Any:
    """Keras 3.15.1's multi-worker branch of reduce_per_replica."""
    if strategy.extended._in_multi_worker_mode():
        if reduction == "sum":
            return tf.nest.map_structure(lambda v: strategy.reduce("SUM", v), values)
        return tf.nest.map_structure(lambda v: strategy.reduce("MEAN", v, axis=0), values)
    return values


def _fixed_reduce(values: Any, strategy: Any, reduction: Any) -> Any:
    op = "SUM" if reduction == "sum" else "MEAN"
    return tf.nest.map_structure(lambda v: strategy.reduce(op, v, axis=None), values)


def test_72388_probe_tells_fixed_from_buggy_code() -> None:
    assert tf_72388.probe(types.SimpleNamespace(reduce_per_replica=_upstream_reduce)) is True
    assert tf_72388.probe(types.SimpleNamespace(reduce_per_replica=_fixed_reduce)) is False


BUGGY_LOOP = """
def _make_function(self, step_function):
    def one_step_on_data(data):
        return self.distribute_strategy.run(step_function, args=(data,))

    def loop(iterator, optional):
        def has_next():
            return one_step_on_data(optional.get_value())

        return tf.cond(optional.has_value(), has_next, lambda: None)
"""

LAMBDA_LOOP = """
def f(self, strategy, step):
    return tf.cond(pred, lambda: strategy.run(step), lambda: None)
"""


def test_19246_probe_reads_the_construct() -> None:
    assert keras_19246.step_inside_cond(BUGGY_LOOP) is True
    assert keras_19246.step_inside_cond(LAMBDA_LOOP) is True
    # The workaround's own loop keeps the step out of tf.cond.
    fixed = inspect.getsource(keras_19246._make_function_factory)
    assert keras_19246.step_inside_cond(fixed) is False


def test_bad_arguments_say_what_exists() -> None:
    with pytest.raises(ValueError, match=r"keras#19246"):
        compat.apply(["keras#1"])
    with pytest.raises(TypeError, match=r"\['keras#19246'\]"):
        compat.apply("keras#19246")


@pytest.mark.keras
def test_needed_for(two_cpus: Any) -> None:
    assert compat.needed_for(two_cpus) == ("keras#19246", "keras#20582", "keras-lso-replicas")
    assert compat.needed_for(tf.distribute.MirroredStrategy(["/cpu:0"])) == ("keras#20582",)
    assert compat.needed_for(tf.distribute.OneDeviceStrategy("/cpu:0")) == ()
    assert compat.needed_for(tf.distribute.get_strategy()) == ()


# --------------------------------------------------------------------- apply / applied / off


def _workaround_patches() -> list[Patch]:
    """The patches the registry holds for the applied workarounds."""
    entries = [REGISTRY.get(issue) for issue in compat.applied()]
    return [patch for entry in entries if entry is not None for patch in entry.patches]


def _patched_attributes() -> dict[str, Any]:
    """Every attribute of Keras' Model classes (and the TF trainer module) a workaround replaced."""
    found: dict[str, Any] = {}
    owners: list[Any] = list(keras.Model.__mro__)
    trainer = keras3_trainer_module()
    if trainer is not None:
        owners += [
            trainer,
            keras_20582.tf_optimizer_class(trainer),
            keras_lso_replicas.loss_scale_optimizer_class(trainer),
        ]
    for owner in owners:
        for name, value in vars(owner).items():
            if change_of(value) in ISSUES:
                found[f"{getattr(owner, '__name__', owner)}.{name}"] = value
    return found


@pytest.mark.keras
def test_apply_once_logged_once_from_many_threads(
    fresh: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tfdp_utils")
    present = [s.issue for s in compat.status() if s.bug_present]
    results: list[tuple[str, ...]] = []
    threads = [threading.Thread(target=lambda: results.append(compat.apply())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    results.append(compat.apply())
    assert all(result == tuple(present) for result in results)
    assert compat.applied() == tuple(present)
    for issue in present:
        messages = [r.getMessage() for r in caplog.records if issue in r.getMessage()]
        assert len(messages) == 1, messages
        assert "TFDP_NO_KERAS_PATCHES=1" in messages[0]
    # Each patch wraps Keras' own code, never a workaround's patch (applying twice from many
    # threads wraps nothing twice). It may wrap a process change installed before it: on
    # Keras 3, fit-one-iterator also replaces _maybe_symbolic_build when a builder dataset
    # was made earlier in the process, and keras#20585's patch then wraps that one.
    patches = _workaround_patches()
    assert all(change_of(p.original) in (None, "fit-one-iterator") for p in patches)
    assert len(_patched_attributes()) == len(patches)
    status = {s.issue: s for s in compat.status() if s.kind == "workaround"}
    assert {i: s.applied for i, s in status.items()} == {
        i: ("fix" if i in present else None) for i in ISSUES
    }
    for issue in present:  # what, why, when, by what, and how to take it out
        assert status[issue].applied_by == "tdu.compat.apply()"
        assert status[issue].applied_at is not None and status[issue].undoable
        assert status[issue].changes and issue in status[issue].why
        assert status[issue].patched


@pytest.mark.keras
def test_off_switch_applies_nothing(
    fresh: None, two_cpus: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tfdp_utils")
    monkeypatch.setenv("TFDP_NO_KERAS_PATCHES", "1")
    assert compat.disabled()
    assert compat.apply() == ()
    assert compat.apply_for_strategy(two_cpus) == ()
    assert _patched_attributes() == {}
    if any(s.bug_present for s in compat.status()):
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "TFDP_NO_KERAS_PATCHES=1" in warnings[0]


@pytest.mark.keras
def test_only_keras3_tensorflow_trainer_is_patched(fresh: None) -> None:
    compat.apply()
    patched = _patched_attributes()
    if not IS_KERAS3:
        assert compat.applied() == () and patched == {}
        assert all(not s.bug_present for s in compat.status())
        return
    trainer = keras3_trainer_module()
    assert trainer is not None
    for patch in _workaround_patches():
        assert patch.owner in (
            trainer,
            keras3_trainer_class(trainer),
            keras_20582.tf_optimizer_class(trainer),
            keras_lso_replicas.loss_scale_optimizer_class(trainer),
        ) or (patch.owner, patch.name) == (keras3_trainer_class(trainer).__mro__[1], "compile")


@pytest.mark.keras
def test_auto_strategy_applies_what_its_strategy_needs(fresh: None) -> None:
    strategy = tdu.auto_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
    present = {s.issue for s in compat.status() if s.bug_present}
    # MirroredStrategy needs keras#19246 and keras#20582; the multi-worker fixes stay out.
    wanted = ("keras#19246", "keras#20582", "keras-lso-replicas")
    assert compat.applied() == tuple(issue for issue in wanted if issue in present)
    assert strategy.num_replicas_in_sync == 2


# ------------------------------------------------------------- steps_per_execution on 2 CPUs


def _train(strategy: Any, steps_per_execution: int, batches: int) -> dict[str, Any]:
    rng = np.random.RandomState(0)
    x = rng.rand(batches * 8, 3).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]], "float32") + 0.25).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    assert int(data.cardinality()) == batches
    init = [rng.randn(3, 1).astype("float32"), np.zeros((1,), "float32")]
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(
            optimizer=keras.optimizers.SGD(0.05),
            loss="mse",
            metrics=["mae"],
            steps_per_execution=steps_per_execution,
        )
    model.set_weights(init)
    history = model.fit(data, epochs=2, verbose=0)
    return {
        "init": init,
        "iterations": int(model.optimizer.iterations.numpy()),
        "weights": model.get_weights(),
        "history": history.history,
        "evaluate": model.evaluate(data, verbose=0),
        "predict": model.predict(x, batch_size=8, verbose=0),
    }


@pytest.mark.keras
@pytest.mark.parametrize("batches", [16, 18])
def test_steps_per_execution_4_matches_1(two_cpus: Any, batches: int) -> None:
    """Every batch is one optimizer step, and the result is that of steps_per_execution=1.

    18 batches end each epoch on a short execution of 2 steps.
    """
    applied = compat.apply_for_strategy(two_cpus)
    if any(s.issue == "keras#19246" and s.bug_present for s in compat.status()):
        assert "keras#19246" in applied
    reference = _train(two_cpus, 1, batches)
    grouped = _train(two_cpus, 4, batches)
    assert reference["iterations"] == grouped["iterations"] == 2 * batches
    for ours, theirs in zip(grouped["weights"], reference["weights"], strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
    for name in ("loss", "mae"):
        np.testing.assert_allclose(grouped["history"][name], reference["history"][name], rtol=1e-6)
    np.testing.assert_allclose(grouped["evaluate"], reference["evaluate"], rtol=1e-6)
    np.testing.assert_allclose(grouped["predict"], reference["predict"], rtol=1e-6, atol=1e-6)
    assert not np.allclose(reference["weights"][0], reference["init"][0])  # it did train


# ------------------------------------------------------------------------------- the guard


class _Steps(keras.callbacks.Callback):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.begun = 0

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.begun += 1


@pytest.mark.keras
@pytest.mark.skipif(not IS_KERAS3, reason="the guard patches Keras 3's trainer only")
def test_guard_fails_before_the_first_step(fresh: None, two_cpus: Any) -> None:
    trainer = keras3_trainer_module()
    assert trainer is not None
    mode, patches = keras_19246.install_guard(trainer)
    assert mode == "guard"
    # Recorded as apply() records a workaround, so that undo() takes it out again.
    REGISTRY.record(keras_19246.WORKAROUND.change, applied_by="test", patches=patches, mode=mode)
    assert {s.issue: s.applied for s in compat.status()}["keras#19246"] == "guard"
    try:
        data = tf.data.Dataset.from_tensor_slices((np.ones((64, 3)), np.ones((64, 1)))).batch(8)
        with two_cpus.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse", steps_per_execution=4)
        steps = _Steps()
        with pytest.raises(compat.KerasCompatError) as raised:
            model.fit(data, verbose=0, callbacks=[steps])
        message = str(raised.value)
        for needed in ("keras#19246", "steps_per_execution=1", "tf_keras", "MirroredStrategy"):
            assert needed in message
        assert steps.begun == 0 and int(model.optimizer.iterations.numpy()) == 0
        with pytest.raises(compat.KerasCompatError, match="keras#19246"):
            model.evaluate(data, verbose=0)
        # Models the bug does not affect train as usual under the guard.
        with two_cpus.scope():
            plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            plain.compile(optimizer="sgd", loss="mse", steps_per_execution=1)
        plain.fit(data, verbose=0)
        assert int(plain.optimizer.iterations.numpy()) == 8
    finally:
        compat.undo("keras#19246")
    assert not any(patch.installed() for patch in patches)


# ------------------------------------------------- keras#20582: gradient_accumulation_steps

UPSTREAM_APPLY = """
def _backend_apply_gradients(self, grads, trainable_variables):
    if self.gradient_accumulation_steps:
        is_update_step = (self._iterations + 1) % self.gradient_accumulation_steps == 0

        def _update_step_fn(grads, trainable_variables):
            self._backend_update_step(grads, trainable_variables, self.learning_rate)

        ops.cond(
            is_update_step,
            lambda: _update_step_fn(grads, trainable_variables),
            lambda: self._backend_increment_gradient_accumulators(grads, acc_grads),
        )
"""


def test_20582_probe_reads_the_construct() -> None:
    assert keras_20582.sync_inside_replica_cond(UPSTREAM_APPLY) is True
    # The workaround's cond sits in the function given to merge_call (cross-replica).
    fixed = inspect.getsource(keras_20582._accumulate_or_update)
    assert keras_20582.sync_inside_replica_cond(fixed) is False
    gone = types.SimpleNamespace(__name__="keras.src.backend.tensorflow.trainer")
    assert keras_20582.probe(gone) is False  # no TFOptimizer method: nothing to work around


def _fit_with_accumulation(strategy: Any) -> Any:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(
            optimizer=keras.optimizers.SGD(0.01, gradient_accumulation_steps=2), loss="mse"
        )
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    return model


@pytest.mark.keras
@pytest.mark.skipif(not IS_KERAS3, reason="tf_keras optimizers have no gradient accumulation")
def test_20582_upstream_failure_without_the_workaround(fresh: None, two_cpus: Any) -> None:
    assert compat.applied() == ()
    assert {s.issue: s.bug_present for s in compat.status()}["keras#20582"] is True
    with pytest.raises(RuntimeError, match="merge_call` called while defining a new graph"):
        _fit_with_accumulation(two_cpus)


@pytest.mark.keras
@pytest.mark.skipif(not IS_KERAS3, reason="tf_keras optimizers have no gradient accumulation")
def test_20582_workaround_trains_with_accumulation(fresh: None, two_cpus: Any) -> None:
    assert "keras#20582" in compat.apply_for_strategy(two_cpus)
    model = _fit_with_accumulation(two_cpus)
    # 4 micro-steps of 16 examples, 2 per update: 2 updates.
    assert int(model.optimizer._iterations.numpy()) == 4
    assert int(model.optimizer.iterations.numpy()) == 2
    compat.undo("keras#20582")
    assert not any(
        change_of(value) == "keras#20582"
        for value in vars(keras_20582.tf_optimizer_class(keras3_trainer_module())).values()
    )


def test_a_saved_model_loads_compiled_with_the_workarounds_applied(
    fresh: None, tmp_path: Any
) -> None:
    # keras#19246's argument check wraps Keras' compile where Keras defines it: load_model
    # compiles a restored model only when its class's compile is Keras' own.
    compat.apply(["keras#19246"])
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(np.ones((8, 3), "float32"), np.ones((8, 1), "float32"), batch_size=4, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert int(loaded.optimizer.iterations.numpy()) == 2
    compat.undo("keras#19246")
    assert "keras#19246" not in compat.applied()


# ----------------------- keras-lso-replicas: LossScaleOptimizer's first-replica verdict


def _mixed_precision_fit(strategy: Any) -> Any:
    """mixed_float16 on a builder dataset of unknown size: a replica's gradients overflow
    where the first replica's do not (its last batch of an epoch differs)."""
    from support import interactions as job

    settings = job.Settings(mixed=True, unknown_size=True)
    with job.applied(settings):
        cell = job.Job(settings, strategy)
        data = job.dataset(settings, strategy)
        # The overflow on one replica only comes with the orders of Keras' own iterator per
        # epoch (reshuffled each pass); fit-one-iterator's stream from the second epoch on
        # shuffles each epoch with a seed of its own, in other orders.
        compat.undo("fit-one-iterator")
        job.fit(cell, data, [])
    return cell


def test_lso_replicas_probe_reads_the_construct() -> None:
    assert keras_lso_replicas.first_replica_decides(
        "finite = distribution.experimental_local_results(finite_per_replica)[0]"
    )
    assert not keras_lso_replicas.first_replica_decides(
        "failing = distribution.reduce(SUM, per_replica, axis=None)\n"
        "x = distribution.experimental_local_results(v)[0]"
    )


@pytest.mark.keras
def test_lso_replicas_nan_weights_without_the_workaround_finite_with_it(
    fresh: None, two_cpus: Any
) -> None:
    if not IS_KERAS3:
        # tf_keras' LossScaleOptimizer all-reduces the gradients before its check: no bug,
        # nothing applied, finite weights.
        assert "keras-lso-replicas" not in compat.apply_for_strategy(two_cpus)
        cell = _mixed_precision_fit(two_cpus)
        assert all(np.isfinite(w).all() for w in cell.weights())
        return
    assert compat.applied() == ()
    assert {s.issue: s.bug_present for s in compat.status()}["keras-lso-replicas"] is True
    broken = _mixed_precision_fit(two_cpus)
    assert any(np.isnan(w).any() for w in broken.weights())  # the upstream failure
    assert "keras-lso-replicas" in compat.apply(["keras-lso-replicas"])
    fixed = _mixed_precision_fit(two_cpus)
    assert all(np.isfinite(w).all() for w in fixed.weights())
    # The overflowing step was skipped on both replicas: fewer updates than steps.
    assert 0 < fixed.updates() < 3 * 6
    compat.undo("keras-lso-replicas")
