"""A positioned builder stream (the resumed epoch, the one-iterator fit) under any global seed.

TensorFlow pairs an op seed with the global seed and compares the pair to ``(0, 0)`` in
Python, so a tensor seed under ``tf.random.set_seed(0)`` (or ``keras.utils.set_random_seed(0)``,
the most common seed) failed in graph mode. The positioned stream must build under every
global seed, give the same global batches whatever the global seed (a resumed run that seeds
differently still continues the same epoch), and start at step ``k`` on the very batches the
whole epoch has from step ``k`` on (counted ids, not the code's own arithmetic).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf

pytestmark = pytest.mark.keras

N, GLOBAL_BATCH = 36, 8  # 5 steps per epoch, the last one partial


@pytest.fixture
def global_seed() -> Iterator[Any]:
    def set_seed(seed: int | None) -> None:
        if seed is None:
            tf.random.set_seed(None)
        else:
            keras.utils.set_random_seed(seed)

    yield set_seed
    tf.random.set_seed(None)


def _steps(dist: Any, strategy: Any, steps: int) -> list[list[int]]:
    """The example ids of each of the first ``steps`` global steps, per replica in order."""
    out = []
    iterator = iter(dist)
    for _ in range(steps):
        x, _ = next(iterator)
        parts = strategy.experimental_local_results(x)
        out.append([int(i) for part in parts for i in part.numpy()[:, 0]])
    return out


@pytest.mark.parametrize("files", [False, True], ids=["arrays", "files"])
def test_the_positioned_stream_is_the_same_under_every_global_seed(
    global_seed: Any, files: bool, tmp_path: Any
) -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    ids = np.arange(N, dtype="float32")
    x = np.stack([ids, ids * 0.5], axis=1)
    y = ids[:, None]
    if files:
        paths = []
        for part in range(3):
            path = str(tmp_path / f"part-{part}.tfrecord")
            with tf.io.TFRecordWriter(path) as writer:
                for i in range(part, N, 3):
                    writer.write(tf.io.serialize_tensor(tf.constant(x[i])).numpy())
            paths.append(path)

        def reader(path: Any) -> Any:
            records = tf.data.TFRecordDataset(path)
            return records.map(lambda r: tf.ensure_shape(tf.io.parse_tensor(r, tf.float32), [2]))

        source: Any = paths
        build = {
            "reader": reader,
            "count_examples": True,
            "map_fn": lambda element: (element, element[:1]),
        }
    else:
        source, build = (x, y), {}
    streams: dict[Any, list[list[int]]] = {}
    for seed in (0, 1, None):
        global_seed(seed)
        dist = tdu.build_distributed_dataset(
            source,
            strategy=strategy,
            global_batch_size=GLOBAL_BATCH,
            shuffle_buffer_size=64,
            seed=3,
            **build,
        )
        resumable = dist.tfdp.resumable()
        whole = _steps(resumable.at(1, 0, 3), strategy, 5)
        from_step_2 = _steps(resumable.at(1, 2, 3), strategy, 3)
        assert from_step_2 == whole[2:], f"global seed {seed}: step 2 on is not the epoch's"
        assert sorted(i for step in whole for i in step) == list(range(N))
        streams[seed] = whole
    assert streams[0] == streams[1] == streams[None]
