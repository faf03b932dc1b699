"""The rest of an interrupted epoch of files, laid out on another shape, without TensorFlow.

Checked against a simulation written here: each worker of the first shape holds a list of
example ids (its stream), step ``s`` trains ``S`` ids of every stream, the job stops after
``k`` steps; the rest's layout on the new workers must train each id not yet trained exactly
once, in the same number of steps on every worker, and each global batch must be the first
shape's global step where that step was full.
"""

from __future__ import annotations

import itertools
import json

import pytest

from tfdp_utils.data._epoch_rest import EpochRest

pytestmark = pytest.mark.pure


def _streams(kept: list[int]) -> list[list[int]]:
    """Distinct ids per stream: stream w holds w * 1000 + position."""
    return [[w * 1000 + p for p in range(n)] for w, n in enumerate(kept)]


def _old_steps(kept: list[int], per_worker: int) -> list[set[int]]:
    """The ids each global step of the first shape trains (an independent simulation)."""
    streams = _streams(kept)
    steps = []
    step = 0
    while any(step * per_worker < len(s) for s in streams):
        steps.append({i for s in streams for i in s[step * per_worker : (step + 1) * per_worker]})
        step += 1
    return steps


def _ids(rest: EpochRest, worker: int, workers: int) -> list[int]:
    streams = _streams(list(rest.kept))
    return [
        streams[w][p] for w, start, end in rest.runs_for(worker, workers) for p in range(start, end)
    ]


def _rest(kept: list[int], batch: int, step: int) -> EpochRest:
    facts = {
        "num_workers": len(kept),
        "global_batch_size": batch,
        "examples_per_worker": kept,
        "policy": "file",
        "files": [[f"f{w}"] for w in range(len(kept))],
        "steps_per_epoch": 99,
        "drop_remainder": False,
    }
    return EpochRest.interrupted(facts, 1, step)


CASES = [
    ([24, 24], 8, 3, 1),  # 2 workers -> 1, full steps
    ([48], 8, 2, 2),  # 1 -> 2
    ([20, 28], 8, 2, 1),  # unbalanced: the first shape's last steps were partial
    ([20, 28], 8, 5, 4),
    ([10, 7, 13, 9], 8, 1, 2),  # 4 -> 2
    ([10, 7, 13, 9], 12, 1, 3),  # 4 -> 3, global batch 12
    ([5, 0, 3], 6, 0, 6),  # a worker with no examples; more new workers than examples left
]


@pytest.mark.parametrize(("kept", "batch", "step", "workers"), CASES)
def test_every_example_left_is_trained_once_in_equal_steps(
    kept: list[int], batch: int, step: int, workers: int
) -> None:
    rest = _rest(kept, batch, step)
    old = _old_steps(kept, batch // len(kept))
    left = set().union(*old[step:])
    parts = [_ids(rest, w, workers) for w in range(workers)]
    trained = list(itertools.chain(*parts))
    assert sorted(trained) == sorted(left)  # each once, nothing else
    assert rest.remaining == len(left)
    assert rest.steps == -(-len(left) // batch)
    sizes = [rest.part_sizes(w, workers) for w in range(workers)]
    assert all(len(s) == rest.steps for s in sizes)  # equal steps on every worker
    assert [sum(s) for s in sizes] == [len(p) for p in parts]
    # Global batch g: every worker's part of it, in order.
    starts = [list(itertools.accumulate(s, initial=0)) for s in sizes]
    batches = [
        {i for w in range(workers) for i in parts[w][starts[w][g] : starts[w][g + 1]]}
        for g in range(rest.steps)
    ]
    assert all(len(b) == batch for b in batches[:-1])
    full = [s for s in old[step:] if len(s) == batch]
    if len(full) == len(old[step:]):  # every remaining step full: the very global steps
        assert batches == old[step:]


@pytest.mark.parametrize(("kept", "batch", "step", "workers"), CASES)
def test_a_rest_stopped_again_goes_on_from_its_global_batches(
    kept: list[int], batch: int, step: int, workers: int
) -> None:
    rest = _rest(kept, batch, step)
    whole = _ids(rest, 0, 1)
    for done in range(rest.steps + 1):
        later = EpochRest.from_json(json.loads(json.dumps(rest.after(done).to_json())))
        assert later.steps == rest.steps - done
        # On any number of workers, the rest after `done` global batches is the tail.
        for new in (1, 2):
            if batch % new:
                continue
            trained = sorted(itertools.chain(*(_ids(later, w, new) for w in range(new))))
            assert trained == sorted(whole[done * batch :])


def test_drop_remainder_keeps_the_whole_steps_every_worker_trained() -> None:
    facts = {
        "num_workers": 2,
        "global_batch_size": 8,
        "examples_per_worker": [22, 30],
        "policy": "file",
        "files": [["a"], ["b"]],
        "steps_per_epoch": 5,
        "drop_remainder": True,
    }
    rest = EpochRest.interrupted(facts, 0, 2)
    assert rest.kept == (20, 20)
    assert rest.remaining == 24 and rest.steps == 3
