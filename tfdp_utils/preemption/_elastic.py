"""Elastic resume: a checkpoint resumed on another number of replicas or workers. Pure.

The saved position is "epoch e, global step k of a global batch of B examples, shuffle seed
s". Under DATA sharding every worker shuffles the whole epoch with the same seed and keeps
every W-th example, so the global batch at step k is the same examples on any shape (the
builder's order does not depend on W or the replicas: ``tests/data/test_elastic_order.py``).
A resume on another shape is then exact up to the order of the floating-point sums, as long
as the global batch is the same and divides over the new replicas.

What this module refuses, each by name with its reason (a
:class:`~tfdp_utils.errors.ResumeMismatchError`): a changed global batch, a global batch that
does not divide over the new replicas, sources whose global batches depend on the shape
(files sharded by file, a ``fn(input_context)`` that shards itself, ``shard_policy='off'`` over
several workers), and file sources in general (not in this release).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tfdp_utils.errors import ResumeMismatchError

SHAPE_FACTS = ("num_replicas_in_sync", "num_workers", "policy", "files")
"""The facts that may differ on another shape (the others must be the same)."""

ELASTIC_SOURCES = ("arrays", "dataset")
"""Source kinds whose global order the builder defines before it shards (DATA)."""


@dataclasses.dataclass(frozen=True)
class Shape:
    """How a run spreads one global batch: workers, replicas over them, examples each."""

    num_workers: int
    num_replicas_in_sync: int
    global_batch_size: int

    @classmethod
    def of(cls, facts: Mapping[str, Any]) -> Shape:
        """The shape a checkpoint's (or a run's) dataset facts record."""
        return cls(
            int(facts.get("num_workers") or 1),
            int(facts.get("num_replicas_in_sync") or 1),
            int(facts.get("global_batch_size") or 0),
        )

    def describe(self) -> str:
        """``"2 workers x 1 replica (4 examples per replica)"``."""
        workers = f"{self.num_workers} worker{'s' if self.num_workers != 1 else ''}"
        each = max(1, self.num_replicas_in_sync // self.num_workers)
        replicas = f"{each} replica{'s' if each != 1 else ''}"
        per_replica = self.global_batch_size // max(1, self.num_replicas_in_sync)
        return f"{workers} x {replicas} ({per_replica} examples per replica)"


def changed(before: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    """Whether the checkpoint's facts ``before`` record another number of replicas or workers
    than this run's ``now`` (facts it does not record are not compared)."""
    return any(
        key in before and before[key] != now.get(key)
        for key in ("num_replicas_in_sync", "num_workers")
    )


def _refuse(path: str, what: str, fix: str) -> ResumeMismatchError:
    return ResumeMismatchError(
        f"the checkpoint {path} cannot be resumed on another shape: {what}. {fix}"
    )


def _same_order_reason(facts: Mapping[str, Any]) -> str | None:
    """Why the global batches of a run with ``facts`` would depend on its shape, or None."""
    kind, policy = facts.get("source_kind"), facts.get("policy")
    workers = int(facts.get("num_workers") or 1)
    if kind == "files":
        if policy == "file":
            return (
                "files sharded by file (FILE) give each worker its own files, so the examples "
                "of a global step depend on the number of workers"
            )
        return (
            "an elastic resume of file sources is not supported yet (arrays, tensor "
            "slices and sized tf.data datasets are)"
        )
    if kind == "function":
        return (
            "a fn(input_context) source shards its own data by input_pipeline_id, so its "
            "global batches depend on the number of workers"
        )
    if kind not in ELASTIC_SOURCES:
        return f"a source of kind {kind!r} is not known to keep its order on another shape"
    if policy == "off" and workers > 1:
        return (
            f"shard_policy='off' over {workers} workers trains every example on each worker, "
            "so an epoch is not the same examples on another number of workers"
        )
    if policy not in ("data", "off"):
        return f"shard_policy={policy!r} leaves the order to tf.data's own autoshard"
    return None


def check_shape_change(path: str, before: Mapping[str, Any], now: Mapping[str, Any]) -> None:
    """Raise unless a run with facts ``now`` continues the epochs of a checkpoint saved with
    facts ``before`` on another number of replicas or workers.

    Args:
        path: the checkpoint's folder (named in the error).
        before: the dataset facts the checkpoint was saved with.
        now: this run's dataset facts.

    Raises:
        ResumeMismatchError: a changed global batch, one that does not divide over this
            run's replicas, or a source whose global batches depend on the shape.
    """
    old, new = Shape.of(before), Shape.of(now)
    where = f"saved on {old.describe()}, resumed on {new.describe()}"
    if old.global_batch_size % new.num_replicas_in_sync:
        divisors = [
            d for d in range(1, old.global_batch_size + 1) if old.global_batch_size % d == 0
        ]
        raise _refuse(
            path,
            f"its global batch of {old.global_batch_size} examples does not divide over "
            f"this run's {new.num_replicas_in_sync} replicas in sync ({where})",
            f"Resume on a number of replicas that divides {old.global_batch_size} "
            f"({', '.join(map(str, divisors[:8]))}...), or start afresh with another directory=.",
        )
    if old.global_batch_size != new.global_batch_size:
        raise _refuse(
            path,
            f"it was saved with a global batch of {old.global_batch_size} examples, this run "
            f"has {new.global_batch_size} ({where}); the saved position counts global batches "
            "of the first size, so another size would skip or repeat examples",
            f"Build the dataset with global_batch_size={old.global_batch_size} (per-replica "
            f"batch {old.global_batch_size // new.num_replicas_in_sync} on "
            f"{new.num_replicas_in_sync} replicas), or start afresh with another directory=.",
        )
    for facts, which in ((before, "the checkpoint's run"), (now, "this run")):
        reason = _same_order_reason(facts)
        if reason is not None:
            raise _refuse(
                path,
                f"in {which}, {reason} ({where})",
                "Resume on the saved shape, or start afresh with another directory=.",
            )


def describe_change(before: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """``"2 workers x 1 replica (...) -> 1 worker x 2 replicas (...)"``, or None when the
    shape is the same."""
    if not changed(before, now):
        return None
    return f"{Shape.of(before).describe()} -> {Shape.of(now).describe()}"
