"""One small training job whose settings the interaction matrix (tests/interactions/) crosses.

In the test process, on its logical CPUs: a builder dataset over arrays (or a generator of
unknown size) whose first column is the example id, a model whose first layer counts the ids
each epoch trains on (a replica-local SUM variable, independent of every callback under test),
and ``fit`` with the cell's settings. The global state a setting changes (the global seed, op
determinism, the mixed-precision policy) is set for the job and put back after it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from support.matrix import FACTORS, Settings
from tfdp_utils._tf import IS_KERAS3, keras

__all__ = ["FACTORS", "Settings"]

N, GLOBAL_BATCH, EPOCHS = 44, 8, 3  # 6 steps per epoch, the last one partial (4 examples)
VALIDATION = 16


@contextlib.contextmanager
def applied(settings: Settings) -> Iterator[None]:
    """The settings' global state for one job, put back after it."""
    from tensorflow.python.framework import config as tf_config

    if settings.seed is None:
        tf.random.set_seed(None)
    else:
        keras.utils.set_random_seed(settings.seed)
    if settings.determinism:
        tf.config.experimental.enable_op_determinism()
    if settings.mixed:
        keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")
        tf_config.disable_op_determinism()
        tf.random.set_seed(None)
        _forget_keras_seed()


def _forget_keras_seed() -> None:
    """Undo ``keras.utils.set_random_seed``'s Keras side: later models draw unseeded again."""
    if IS_KERAS3:
        from keras.src.backend.common import global_state
        from keras.src.random import seed_generator
        from keras.src.utils import rng_utils

        global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, None)
        generator = getattr(seed_generator, "GLOBAL_SEED_GENERATOR", None)  # Keras >= 3.11
        if generator is not None:
            global_state.set_global_attribute(generator, None)
    else:
        from tf_keras.src import backend

        backend._SEED_GENERATOR.generator = None


def strategy_for(settings: Settings) -> Any:
    """What ``tdu.auto_strategy()`` gives on a machine with ``replicas`` devices (with the
    Keras workarounds that strategy needs applied, as auto_strategy applies them)."""
    import tfdp_utils as tdu

    devices = [f"/cpu:{i}" for i in range(settings.replicas)]
    return tdu.auto_strategy(devices=devices, verbose=False)


