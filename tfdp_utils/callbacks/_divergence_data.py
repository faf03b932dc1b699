"""What ``DivergenceGuard`` reads back after a non-finite step: its examples, and its files.

TensorFlow glue, run only after a non-finite step. :func:`step_examples` names the source
indices of the examples each named replica of this worker received in the step (through the
builder dataset's :class:`~tfdp_utils.data._replay.ExampleIndex`); :func:`save_files` writes
the first such replica's weights before the step and its batch for
:func:`tfdp_utils.replay_step`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tfdp_utils._dataset_info import record_of
from tfdp_utils.cluster import _topology as topology
from tfdp_utils.training._divergence_report import Divergence, ReplicaExamples, worker_of
from tfdp_utils.training._guarded_update import GuardedUpdate
from tfdp_utils.training._step_files import save_step


@dataclasses.dataclass(frozen=True)
class StepExamples:
    """The examples of a non-finite step on this worker, or why they are not named.

    Attributes:
        examples: for each named replica this worker runs, its examples.
        unknown: why ``examples`` is empty ("" when it is not).
        index: the dataset's :class:`~tfdp_utils.data._replay.ExampleIndex`, or None.
    """

    examples: tuple[ReplicaExamples, ...] = ()
    unknown: str = ""
    index: Any = None


def _mine(guard: GuardedUpdate, replicas: tuple[int, ...]) -> tuple[list[int], int, int]:
    local = guard.local_replicas()
    worker = topology.position_of(guard.strategy).index
    return [r for r in replicas if worker_of(r, local_replicas=local) == worker], worker, local


def step_examples(
    dataset: Any, guard: GuardedUpdate, step: int, replicas: tuple[int, ...]
) -> StepExamples:
    """The examples the named replicas of this worker received in guard step ``step``."""
    record = record_of(dataset)
    factory = None if record is None else record.example_index
    if factory is None:
        return StepExamples(
            unknown="the training data is not a dataset from build_distributed_dataset() "
            "over arrays or a sized source (or the guard did not see it)"
        )
    try:
        index = factory()
        unknown = index if isinstance(index, str) else index.unknown_reason()
        if unknown:
            return StepExamples(unknown=unknown)
        mine, worker, local = _mine(guard, replicas)
        if not mine:
            return StepExamples(unknown="they ran on other workers, whose own reports name them")
        batches = index.at_step(step)
        found = []
        for replica in mine:
            indices = batches[replica - worker * local]
            found.append(ReplicaExamples(replica, indices, index.non_finite(indices)))
        return StepExamples(tuple(found), "", index)
    except Exception as error:  # a diagnosis must not end the fit it diagnoses
        return StepExamples(unknown=f"reading them back failed ({type(error).__name__}: {error})")


def save_files(
    directory: str, guard: GuardedUpdate, found: Divergence, examples: StepExamples
) -> str | None:
    """Save the first named replica of this worker: its weights before the step and, where
    its examples are named, its batch. The folder, or None (no named replica here)."""
    mine, worker, local = _mine(guard, found.replicas)
    if not mine:
        return None
    replica = mine[0]
    batch = None
    part = next((e for e in examples.examples if e.replica == replica), None)
    if part is not None and examples.index is not None:
        batch = examples.index.batch(part.indices)
    report = dataclasses.asdict(found)
    report["replica_saved"] = replica
    return save_step(
        directory,
        step=found.step,
        names=guard.names,
        weights=guard.weights_before(replica - worker * local),
        batch=batch,
        report=report,
    )
