"""The restore path: where a prepared run starts, and the checkpoint read back at train begin.

The latest good checkpoint in the directory (each read back whole, :mod:`._store`) is checked
against this run (:mod:`._mismatch`) and gives the position and the shuffle seed; without one the
run starts at ``initial_epoch``. A ``BackupAndRestore`` backup newer than it is followed instead
(:mod:`._backups`); on several workers they agree on that before the first step, or all refuse
(:func:`agreed_start`). At train begin the weights and the optimizer state are read back.

TensorFlow glue: a checkpoint's tensors are read with ``tf.train``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import random
from collections.abc import Sequence
from typing import Any

from tfdp_utils._tf import tf
from tfdp_utils.cluster._coordination import CoordinationStore, KeyValueStore
from tfdp_utils.cluster._topology import position_of
from tfdp_utils.data._epoch_rest import EpochRest
from tfdp_utils.errors import ResumeMismatchError
from tfdp_utils.preemption import _agreement as agreement
from tfdp_utils.preemption import _arguments as arguments
from tfdp_utils.preemption import _backups as backups
from tfdp_utils.preemption import _elastic as elastic
from tfdp_utils.preemption import _mismatch as mismatch
from tfdp_utils.preemption import _position as position
from tfdp_utils.preemption import _store as store
from tfdp_utils.preemption._run import Run
from tfdp_utils.preemption._saving import KERAS

logger = logging.getLogger("tfdp_utils")

START_AGREEMENT_SECONDS = 300.0
"""How long the workers of a resumed job wait for each other's start (building the dataset
and the model may take one worker longer than another)."""

_starts = itertools.count()  # one agreement per fit, the same count on every worker


@dataclasses.dataclass(frozen=True)
class Start:
    """Where a prepared run starts, and from what.

    Attributes:
        facts: the dataset's facts (a checkpoint is checked against them, each save records them).
        epoch: the epoch it starts in (0-based).
        step: the steps of that epoch done.
        seed: the shuffle seed of the run.
        restore: the checkpoint read back at train begin (None: none, or a newer backup's state).
        resumed_from: the folder of the checkpoint or backup it resumes from, or None.
        shape_change: the shape the checkpoint was saved on -> this run's, when it differs
            (an elastic resume), else None.
        rest: the rest of the interrupted epoch laid out on this shape (files sharded by
            file, on another shape or stopped again during such a rest), else None; ``step``
            is then where it starts.
        step_offset: steps trained before ``epoch * steps_per_epoch + step`` counts (an epoch
            of another number of steps on the checkpoint's shape).
    """

    facts: dict[str, Any]
    epoch: int
    step: int
    seed: int | None
    restore: store.Saved | None
    resumed_from: str | None
    shape_change: str | None = None
    rest: EpochRest | None = None
    step_offset: int = 0


def check_variables(prefix: str) -> None:
    """Read every saved tensor back: the index alone says nothing of the data files (a
    truncated or overwritten data file fails only here, by its size or its checksum)."""
    reader = tf.train.load_checkpoint(prefix)
    for name in reader.get_variable_to_shape_map():
        reader.get_tensor(name)


def from_checkpoint(directory: str, resumable: Any, initial_epoch: Any) -> Start:
    """The latest good checkpoint's position in ``directory``, checked against this run, or
    the start (``initial_epoch``, a fresh seed where the dataset shuffles without one)."""
    if position_of(resumable.strategy).is_chief:
        store.clear_temporary(directory)  # the others' probes may be in use: chief only
    latest = store.latest(directory, check_variables)
    facts = resumable.facts()
    if latest is not None:
        mismatch.check_facts(latest, facts)
        mismatch.check_flavour(latest, KERAS)
        epoch, step = position.recorded(latest.state)
        # The builder's own seed (DATA sharding over several workers, no seed= given) gives
        # way to the checkpoint's: a job started on one worker resumes on several.
        seed = mismatch.checked_seed(
            latest, getattr(resumable, "given_seed", resumable.recipe.seed)
        )
        change = _say_shape_change(latest, facts)
        rest = elastic.epoch_rest(latest.path, latest.state, facts, epoch, step)
        if rest is not None:
            step = _rest_start(latest, rest, resumable, epoch, step)
        offset = latest.step - position.global_step(epoch, step, resumable.steps_per_epoch)
        return Start(facts, epoch, step, seed, latest, latest.path, change, rest, offset)
    epoch, step = arguments.initial_epoch(initial_epoch), 0
    seed = resumable.recipe.seed
    if seed is None and resumable.shuffles:
        seed = random.randrange(2**31)  # kept in every checkpoint of this run
    return Start(facts, epoch, step, seed, None, None)


def _rest_start(latest: store.Saved, rest: EpochRest, resumable: Any, epoch: int, step: int) -> int:
    """The step of ``epoch`` the rest starts at on this shape (its steps are the epoch's last)."""
    spe = int(resumable.steps_per_epoch)
    start = spe - rest.steps
    logger.warning(
        "tfdp_utils: PreemptionCheckpoint resumes %s at step %d of epoch %d (files sharded by "
        "file): the rest of the epoch, %d examples left by %d worker(s), is redistributed over "
        "this run's %d worker(s) as %d global steps of %d, Keras' steps %d..%d of %d.",
        latest.path,
        step,
        epoch + 1,
        rest.remaining,
        rest.num_workers,
        position_of(resumable.strategy).num_workers,
        rest.steps,
        rest.global_batch_size,
        start,
        spe - 1,
        spe,
    )
    return start


def _say_shape_change(latest: store.Saved, facts: dict[str, Any]) -> str | None:
    change = elastic.describe_change(latest.state.get("dataset", {}), facts)
    if change is not None:
        logger.warning(  # an elastic resume: the same global batches on another shape
            "tfdp_utils: PreemptionCheckpoint resumes %s on another shape: %s; the global "
            "batches, the step numbers and the optimizer state go on.",
            latest.path,
            change,
        )
    return change


def beside_backups(start: Start, beside: Sequence[Any], steps_per_epoch: int) -> Start:
    """``start``, or the newest ``BackupAndRestore`` backup's position where it is newer."""
    backup = backups.newest(beside, steps_per_epoch)
    if backup is None:
        return start
    latest, spe = start.restore, steps_per_epoch
    if backup.global_step(spe) > position.global_step(start.epoch, start.step, spe):
        if latest is not None:
            _check_backup_shape(latest, start, beside, backup)
        # BackupAndRestore's newer state is restored whole (its on_train_begin): the
        # data and Keras' steps follow it, with this job's shuffle seed.
        logger.warning(
            "tfdp_utils: PreemptionCheckpoint follows BackupAndRestore's backup %s "
            "(epoch %d, step %d of %d), newer than %s; its weights and optimizer state are "
            "the ones restored.",
            backup.path,
            backup.epoch + 1,
            backup.step,
            spe,
            f"the checkpoint {latest.path}" if latest is not None else "any checkpoint",
        )
        return dataclasses.replace(
            start,
            epoch=backup.epoch,
            step=backup.step,
            restore=None,
            resumed_from=backup.path,
            rest=None,
            step_offset=0,
        )
    if latest is not None:
        logger.warning(
            "tfdp_utils: PreemptionCheckpoint resumes from %s (epoch %d, step %d), not from "
            "BackupAndRestore's older backup %s (epoch %d, step %d): the checkpoint's "
            "weights, optimizer state and position are restored after the backup's.",
            latest.path,
            start.epoch + 1,
            start.step,
            backup.path,
            backup.epoch + 1,
            backup.step,
        )
    return start


def agreed_start(
    start: Start,
    beside: Sequence[Any],
    resumable: Any,
    *,
    store: KeyValueStore | None = None,
) -> Start:
    """:func:`beside_backups` on every worker of the job, agreed before the first step.

    Beside ``BackupAndRestore`` on several workers, each worker tells the chief where it would
    start (a backup newer than the checkpoint, or the checkpoint) through the coordination
    service (:func:`~._agreement.gather`); where they differ, or one of them refused, the
    resume is refused on every worker (:func:`~._elastic.check_same_start`). Keras 3's backups
    are per worker, so on more workers than wrote them only the old workers find one.
    Without a ``BackupAndRestore`` or on one worker nothing is exchanged.

    Raises:
        ResumeMismatchError: the workers would start from different states, or one refused.
    """
    spe = resumable.steps_per_epoch
    worker = position_of(resumable.strategy)
    if not beside or worker.num_workers <= 1:
        return beside_backups(start, beside, spe)
    refused: str | None = None
    try:
        chosen = beside_backups(start, beside, spe)
    except ResumeMismatchError as error:
        chosen, refused = start, str(error)
    followed = chosen.resumed_from if chosen.resumed_from != start.resumed_from else None
    mine = elastic.WorkerStart(worker.index, chosen.epoch, chosen.step, followed, refused)
    latest = start.restore

    def decide(texts: list[str]) -> str:
        return json.dumps(
            elastic.check_same_start(
                [elastic.WorkerStart.decode(text) for text in texts],
                checkpoint=latest.path if latest is not None else None,
                before=latest.state.get("dataset", {}) if latest is not None else {},
                now=start.facts,
            )
        )

    verdict = agreement.gather(
        store if store is not None else CoordinationStore(),
        f"tfdp/preemption/start/{next(_starts)}",
        worker=worker.index,
        num_workers=worker.num_workers,
        mine=mine.encode(),
        decide=decide,
        timeout=START_AGREEMENT_SECONDS,
    )
    refusal = json.loads(verdict)
    if refusal is not None:
        raise ResumeMismatchError(refusal)
    return chosen


def _check_backup_shape(
    latest: store.Saved, start: Start, beside: Sequence[Any], backup: backups.BackupPosition
) -> None:
    """Refuse a newer mid-epoch backup whose step names other examples on this shape (files
    sharded by file): counted with the checkpoint's steps per epoch as well as this run's."""
    before = latest.state.get("dataset", {})
    saved_spe = int(before.get("steps_per_epoch") or 0)
    other = backups.newest(beside, saved_spe) if saved_spe else None
    positions = [(backup.epoch, backup.step)]
    if other is not None:
        positions.append((other.epoch, other.step))
    elastic.check_backup_position(
        latest.path,
        before,
        start.facts,
        in_rest=start.rest is not None,
        backup=backup.path,
        positions=tuple(positions),
    )


def prepared_run(directory: str, resumable: Any, start: Start) -> Run:
    """The run of one ``fit`` call (or custom loop) at ``start``, on this worker."""
    run = Run(
        directory=directory,
        facts=start.facts,
        seed=start.seed,
        steps_per_epoch=resumable.steps_per_epoch,
        epoch=start.epoch,
        done=start.step,
        restore=start.restore,
    )
    run.strategy = resumable.strategy
    run.rest, run.rest_start, run.step_offset = start.rest, start.step, start.step_offset
    worker = position_of(resumable.strategy)
    run.worker, run.num_workers = worker.index, worker.num_workers
    if start.restore is not None:
        logger.warning(  # a resume changes what the run does: said at the default level
            "tfdp_utils: PreemptionCheckpoint resumes from %s: epoch %d, step %d of %d.",
            start.restore.path,
            start.epoch + 1,
            start.step,
            resumable.steps_per_epoch,
        )
    return run


def read_back(run: Run, model: Any, optimizer: Any) -> None:
    """Give the run its checkpoint object; read the saved weights and optimizer state back
    into ``model`` and ``optimizer`` when the run resumes from a checkpoint."""
    run.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    if run.restore is not None:
        mismatch.check_optimizer(run.restore, type(optimizer).__name__)
        mismatch.check_weights(run.restore, position.model_variables(model))
        run.checkpoint.read(run.restore.variables).expect_partial()
