"""``PreemptionCheckpoint``: save on a preemption notice, exit to be run again, resume exactly.

TensorFlow glue over the pure pieces of this package (:mod:`._signals`, :mod:`._store`). The
callback takes part in the ``fit`` call it is passed to before Keras sees the call (through
:class:`tfdp_utils.compat._fit_binding.FitCallAdapter`): it reads the latest checkpoint in its
directory, checks that it was saved by the same training setup, and hands ``fit`` the builder
dataset positioned at the saved step of the saved epoch (``tfdp.resumable``),
``steps_per_epoch`` and ``initial_epoch``; Keras' first epoch then starts at that step
(:mod:`tfdp_utils.compat._resume_position`). At train begin the weights and the optimizer
state (its step counter, slots, loss scale) are read back.

A notice (SIGTERM by default) only sets a flag; at the end of the step that is running, the
position is saved atomically and ``fit`` ends: the process exits with
:data:`~tfdp_utils.preemption._signals.PREEMPTED_EXIT_STATUS` (75), which schedulers treat as
"run again", or ``fit`` returns when ``exit=False``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import numbers
import os
import random
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from tfdp_utils import _dataset_info, _tf, _validate
from tfdp_utils._tf import keras, tf
from tfdp_utils.cluster import _coordination as coordination
from tfdp_utils.cluster._topology import position_of
from tfdp_utils.compat import _fit_binding as fit_binding
from tfdp_utils.compat import _resume_position as resume_position
from tfdp_utils.errors import ResumeMismatchError
from tfdp_utils.preemption import _agreement as agreement
from tfdp_utils.preemption import _backups as backups
from tfdp_utils.preemption import _signals as signals_
from tfdp_utils.preemption import _store as store
from tfdp_utils.training import _accumulation as accumulation

logger = logging.getLogger("tfdp_utils")

_Callback: Any = keras.callbacks.Callback
_CALLER = "PreemptionCheckpoint"
_fits = itertools.count()  # keys of each prepared fit: the same on every worker of a job
DEFAULT_GRACE_SECONDS = 25.0


def _positive_int_or_none(value: Any, name: str, hint: str) -> int | None:
    return None if value is None else _validate.positive_int(value, name, hint=hint)


def _model_variables(model: Any) -> list[list[Any]]:
    return [[v.path if hasattr(v, "path") else v.name, list(v.shape)] for v in model.weights]


class PreemptionCheckpoint(_Callback):  # type: ignore[misc]
    """Save on a preemption notice and exit to be run again; resume mid-epoch, exactly.

    Pass it to ``fit`` with a dataset from ``tdu.build_distributed_dataset()``. On SIGTERM
    (or the ``signals`` named) the step that is running ends, the training position is saved
    to ``directory`` and the process exits with status 75 (``exit=False``: ``fit`` returns).
    Running the same script again resumes at the saved step of the saved epoch: the dataset
    skips the global batches the epoch already trained on, the weights and optimizer state
    are read back, and every example of that epoch is trained once over the two runs.

    Args:
        directory: a folder that outlives the process (a persistent volume, a shared file
            system). Checkpoints are ``directory/ckpt-<step>``, written atomically.
        signals: the signals that announce a preemption. Defaults to ``("SIGTERM",)``;
            SLURM users add ``"SIGUSR1"`` with ``--signal=B:USR1@90``.
        every_steps: also save every this many steps (the last ``keep`` are kept), so that a
            job killed without notice (SIGKILL, a lost node) resumes from the last one.
            Defaults to `None` (no periodic save).
        keep: how many checkpoints to keep. Defaults to `3`.
        exit: end the process after the save (status 75). `False`: ``fit`` returns.
            Defaults to `True`.
        grace_seconds: the time the scheduler gives between the notice and SIGKILL; a save
            still running then is logged as a WARNING before it is cut short. Defaults to
            `25.0` (Kubernetes gives 30 s).

    Raises:
        TypeError: a ``directory`` that is not a path; ``every_steps``/``keep`` not integers,
            ``grace_seconds`` not a number, ``exit`` not a bool, ``signals`` not names or
            numbers.
        ValueError: a signal that cannot be caught or is unknown, ``every_steps`` or ``keep``
            below 1, ``grace_seconds`` not a positive finite number, a ``directory`` with
            whitespace around it. When ``fit`` starts: a second PreemptionCheckpoint in the
            same call, an ``initial_epoch`` below 0, a ``steps_per_epoch`` other than the
            dataset's epoch.
    """

    EXIT_STATUS = signals_.PREEMPTED_EXIT_STATUS
    """The process's exit status after a preemption save: 75 (``EX_TEMPFAIL``, "run again")."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        signals: Any = signals_.DEFAULT_SIGNALS,
        every_steps: int | None = None,
        keep: int = 3,
        exit: bool = True,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
    ) -> None:
        super().__init__()
        self._supports_tf_logs = True  # it reads no logs: tf_keras need not convert them
        if not isinstance(directory, (str, os.PathLike)) or not str(os.fspath(directory)).strip():
            raise TypeError(
                f"directory must be a folder path, but received {directory!r}. Pass a folder "
                "on a volume that outlives the job's processes."
            )
        text = os.fspath(directory)
        if isinstance(text, str) and text != text.strip():
            # " /mnt/ckpt" is a folder under the working directory, which a restarted
            # container does not keep: the job would never resume.
            raise ValueError(
                f"directory={text!r} begins or ends with whitespace, so it names another "
                f"folder than {text.strip()!r} (a leading space makes it relative to the "
                f"working directory). Pass directory={text.strip()!r}."
            )
        self.directory = text  # checked and made absolute when fit starts
        self.signals = signals_.signal_numbers(signals)
        self.every_steps = _positive_int_or_none(
            every_steps, "every_steps", "Pass e.g. every_steps=500, or None for no periodic save."
        )
        self.keep = _validate.positive_int(keep, "keep", hint="Pass e.g. keep=3.")
        self.exit = _validate.boolean(exit, "exit")
        self.grace_seconds = _validate.positive_float(
            grace_seconds,
            "grace_seconds",
            unit="number of seconds",
            hint="Pass the scheduler's grace period, e.g. grace_seconds=25 (Kubernetes: 30 s).",
        )
        # fit must be wrapped before the call that takes this callback is looked up.
        fit_binding.install(applied_by="PreemptionCheckpoint()")
        self.notice = signals_.Notice()
        self.saved_path: str | None = None
        self.resumed_from: str | None = None
        self._run: _Run | None = None
        # A notice before fit (data loading, building the model) or after it: nothing to
        # save, and the job must still be run again (status 75, not killed by the signal).
        self._outside_fit = signals_.ExitOutsideFit(self.signals, _say_exit_outside_fit)

    # -- before Keras sees the call (FitCallAdapter) -------------------------------------

    def prepare_fit(
        self, model: Any, arguments: dict[str, Any]
    ) -> contextlib.AbstractContextManager[Any]:
        """Position ``fit``'s data and counters at the latest checkpoint (or the start)."""
        given = arguments.get("steps_per_epoch")
        callbacks = arguments.get("callbacks")
        _check_one_checkpoint(callbacks)
        beside = backups.backups_in(callbacks)
        if isinstance(callbacks, (list, tuple)):
            # The restore after BackupAndRestore's (the state followed is restored last) and
            # before every other callback's on_train_begin (each starts from the resumed state).
            # A stop after a notice ends the epoch's loop first, before any other callback's
            # epoch-end or validation hooks (they would act on a cut epoch: BackupAndRestore
            # would save it as complete, a learning-rate callback step on it).
            ordered = backups.with_restorer(callbacks, _RestoreFirst(self))
            arguments["callbacks"] = [_StopFirst(self), *ordered]
        run, dataset = self._position(
            arguments.get("x"), arguments.get("initial_epoch", 0), beside=beside
        )
        _say_if_finished(run, arguments.get("epochs", 1), self.resumed_from)
        if given is not None and (isinstance(given, bool) or not isinstance(given, numbers.Real)):
            raise TypeError(
                f"steps_per_epoch must be a number of steps, but received {given!r} of type "
                f"{type(given).__name__}. Leave steps_per_epoch out: PreemptionCheckpoint "
                f"hands fit the dataset's epoch of {run.steps_per_epoch} steps."
            )
        if given is not None and given != run.steps_per_epoch:
            raise ValueError(
                f"steps_per_epoch={given!r} differs from the dataset's epoch of "
                f"{run.steps_per_epoch} steps; PreemptionCheckpoint resumes whole "
                "epochs of the builder dataset. Leave steps_per_epoch out."
            )
        if run.done and not resume_position.install(applied_by=_CALLER):
            raise ResumeMismatchError(
                f"the checkpoint {self.resumed_from} is at step {run.done} of epoch "
                f"{run.epoch + 1}, but TFDP_NO_KERAS_PATCHES=1 keeps tfdp-utils from starting "
                "Keras' epoch there. Unset TFDP_NO_KERAS_PATCHES to resume mid-epoch."
            )
        if run.done:
            from tfdp_utils import compat

            compat.apply_for_resume()  # the first step may be a partial one, cut unevenly
        arguments["x"] = dataset
        arguments["steps_per_epoch"] = run.steps_per_epoch
        arguments["initial_epoch"] = run.epoch
        self._run = run
        # One process without periodic saves or accumulation needs nothing per step: a notice
        # sets Keras' stop_training (as EarlyStopping does), the epoch's loop ends after the
        # step that runs, and the position is the last step begun (a batch-begin hook: Python
        # only, no host sync). Otherwise a batch-end hook acts at a step boundary (on Keras 3
        # it costs a host sync per step); under accumulation it waits for the update, so that
        # no gradients are pending in the accumulators when the state is saved.
        run.accumulation = accumulation.accumulation_steps(model)
        run.per_step = run.num_workers > 1 or self.every_steps is not None or run.accumulation > 1
        run.steps_per_execution = _tf.steps_per_execution(model)
        _check_executions_fit_epochs(run.steps_per_execution, run.steps_per_epoch)
        if run.per_step:
            self.on_train_batch_end = self._on_train_batch_end
        else:
            self.__dict__.pop("on_train_batch_end", None)
        _say_save_granularity(self.every_steps, run.steps_per_execution, run.accumulation)
        return self._fit_call(run.done, model if not run.per_step else None)

    def _position(
        self,
        x: Any,
        initial_epoch: Any,
        *,
        beside: list[Any] | None = None,
        receiver: str = "fit",
    ) -> tuple[_Run, Any]:
        """The run's position (the latest checkpoint's, a newer ``BackupAndRestore`` backup's,
        or the start) and its dataset (``receiver``, the call that took ``x``, is named when
        it is not a builder dataset)."""
        self.notice = signals_.Notice()  # a notice ends one run: the next starts afresh
        self.saved_path = None
        resumable = self._resumable(x, receiver)
        directory = store.check_directory(self.directory)
        if position_of(resumable.strategy).is_chief:
            store.clear_temporary(directory)  # the others' probes may be in use: chief only
        latest = store.latest(directory, _check_variables)
        facts = resumable.facts()
        if latest is not None:
            _check_facts(latest, facts)
            _check_flavour(latest)
            epoch, step = int(latest.state["epoch"]), int(latest.state["step_in_epoch"])
            seed = _checked_seed(latest, resumable.recipe.seed)
        else:
            epoch, step = _initial_epoch(initial_epoch), 0
            seed = resumable.recipe.seed
            if seed is None and resumable.shuffles:
                seed = random.randrange(2**31)  # kept in every checkpoint of this run
        self.resumed_from = latest.path if latest is not None else None
        backup = backups.newest(beside or [], resumable.steps_per_epoch)
        spe = resumable.steps_per_epoch
        if backup is not None and backup.global_step(spe) > epoch * spe + step:
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
            epoch, step, latest = backup.epoch, backup.step, None
            self.resumed_from = backup.path
        elif backup is not None and latest is not None:
            logger.warning(
                "tfdp_utils: PreemptionCheckpoint resumes from %s (epoch %d, step %d), not from "
                "BackupAndRestore's older backup %s (epoch %d, step %d): the checkpoint's "
                "weights, optimizer state and position are restored after the backup's.",
                latest.path,
                epoch + 1,
                step,
                backup.path,
                backup.epoch + 1,
                backup.step,
            )
        run = _Run(
            directory=directory,
            facts=facts,
            seed=seed,
            steps_per_epoch=resumable.steps_per_epoch,
            epoch=epoch,
            done=step,
            restore=latest,
        )
        run.strategy = resumable.strategy
        position = position_of(resumable.strategy)
        run.worker, run.num_workers = position.index, position.num_workers
        if latest is not None:
            logger.warning(  # a resume changes what the run does: said at the default level
                "tfdp_utils: PreemptionCheckpoint resumes from %s: epoch %d, step %d of %d.",
                latest.path,
                epoch + 1,
                step,
                resumable.steps_per_epoch,
            )
        return run, resumable.at(epoch, step, seed)

    def loop(
        self,
        model: Any,
        dataset: Any,
        *,
        epochs: int,
        optimizer: Any = None,
        initial_epoch: int = 0,
    ) -> CustomLoop:
        """The same for a custom training loop (``tdu.make_distributed_train_step``).

        Use it as a context manager and iterate over it: it yields ``(epoch, step, batch)``
        from the latest checkpoint's position on (or from the start), ``step`` counted within
        the epoch. When the next batch is asked for, the step before is done: a notice then
        saves and ends the loop (the process exits with status 75; with ``exit=False`` the
        ``with`` block ends), and periodic saves happen there.

        Args:
            model: the model the loop trains (its weights are saved).
            dataset: a dataset from ``tdu.build_distributed_dataset()``.
            epochs: the epochs of the whole job.
            optimizer: the optimizer the step applies. Defaults to ``model.optimizer``.
            initial_epoch: where a job without a checkpoint starts. Defaults to `0`.

        Examples:
            >>> with checkpoints.loop(model, dist, epochs=3, optimizer=opt) as batches:
            ...     for epoch, step, batch in batches:  # doctest: +SKIP
            ...         train_step(batch)
        """
        epochs = _validate.positive_int(epochs, "epochs", hint="Pass e.g. epochs=3.")
        # Looked up on the class: tf_keras raises from the property on a model not built yet.
        if not hasattr(type(model), "trainable_variables") or not callable(model):
            raise TypeError(
                f"model must be a Keras model, but received {model!r:.80} of type "
                f"{type(model).__name__}. Pass the model the loop trains (its weights are saved)."
            )
        optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError(
                "PreemptionCheckpoint.loop needs the optimizer the step applies (its state is "
                "saved): pass optimizer=..., or compile the model with it."
            )
        if not hasattr(optimizer, "apply_gradients") or not hasattr(optimizer, "iterations"):
            raise TypeError(
                f"optimizer must be a Keras optimizer object, but received {optimizer!r:.80} of "
                f"type {type(optimizer).__name__}. Pass the optimizer object the step applies "
                "(its state is saved), e.g. the one given to tdu.make_distributed_train_step, "
                "or leave optimizer out to use model.optimizer."
            )
        initial_epoch = _initial_epoch(initial_epoch)
        return CustomLoop(self, model, optimizer, dataset, epochs, initial_epoch)

    @contextlib.contextmanager
    def _fit_call(self, step: int, stop_model: Any) -> Iterator[None]:
        def stop_training() -> None:
            stop_model.stop_training = True

        handlers = signals_.SignalHandlers(
            self.signals, self.notice, stop_training if stop_model is not None else None
        )
        try:
            with resume_position.first_epoch_starts_at(step):
                yield
        finally:
            handlers.restore()

    @staticmethod
    def _resumable(x: Any, receiver: str = "fit") -> Any:
        factory = _dataset_info.resumable_of(x)
        if factory is None:
            raise TypeError(
                f"PreemptionCheckpoint resumes a dataset from tdu.build_distributed_dataset(), "
                f"but {receiver} received {type(x).__name__}. Build the training data with "
                "tdu.build_distributed_dataset(...) (not through the tf.data service): the "
                "same arrays or tf.data.Dataset go where x was, and the job then resumes at "
                "the step it stopped. For a resume at the last epoch's end instead, use "
                "keras.callbacks.BackupAndRestore."
            )
        resumable = factory()
        if resumable is None:
            raise ValueError(
                "PreemptionCheckpoint needs a dataset whose epochs it can count and align: a "
                "source of known size (files with count_examples=True, arrays, a sized "
                "tf.data.Dataset) of dense elements, read per worker (not through tf.data's "
                "FILE/HINT autoshard of a dataset). This dataset's epochs are of unknown size "
                "or hold sparse or ragged elements."
            )
        return resumable

    # -- Keras callbacks --------------------------------------------------------------------

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        run = self._run
        if run is not None and run.training:
            return  # restored already, by this fit's _RestoreFirst
        if run is None:
            off = " (TFDP_NO_KERAS_PATCHES=1 keeps it off)" if not fit_binding.installed() else ""
            raise RuntimeError(
                "PreemptionCheckpoint takes part in the fit call it is passed to, through "
                f"tfdp-utils' wrapper of Model.fit{off}; this fit call did not go through it. "
                "Pass the callback in model.fit(callbacks=[...]) (not in a CallbackList made "
                "by hand), and create it before model.fit is looked up."
            )
        self._begin(run, self.model, self.model.optimizer)
        if _tf.IS_KERAS3:
            # A BackupAndRestore before this callback set Keras' first epoch; the fit's own
            # initial_epoch (this run's position, handed to fit) is the one to follow.
            self.model._initial_epoch = None
        run.training = True

    def _begin(self, run: _Run, model: Any, optimizer: Any) -> None:
        """Read the checkpoint back; start the grace monitor and the workers' channel."""
        run.model, run.optimizer = model, optimizer
        if self.every_steps:
            run.periodic_mark = run.global_step // self.every_steps
        run.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        if run.restore is not None:
            _check_model(run.restore, model, optimizer)
            run.checkpoint.read(run.restore.variables).expect_partial()
        run.monitor = _GraceMonitor(self.notice, self.grace_seconds, lambda: run.phase)
        if run.num_workers > 1:
            run.channel = agreement.CoordinationChannel(
                coordination.CoordinationStore(),
                f"tfdp/preemption/{run.serial}",
                worker=run.worker,
                num_workers=run.num_workers,
                ack_timeout=self.grace_seconds,
                exists_error=tf.errors.AlreadyExistsError,
            )
        elif self.notice.received:
            self._stop(run, save=False)

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        run = self._run
        if run is not None:
            if run.begun is None and run.channel is None and self.notice.received:
                # A notice during the other callbacks' on_train_begin (after the restore):
                # nothing trained in this fit yet, nothing to save.
                self._stop(run, save=False)
            run.begun = None
            if epoch != run.epoch:
                run.epoch, run.done = epoch, 0

    def on_test_batch_begin(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        # A notice during fit's validation stops it at the next validation batch (one process;
        # several workers act on it at the next training step, where they agree). The epoch's
        # steps are all done: the position is the next epoch's start.
        run = self._run
        if run is None or not run.training or not self.notice.received or run.channel is not None:
            return
        if not run.per_step:
            self._stop_after_loop()
        elif run.accumulation <= 1 or accumulation.pending_batches(run.model) == 0:
            self._stop(run, save=True)

    def on_test_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        if self._run is not None:
            self._run.phase = "validation"
        self._stop_after_loop()  # a notice during the epoch: save before validation runs

    def on_test_end(self, logs: Mapping[str, Any] | None = None) -> None:
        if self._run is not None:
            self._run.phase = "training step"

    def on_train_batch_begin(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        # Python only (Keras calls batch-begin hooks synchronously, before the step, with no
        # logs): where a notice stops the epoch's loop, the steps begun are the steps done.
        run = self._run
        if run is not None:
            run.begun = int(batch)

    def _on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        # Installed as on_train_batch_end only where a fit needs it (see prepare_fit).
        run = self._run
        if run is not None:
            self._after_step(run, int(batch) + 1)

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        self._stop_after_loop()

    def _stop_after_loop(self) -> None:
        """One process, no batch hook: after a notice ended the epoch's loop, save the
        position the optimizer's step count gives, and stop."""
        run = self._run
        if run is None or run.per_step or not self.notice.received or not run.training:
            return
        if run.begun is not None:
            # The execution begun at step `begun` ran whole (steps_per_execution steps, at
            # most to the epoch's end): Keras checks stop_training between executions.
            done = min(run.begun + run.steps_per_execution, run.steps_per_epoch)
            run.epoch, run.done = divmod(
                run.epoch * run.steps_per_epoch + done, run.steps_per_epoch
            )
        self._stop(run, save=True)

    def _after_step(self, run: _Run, done: int) -> None:
        """After the step that made ``done`` steps of the epoch: save or stop where due.

        Saves and stops come at a step boundary where no gradients are pending in the
        accumulators (every step without accumulation): a saved state is then complete.
        """
        run.done = done
        if run.done >= run.steps_per_epoch:
            run.epoch, run.done = run.epoch + 1, 0
        whole = run.accumulation <= 1 or accumulation.pending_batches(run.model) == 0
        if run.channel is None:
            if self.notice.received and whole:
                self._stop(run, save=True)
            elif whole and self._periodic_due(run):
                self._save(run, reason="every_steps")
            return
        # Several workers: act on the agreed requests for this step; ask for a stop once.
        for request in run.channel.received()[run.acted :]:
            if request.call > run.global_step:
                break
            if request.action == "stop" and not whole:
                break  # the same on every worker: the accumulators fill in step
            run.acted += 1
            if request.action == "stop":
                self._stop(run, save=True, request=request)
        if whole and self._periodic_due(run):
            self._save(run, reason="every_steps")
        if self.notice.received and not run.asked:
            run.asked = True
            agreed = run.channel.propose(
                "stop", after_call=run.global_step, reason=str(self.notice.signal_name)
            )
            logger.warning(
                "tfdp_utils: PreemptionCheckpoint: %s on worker %d; every worker stops after "
                "step %d.",
                self.notice.signal_name,
                run.worker,
                agreed.call,
            )

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        # A notice after the last epoch's hooks (Keras ends the loop on stop_training): the
        # position is saved too, and the process still exits to be run again.
        self._stop_after_loop()
        run = self._run
        if run is not None:
            run.close()

    def _periodic_due(self, run: _Run) -> bool:
        """Whether a multiple of ``every_steps`` was passed since the last periodic save (a
        batch hook runs every ``steps_per_execution`` steps, not at each multiple)."""
        every = self.every_steps
        if not every:
            return False
        mark = run.global_step // every
        if run.periodic_mark is not None and mark <= run.periodic_mark:
            return False
        run.periodic_mark = mark
        return True

    # -- saving -----------------------------------------------------------------------------

    def _save(self, run: _Run, *, reason: str) -> None:
        model, optimizer = run.model, run.optimizer
        state = {
            "epoch": run.epoch,
            "step_in_epoch": run.done,
            "steps_per_epoch": run.steps_per_epoch,
            "seed": run.seed,
            "dataset": run.facts,
            "optimizer": type(optimizer).__name__,
            "variables": _model_variables(model),
            "keras": _tf.KERAS_VERSION if _tf.IS_KERAS3 else "tf_keras",
            "reason": reason,
            "saved_at": time.time(),
        }
        checkpoint = run.checkpoint
        if run.worker != 0:
            # Every worker takes part in writing (reading synchronised values is collective);
            # only the chief's copy is kept.
            store.scratch_save(run.directory, run.worker, lambda prefix: checkpoint.write(prefix))
            self.saved_path = os.path.join(run.directory, store.folder_name(run.global_step))
            return
        saved = store.save(
            run.directory,
            run.global_step,
            state,
            lambda prefix: checkpoint.write(prefix),
            keep=self.keep,
        )
        self.saved_path = saved.path

    def _stop(self, run: _Run, *, save: bool, request: agreement.Request | None = None) -> None:
        started = time.monotonic()
        reason = (
            f"notice {self.notice.signal_name}"
            if request is None
            else f"notice {request.reason} on worker {request.worker}"
        )
        if save:
            run.phase = "save"
            self._save(run, reason=reason)
        if run.channel is not None:
            # The others may still be writing: wait for every worker's part, bounded.
            agreement.barrier(
                coordination.CoordinationStore(),
                f"tfdp/preemption/{run.serial}/saved/{run.global_step}",
                worker=run.worker,
                num_workers=run.num_workers,
                timeout=self.grace_seconds,
            )
        run.close()
        received = self.notice.received_at or started
        logger.warning(
            "tfdp_utils: PreemptionCheckpoint: %s; %s at epoch %d, step %d of %d "
            "(%.1f s after the notice). %s",
            reason,
            f"saved {self.saved_path}" if save else "nothing trained since the last save",
            run.epoch + 1,
            run.done,
            run.steps_per_epoch,
            time.monotonic() - received,
            f"Exiting with status {signals_.PREEMPTED_EXIT_STATUS}: run the same command to resume."
            if self.exit
            else "Training ends here (exit=False).",
        )
        raise fit_binding.StopFit(
            "stopped by a preemption notice",
            exit_status=signals_.PREEMPTED_EXIT_STATUS if self.exit else None,
            batches=run.global_step,
        )


class _RestoreFirst(_Callback):  # type: ignore[misc]
    """Before the other callbacks' ``on_train_begin`` (after BackupAndRestore's): the
    checkpoint is read back there, so that every other callback starts from the resumed state."""

    def __init__(self, owner: PreemptionCheckpoint) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self._owner = owner

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self._owner.on_train_begin(logs)


class _StopFirst(_Callback):  # type: ignore[misc]
    """First in a fit's callbacks: after a notice, the stop comes before the other callbacks'
    epoch-end, validation and train-end hooks run on the cut epoch."""

    def __init__(self, owner: PreemptionCheckpoint) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self._owner = owner

    def on_test_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self._owner._stop_after_loop()

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        self._owner._stop_after_loop()

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        self._owner._stop_after_loop()


class CustomLoop:
    """A custom training loop's batches, positioned and saved by a ``PreemptionCheckpoint``.

    Made by :meth:`PreemptionCheckpoint.loop`; see there.

    Attributes:
        epoch: the epoch of the last batch yielded (0-based).
        step: its step within the epoch (0-based).
    """

    def __init__(
        self,
        owner: PreemptionCheckpoint,
        model: Any,
        optimizer: Any,
        dataset: Any,
        epochs: int,
        initial_epoch: int,
    ) -> None:
        self._owner, self._model, self._optimizer = owner, model, optimizer
        self._dataset, self._epochs, self._initial = dataset, epochs, initial_epoch
        self._run: _Run | None = None
        self._stream: Any = None
        self._handlers: signals_.SignalHandlers | None = None
        self.epoch, self.step = 0, -1

    def __enter__(self) -> CustomLoop:
        owner = self._owner
        run, self._stream = owner._position(self._dataset, self._initial, receiver="loop()")
        self._handlers = signals_.SignalHandlers(owner.signals, owner.notice)
        try:
            owner._begin(run, self._model, self._optimizer)
        except BaseException:
            self._handlers.restore()
            raise
        self._run = run
        return self

    def __iter__(self) -> Iterator[tuple[int, int, Any]]:
        run, owner = self._run, self._owner
        if run is None:
            raise RuntimeError("iterate over the loop inside its with block")
        if run.channel is None and owner.notice.received:
            owner._stop(run, save=False)
        iterator = iter(self._stream)
        started = False
        while True:
            if started:
                owner._after_step(run, run.done + 1)
            if run.epoch >= self._epochs:
                return
            started = True
            self.epoch, self.step = run.epoch, run.done
            yield run.epoch, run.done, next(iterator)

    def __exit__(self, error_type: Any, error: Any, traceback: Any) -> bool:
        if self._handlers is not None:
            self._handlers.restore()
        if self._run is not None:
            self._run.close()
        if isinstance(error, fit_binding.StopFit):
            fit_binding.end_stopped(error)  # exits, unless exit=False
            return True  # the with block ends
        return False


class _Run:
    """The position and the objects of one prepared ``fit`` call."""

    def __init__(
        self,
        *,
        directory: str,
        facts: dict[str, Any],
        seed: int | None,
        steps_per_epoch: int,
        epoch: int,
        done: int,
        restore: store.Saved | None,
    ) -> None:
        self.directory = directory
        self.facts = facts
        self.seed = seed
        self.steps_per_epoch = steps_per_epoch
        self.epoch = epoch
        self.done = done
        self.restore = restore
        self.checkpoint: Any = None
        self.model: Any = None
        self.optimizer: Any = None
        self.strategy: Any = None
        self.per_step = True  # whether a batch hook acts at each step boundary
        self.training = False  # between this fit's on_train_begin and on_train_end
        self.monitor: _GraceMonitor | None = None
        self.serial = next(_fits)
        self.worker, self.num_workers = 0, 1
        self.channel: agreement.CoordinationChannel | None = None
        self.acted = 0  # agreed requests acted on
        self.asked = False  # whether this worker asked for a stop
        self.accumulation = 1  # batches per optimizer update
        self.steps_per_execution = 1
        self.begun: int | None = None  # the step index of the last execution begun
        self.periodic_mark: int | None = None  # global_step // every_steps at the last save
        self.phase = "training step"  # what runs now: "training step", "validation", "save"

    def close(self) -> None:
        """Stop the grace monitor and the watcher thread."""
        self.training = False
        if self.monitor is not None:
            self.monitor.stop()
        if self.channel is not None:
            self.channel.close()

    @property
    def global_step(self) -> int:
        """Steps trained since the first epoch of the job began."""
        return self.epoch * self.steps_per_epoch + self.done


class _GraceMonitor:
    """Logs a WARNING when a save is still running ``grace`` seconds after the notice."""

    def __init__(
        self, notice: signals_.Notice, grace: float, phase: Any = lambda: "training step"
    ) -> None:
        self._notice, self._grace, self._phase = notice, grace, phase
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tfdp-preemption", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stopped.wait(0.25):
            received = self._notice.received_at
            if received is not None and time.monotonic() - received > self._grace:
                phase = self._phase()
                logger.warning(
                    "tfdp_utils: PreemptionCheckpoint: %s came %.0f s ago and the %s running "
                    "then has not finished; the scheduler's SIGKILL will cut it short, and the "
                    "job will resume from the previous checkpoint. Give the job a longer grace "
                    "period (terminationGracePeriodSeconds, SLURM --signal=...@seconds)%s.",
                    self._notice.signal_name,
                    self._grace,
                    phase,
                    " or validate less at a time (validation_steps, validation_freq)"
                    if phase == "validation"
                    else "",
                )
                return

    def stop(self) -> None:
        self._stopped.set()


def _check_variables(prefix: str) -> None:
    """Read every saved tensor back: the index alone says nothing of the data files (a
    truncated or overwritten data file fails only here, by its size or its checksum)."""
    reader = tf.train.load_checkpoint(prefix)
    for name in reader.get_variable_to_shape_map():
        reader.get_tensor(name)


_FACT_WORDS = {  # the causes first: the steps per epoch follow from them
    "global_batch_size": "global batch size",
    "num_replicas_in_sync": "replicas",
    "num_workers": "workers",
    "examples_per_epoch": "examples per epoch",
    "source_kind": "kind of source",
    "policy": "sharding policy",
    "files": "files (per worker)",
    "shuffle_buffer_size": "shuffle buffer size",
    "drop_remainder": "drop_remainder",
    "steps_per_epoch": "steps per epoch",
}


def _check_facts(saved: store.Saved, facts: Mapping[str, Any]) -> None:
    before = saved.state.get("dataset", {})
    for key, words in _FACT_WORDS.items():
        if key in before and before[key] != facts.get(key):
            raise ResumeMismatchError(
                f"the checkpoint {saved.path} was saved with {words} {before[key]!r}, but this "
                f"run has {facts.get(key)!r}: resuming would not continue the same epochs. "
                "Resume with the same settings, or start afresh with another directory= "
                "(or delete the old checkpoints)."
            )


def _check_model(saved: store.Saved, model: Any, optimizer: Any) -> None:
    before = saved.state.get("optimizer")
    now = type(optimizer).__name__
    if before is not None and before != now:
        raise ResumeMismatchError(
            f"the checkpoint {saved.path} holds the state of a {before} optimizer, but this "
            f"run's optimizer is {now}. Train with {before} to resume, or start afresh "
            "with another directory=."
        )
    shapes = saved.state.get("variables")
    if shapes is None:
        return
    current = _model_variables(model)
    if [shape for _, shape in shapes] == [shape for _, shape in current]:
        return
    pairs = zip(shapes, current, strict=False)
    differ = next(((a, b) for a, b in pairs if a[1] != b[1]), None)
    detail = (
        f"{differ[0][0]} has shape {differ[0][1]} there, {differ[1][0]} has {differ[1][1]} here"
        if differ is not None
        else f"{len(shapes)} weights there, {len(current)} here"
    )
    raise ResumeMismatchError(
        f"the checkpoint {saved.path} was saved from a different model: {detail}. Resume "
        "with the same model, or start afresh with another directory=."
    )


def _check_flavour(saved: store.Saved) -> None:
    """A checkpoint of the other Keras is refused: its variables carry other names, so a
    restore would match nothing and train from fresh weights without a word."""
    before = str(saved.state.get("keras", ""))
    if not before:
        return
    saved_flavour = "tf_keras" if before == "tf_keras" else "keras3"
    if saved_flavour == _tf.KERAS_FLAVOUR:
        return
    words = {"tf_keras": "tf_keras (TF_USE_LEGACY_KERAS=1)", "keras3": f"Keras 3 ({before})"}
    fix = (
        "tf_keras: set TF_USE_LEGACY_KERAS=1"
        if saved_flavour == "tf_keras"
        else "Keras 3: unset TF_USE_LEGACY_KERAS"
    )
    now = (
        "tf_keras (TF_USE_LEGACY_KERAS=1)"
        if not _tf.IS_KERAS3
        else f"Keras 3 ({_tf.KERAS_VERSION})"
    )
    raise ResumeMismatchError(
        f"the checkpoint {saved.path} was saved under {words[saved_flavour]}, but this run "
        f"uses {now}: the two Kerases name their variables differently, so nothing would be "
        f"restored. Resume under {fix}, "
        "or start afresh with another directory=."
    )


def _checked_seed(saved: store.Saved, given: int | None) -> Any:
    """The shuffle seed to resume with: the checkpoint's, which a seed= given differently
    must not silently replace (the epoch's order would change mid-epoch)."""
    before = saved.state.get("seed")
    if given is not None and before is not None and given != before:
        raise ResumeMismatchError(
            f"the checkpoint {saved.path} was saved with the shuffle seed {before!r}, but "
            f"this run's dataset has seed={given!r}: the interrupted epoch would continue in "
            f"another order, training some examples twice and others never. Resume with "
            f"seed={before!r}, or start afresh with another directory=."
        )
    return before


def _say_if_finished(run: _Run, epochs: Any, resumed_from: str | None) -> None:
    """A job whose checkpoint is at or past the fit's last epoch trains nothing: say so."""
    if resumed_from is None or isinstance(epochs, bool) or not isinstance(epochs, int):
        return
    if run.epoch < epochs:
        return
    logger.warning(
        "tfdp_utils: PreemptionCheckpoint: the checkpoint %s is at the end of epoch %d, and "
        "this fit runs to epoch %d: the job has finished, so fit trains nothing (the "
        "checkpoint's weights are restored). To train more, raise epochs=; to train afresh, "
        "pass another directory= (or delete the old checkpoints).",
        resumed_from,
        run.epoch if run.done == 0 else run.epoch + 1,
        epochs,
    )


def _say_save_granularity(every_steps: int | None, per_execution: int, accumulate: int) -> None:
    """Periodic saves come at batch hooks and accumulation boundaries: say when that makes
    the steps a kill can lose more than ``every_steps``."""
    if not every_steps:
        return
    unit = math.lcm(per_execution, accumulate)
    if unit <= 1 or every_steps % unit == 0:
        return
    causes = []
    if per_execution > 1:
        causes.append(
            f"steps_per_execution={per_execution} (Keras calls the batch hooks once per execution)"
        )
    if accumulate > 1:
        causes.append(
            f"gradient accumulation over {accumulate} batches (a save waits for the update)"
        )
    logger.warning(
        "tfdp_utils: PreemptionCheckpoint(every_steps=%d) saves at the first step after each "
        "multiple of %d where %s allows: at most %d steps are lost to a kill, not %d. Use a "
        "multiple of %d to save exactly every N steps.",
        every_steps,
        every_steps,
        " and ".join(causes),
        every_steps + unit - 1,
        every_steps,
        unit,
    )


def _check_one_checkpoint(callbacks: Any) -> None:
    """One PreemptionCheckpoint per fit: each would position the dataset and save the job."""
    if not isinstance(callbacks, (list, tuple)):
        return
    found = [c for c in callbacks if isinstance(c, PreemptionCheckpoint)]
    if len(found) < 2:
        return
    folders = ", ".join(repr(c.directory) for c in found)
    raise ValueError(
        f"fit received {len(found)} PreemptionCheckpoint callbacks (directories {folders}); "
        "one positions the dataset at its checkpoint and saves the whole job, so a second "
        "would position it again and save a second copy. Pass one PreemptionCheckpoint "
        "(every_steps= for periodic saves besides the notice's)."
    )


def _initial_epoch(value: Any) -> int:
    """``initial_epoch`` of a job without a checkpoint, checked: an integer >= 0 (None: 0)."""
    if value is None:
        return 0
    return _validate.positive_int(
        value,
        "initial_epoch",
        minimum=0,
        hint="Pass the epoch a job without a checkpoint starts at, e.g. initial_epoch=0.",
    )


def _check_executions_fit_epochs(per_execution: int, steps_per_epoch: int) -> None:
    """Keras 3 runs whole executions: one that does not end with the epoch would take the
    next epoch's first batches from the stream of epochs (tf_keras cuts it at the epoch)."""
    if not _tf.IS_KERAS3 or per_execution <= 1 or steps_per_epoch % per_execution == 0:
        return
    divisors = [d for d in range(1, steps_per_epoch + 1) if steps_per_epoch % d == 0]
    shown = ", ".join(str(d) for d in divisors[:6]) + (", ..." if len(divisors) > 6 else "")
    raise ValueError(
        f"PreemptionCheckpoint received a model compiled with steps_per_execution="
        f"{per_execution}, which does not divide the dataset's epoch of {steps_per_epoch} "
        f"steps: Keras 3 runs every execution whole, so the epoch's last one would train "
        f"{per_execution - steps_per_epoch % per_execution} batches of the next epoch, and "
        f"no epoch would be the one a resume continues. Compile with a steps_per_execution "
        f"that divides {steps_per_epoch} ({shown}), or change the global batch size."
    )


def _say_exit_outside_fit(signal_name: str) -> None:
    logger.warning(
        "tfdp_utils: PreemptionCheckpoint: %s outside fit: nothing trained since the last "
        "checkpoint. Exiting with status %d: run the same command to resume.",
        signal_name,
        signals_.PREEMPTED_EXIT_STATUS,
    )