def arrays(n: int = N, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    ids = np.arange(offset, offset + n, dtype="float32")
    x = np.stack([ids, np.linspace(-1, 1, n), np.cos(ids)], axis=1).astype("float32")
    y = (x[:, 1:2] * 3 + np.sin(ids)[:, None]).astype("float32")
    return x, y


def dataset(settings: Settings, strategy: Any, **kwargs: Any) -> Any:
    """The training data: a shuffled builder dataset of ``N`` examples (seed 5)."""
    import tfdp_utils as tdu

    x, y = arrays()
    source: Any = (x, y)
    if settings.unknown_size:

        def examples() -> Iterator[tuple[np.ndarray, np.ndarray]]:
            yield from zip(x, y, strict=True)

        source = tf.data.Dataset.from_generator(
            examples,
            output_signature=(
                tf.TensorSpec([3], tf.float32),
                tf.TensorSpec([1], tf.float32),
            ),
        )
    options = {"shuffle_buffer_size": 64, "seed": 5, **kwargs}
    return tdu.build_distributed_dataset(
        source, strategy=strategy, global_batch_size=GLOBAL_BATCH, **options
    )


def validation_data(strategy: Any) -> Any:
    import tfdp_utils as tdu

    return tdu.build_distributed_dataset(
        arrays(VALIDATION, offset=1000), strategy=strategy, global_batch_size=GLOBAL_BATCH
    )


class Job:
    """One cell's model and the ids it trained on, epoch by epoch."""

    def __init__(self, settings: Settings, strategy: Any) -> None:
        self.settings, self.strategy = settings, strategy
        with strategy.scope():
            self.seen = tf.Variable(
                tf.zeros([N]),
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )
        self.model = self._model()
        self.epochs: dict[int, list[float]] = {}

    def _model(self) -> Any:
        seen = self.seen

        class Count(keras.layers.Layer):  # type: ignore[misc]
            def call(self, inputs: Any, training: Any = None) -> Any:
                if training:
                    ids = tf.cast(inputs[:, 0], tf.int32)
                    counts = tf.math.bincount(ids, minlength=N, maxlength=N, dtype=tf.float32)
                    seen.assign_add(counts)
                return inputs[:, 1:]

        settings = self.settings
        with self.strategy.scope():
            model = keras.Sequential(
                [
                    keras.Input((3,)),
                    Count(dtype="float32"),
                    keras.layers.Dense(4, activation="tanh"),
                    keras.layers.Dense(1, dtype="float32"),
                ]
            )
            # The same start in every run, whatever the global seed.
            rng = np.random.default_rng(0)
            start = [rng.normal(0, 0.5, w.shape) for w in model.get_weights()]
            model.set_weights([w.astype("float32") for w in start])
            schedule = keras.optimizers.schedules.ExponentialDecay(
                0.01, decay_steps=4, decay_rate=0.8
            )
            options: dict[str, Any] = {}
            if IS_KERAS3 and settings.accumulation > 1:
                options["gradient_accumulation_steps"] = settings.accumulation
            model.compile(
                keras.optimizers.Adam(schedule, **options),
                "mse",
                steps_per_execution=settings.spe,
            )
        if not IS_KERAS3 and settings.accumulation > 1:
            import tfdp_utils as tdu

            tdu.enable_gradient_accumulation(model, settings.accumulation)
        return model

    def local_counts(self) -> list[float]:
        parts = self.strategy.experimental_local_results(self.seen)
        return np.sum([v.numpy() for v in parts], axis=0).tolist()

    def recorder(self) -> Any:
        job = self

        class Record(keras.callbacks.Callback):  # type: ignore[misc]
            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                job.current = epoch
                job.seen.assign(tf.zeros([N]))

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                job.epochs[epoch] = job.local_counts()

        return Record()

    def weights(self) -> list[np.ndarray]:
        return [np.array(w) for w in self.model.get_weights()]

    def batches(self) -> int:
        """Batches trained as the library counts them (the optimizer's batch counter)."""
        from tfdp_utils.training._accumulation import batches_trained

        return batches_trained(self.model)

    def updates(self) -> int:
        """Optimizer updates (a step mixed precision skips is not one)."""
        return int(self.model.optimizer.iterations.numpy())

    def examples_trained(self) -> float:
        """Examples the model trained on in its recorded epochs and the one running now."""
        return float(sum(sum(counts) for counts in self.epochs.values()))


STEPS_PER_EPOCH = -(-N // GLOBAL_BATCH)


class SignalAfter(keras.callbacks.Callback):  # type: ignore[misc]
    """Sends this process ``signum`` once ``step`` steps of a fit from epoch 0 are done (at
    the first batch hook at or after it: every ``steps_per_execution`` steps)."""

    def __init__(self, step: int, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.step, self.signum, self.epoch, self.sent = step, signum, 0, False

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if not self.sent and self.epoch * STEPS_PER_EPOCH + batch + 1 >= self.step:
            self.sent = True
            os.kill(os.getpid(), self.signum)


def fit(
    job: Job,
    data: Any,
    callbacks: Sequence[Any],
    *,
    epochs: int = EPOCHS,
    validation: Any = None,
) -> Any:
    return job.model.fit(
        data,
        epochs=epochs,
        verbose=0,
        validation_data=validation,
        callbacks=[job.recorder(), *callbacks],
    )


def backup_dir(tmp: Path) -> str:
    return str(tmp / "backup")


def ids_once(*runs: Sequence[float]) -> bool:
    total = np.sum([np.asarray(r) for r in runs], axis=0)
    return bool(np.all(total == 1.0))


def max_difference(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) if x.size else 0.0 for x, y in zip(a, b, strict=True))
