"""Linear learning-rate scaling with gradual warm-up (Goyal et al. 2017, arXiv 1706.02677).

The reference learning rate is tuned for a base batch of 32; with a global batch of 256 the linear
rule multiplies it by 8, and the first epochs ramp up to it so early training stays stable.

Run: python examples/lr_warmup.py
"""

from __future__ import annotations

from tfdp_utils.demo import build_model, configure_replicas, load_data

configure_replicas(2)

import tensorflow as tf  # noqa: E402

import tfdp_utils as tdu  # noqa: E402

keras = tf.keras  # Keras 3, or tf_keras when TF_USE_LEGACY_KERAS=1

BASE_LEARNING_RATE, BASE_BATCH_SIZE = 0.01, 32
GLOBAL_BATCH_SIZE = 256
EPOCHS, WARMUP_EPOCHS = 6, 2

_, (x_train, y_train), (x_test, y_test) = load_data()
strategy = tdu.auto_strategy()
steps = tdu.steps_per_epoch(len(x_train), GLOBAL_BATCH_SIZE)
target = tdu.scale_learning_rate(
    BASE_LEARNING_RATE, base_batch_size=BASE_BATCH_SIZE, global_batch_size=GLOBAL_BATCH_SIZE
)
schedule = tdu.WarmupSchedule(
    target,
    warmup_steps=WARMUP_EPOCHS * steps,
    after=keras.optimizers.schedules.CosineDecay(
        target, decay_steps=(EPOCHS - WARMUP_EPOCHS) * steps
    ),
)
print(
    f"per-replica batch {tdu.per_replica_batch_size(GLOBAL_BATCH_SIZE, strategy=strategy)}, "
    f"target learning rate {target:g}, warm-up {WARMUP_EPOCHS * steps} steps"
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
    model = build_model("mlp")
    model.compile(
        optimizer=keras.optimizers.SGD(schedule, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
model.fit(train, epochs=EPOCHS, verbose=2)
for step in (0, steps, WARMUP_EPOCHS * steps, EPOCHS * steps):
    print(f"learning rate at step {step}: {float(schedule(step)):.5f}")
loss, accuracy = model.evaluate(test, verbose=0)
print(f"test accuracy {accuracy:.3f}")
assert accuracy > 0.5
