"""The tutorial's CNN trained with `model.fit`, data-parallel.

Run: python examples/cnn_fit.py
"""

from __future__ import annotations

from tfdp_utils.demo import build_model, configure_replicas, load_data

configure_replicas(2)

import tensorflow as tf  # noqa: E402

import tfdp_utils as tdu  # noqa: E402

keras = tf.keras  # Keras 3, or tf_keras when TF_USE_LEGACY_KERAS=1

GLOBAL_BATCH_SIZE = 64

_, (x_train, y_train), (x_test, y_test) = load_data()
strategy = tdu.auto_strategy()
# Scale the learning rate with the global batch (sqrt rule suits Adam).
learning_rate = tdu.scale_learning_rate(
    1e-3, base_batch_size=32, global_batch_size=GLOBAL_BATCH_SIZE, rule="sqrt"
)
train = tdu.build_distributed_dataset(
    (x_train, y_train),
    strategy=strategy,
    global_batch_size=GLOBAL_BATCH_SIZE,
    shuffle_buffer_size=2048,
    seed=0,
)
test = tdu.build_distributed_dataset(
    (x_test, y_test), strategy=strategy, global_batch_size=GLOBAL_BATCH_SIZE
)

with strategy.scope():
    model = build_model("cnn")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
model.fit(train, epochs=4, verbose=2)
loss, accuracy = model.evaluate(test, verbose=0)
print(f"test accuracy {accuracy:.3f} on {strategy.num_replicas_in_sync} replicas")
assert accuracy > 0.5, "the CNN should beat chance (0.1) by far"
