"""``PreemptionCheckpoint``: save on a preemption notice, exit to be run again, resume exactly.

The Keras adapter over the parts of this package: the arguments it checks (:mod:`._arguments`),
where a run starts and what is read back (:mod:`._restore`, checked by :mod:`._mismatch`), the
run's position (:mod:`._position`, held by :class:`._run.Run`), the saves and the stop after a
notice (:mod:`._saving`, agreed by :mod:`._agreement` across workers), where its hooks run among
the fit's callbacks (:mod:`._ordering`) and the custom loop (:mod:`._loop`).

The callback takes part in the ``fit`` call it is passed to before Keras sees the call (through
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
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from typing import Any

from tfdp_utils import _tf, _validate
from tfdp_utils._tf import keras
from tfdp_utils.compat import _fit_binding as fit_binding
from tfdp_utils.compat import _resume_position as resume_position
from tfdp_utils.errors import ResumeMismatchError
from tfdp_utils.preemption import _agreement as agreement
from tfdp_utils.preemption import _arguments as arguments_
from tfdp_utils.preemption import _backups as backups
from tfdp_utils.preemption import _ordering as ordering
from tfdp_utils.preemption import _position as position
from tfdp_utils.preemption import _restore as restore
from tfdp_utils.preemption import _saving as saving
from tfdp_utils.preemption import _signals as signals_
from tfdp_utils.preemption import _store as store
from tfdp_utils.preemption._loop import CustomLoop
from tfdp_utils.preemption._run import GraceMonitor, Run
from tfdp_utils.training import _accumulation as accumulation

_Callback: Any = keras.callbacks.Callback
_CALLER = "PreemptionCheckpoint"
DEFAULT_GRACE_SECONDS = 25.0


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
        self.directory = arguments_.checked_directory(directory)  # made absolute when fit starts
        self.signals = signals_.signal_numbers(signals)
        self.every_steps = arguments_.positive_int_or_none(
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
        self._run: Run | None = None
        # A notice before fit (data loading, building the model) or after it: nothing to
        # save, and the job must still be run again (status 75, not killed by the signal).
        self._outside_fit = signals_.ExitOutsideFit(self.signals, saving.say_exit_outside_fit)

    # -- before Keras sees the call (FitCallAdapter) -------------------------------------

    def prepare_fit(
        self, model: Any, arguments: dict[str, Any]
    ) -> contextlib.AbstractContextManager[Any]:
        """Position ``fit``'s data and counters at the latest checkpoint (or the start)."""
        given = arguments.get("steps_per_epoch")
        callbacks = arguments.get("callbacks")
        beside = backups.backups_in(callbacks)
        if isinstance(callbacks, (list, tuple)):
            arguments_.check_one_checkpoint(
                [c.directory for c in callbacks if isinstance(c, PreemptionCheckpoint)]
            )
            # The restore first at train begin (after BackupAndRestore's), the stop first
            # after a notice, before the other callbacks act on a cut epoch (see _ordering).
            arguments["callbacks"] = ordering.ordered(callbacks, self)
        run, dataset = self._position(
            arguments.get("x"), arguments.get("initial_epoch", 0), beside=beside
        )
        arguments_.say_if_finished(
            run.epoch, run.done, arguments.get("epochs", 1), self.resumed_from
        )
        arguments_.check_steps_per_epoch(given, run.steps_per_epoch)
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
        arguments_.check_executions_fit_epochs(
            run.steps_per_execution, run.steps_per_epoch, whole_executions=_tf.IS_KERAS3
        )
        rest_start = run.rest_start if run.rest is not None else None
        arguments_.check_executions_fit_rest(
            run.steps_per_execution, run.steps_per_epoch, rest_start, whole_executions=_tf.IS_KERAS3
        )
        if run.per_step:
            self.on_train_batch_end = self._on_train_batch_end
        else:
            self.__dict__.pop("on_train_batch_end", None)
        arguments_.say_save_granularity(self.every_steps, run.steps_per_execution, run.accumulation)
        return self._fit_call(run.done, model if not run.per_step else None)

    def _position(
        self,
        x: Any,
        initial_epoch: Any,
        *,
        beside: list[Any] | None = None,
        receiver: str = "fit",
    ) -> tuple[Run, Any]:
        """The run's position (the latest checkpoint's, a newer ``BackupAndRestore`` backup's,
        or the start) and its dataset (``receiver``, the call that took ``x``, is named when
        it is not a builder dataset)."""
        self.notice = signals_.Notice()  # a notice ends one run: the next starts afresh
        self.saved_path = None
        resumable = arguments_.resumable(x, receiver)
        directory = store.check_directory(self.directory)
        start = restore.from_checkpoint(directory, resumable, initial_epoch)
        self.resumed_from = start.resumed_from
        start = restore.agreed_start(start, beside or [], resumable)
        self.resumed_from = start.resumed_from
        run = restore.prepared_run(directory, resumable, start)
        dataset = resumable.at(
            start.epoch,
            start.step,
            start.seed,
            shape_change=start.shape_change,
            rest=start.rest,
            step_offset=start.step_offset,
        )
        return run, dataset

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
        optimizer = arguments_.loop_optimizer(model, optimizer)
        initial_epoch = arguments_.initial_epoch(initial_epoch)
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

    # -- Keras callbacks --------------------------------------------------------------------

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        run = self._run
        if run is not None and run.training:
            return  # restored already, by this fit's RestoreFirst (_ordering)
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

    def _begin(self, run: Run, model: Any, optimizer: Any) -> None:
        """Read the checkpoint back; start the grace monitor and the workers' channel."""
        run.model, run.optimizer = model, optimizer
        if self.every_steps:
            run.periodic_mark = position.periodic_mark(run.global_step, self.every_steps, None)
        restore.read_back(run, model, optimizer)
        run.start_step = run.global_step
        run.monitor = GraceMonitor(self.notice, self.grace_seconds, lambda: run.phase)
        if run.num_workers > 1:
            run.channel = saving.open_channel(run, self.grace_seconds)
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
            run.epoch, run.done = position.after_execution(
                run.epoch, run.begun, run.steps_per_execution, run.steps_per_epoch
            )
        self._stop(run, save=True)

    def _after_step(self, run: Run, done: int) -> None:
        """After the step that made ``done`` steps of the epoch: save or stop where due.

        Saves and stops come at a step boundary where no gradients are pending in the
        accumulators (every step without accumulation): a saved state is then complete.
        """
        run.epoch, run.done = position.after_step(run.epoch, done, run.steps_per_epoch)
        whole = run.accumulation <= 1 or accumulation.pending_batches(run.model) == 0
        if run.channel is None:
            if self.notice.received and whole:
                self._stop(run, save=True)
            elif whole and self._periodic_due(run):
                self._save(run, reason="every_steps")
            return
        # Several workers: act on the agreed requests for this step; ask for a stop once.
        for request in saving.requests_due(run, run.channel, whole):
            if request.action == "stop":
                self._stop(run, save=True, request=request)
        if whole and self._periodic_due(run):
            self._save(run, reason="every_steps")
        if self.notice.received and not run.asked:
            saving.ask_to_stop(run, run.channel, self.notice)

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        # A notice after the last epoch's hooks (Keras ends the loop on stop_training): the
        # position is saved too, and the process still exits to be run again.
        self._stop_after_loop()
        run = self._run
        if run is not None:
            run.close()

    def _periodic_due(self, run: Run) -> bool:
        """Whether a multiple of ``every_steps`` was passed since the last periodic save (a
        batch hook runs every ``steps_per_execution`` steps, not at each multiple)."""
        every = self.every_steps
        if not every:
            return False
        mark = position.periodic_mark(run.global_step, every, run.periodic_mark)
        if mark is None:
            return False
        run.periodic_mark = mark
        return True

    # -- saving -----------------------------------------------------------------------------

    def _save(self, run: Run, *, reason: str) -> None:
        if run.held:
            return  # the last good step is saved: a later position would skip its batches
        started = time.perf_counter()
        self.saved_path = saving.save(run, keep=self.keep, reason=reason)
        if reason == "every_steps":
            run.periodic_saves.append((started, time.perf_counter()))

    def fit_save_spans(self) -> tuple[tuple[float, float], ...]:
        """When the current (or last) ``fit``'s periodic saves ran: ``(start, end)`` each, in
        ``time.perf_counter()`` seconds.

        The ``ThroughputLogger`` of the same ``fit`` call reads them for the job's goodput
        (``checkpoint_saves``: the parts while its step clock ran); the save at a notice is not
        among them (it ends the fit).
        """
        return () if self._run is None else tuple(self._run.periodic_saves)

    def save_last_good(self, steps: int, *, reason: str) -> str | None:
        """Save the current weights at the position ``steps`` steps after this fit began,
        as the newest checkpoint, and save nothing more in this fit.

        For ``DivergenceGuard`` under ``policy="stop"``: no update was applied after the
        first non-finite step, so the weights are those of the last good step, and a resume
        starts at the non-finite step's batch. Checkpoints this fit saved at later positions
        (periodic saves before the guard read its flags) are deleted: they hold the same
        weights under a position that would skip batches.

        Args:
            steps: the steps of this fit whose updates were applied.
            reason: why, as the checkpoint records it.

        Over several workers every worker must call it at the same batch with the same
        ``steps`` (``DivergenceGuard`` does: its flags are agreed inside the step and read on
        the training thread at the same batch on every worker); every worker takes part in the
        save, as in any other, and the chief deletes the later checkpoints.

        Returns:
            The checkpoint's folder (on a worker other than the chief: the folder the chief's
            copy goes to), or None where nothing was saved: no fit is running.
        """
        run = self._run
        if run is None or not run.training:
            return None
        target = run.start_step + steps
        run.epoch, run.done = divmod(target, run.steps_per_epoch)
        if run.worker == 0:
            for step, path in store.saved(run.directory):
                if step > target:
                    shutil.rmtree(path, ignore_errors=True)
        run.phase = "save"
        self._save(run, reason=reason)
        run.held, run.phase = True, "training step"
        return self.saved_path

    def _stop(self, run: Run, *, save: bool, request: agreement.Request | None = None) -> None:
        started = time.monotonic()
        reason = saving.stop_reason(self.notice, request)
        if save:
            run.phase = "save"
            self._save(run, reason=reason)
        saving.end(
            run,
            self.notice,
            reason=reason,
            saved=self.saved_path if save else None,
            exit=self.exit,
            grace_seconds=self.grace_seconds,
            started=started,
        )


PreemptionCheckpoint.__module__ = "tfdp_utils.callbacks"  # public home (tfdp_utils._public)
