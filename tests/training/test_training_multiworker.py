"""make_distributed_train_step across two real localhost workers matches one device."""

from __future__ import annotations

import numpy as np
import pytest
from support.two_worker_cluster import MODEL, TRAIN_GLOBAL_BATCH, phase_results

from tfdp_utils._tf import keras, tf

pytestmark = [pytest.mark.keras, pytest.mark.slow]


def _reference(x, y, initial_weights):
    namespace: dict = {}
    exec(MODEL, namespace)
    model = namespace["build_model"](keras)
    model.set_weights(initial_weights)
    optimizer = keras.optimizers.SGD(learning_rate=0.3, momentum=0.9)
    losses = []
    for xb, yb in tf.data.Dataset.from_tensor_slices((x, y)).batch(TRAIN_GLOBAL_BATCH):
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(yb, logits, from_logits=True)
            ) + tf.add_n(model.losses)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        losses.append(float(loss))
    return losses, model.get_weights()


def test_two_workers_train_like_one_device(two_worker_phases):
    """The ``train_step`` phase of the shared 2-worker cluster (tests/two_worker_cluster.py)."""
    data = np.load(two_worker_phases["inputs"]["train_data"])
    x, y = data["x"], data["y"]
    initial = [data[f"w{i}"] for i in range(len(data.files) - 2)]
    ref_losses, ref_weights = _reference(x, y, initial)
    for result in phase_results(two_worker_phases, "train_step"):
        assert result["replicas"] == 2
        assert len(result["losses"]) == len(ref_losses) == 4
        np.testing.assert_allclose(result["losses"], ref_losses, atol=1e-5, rtol=0)
        for got, want in zip(result["weights"], ref_weights, strict=True):
            np.testing.assert_allclose(got, want.ravel(), atol=1e-5, rtol=0)
