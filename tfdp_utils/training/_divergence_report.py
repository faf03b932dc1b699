"""What ``DivergenceGuard`` reports, as data and in words (pure: no TensorFlow).

:class:`Divergence` names the first step whose loss or gradients went non-finite: where it was
in the ``fit`` (epoch, batch, step), the replicas and workers, whether their loss was
non-finite, and the variable whose gradient went non-finite first in backpropagation order.
:class:`Disagreement` names replicas whose weights differ from replica 0's, found by comparing
their checksums (:func:`compare_checksums`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

RELATIVE_TOLERANCE = 1e-6
"""Checksums closer than this (relative to the larger) count as equal: the replicas of a
Mirrored strategy hold the same bits, and only a real difference should be reported."""


def step_place(step: int, epoch_starts: Mapping[int, int]) -> tuple[int, int]:
    """``(epoch, batch)`` of the guard step ``step``, given each epoch's first guard step.

    Epochs and batches are 0-based, as Keras passes them to callbacks.
    """
    epoch, start = 0, 0
    for candidate, first in sorted(epoch_starts.items()):
        if first <= step:
            epoch, start = candidate, first
    return epoch, step - start


def worker_of(replica: int, *, local_replicas: int) -> int:
    """The worker that runs global replica ``replica`` (MultiWorkerMirroredStrategy's order)."""
    return replica // max(1, local_replicas)


@dataclasses.dataclass(frozen=True)
class ReplicaExamples:
    """The examples one replica received in the step, for a builder dataset over a sized source.

    Attributes:
        replica: the global replica id.
        indices: the examples' indices in the source, in the order the replica received them.
        non_finite: those of them whose values (after ``map_fn``) hold an inf or NaN.
    """

    replica: int
    indices: tuple[int, ...]
    non_finite: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first step whose loss or gradients were not finite on some replica.

    Attributes:
        epoch: the epoch (0-based, as Keras' callbacks count).
        batch: the batch within the epoch (0-based).
        step: the step of the ``fit`` (1-based): the first step is 1.
        replicas: global ids of the replicas whose loss or gradients were non-finite.
        workers: the workers running them.
        loss_replicas: the replicas among them whose loss itself was non-finite.
        variable: the variable whose gradient went non-finite first in backpropagation order
            on the first replica named (None when only the loss was non-finite).
        policy: ``"stop"`` or ``"skip"``.
        examples: for each replica named that this worker runs, the source indices of the
            examples it received in that step and which of them hold a non-finite value
            (a dataset from ``build_distributed_dataset`` over arrays or a sized source).
        examples_unknown: why ``examples`` is empty, in words ("" when it is not).
    """

    epoch: int
    batch: int
    step: int
    replicas: tuple[int, ...]
    workers: tuple[int, ...]
    loss_replicas: tuple[int, ...]
    variable: str | None
    policy: str
    examples: tuple[ReplicaExamples, ...] = ()
    examples_unknown: str = ""

    @property
    def non_finite_examples(self) -> tuple[int, ...]:
        """The source indices of the examples named that hold an inf or NaN, sorted."""
        return tuple(sorted({i for part in self.examples for i in part.non_finite}))

    def _examples_text(self) -> str:
        if self.examples_unknown:
            return f" Its examples are not named: {self.examples_unknown}."
        parts = []
        for part in self.examples:
            bad = (
                f"; non-finite values in examples {list(part.non_finite)}"
                if part.non_finite
                else "; none of them holds a non-finite value"
            )
            parts.append(
                f" Replica {part.replica} received source examples "
                f"{_index_list(part.indices)}{bad}."
            )
        return "".join(parts)

    def describe(self) -> str:
        """One paragraph for the log."""
        where = (
            f"epoch {self.epoch + 1} (index {self.epoch}), batch {self.batch} "
            f"(step {self.step} of this fit)"
        )
        who = ", ".join(
            f"replica {r} on worker {w}" for r, w in zip(self.replicas, self.workers, strict=True)
        )
        what = "loss and gradients" if self.loss_replicas else "gradients"
        if self.loss_replicas and len(self.loss_replicas) < len(self.replicas):
            what = f"loss (replicas {list(self.loss_replicas)}) or gradients"
        variable = (
            f"; the first gradient to go non-finite (in backpropagation order) was that of "
            f"{self.variable!r}"
            if self.variable
            else ""
        )
        done = (
            "Its update was not applied on any replica and training stops with the last "
            "finite weights."
            if self.policy == "stop"
            else "Its update was skipped on every replica."
        )
        return f"non-finite {what} at {where} on {who}{variable}.{self._examples_text()} {done}"


def _index_list(indices: Sequence[int], *, shown: int = 16) -> str:
    listed = ", ".join(str(i) for i in indices[:shown])
    more = f", ... ({len(indices)} in all)" if len(indices) > shown else ""
    return f"[{listed}{more}]"


@dataclasses.dataclass(frozen=True)
class VariableDifference:
    """One variable of one replica whose checksum differs from replica 0's."""

    replica: int
    worker: int
    variable: str
    sum_difference: float
    norm_difference: float


@dataclasses.dataclass(frozen=True)
class Disagreement:
    """Replicas whose weights differ from replica 0's, before the update of one step.

    Attributes:
        epoch: the epoch (0-based) of the step.
        batch: the batch within the epoch (0-based).
        step: the step of the ``fit`` (1-based) before whose update the weights were compared.
        replicas: global ids of the replicas that differ from replica 0.
        workers: the workers running them.
        differences: each differing variable of each such replica, by how much: the
            difference of the sums of its values, and of their Euclidean norms.
    """

    epoch: int
    batch: int
    step: int
    replicas: tuple[int, ...]
    workers: tuple[int, ...]
    differences: tuple[VariableDifference, ...]

    def describe(self) -> str:
        """One paragraph for the log."""
        shown = "; ".join(
            f"replica {d.replica} (worker {d.worker}) {d.variable!r}: sum differs by "
            f"{d.sum_difference:.3g}, norm by {d.norm_difference:.3g}"
            for d in self.differences[:5]
        )
        more = f" and {len(self.differences) - 5} more" if len(self.differences) > 5 else ""
        return (
            f"the weights of replicas {list(self.replicas)} (workers {list(self.workers)}) "
            f"differ from replica 0's (worker 0) before the update of step {self.step} of this "
            f"fit (epoch index {self.epoch}, batch {self.batch}): {shown}{more}. Replicas that "
            "disagree train different models on one all-reduced gradient; the usual cause is "
            "weights loaded or set on one worker only (load them on every worker, or before "
            "the strategy's scope copies them)."
        )


def _differs(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return not (math.isnan(a) and math.isnan(b))
    return abs(a - b) > RELATIVE_TOLERANCE * max(abs(a), abs(b), 1e-30)


def compare_checksums(
    checksums: Sequence[Sequence[tuple[float, float]]],
    names: Sequence[str],
    *,
    local_replicas: int,
) -> tuple[VariableDifference, ...]:
    """Each variable of each replica whose ``(sum, sum of squares)`` differs from replica 0's.

    Args:
        checksums: per global replica, per variable, ``(sum, sum of squares)``.
        names: the variables' names, in the same order.
        local_replicas: replicas per worker, to name the worker of each.
    """
    reference = checksums[0]
    found = []
    for replica, rows in enumerate(checksums[1:], start=1):
        for name, (total, squares), (ref_total, ref_squares) in zip(
            names, rows, reference, strict=True
        ):
            if _differs(total, ref_total) or _differs(squares, ref_squares):
                found.append(
                    VariableDifference(
                        replica=replica,
                        worker=worker_of(replica, local_replicas=local_replicas),
                        variable=name,
                        sum_difference=total - ref_total,
                        norm_difference=math.sqrt(max(squares, 0.0))
                        - math.sqrt(max(ref_squares, 0.0)),
                    )
                )
    return tuple(found)
