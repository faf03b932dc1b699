"""One worker's part of the rest of an interrupted FILE epoch, as TensorFlow builds it.

:func:`~tfdp_utils.data._rest_stream.rest_examples` builds one pipeline for every old stream a
new worker takes examples from (the old worker's index a tensor). Checked here against a
reference built independently, as a positioned stream builds an epoch: each old worker's
stream on its own (a Python index, inside ``flat_map``), its ids read back, and the new
worker's ids picked from those lists by the layout's runs. Every new worker must get exactly
those ids in that order, and the new workers together every id of the rest once. The ids
are counted as they come out of the pipeline (a parse of each line), not derived from the
layout.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from tfdp_utils._tf import tf, traced_as_written
from tfdp_utils.data._epoch_examples import epoch_examples
from tfdp_utils.data._epoch_rest import EpochRest
from tfdp_utils.data._positioned import _read_once as positioned_read_once
from tfdp_utils.data._rest_stream import _old_recipe, rest_examples
from tfdp_utils.data._sharding import assign_files

pytestmark = pytest.mark.keras

SIZES = (24, 12, 12, 20)  # lines per file: ids 0..67
BATCH = 12


@pytest.fixture(autouse=True)
def global_seed() -> Iterator[None]:
    """A global seed, as training jobs set: seeds built outside a traced function pair with it."""
    tf.random.set_seed(3)
    yield
    tf.random.set_seed(None)


def _parse(line: object) -> object:
    return tf.strings.to_number(line, tf.int64)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder = tmp_path_factory.mktemp("rest-files")
    first = 0
    for index, size in enumerate(SIZES):
        lines = "".join(f"{i}\n" for i in range(first, first + size))
        (folder / f"part-{index}.txt").write_text(lines)
        first += size
    return sorted(str(folder / name) for name in os.listdir(folder))


def _recipe(files: list[str], *, cache: bool) -> object:
    import tfdp_utils as tdu

    dist = tdu.build_distributed_dataset(
        files,
        strategy=tf.distribute.get_strategy(),
        global_batch_size=BATCH,
        reader=tf.data.TextLineDataset,
        map_fn=_parse,
        count_examples=True,
        shuffle_buffer_size=16,
        seed=5,
        cache=cache,
    )
    return dist.tfdp.resumable().recipe


def _rest(files: list[str], old: int, step: int, trained: int = 0) -> EpochRest:
    assigned = assign_files(files, old, list(SIZES))
    size = dict(zip(files, SIZES, strict=True))
    facts = {
        "num_workers": old,
        "global_batch_size": BATCH,
        "policy": "file" if old > 1 else "off",
        "files": [list(f) for f in assigned],
        "drop_remainder": False,
        "examples_per_worker": [sum(size[f] for f in fs) for fs in assigned],
    }
    rest = EpochRest.interrupted(facts, 1, step)
    return rest.after(trained) if trained else rest


def _ids(dataset: object) -> list[int]:
    return [int(i) for i in dataset.as_numpy_iterator()]  # type: ignore[attr-defined]


def _reference(recipe: object, rest: EpochRest, worker: int, workers: int) -> list[int]:
    """Each old worker's stream of the epoch as its positioned stream builds it (what every
    epoch reads again, then the epoch inside ``flat_map``), and this worker's ids from them."""
    old = _old_recipe(recipe, rest)  # type: ignore[arg-type]
    streams = []
    for w in range(rest.num_workers):
        context = SimpleNamespace(input_pipeline_id=w, num_input_pipelines=rest.num_workers)
        once = positioned_read_once(old, None, context, w, rest.num_workers)
        epoch = tf.data.Dataset.range(rest.epoch, rest.epoch + 1)
        one = epoch.flat_map(
            lambda e, w=w, once=once: epoch_examples(old, once, w, rest.num_workers, e)
        ).take(rest.kept[w])
        streams.append(_ids(one))
    return [i for w, s, e in rest.runs_for(worker, workers) for i in streams[w][s:e]]


CASES = [
    (2, 2, 1, 0),  # 2 workers -> 1 (each stream kept whole from the rest's start)
    (4, 2, 2, 0),  # 4 -> 2: each new worker takes 2 whole streams
    (2, 1, 3, 0),  # 2 -> 3: every new worker takes part of both streams' steps
    (4, 1, 3, 0),  # 4 -> 3
    (4, 2, 6, 0),  # 4 -> 6
    (1, 1, 2, 0),  # 1 -> 2 (one old stream of every file)
    (2, 1, 4, 1),  # 2 -> 4, stopped again one global step into the rest
]


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize(("old", "step", "workers", "trained"), CASES)
def test_each_worker_gets_its_part_of_the_rest_in_order(
    files: list[str], old: int, step: int, workers: int, trained: int, cache: bool
) -> None:
    recipe = _recipe(files, cache=cache)
    rest = _rest(files, old, step, trained)
    parts = []
    for worker in range(workers):
        got = _ids(rest_examples(recipe, rest, worker, workers))  # type: ignore[arg-type]
        assert got == _reference(recipe, rest, worker, workers)
        parts.append(got)
    every = [i for part in parts for i in part]
    assert len(every) == len(set(every)) == rest.remaining
    # The rest is the ids the first shape had not trained: the same count from its streams.
    assert rest.remaining == sum(max(0, n - step * (BATCH // old)) for n in rest.kept) - (
        trained * BATCH
    )


def test_traced_as_written_converts_the_users_functions_inside_not_its_own() -> None:
    """The pipeline's own functions are traced as written (a Python ``if`` on a tensor there
    fails, as it does without AutoGraph), while a user's function handed to tf.data inside is
    converted by AutoGraph as anywhere (its ``if`` on a tensor becomes a ``tf.cond``)."""

    def users(x: object) -> object:
        if x > 2:  # type: ignore[operator]
            return x * 10  # type: ignore[operator]
        return x

    inner = traced_as_written(lambda _: tf.data.Dataset.range(5).map(users))
    dataset = tf.data.Dataset.range(1).flat_map(inner)
    assert [int(i) for i in dataset.as_numpy_iterator()] == [0, 1, 2, 30, 40]

    def ours(_: object) -> object:
        if tf.constant(True):
            return tf.data.Dataset.range(1)
        return tf.data.Dataset.range(2)

    with pytest.raises(TypeError, match=r"symbolic|tf\.Tensor"):
        tf.data.Dataset.range(1).flat_map(traced_as_written(ours))
    # Converted, as tf.data does by default, the same function builds.
    assert len(list(tf.data.Dataset.range(1).flat_map(ours))) == 1
