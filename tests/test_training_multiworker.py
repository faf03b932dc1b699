"""make_distributed_train_step across two real localhost workers matches one device."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import free_port, start_python, tf_config, wait_all

from tfdp_utils._tf import keras, tf

pytestmark = [pytest.mark.keras, pytest.mark.slow]

GLOBAL_BATCH = 8
NUM_EXAMPLES = 3 * GLOBAL_BATCH + 5  # the last global batch is partial

MODEL = """
def build_model(keras):
    return keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(6, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.05)),
        keras.layers.Dense(3),
    ])
"""

WORKER = (
    MODEL
    + """
import json, os, sys
import numpy as np
import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf

strategy = tdu.auto_strategy(prefer="multi_worker", cluster_timeout=60, collective_timeout=60)
data = np.load(os.environ["DATA"])
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = tf.data.Dataset.from_tensor_slices((data["x"], data["y"])).batch(int(os.environ["GB"]))
dist = strategy.experimental_distribute_dataset(dataset.with_options(options))
with strategy.scope():
    model = build_model(keras)
    model.set_weights([data[f"w{i}"] for i in range(len(model.get_weights()))])
    optimizer = keras.optimizers.SGD(learning_rate=0.3, momentum=0.9)
step = tdu.make_distributed_train_step(
    model,
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
    optimizer=optimizer,
    strategy=strategy,
)
losses = [float(step(batch)) for batch in dist]
print("RESULT", json.dumps({
    "replicas": strategy.num_replicas_in_sync,
    "losses": losses,
    "weights": [w.ravel().tolist() for w in model.get_weights()],
}))
"""
)


def _reference(x, y, initial_weights):
    namespace: dict = {}
    exec(MODEL, namespace)
    model = namespace["build_model"](keras)
    model.set_weights(initial_weights)
    optimizer = keras.optimizers.SGD(learning_rate=0.3, momentum=0.9)
    losses = []
    for xb, yb in tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH):
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(yb, logits, from_logits=True)
            ) + tf.add_n(model.losses)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        losses.append(float(loss))
    return losses, model.get_weights()


def test_two_workers_train_like_one_device(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(NUM_EXAMPLES, 5)).astype("float32")
    y = rng.integers(0, 3, size=NUM_EXAMPLES).astype("int64")
    namespace: dict = {}
    exec(MODEL, namespace)
    initial = namespace["build_model"](keras).get_weights()
    path = tmp_path / "data.npz"
    np.savez(path, x=x, y=y, **{f"w{i}": w for i, w in enumerate(initial)})
    ref_losses, ref_weights = _reference(x, y, initial)

    ports = [free_port(), free_port()]
    processes = [
        start_python(
            WORKER,
            env={"TF_CONFIG": tf_config(ports, i), "DATA": str(path), "GB": str(GLOBAL_BATCH)},
        )
        for i in range(2)
    ]
    results = wait_all(processes, timeout=240)
    for rc, out, err in results:
        assert rc == 0, err[-3000:]
        line = next(x for x in out.splitlines() if x.startswith("RESULT "))
        data = json.loads(line[len("RESULT ") :])
        assert data["replicas"] == 2
        assert len(data["losses"]) == len(ref_losses) == 4
        np.testing.assert_allclose(data["losses"], ref_losses, atol=1e-5, rtol=0)
        for got, want in zip(data["weights"], ref_weights, strict=True):
            np.testing.assert_allclose(got, want.ravel(), atol=1e-5, rtol=0)
