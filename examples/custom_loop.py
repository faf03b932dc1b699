"""The tutorial's custom `strategy.run` loop, done right.

The tutorial averaged the loss with `tf.reduce_mean` inside `strategy.run`, which averages over
the *per-replica* batch; summed across replicas the gradients come out N times too large. It also
looped over a `.repeat()`ed dataset with no end. Here `make_distributed_train_step` averages over
the *global* batch (a partial last batch included) and each epoch is one pass that ends.

Run: python examples/custom_loop.py
"""

from __future__ import annotations

from tfdp_utils.demo import build_model, configure_replicas, load_data

configure_replicas(2)

import tensorflow as tf  # noqa: E402

import tfdp_utils as tdu  # noqa: E402

keras = tf.keras  # Keras 3, or tf_keras when TF_USE_LEGACY_KERAS=1

GLOBAL_BATCH_SIZE = 64
EPOCHS = 3

_, (x_train, y_train), _ = load_data()
strategy = tdu.auto_strategy()
dataset = tdu.build_distributed_dataset(
    (x_train, y_train),
    strategy=strategy,
    global_batch_size=GLOBAL_BATCH_SIZE,
    shuffle_buffer_size=2048,
    seed=0,
)

with strategy.scope():
    model = build_model("mlp")
    optimizer = keras.optimizers.SGD(
        tdu.scale_learning_rate(0.05, base_batch_size=32, global_batch_size=GLOBAL_BATCH_SIZE)
    )
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    # reduction="none": the step averages per-example losses over the global batch itself.
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

train_step = tdu.make_distributed_train_step(
    model, loss=loss, optimizer=optimizer, strategy=strategy, metrics=[accuracy]
)

losses = []
for epoch in range(EPOCHS):
    accuracy.reset_state()
    total, steps = 0.0, 0
    for batch in dataset:  # one pass over the data: the epoch ends
        total += float(train_step(batch))
        steps += 1
    losses.append(total / steps)
    print(
        f"epoch {epoch + 1}: {steps} steps, mean loss {losses[-1]:.4f}, "
        f"accuracy {float(accuracy.result()):.3f}"
    )
assert steps == tdu.steps_per_epoch(len(x_train), GLOBAL_BATCH_SIZE), steps
assert losses[-1] < losses[0], "training should reduce the loss"
