"""Gradient accumulation: 2 replicas x 2 micro-batches x 8 examples == one device on 32.

Every run here is compared with an independent reference: one device, no strategy, no
accumulation, a plain GradientTape loop over global batches of 32 (the same examples in the
same order), with the loss averaged over each batch.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.two_worker_cluster import phase_results

import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf

pytestmark = pytest.mark.keras

REPLICAS = 2
PER_REPLICA = 8
ACCUMULATION = 2
MICRO_BATCH = REPLICAS * PER_REPLICA  # 16 examples per micro-step over both replicas
UPDATE_BATCH = MICRO_BATCH * ACCUMULATION  # 32 examples per optimizer update
UPDATES = 5
FULL = UPDATES * UPDATE_BATCH  # 160 examples: 5 full updates
PARTIAL = FULL - 10  # 150: the last update has a full micro-batch of 16 and a partial one of 6
TOLERANCE = 1e-5


def _data(num_examples: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    x = rng.normal(size=(num_examples, 6)).astype("float32")
    y = rng.integers(0, 3, size=num_examples).astype("int64")
    return x, y


def _model(regularized: bool = True) -> keras.Model:
    regularizer = keras.regularizers.L2(0.01) if regularized else None
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="tanh", kernel_regularizer=regularizer),
            keras.layers.Dense(3),
        ]
    )


def _optimizer() -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(learning_rate=0.2, momentum=0.9)


@pytest.fixture(scope="module")
def initial_weights() -> list[np.ndarray]:
    return [w.copy() for w in _model().get_weights()]


@pytest.fixture(scope="module")
def strategy() -> tf.distribute.Strategy:
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])


def _one_device(model, x, y, *, update_batch=UPDATE_BATCH, micro_batch=None):
    """One device, no strategy: one SGD update per ``update_batch`` consecutive examples.

    By default each update's loss is the mean over all its examples (+ regularization), as one
    step on the whole batch. With ``micro_batch``, each update's gradient is instead the mean
    of the gradients of its micro-batches, each averaged over its own examples: Keras 3's
    documented ``gradient_accumulation_steps`` semantics, which weigh a partial micro-batch
    like a full one.
    """
    optimizer = _optimizer()
    updates = 0
    for start in range(0, len(x), update_batch):
        end = min(start + update_batch, len(x))
        size = micro_batch or update_batch
        parts = [(i, min(i + size, end)) for i in range(start, end, size)]
        gradients = None
        for low, high in parts:
            with tf.GradientTape() as tape:
                logits = model(x[low:high], training=True)
                loss = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(
                        y[low:high], logits, from_logits=True
                    )
                )
                if model.losses:
                    loss += tf.add_n(model.losses)
            new = tape.gradient(loss, model.trainable_variables)
            gradients = (
                new if gradients is None else [a + b for a, b in zip(gradients, new, strict=True)]
            )
        gradients = [g / len(parts) for g in gradients]
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        updates += 1
    return model.get_weights(), updates


def _reference(initial_weights, num_examples, regularized=True, micro_batch=None):
    """One device on global batches of 32 (loss = mean over the batch + regularization)."""
    model = _model(regularized)
    model.set_weights(initial_weights)
    return _one_device(model, *_data(num_examples), micro_batch=micro_batch)


def _max_difference(a, b) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


def _custom_step_run(strategy, initial_weights, num_examples, **step_kwargs):
    with strategy.scope():
        model = _model()
        model.set_weights(initial_weights)
        optimizer = _optimizer()
    step = tdu.make_distributed_train_step(
        model,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
        optimizer=optimizer,
        strategy=strategy,
        accumulation_steps=ACCUMULATION,
        **step_kwargs,
    )
    x, y = _data(num_examples)
    micro_batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(MICRO_BATCH)
    calls = 0
    for batch in strategy.experimental_distribute_dataset(micro_batches):
        assert np.isfinite(float(step(batch)))
        calls += 1
    return model.get_weights(), int(optimizer.iterations.numpy()), calls, step


@pytest.mark.parametrize("num_examples", [FULL, PARTIAL])
def test_custom_step_accumulates_to_the_one_device_weights(strategy, initial_weights, num_examples):
    reference, updates = _reference(initial_weights, num_examples)
    weights, iterations, calls, step = _custom_step_run(strategy, initial_weights, num_examples)
    assert (calls, iterations, updates) == (2 * UPDATES, UPDATES, UPDATES)
    assert step.pending_micro_steps == 0 and step.skipped_steps == 0
    print(f"custom step, {num_examples} examples: {_max_difference(weights, reference):.2e}")
    assert _max_difference(weights, reference) <= TOLERANCE
    assert _max_difference(weights, initial_weights) > 1e-2  # it trained


def test_custom_step_with_xla_accumulates_to_the_same_weights(strategy, initial_weights):
    reference, _ = _reference(initial_weights, PARTIAL)
    weights, iterations, _, step = _custom_step_run(
        strategy, initial_weights, PARTIAL, jit_compile=True
    )
    assert step.jit_compile is True and iterations == UPDATES
    assert _max_difference(weights, reference) <= TOLERANCE


def test_averaging_each_micro_batch_alone_would_differ(initial_weights):
    """The partial case is a real test: a mean of micro-batch means gives other weights."""
    reference, _ = _reference(initial_weights, PARTIAL)
    mean_of_means, _ = _reference(initial_weights, PARTIAL, micro_batch=MICRO_BATCH)
    assert _max_difference(mean_of_means, reference) > 1e-3
    full, _ = _reference(initial_weights, FULL)
    full_mean_of_means, _ = _reference(initial_weights, FULL, micro_batch=MICRO_BATCH)
    assert _max_difference(full_mean_of_means, full) <= TOLERANCE  # equal sizes: the same


def test_pending_micro_batches_carry_over(strategy, initial_weights):
    with strategy.scope():
        model = _model()
        model.set_weights(initial_weights)
        optimizer = _optimizer()
    step = tdu.make_distributed_train_step(
        model,
        loss="sparse_categorical_crossentropy",
        optimizer=optimizer,
        strategy=strategy,
        accumulation_steps=3,
    )
    x, y = _data(4 * MICRO_BATCH)
    batches = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(MICRO_BATCH)
    )
    seen = []
    for batch in batches:
        step(batch)
        seen.append((step.pending_micro_steps, int(optimizer.iterations.numpy())))
    assert seen == [(1, 0), (2, 0), (0, 1), (1, 1)]


def test_plain_tensors_are_refused_with_the_fix(strategy, initial_weights):
    with strategy.scope():
        model = _model()
        optimizer = _optimizer()
    step = tdu.make_distributed_train_step(
        model, loss="sparse_categorical_crossentropy", optimizer=optimizer, strategy=strategy
    )
    x, y = _data(MICRO_BATCH)
    with pytest.raises(ValueError, match=r"plain tensors.*each of the 2 replicas.*"):
        step((tf.constant(x), tf.constant(y)))
    # A batch distributed by a strategy of another size: refused, not silently misread.
    four = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    other = four.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(MICRO_BATCH)
    )
    with pytest.raises(ValueError, match=r"split into 4 per-replica parts.*another strategy"):
        step(next(iter(other)))
    assert int(optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"accumulation_steps": 0}, ValueError, "accumulation_steps must be"),
        ({"accumulation_steps": 2.0}, TypeError, "accumulation_steps=2"),
        ({"jit_compile": "yes"}, TypeError, "jit_compile must be True, False or 'auto'"),
    ],
)
def test_bad_arguments_are_rejected(strategy, kwargs, error, pattern):
    with strategy.scope():
        model = _model()
        optimizer = _optimizer()
    with pytest.raises(error, match=pattern):
        tdu.make_distributed_train_step(
            model,
            loss="sparse_categorical_crossentropy",
            optimizer=optimizer,
            strategy=strategy,
            **kwargs,
        )


def test_jit_compile_auto_is_off_on_cpus(strategy):
    from tfdp_utils.training._step import resolve_jit_compile

    assert resolve_jit_compile("auto", strategy) is False
    assert resolve_jit_compile(True, strategy) is True


# --- fit: Keras 3 gradient_accumulation_steps (keras#20582 worked around), tf_keras mixin ----


def _fit_run(strategy, initial_weights, num_examples):
    from tfdp_utils import compat

    compat.apply_for_strategy(strategy)  # keras#20582 on Keras 3; nothing on tf_keras
    x, y = _data(num_examples)
    with strategy.scope():
        model = _model()
        model.set_weights(initial_weights)
        if tdu.IS_KERAS3:
            optimizer = keras.optimizers.SGD(0.2, momentum=0.9, gradient_accumulation_steps=2)
        else:
            optimizer = _optimizer()
        model.compile(
            optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    if not tdu.IS_KERAS3:
        tdu.enable_gradient_accumulation(model, ACCUMULATION)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(MICRO_BATCH)
    history = model.fit(dataset, epochs=1, verbose=0, shuffle=False)
    return model, history


def test_fit_accumulates_to_the_one_device_weights(strategy, initial_weights):
    reference, updates = _reference(initial_weights, FULL)
    model, history = _fit_run(strategy, initial_weights, FULL)
    assert np.isfinite(history.history["loss"][0])
    assert int(model.optimizer.iterations.numpy()) == updates == UPDATES
    print(f"fit: max weight difference {_max_difference(model.get_weights(), reference):.2e}")
    assert _max_difference(model.get_weights(), reference) <= TOLERANCE
    assert _max_difference(model.get_weights(), initial_weights) > 1e-2


def test_fit_weighs_a_partial_micro_batch_like_keras(strategy, initial_weights):
    """fit averages each micro-batch over its own examples (Keras 3's semantics, kept on
    tf_keras): with a partial last micro-batch it matches one device doing the same, and the
    exact average over the update's examples needs the custom step (or full batches)."""
    keras_semantics, updates = _reference(initial_weights, PARTIAL, micro_batch=MICRO_BATCH)
    exact, _ = _reference(initial_weights, PARTIAL)
    model, _ = _fit_run(strategy, initial_weights, PARTIAL)
    assert int(model.optimizer.iterations.numpy()) == updates == UPDATES
    print(
        f"fit, {PARTIAL} examples: {_max_difference(model.get_weights(), keras_semantics):.2e} "
        f"to the mean of micro-batch means, {_max_difference(model.get_weights(), exact):.2e} "
        "to the exact mean"
    )
    assert _max_difference(model.get_weights(), keras_semantics) <= TOLERANCE
    assert _max_difference(model.get_weights(), exact) > 1e-3


