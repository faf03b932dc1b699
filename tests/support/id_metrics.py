"""Keras metrics that count example ids inside the model's step, apart from the builder.

No side effects at import (unlike conftest.py, which configures devices), so worker
subprocesses import it too: ``sys.path.insert(0, "tests")`` from the repository root.
"""

from __future__ import annotations

from typing import Any


def id_metrics(n: int) -> list[Any]:
    """Metrics ``seen`` (ids reaching the model) and ``once`` (ids seen exactly once), per epoch.

    ``y_true`` carries each example's id in ``0..n-1``; both are summed over all replicas.
    """
    from tfdp_utils._tf import keras, tf

    class IdCounts(keras.metrics.Metric):  # type: ignore[misc]
        def __init__(self, name: str, exactly_once: bool) -> None:
            super().__init__(name=name)
            self.exactly_once = exactly_once
            self.counts = self.add_weight(name="counts", shape=(n,), initializer="zeros")

        def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
            ids = tf.cast(tf.reshape(y_true, [-1]), tf.int32)
            self.counts.assign_add(tf.math.bincount(ids, minlength=n, maxlength=n, dtype="float32"))

        def result(self) -> Any:
            if self.exactly_once:
                return tf.reduce_sum(tf.cast(tf.equal(self.counts, 1.0), "float32"))
            return tf.reduce_sum(self.counts)

        def reset_state(self) -> None:
            self.counts.assign(tf.zeros((n,)))

    return [IdCounts("seen", exactly_once=False), IdCounts("once", exactly_once=True)]
