"""The tutorial's MLP trained with `model.fit`, data-parallel, in a few lines.

Fixes from the tutorial's version: the 28x28 images are flattened before the 784-input Dense
layer, the batch size is the *global* batch, and the dataset is sharded and batched for the
strategy by `build_distributed_dataset`.

Run: python examples/mlp_fit.py   (2 logical CPUs stand in for 2 GPUs when none is visible)
"""

from __future__ import annotations

import tempfile

from tfdp_utils.demo import build_model, configure_replicas, load_data

configure_replicas(2)  # only when no GPU/TPU is visible; must precede TensorFlow's device setup

import tensorflow as tf  # noqa: E402

import tfdp_utils as tdu  # noqa: E402

keras = tf.keras  # Keras 3, or tf_keras when TF_USE_LEGACY_KERAS=1

GLOBAL_BATCH_SIZE = 64

_, (x_train, y_train), (x_test, y_test) = load_data()
strategy = tdu.auto_strategy()
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
    model = build_model("mlp")
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )

log_dir = tempfile.mkdtemp(prefix="tfdp-mlp-")
model.fit(
    train,
    epochs=5,
    verbose=2,
    callbacks=[tdu.callbacks.ThroughputLogger(log_dir, log_every_n_steps=10, warmup_steps=5)],
)
loss, accuracy = model.evaluate(test, verbose=0)
print(
    f"test accuracy {accuracy:.3f} on {strategy.num_replicas_in_sync} replicas; logs in {log_dir}"
)
assert accuracy > 0.5, "the MLP should beat chance (0.1) by far"