# --- 2 localhost workers (the accumulation phase of tests/two_worker_cluster.py) ---------


@pytest.mark.slow
def test_two_workers_accumulate_to_the_one_device_weights(two_worker_phases):
    from support.two_worker_cluster import (
        ACCUMULATION_MICRO_BATCH,
        ACCUMULATION_STEP_EXAMPLES,
        ACCUMULATION_STEPS,
        MODEL,
    )

    data = np.load(two_worker_phases["inputs"]["accumulation_data"])
    initial = [data[f"w{i}"] for i in range(len(data.files) - 2)]

    def one_device(examples):
        namespace: dict = {}
        exec(MODEL, namespace)
        model = namespace["build_model"](keras)
        model.set_weights(initial)
        x, y = data["x"][:examples], data["y"][:examples]
        return _one_device(model, x, y, update_batch=ACCUMULATION_MICRO_BATCH * ACCUMULATION_STEPS)

    fit_reference, fit_updates = one_device(len(data["x"]))
    step_reference, step_updates = one_device(ACCUMULATION_STEP_EXAMPLES)
    differences = []
    for result in phase_results(two_worker_phases, "accumulation"):
        assert result["replicas"] == 2
        if tdu.IS_KERAS3:
            assert "keras#20582" in result["applied"]
        for run, reference, updates in (
            ("fit", fit_reference, fit_updates),
            ("step", step_reference, step_updates),
        ):
            assert result[run]["iterations"] == updates == 5, run
            flat = [
                np.asarray(w).reshape(r.shape)
                for w, r in zip(result[run]["weights"], reference, strict=True)
            ]
            differences.append(_max_difference(flat, reference))
            assert differences[-1] <= TOLERANCE, (run, differences[-1])
            assert _max_difference(flat, initial) > 1e-2, run  # it trained
        assert result["step"]["calls"] == 2 * step_updates and result["step"]["pending"] == 0
    print(f"2 workers: max weight difference to one device {max(differences):.2e}")


