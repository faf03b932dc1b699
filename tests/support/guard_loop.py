"""The custom training loop DivergenceGuard's in-process tests guard: a small model trained by
``tdu.make_distributed_train_step`` over global batches of 8, ``check()`` after every call."""

from __future__ import annotations

from typing import Any

import numpy as np

BATCH = 8  # global: on 2 replicas, replica 0 gets examples 0..3 of each batch, replica 1 4..7


def guarded_loop(
    strategy: Any,
    x: np.ndarray,
    y: np.ndarray,
    guard: Any = None,
    *,
    builder: bool = False,
    accumulation_steps: int = 1,
) -> tuple[Any, Any, int]:
    """``make_distributed_train_step`` over the batches of (x, y), through the builder with
    ``builder`` (else ``experimental_distribute_dataset``): the model, the step and the calls
    made before the guard said stop."""
    import tfdp_utils as tdu
    from tfdp_utils._tf import keras, tf

    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(3, name="d1"), keras.layers.Dense(1, name="d2")]
        )
        optimizer = keras.optimizers.Adam(0.01)
    step = tdu.make_distributed_train_step(
        model,
        loss=keras.losses.MeanSquaredError(reduction="none"),
        optimizer=optimizer,
        strategy=strategy,
        accumulation_steps=accumulation_steps,
    )
    if builder:
        dist = tdu.build_distributed_dataset((x, y), strategy=strategy, global_batch_size=BATCH)
    else:
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
        dist = strategy.experimental_distribute_dataset(dataset)
    if guard is not None:
        guard.watch(model, optimizer=optimizer, dataset=dist)
    trained = 0
    for batch in dist:
        step(batch)
        trained += 1
        if guard is not None and guard.check():
            break
    return model, step, trained
