"""``repeat=`` takes only its documented values, and ``"epochs"`` is never quietly ``True``.

Issue 21: ``repeat="epochs"`` on a source of unknown size became ``repeat=True`` (an INFO line
said so), and ``fit`` then called the finite source infinite and suggested the very
``repeat="epochs"`` that was passed; ``repeat=1`` meant "forever" (1 == True) while
``repeat=2`` was refused. Now the builder refuses before training with a fix that works, and
the fix is followed here to the end: every epoch sees every example once, counted in the model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from support.id_metrics import id_metrics

import tfdp_utils as tdu


def _mirrored(n: int) -> Any:
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])


def _generator_source(n: int) -> Any:
    def gen() -> Any:
        for i in range(n):
            yield np.float32([i]), np.int64(i)

    signature = (tf.TensorSpec((1,), tf.float32), tf.TensorSpec((), tf.int64))
    return tf.data.Dataset.from_generator(gen, output_signature=signature)


@pytest.mark.parametrize("repeat", [1, 0, 2, 1.0, np.int64(1), "true", None])
def test_only_the_documented_values_are_taken(repeat: Any) -> None:
    with pytest.raises(ValueError, match=r"repeat=.* is not supported; expected False, True"):
        tdu.build_distributed_dataset(
            np.arange(10), strategy=_mirrored(1), global_batch_size=4, repeat=repeat
        )


def test_a_numpy_bool_is_a_bool() -> None:
    dist = tdu.build_distributed_dataset(
        np.arange(10), strategy=_mirrored(1), global_batch_size=4, repeat=np.bool_(True)
    )
    assert dist.tfdp_info.repeat is True


def test_repeat_epochs_on_an_unsized_dataset_is_refused_before_training() -> None:
    with pytest.raises(ValueError) as raised:
        tdu.build_distributed_dataset(
            _generator_source(10), strategy=_mirrored(2), global_batch_size=4, repeat="epochs"
        )
    message = str(raised.value)
    assert "tf.data does not know the dataset's size" in message
    assert "source.apply(tf.data.experimental.assert_cardinality(N))" in message
    assert "infinite" not in message  # the source is finite; the old error said otherwise


@pytest.mark.keras
def test_following_the_fix_gives_exact_epochs_in_fit() -> None:
    # The message's fix, followed: declare the size, and repeat="epochs" works as documented.
    n, strategy = 13, _mirrored(2)
    source = _generator_source(n).apply(tf.data.experimental.assert_cardinality(n))
    dist = tdu.build_distributed_dataset(
        source, strategy=strategy, global_batch_size=4, repeat="epochs"
    )
    steps = dist.tfdp_info.steps_per_epoch
    assert steps == 4 and dist.tfdp_info.repeat
    from tfdp_utils._tf import keras

    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.0), "mse", metrics=id_metrics(n))
    history = model.fit(dist, epochs=3, steps_per_epoch=steps, verbose=0)
    assert history.history["seen"] == [n] * 3 and history.history["once"] == [n] * 3
    assert int(model.optimizer.iterations.numpy()) == 3 * steps


def test_repeat_epochs_on_files_without_counts_names_count_examples(tmp_path: Any) -> None:
    path = tmp_path / "part.txt"
    path.write_text("".join(f"{i}\n" for i in range(9)))
    with pytest.raises(ValueError, match="Pass count_examples=True"):
        tdu.build_distributed_dataset(
            str(path),
            strategy=_mirrored(1),
            global_batch_size=4,
            reader=tf.data.TextLineDataset,
            repeat="epochs",
        )
    dist = tdu.build_distributed_dataset(
        str(path),
        strategy=_mirrored(1),
        global_batch_size=4,
        reader=tf.data.TextLineDataset,
        repeat="epochs",
        count_examples=True,
    )
    assert dist.tfdp_info.steps_per_epoch == 3


def test_repeat_epochs_on_sparse_elements_is_refused_and_dense_ones_work() -> None:
    def sparse(x: Any) -> Any:
        return tf.sparse.from_dense(tf.reshape(x, [1]))

    with pytest.raises(ValueError, match=r"sparse or ragged.*tf\.sparse\.to_dense"):
        tdu.build_distributed_dataset(
            np.arange(10),
            strategy=_mirrored(2),
            global_batch_size=4,
            repeat="epochs",
            map_fn=sparse,
        )
    dist = tdu.build_distributed_dataset(
        np.arange(10),
        strategy=_mirrored(2),
        global_batch_size=4,
        repeat="epochs",
        map_fn=lambda x: tf.sparse.to_dense(sparse(x)),
    )
    assert dist.tfdp_info.steps_per_epoch == 3


def test_repeat_epochs_on_an_infinite_source_and_on_a_function_of_examples() -> None:
    with pytest.raises(ValueError, match="infinite: it has no epoch to repeat"):
        tdu.build_distributed_dataset(
            tf.data.Dataset.range(5).repeat(),
            strategy=_mirrored(1),
            global_batch_size=4,
            repeat="epochs",
        )
    with pytest.raises(ValueError, match="does not count the examples a fn"):
        tdu.build_distributed_dataset(
            lambda context: tf.data.Dataset.range(10),
            strategy=_mirrored(1),
            global_batch_size=4,
            repeat="epochs",
        )
