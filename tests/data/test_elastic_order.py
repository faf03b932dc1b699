"""The stream of global batches does not depend on the number of workers or replicas.

An elastic resume (``PreemptionCheckpoint`` on another shape) continues epoch ``e`` at step
``k`` on a different number of workers and replicas with the same global batch. That is exact
only if step ``k`` of epoch ``e`` holds the same examples on every shape. Under DATA sharding
every worker shuffles the whole epoch with the same seed and keeps every ``W``-th example, so
worker ``w``'s ``j``-th example of step ``s`` is example ``s * B + W * j + w`` of the epoch's
global order: the union over the workers is that order's ``s``-th global batch, whatever ``W``.

Here each worker's positioned pipeline is built exactly as inside
``distribute_datasets_from_function`` (one input context per worker), without a cluster, and
the example ids of each global step are read back and compared between shapes.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tfdp_utils._tf import tf
from tfdp_utils.data._epochs import StepShape, plan_epochs
from tfdp_utils.data._pipeline import Recipe
from tfdp_utils.data._positioned import positioned_worker_dataset
from tfdp_utils.data._sharding import SourceFacts, plan_from_facts

pytestmark = pytest.mark.keras

GLOBAL_BATCH = 12
SHAPES = [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (3, 1), (4, 1)]  # (workers, replicas each)


def _recipe(examples: int, workers: int, replicas: int, *, drop_remainder: bool) -> Recipe:
    total = workers * replicas
    shape = StepShape(GLOBAL_BATCH // total, total, workers)
    plan = plan_from_facts(
        SourceFacts("arrays", num_examples=examples),
        shard_policy="auto",
        num_workers=workers,
        per_replica_batch_size=shape.per_replica_batch_size,
        replicas_per_worker=replicas,
        drop_remainder=drop_remainder,
    )
    epochs = plan_epochs(
        plan.examples_per_worker,
        shape,
        drop_remainder=drop_remainder,
        repeat="epochs",
        dense=True,
    )
    return Recipe(
        plan,
        shape,
        epochs,
        shuffle_buffer_size=examples,
        seed=5,
        repeat=True,
        drop_remainder=drop_remainder,
        prefetch=False,
    )


def global_steps(
    examples: int,
    workers: int,
    replicas: int,
    *,
    epoch: int = 0,
    step: int = 0,
    steps: int,
    drop_remainder: bool = False,
) -> list[list[int]]:
    """The sorted example ids of each of ``steps`` global steps from ``step`` of ``epoch``."""
    recipe = _recipe(examples, workers, replicas, drop_remainder=drop_remainder)
    source = tf.data.Dataset.from_tensor_slices(np.arange(examples, dtype="int64"))
    per_worker = []
    for index in range(workers):
        context = tf.distribute.InputContext(workers, index, workers * replicas)
        dataset = positioned_worker_dataset(recipe, source, context, epoch, step)
        # Each step takes one batch per replica of the worker, in order.
        batches = [b.numpy().tolist() for b in dataset.take(steps * replicas)]
        per_worker.append(
            [
                list(itertools.chain(*batches[s * replicas : (s + 1) * replicas]))
                for s in range(steps)
            ]
        )
    return [sorted(itertools.chain(*(worker[s] for worker in per_worker))) for s in range(steps)]


@pytest.mark.parametrize(
    ("examples", "drop_remainder"),
    [(48, False), (53, False), (53, True)],
    ids=["whole-steps", "partial-last-step", "drop-remainder"],
)
def test_every_shape_gets_the_same_global_batches(examples: int, drop_remainder: bool) -> None:
    steps = 3 * -(-examples // GLOBAL_BATCH) if not drop_remainder else 3 * (examples // 12)
    streams = {
        shape: global_steps(examples, *shape, steps=steps, drop_remainder=drop_remainder)
        for shape in SHAPES
    }
    reference = streams[(1, 1)]
    for shape, stream in streams.items():
        assert stream == reference, shape
    per_epoch = steps // 3
    for epoch in range(3):
        ids = list(itertools.chain(*reference[epoch * per_epoch : (epoch + 1) * per_epoch]))
        # Each example once per epoch (all but the remainder with drop_remainder).
        assert len(ids) == len(set(ids)) == (examples if not drop_remainder else 48)
    # A new order each epoch.
    assert reference[0] != reference[per_epoch]


@pytest.mark.parametrize(
    ("before", "after"), [((1, 2), (1, 1)), ((2, 1), (1, 2)), ((3, 1), (4, 1))]
)
def test_a_stream_started_mid_epoch_on_another_shape_continues_the_same_epoch(
    before: tuple[int, int], after: tuple[int, int]
) -> None:
    whole = global_steps(53, *before, steps=10)  # 5 steps an epoch, the last one partial
    resumed = global_steps(53, *after, epoch=0, step=3, steps=7)
    assert resumed == whole[3:]


def test_the_order_is_the_seed_s_not_the_shape_s() -> None:
    ids = global_steps(48, 2, 1, steps=4)
    assert ids != [list(range(s * 12, (s + 1) * 12)) for s in range(4)]  # it is shuffled
    assert all(len(step) == GLOBAL_BATCH for step in ids)
