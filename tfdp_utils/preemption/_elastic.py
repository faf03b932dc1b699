"""Elastic resume: a checkpoint resumed on another number of replicas or workers. Pure.

The saved position is "epoch e, global step k of a global batch of B examples, shuffle seed
s". Under DATA sharding every worker shuffles the whole epoch with the same seed and keeps
every W-th example, so the global batch at step k is the same examples on any shape (the
builder's order does not depend on W or the replicas: ``tests/data/test_elastic_order.py``).
File sources read under DATA sharding (or on one worker) are the same: every worker reads every
file, in an order drawn from the shared seed, through a deterministic interleave, so the epoch's
order is one sequence before it is sharded.
A resume on another shape is then exact up to the order of the floating-point sums, as long
as the global batch is the same and divides over the new replicas.

Files sharded by file (FILE: each worker its own files) have no such global order: the rest
of the interrupted epoch is laid out from the facts of the shape it began on (which files each
worker read, how many examples each held, the steps done) and redistributed over the new
workers, each example once (:class:`~tfdp_utils.data._epoch_rest.EpochRest`); the epochs
after it are the new shape's own. The global batches of the rest are those of the first shape
where its steps were full.

What this module refuses, each by name with its reason (a
:class:`~tfdp_utils.errors.ResumeMismatchError`): a changed global batch, a global batch that
does not divide over the new replicas, sources whose global batches depend on the shape
(a ``fn(input_context)`` that shards itself, ``shard_policy='off'`` over several workers),
files sharded by file in a checkpoint that does not record the examples each worker held,
the rest of an epoch that needs more steps than an epoch has on the new shape, and another
set of files.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from tfdp_utils.data._epoch_rest import EpochRest
from tfdp_utils.errors import ResumeMismatchError

SHAPE_FACTS = ("num_replicas_in_sync", "num_workers", "policy", "files", "examples_per_worker")
"""The facts that may differ on another shape (the others must be the same)."""

REST_KEY = "epoch_rest"
"""Where a checkpoint saved during the rest of an epoch records it (``state.json``)."""

ELASTIC_SOURCES = ("arrays", "dataset", "files")
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
    if kind == "files" and policy == "file":
        return None  # the rest of the interrupted epoch is laid out anew (epoch_rest)
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
    _check_same_files(path, before, now)
    if redistributes(before, now) and "examples_per_worker" not in before:
        raise _refuse(
            path,
            "its files were sharded by file (FILE) and it does not record how many examples "
            "each worker held (it was saved by an earlier tfdp-utils), so the rest of the "
            f"interrupted epoch cannot be laid out on other workers ({where})",
            "Resume on the saved shape until the epoch ends (a checkpoint saved from now on "
            "records them), or start afresh with another directory=.",
        )


def redistributes(before: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    """Whether a resume from facts ``before`` on facts ``now`` (another shape) lays out the
    rest of the interrupted epoch anew: files sharded by file on either shape."""
    return before.get("source_kind") == "files" and "file" in (
        before.get("policy"),
        now.get("policy"),
    )


def epoch_rest(
    path: str,
    state: Mapping[str, Any],
    now: Mapping[str, Any],
    epoch: int,
    step: int,
) -> EpochRest | None:
    """The rest of the interrupted epoch a resume from a checkpoint (``path``, its
    ``state.json`` ``state``, at ``step`` of ``epoch``) on a run with facts ``now`` trains,
    or None where the epoch's own steps go on.

    Raises:
        ResumeMismatchError: the rest needs more steps than an epoch has on this shape, or
            the checkpoint's record of it does not read.
    """
    before = state.get("dataset", {})
    saved = state.get(REST_KEY)
    if isinstance(saved, Mapping) and saved.get("epoch") == epoch:
        try:
            rest = EpochRest.from_json(saved)
        except (KeyError, TypeError, ValueError) as error:
            raise _refuse(
                path,
                f"its record of the rest of epoch {epoch + 1} does not read ({error!r})",
                "Resume from an earlier checkpoint (delete this one), or start afresh with "
                "another directory=.",
            ) from None
    elif step and changed(before, now) and redistributes(before, now):
        rest = EpochRest.interrupted(before, epoch, step)
    else:
        return None
    steps = int(now.get("steps_per_epoch") or 0)
    if rest.steps > steps:
        raise _refuse(
            path,
            f"the rest of epoch {epoch + 1} ({rest.remaining} examples of files sharded by "
            f"file) takes {rest.steps} global steps of {rest.global_batch_size}, but an epoch "
            f"has {steps} steps on this shape ({describe_change(before, now) or 'same shape'})",
            "Resume on the saved shape until the epoch ends, or on a number of workers whose "
            "epoch has as many steps (drop_remainder=False keeps every example's step).",
        )
    return rest


def _all_files(facts: Mapping[str, Any]) -> list[str]:
    return sorted({name for files in facts.get("files") or () for name in files})


def _check_same_files(path: str, before: Mapping[str, Any], now: Mapping[str, Any]) -> None:
    """The files (per worker, a shape fact) must be the same files over all workers."""
    if "files" not in before or _all_files(before) == _all_files(now):
        return
    gone = sorted(set(_all_files(before)) - set(_all_files(now)))
    new = sorted(set(_all_files(now)) - set(_all_files(before)))
    raise _refuse(
        path,
        f"it was saved reading other files ({len(gone)} not read here, e.g. {gone[:2]}; "
        f"{len(new)} new, e.g. {new[:2]})",
        "Resume with the same files, or start afresh with another directory=.",
    )


def describe_change(before: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """``"2 workers x 1 replica (...) -> 1 worker x 2 replicas (...)"``, or None when the
    shape is the same."""
    if not changed(before, now):
        return None
    return f"{Shape.of(before).describe()} -> {Shape.of(now).describe()}"


def check_backup_position(
    checkpoint: str,
    before: Mapping[str, Any],
    now: Mapping[str, Any],
    *,
    in_rest: bool,
    backup: str,
    positions: tuple[tuple[int, int], ...],
) -> None:
    """Raise unless a ``BackupAndRestore`` backup newer than ``checkpoint`` names the same
    examples on this run's shape.

    Under FILE sharding "step k of epoch e" names other examples on another number of workers,
    and in the rest of an epoch laid out anew it names that layout's steps. A backup does not
    record the shape it was saved on, so a mid-epoch one cannot be placed on this shape; an
    epoch's start is the same on every shape.

    Args:
        checkpoint: the latest checkpoint's folder.
        before: the dataset facts it was saved with.
        now: this run's dataset facts.
        in_rest: whether this run resumes in the rest of an epoch laid out anew.
        backup: the backup's folder.
        positions: where the backup resumes (epoch, 0-based, and the steps of it its weights
            trained), counted with the steps per epoch of each shape that may have saved it.

    Raises:
        ResumeMismatchError: a mid-epoch backup, newer than the checkpoint, on a shape whose
            steps name other examples.
    """
    mid_epoch = [(epoch, step) for epoch, step in positions if step]
    if not mid_epoch or not (in_rest or (changed(before, now) and redistributes(before, now))):
        return
    (epoch, step), old, new = mid_epoch[0], Shape.of(before), Shape.of(now)
    raise ResumeMismatchError(
        f"Keras' BackupAndRestore backup {backup} (epoch {epoch + 1}, after step {step}) "
        f"is newer than PreemptionCheckpoint's checkpoint {checkpoint} (saved on "
        f"{old.describe()}), and this run is on {new.describe()} with files sharded by file: "
        "a step of an epoch names other examples on each shape, and the backup does not record "
        f"the shape it was saved on, so resuming at it would repeat or skip examples of epoch "
        f"{epoch + 1}. To resume exactly, remove the backup folder {backup} (the job goes on "
        f"from the checkpoint {checkpoint}, the steps after it trained again), or resume on "
        "the shape the backup was saved on until the epoch ends. Backups saved at an epoch's "
        "end (BackupAndRestore(save_freq='epoch')) are followed on any shape."
    )


@dataclasses.dataclass(frozen=True)
class WorkerStart:
    """Where one worker of a multi-worker job would resume, as the workers compare it.

    Attributes:
        worker: the worker's index.
        epoch: the epoch it starts in (0-based).
        step: the steps of that epoch done.
        backup: the ``BackupAndRestore`` folder it follows (newer than the checkpoint), or None
            where the checkpoint (or the start) governs.
        refused: the refusal this worker met on its own (its message), or None.
    """

    worker: int
    epoch: int
    step: int
    backup: str | None = None
    refused: str | None = None

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> WorkerStart:
        return cls(**json.loads(text))


def _workers(indices: Sequence[int]) -> str:
    return f"worker{'s' if len(indices) != 1 else ''} {', '.join(map(str, indices))}"


def check_same_start(
    starts: Sequence[WorkerStart],
    *,
    checkpoint: str | None,
    before: Mapping[str, Any],
    now: Mapping[str, Any],
) -> str | None:
    """Why the workers of a resumed job would not start from one state, or None.

    A refusal one worker met is every worker's. Otherwise the workers must agree on whether a
    ``BackupAndRestore`` backup newer than the checkpoint is followed, and where: Keras 3's
    backups are per worker (``worker_backup_dir``), so on more workers than wrote them the new
    ones find none and would start from the checkpoint while the others follow their backups.

    Args:
        starts: every worker's start, in worker order.
        checkpoint: the latest checkpoint's folder, or None where the directory has none.
        before: the dataset facts it was saved with (empty without one).
        now: this run's dataset facts.
    """
    for start in starts:
        if start.refused is not None:
            return start.refused
    followed = [s for s in starts if s.backup is not None]
    if not followed:
        return None
    positions = {(s.epoch, s.step) for s in followed}
    if len(followed) == len(starts) and len(positions) == 1:
        return None
    new = Shape.of(now)
    folders = ", ".join(str(s.backup) for s in followed)
    plural = len(followed) != 1
    where = "; ".join(f"epoch {epoch + 1}, after step {step}" for epoch, step in sorted(positions))
    if checkpoint is not None:
        than = (
            f"PreemptionCheckpoint's checkpoint {checkpoint} (saved on "
            f"{Shape.of(before).describe()})"
        )
        goes_on = (
            f"the job goes on from the checkpoint {checkpoint}, the steps after it trained again"
        )
        workers = Shape.of(before).num_workers
        old = f"the checkpoint's {workers} worker{'s' if workers != 1 else ''}"
    else:
        than = "any checkpoint of PreemptionCheckpoint (its directory has none)"
        goes_on = "the job starts afresh on every worker"
        old = "the number of workers that wrote them"
    if len(followed) == len(starts):
        what = (
            f"the backups are at different steps ({where}), so the workers would start from "
            "different weights and steps"
        )
    else:
        others = [s.worker for s in starts if s.backup is None]
        what = (
            f"only {_workers([s.worker for s in followed])} of this run on {new.describe()} "
            f"found one: {_workers(others)} found none in {'their' if len(others) > 1 else 'its'} "
            "own folder (under Keras 3, "
            "worker_backup_dir() gives each worker of a multi-worker job its own folder, and "
            "the job that wrote them had fewer workers), so the workers would start from "
            "different weights and steps"
        )
    return (
        f"Keras' BackupAndRestore backup{'s' if plural else ''} {folders} "
        f"({where}) {'are' if plural else 'is'} newer than {than}, and {what}. To resume "
        f"exactly, remove the backup folder{'s' if plural else ''} {folders} ({goes_on}), or "
        f"resume on {old} until the epoch ends."
    )