def test_enable_gradient_accumulation_is_for_tf_keras(strategy):
    with strategy.scope():
        model = _model()
    if tdu.IS_KERAS3:
        with pytest.raises(RuntimeError, match="gradient_accumulation_steps=3"):
            tdu.enable_gradient_accumulation(model, 3)
        return
    with pytest.raises(ValueError, match="accumulation_steps must be"):
        tdu.enable_gradient_accumulation(model, 0)
    with pytest.raises(ValueError, match="is not built"):
        tdu.enable_gradient_accumulation(keras.Sequential([keras.layers.Dense(2)]), 2)


@pytest.mark.parametrize("not_a_model", ["model", None, 3, [1, 2]])
def test_enable_gradient_accumulation_names_what_it_received_instead_of_a_model(not_a_model):
    # Issue 21: on tf_keras the string "model" was taken for a model (AttributeError later).
    with pytest.raises(TypeError, match=r"model must be a .*model \(keras\.Model\), but received"):
        tdu.enable_gradient_accumulation(not_a_model, 2)


def test_enable_gradient_accumulation_refuses_float16_layers_without_loss_scaling(strategy):
    x, y = _data(32)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(8, dtype="mixed_float16"),
                keras.layers.Dense(3, dtype="float32"),
            ]
        )
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    if tdu.IS_KERAS3:  # Keras 3 optimizers accumulate themselves: refused before anything
        with pytest.raises(RuntimeError, match="gradient_accumulation_steps=2"):
            tdu.enable_gradient_accumulation(model, 2)
        return
    with pytest.raises(ValueError, match=r"'dense.*': dtype=\"mixed_float16\".*LossScaleOptimizer"):
        tdu.enable_gradient_accumulation(model, 2)
    # Compiled after enabling: refused when fit traces its step, before any update.
    with strategy.scope():
        later = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, dtype="mixed_float16")])
    tdu.enable_gradient_accumulation(later, 2)
    with strategy.scope():
        later.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    before = [w.copy() for w in later.get_weights()]
    with pytest.raises(ValueError, match=r"compute(s)? in float16"):
        later.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert all(np.array_equal(a, b) for a, b in zip(before, later.get_weights(), strict=True))
