"""``DivergenceGuard``: the Keras hooks over the guarded update and its pure report.

The step itself (:class:`tfdp_utils.training._guarded_update.GuardedUpdate`) keeps every
non-finite update from being applied and writes what it saw to replica-local variables; these
hooks only read them every ``check_every_n_steps`` batches and at each epoch's end, turn them
into a :class:`~tfdp_utils.training._divergence_report.Divergence` or
:class:`~tfdp_utils.training._divergence_report.Disagreement`, log it and stop ``fit``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from tfdp_utils import _tf
from tfdp_utils._public import public
from tfdp_utils._tf import keras, tf
from tfdp_utils._validate import positive_int
from tfdp_utils.callbacks._divergence_crossings import refuse_crossings
from tfdp_utils.callbacks._divergence_data import StepExamples, save_files, step_examples
from tfdp_utils.callbacks._event_writer import RunWriters
from tfdp_utils.cluster import _topology as topology
from tfdp_utils.compat._fit_binding import callback_list
from tfdp_utils.throughput._tags import GLOBAL_RUN
from tfdp_utils.training._divergence_report import (
    Disagreement,
    Divergence,
    compare_checksums,
    step_place,
    worker_of,
)
from tfdp_utils.training._guarded_update import POLICIES, GuardedUpdate, GuardReading

_Callback: Any = keras.callbacks.Callback
logger = logging.getLogger("tfdp_utils")

SKIPPED_TAG = "divergence/skipped_steps"
_SKIPPED_DESCRIPTION = (
    "Steps of this fit whose update DivergenceGuard did not apply (a non-finite loss or "
    "gradient), counted from the fit's first step; the step axis counts the fit's batches."
)
REPORT_TAG = "divergence/report"
_REPORT_DESCRIPTION = (
    "What DivergenceGuard found: the first non-finite step, or replicas that disagree."
)


@public("tfdp_utils.callbacks")
class DivergenceGuard(_Callback):  # type: ignore[misc]
    """Catches a non-finite loss or gradient inside the step, before it reaches the weights.

    Each replica checks its own loss and gradients before the optimizer's update; one small
    all-reduce makes every replica of every worker agree, and the update is applied on all
    replicas or on none, so the weights never turn NaN. The hooks read what the step saw
    every ``check_every_n_steps`` batches and at each epoch's end (no host sync per step:
    it reads every ``check_every_n_steps`` batches, and is async safe on Keras 3).

    - ``policy="stop"`` (the default): from the first non-finite step on, no update is applied;
      at the next read ``fit`` stops (``model.stop_training``, after the batch that read
      began, which applies no update either) and a WARNING names the epoch,
      batch and step, the replicas and workers, whether their loss was non-finite, and the
      variable whose gradient went non-finite first in backpropagation order.
    - ``policy="skip"``: the non-finite step's update is skipped on every replica and training
      goes on; ``summary()["skipped_steps"]`` counts them, and more than
      ``max_skipped_steps`` stops ``fit`` as "stop" does.

    Replica agreement: before the update of the first step and every
    ``check_replicas_every`` steps after, each replica takes a checksum of its own weights
    (sum and sum of squares per variable, float64); the hooks compare them across replicas
    and workers, and a difference (the classic slip: weights loaded on one worker only) is
    logged as a WARNING naming replicas, workers, variables and by how much, and stops
    ``fit``. :func:`tfdp_utils.check_replica_equivalence` is its offline twin.

    With a ``LossScaleOptimizer`` a non-finite gradient of a finite loss is the loss scale's
    own business (it skips the update and lowers the scale): only a non-finite loss counts.

    The reads run in the batch-begin hook, on the training thread: over several workers every
    worker reads, compares (a collective) and stops at the same batch. The guard has no
    batch-end hook, so it never keeps Keras 3 from dispatching those off the training thread
    (``async_safe``; Keras 3.15's TensorFlow backend itself never does).

    Args:
        policy: ``"stop"`` or ``"skip"``. Defaults to `"stop"`.
        max_skipped_steps: under ``"skip"``, the most steps that may be skipped in one
            ``fit``; one more stops it. Defaults to `10`.
        check_replicas_every: steps between weight checksums. Defaults to `1000`.
        check_every_n_steps: batches between reads of the step's flags (a stop comes at most
            this many batches after the step; no update is applied meanwhile).
            Defaults to `100`.
        log_dir: where the chief writes, into the TensorBoard run ``global`` (the run
            ``ThroughputLogger`` writes with the same ``log_dir``), the scalar
            ``divergence/skipped_steps`` (the fit's skipped steps so far, at each read where
            it changed and at the fit's end; the step axis counts the fit's batches) and
            the text ``divergence/report`` (what was found). Defaults to `None` (none).
        directory: where to save the first non-finite step of the first named replica of
            this worker: its weights before the step (kept inside the step in replica-local
            copies, one more copy of the weights per replica) and, where the examples are
            named, its batch, in ``directory/step-<n>`` (``summary()["saved_to"]``), for
            :func:`tfdp_utils.replay_step`. Defaults to `None` (nothing saved).

    Raises:
        ValueError: an unknown ``policy`` or a count below its minimum; at train begin, a
            model without an optimizer, or an optimizer another guard watches.

    Examples:
    ```python
    guard = tdu.callbacks.DivergenceGuard(policy="skip", max_skipped_steps=5)
    model.fit(dataset, epochs=3, callbacks=[guard])
    guard.summary()["skipped_steps"]
    ```
    """

    def __init__(
        self,
        policy: str = "stop",
        *,
        max_skipped_steps: int = 10,
        check_replicas_every: int = 1000,
        check_every_n_steps: int = 100,
        log_dir: str | None = None,
        directory: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__()
        if policy not in POLICIES:
            raise ValueError(
                f"policy={policy!r} is not a DivergenceGuard policy; pass 'stop' (end fit at "
                "the first non-finite step) or 'skip' (skip its update and go on)."
            )
        self.policy = policy
        self.max_skipped_steps = positive_int(max_skipped_steps, "max_skipped_steps", minimum=0)
        self.check_replicas_every = positive_int(check_replicas_every, "check_replicas_every")
        self.check_every_n_steps = positive_int(check_every_n_steps, "check_every_n_steps")
        self.divergence: Divergence | None = None
        self.disagreement: Disagreement | None = None
        self._guard: GuardedUpdate | None = None
        self._epoch_starts: dict[int, int] = {}
        self._calls = 0
        self._compared_at = -1
        self._last: GuardReading | None = None
        self._stopped = False
        self._lock = threading.RLock()
        self._fit_arguments: dict[str, Any] | None = None  # the running fit's, for its x
        self._dataset: Any = None  # a custom loop's, given to watch()
        self.log_dir = log_dir
        self._events: RunWriters | None = None
        self._logged: tuple[int, int] = (-1, -1)  # (step, skipped) written last
        self.checkpoint: str | None = None
        self.directory = None if directory is None else os.fspath(directory)
        self.saved_to: str | None = None
        self._step_examples = StepExamples()
        _tf.accept_tensor_logs(self)  # tf_keras: no copy of the logs to the host per batch

    # Keras 3 dispatches the batch-end hooks of a fit on a thread pool (no host sync per step)
    # only when its backend is thread safe and every callback's hooks are async safe. The
    # guard has none: it reads in its batch-begin hook, which Keras 3 always calls on the
    # training thread, so every worker reads, compares (a collective over several workers)
    # and stops at the same batch.
    async_safe = True

    # ------------------------------------------------------------------ hooks

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self._start(self._attach(self.model, self.model.optimizer if self.model else None))

    def _start(self, guard: GuardedUpdate) -> None:
        self._guard = guard
        guard.reset()
        self.divergence = self.disagreement = None
        self._epoch_starts, self._calls, self._compared_at = {0: 0}, 0, -1
        self._last, self._stopped = None, False
        self.checkpoint = self.saved_to = None
        self._step_examples = StepExamples()
        self._close_events()
        if self.log_dir is not None and topology.position_of(guard.strategy).is_chief:
            self._events = RunWriters(self.log_dir, owner="DivergenceGuard")
            self._events.open([GLOBAL_RUN])
            self._logged = (-1, -1)
            self._log_skipped(0, 0)

    def _log_skipped(self, step: int, skipped: int, *, last: bool = False) -> None:
        if self._events is None or (step, skipped) == self._logged:
            return
        if skipped != self._logged[1] or last:
            self._events.scalar(GLOBAL_RUN, SKIPPED_TAG, skipped, step, _SKIPPED_DESCRIPTION)
            self._events.flush()
            self._logged = (step, skipped)

    def _log_report(self, text: str, step: int) -> None:
        if self._events is not None:
            self._events.text(GLOBAL_RUN, REPORT_TAG, text, step, _REPORT_DESCRIPTION)
            self._events.flush()

    def _close_events(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None

    # ------------------------------------------------------------------ custom loops

    @contextlib.contextmanager
    def _fit_call(self, arguments: dict[str, Any]) -> Iterator[None]:
        self._fit_arguments = arguments
        try:
            yield
        finally:
            self._fit_arguments = None

    def prepare_fit(
        self, model: Any, arguments: dict[str, Any]
    ) -> contextlib.AbstractContextManager[Any]:
        """Keep the ``fit`` call's arguments while it runs: its ``x`` (after the wrappers have
        swapped in the stream it trains on) names the examples of a non-finite step."""
        return self._fit_call(arguments)

    def watch(self, model: Any, *, optimizer: Any = None, dataset: Any = None) -> None:
        """Guard a custom training loop's updates of ``model`` (no ``fit``).

        Call it before the loop's step is first called (the step must be traced with the
        guard): with :func:`tfdp_utils.make_distributed_train_step`, or any step that calls
        ``optimizer.apply_gradients`` inside ``strategy.run``. Then call :meth:`check` every
        few steps and stop when it returns True; call ``on_epoch_begin(epoch)`` at each
        epoch's start for the epoch and batch in the report.

        Args:
            model: the model the loop trains (built under its strategy's scope).
            optimizer: the optimizer the loop applies. Defaults to `None`: ``model.optimizer``.
            dataset: the distributed dataset the loop iterates from its start, one step per
                batch; for one from ``build_distributed_dataset`` over a sized source, the
                report names the examples of the non-finite step. Defaults to `None`.

        Raises:
            ValueError: no optimizer, or one another guard watches with other arguments.
        """
        self.set_model(model)
        self._dataset = dataset
        self._start(self._attach(model, optimizer or getattr(model, "optimizer", None), fit=False))

    def check(self) -> bool:
        """Read what the step saw (waits for the steps dispatched), report, and say whether to stop.

        Returns:
            True once the loop should stop: a non-finite step under "stop", more than
            ``max_skipped_steps`` skipped steps, or replicas whose weights differ.
        """
        self._check()
        return self._stopped

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        if self._guard is not None:
            self._epoch_starts[epoch] = self._guard.steps_seen()

    def on_train_batch_begin(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        # On the training thread (both Kerases): reads after the first batch and every
        # check_every_n_steps batches see the same steps on every worker.
        with self._lock:
            done, self._calls = self._calls, self._calls + 1
        if done == 1 or (done > 0 and done % self.check_every_n_steps == 0):
            self._check()

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        self._check()

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        self._check()
        if self._guard is not None:
            self._guard.release()
        with self._lock:
            if self._last is not None:
                self._log_skipped(self._last.steps, self._last.skipped, last=True)
            self._close_events()

    # ------------------------------------------------------------------ reading

    def _attach(self, model: Any, optimizer: Any, *, fit: bool = True) -> GuardedUpdate:
        if optimizer is None:
            raise ValueError(
                "DivergenceGuard needs a compiled model with an optimizer (it guards the "
                "optimizer's update); call model.compile(optimizer=...) before fit, or pass "
                "optimizer= to watch()."
            )
        refuse_crossings(model, fit=fit)
        guard = getattr(optimizer, "_tfdp_guard", None)
        if guard is not None:
            snapshot = bool(guard.before)
            if (guard.policy, guard.max_skipped_steps, guard.check_replicas_every, snapshot) != (
                self.policy,
                self.max_skipped_steps,
                self.check_replicas_every,
                self.directory is not None,
            ):
                raise ValueError(
                    "this model's optimizer is already watched by a DivergenceGuard with "
                    f"policy={guard.policy!r}, max_skipped_steps={guard.max_skipped_steps}, "
                    f"check_replicas_every={guard.check_replicas_every}, "
                    f"directory {'set' if snapshot else 'None'}; pass the same guard (or one "
                    "with the same arguments) to every fit of this model."
                )
            return guard  # type: ignore[no-any-return]
        strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
        guard = GuardedUpdate(
            optimizer,
            model.trainable_variables,
            strategy=strategy,
            policy=self.policy,
            max_skipped_steps=self.max_skipped_steps,
            check_replicas_every=self.check_replicas_every,
            snapshot=self.directory is not None,
        )
        guard.install(applied_by="DivergenceGuard()")
        if fit:
            model.make_train_function(force=True)  # trace the step again, with the guard
        return guard

    def _check(self) -> None:
        with self._lock:
            self._check_locked()

    def _check_locked(self) -> None:
        guard = self._guard
        if guard is None or self._stopped:
            return
        reading = guard.read(checksums_after=self._compared_at)
        self._last = reading
        self._log_skipped(reading.steps, reading.skipped)
        if reading.checked_at > self._compared_at:
            self._compared_at = reading.checked_at
            self._compare(guard, reading)
        if self.divergence is None and reading.first_step >= 0:
            self.divergence = self._divergence(guard, reading)
            level = logging.WARNING
            if self.policy == "skip" and not reading.halted:
                level = logging.INFO
            logger.log(level, "tfdp_utils: DivergenceGuard: %s", self.divergence.describe())
            self._log_report(self.divergence.describe(), self.divergence.step)
            if self.directory is not None:
                self.saved_to = save_files(
                    self.directory, guard, self.divergence, self._step_examples
                )
            if self.policy == "stop":
                self._save_last_good(reading.first_step)
        if reading.halted:
            first = "" if self.divergence is None else f"; the first: {self.divergence.describe()}"
            self._stop(
                f"more than max_skipped_steps={self.max_skipped_steps} steps were skipped "
                f"({reading.skipped} skipped{first})"
                if self.policy == "skip"
                else "a non-finite step (see the warning above)"
            )

    def _save_last_good(self, steps: int) -> None:
        """Under "stop", have the fit's ``PreemptionCheckpoint`` save the weights at the last
        good step (no update was applied since), where it can."""
        arguments = self._fit_arguments
        found = callback_list(None if arguments is None else arguments.get("callbacks"))
        for callback in found:
            save = getattr(callback, "save_last_good", None)
            if callable(save):
                path = save(steps, reason=f"DivergenceGuard: non-finite step {steps + 1}")
                if path:
                    self.checkpoint = path
                    logger.warning(
                        "tfdp_utils: DivergenceGuard: the weights of the last good step "
                        "(step %d of this fit) are saved to %s; running the job again resumes "
                        "there, at the non-finite step's batch.",
                        steps,
                        path,
                    )
                return

    def _stop(self, why: str) -> None:
        self._stopped = True
        self.model.stop_training = True
        logger.warning("tfdp_utils: DivergenceGuard stops training: %s.", why)

    def _local_replicas(self, guard: GuardedUpdate) -> int:
        return guard.local_replicas()

    def _divergence(self, guard: GuardedUpdate, reading: GuardReading) -> Divergence:
        epoch, batch = step_place(reading.first_step, self._epoch_starts)
        local = self._local_replicas(guard)
        first = reading.bad_replicas[0] if reading.bad_replicas else None
        index = reading.variables.get(first, -1) if first is not None else -1
        self._step_examples = step_examples(
            self._training_data(), guard, reading.first_step, reading.bad_replicas
        )
        return Divergence(
            epoch=epoch,
            batch=batch,
            step=reading.first_step + 1,
            replicas=reading.bad_replicas,
            workers=tuple(worker_of(r, local_replicas=local) for r in reading.bad_replicas),
            loss_replicas=reading.loss_replicas,
            variable=guard.names[index] if index >= 0 else None,
            policy=self.policy,
            examples=self._step_examples.examples,
            examples_unknown=self._step_examples.unknown,
        )

    def _training_data(self) -> Any:
        arguments = self._fit_arguments
        return self._dataset if arguments is None else arguments.get("x")

    def _compare(self, guard: GuardedUpdate, reading: GuardReading) -> None:
        local = self._local_replicas(guard)
        checksums = _gather_checksums(guard, reading, local_replicas=local)
        differences = compare_checksums(checksums, guard.names, local_replicas=local)
        if not differences or self.disagreement is not None:
            return
        epoch, batch = step_place(reading.checked_at, self._epoch_starts)
        replicas = tuple(sorted({d.replica for d in differences}))
        self.disagreement = Disagreement(
            epoch=epoch,
            batch=batch,
            step=reading.checked_at + 1,
            replicas=replicas,
            workers=tuple(sorted({worker_of(r, local_replicas=local) for r in replicas})),
            differences=differences,
        )
        logger.warning("tfdp_utils: DivergenceGuard: %s", self.disagreement.describe())
        self._log_report(self.disagreement.describe(), self.disagreement.step)
        self._stop("the replicas' weights disagree (see the warning above)")

    def summary(self) -> dict[str, Any]:
        """What the guard saw in the last ``fit``, as a plain dict.

        Keys: ``policy``, ``steps`` (steps seen), ``skipped_steps`` (updates not applied
        because a loss or gradient was non-finite), ``divergence`` (the first non-finite
        step, a :class:`~tfdp_utils.training._divergence_report.Divergence`, or None),
        ``disagreement`` (replicas whose weights differed, or None), ``checked_at_step`` (the
        step of the last weight comparison, 1-based; 0 when none), ``stopped`` (whether
        the guard stopped ``fit``) and ``checkpoint`` (the folder the fit's
        ``PreemptionCheckpoint`` saved the last good step to under "stop", or None) and
        ``saved_to`` (the step's folder with ``directory=``, or None).
        """
        reading = self._last
        return {
            "policy": self.policy,
            "steps": 0 if reading is None else reading.steps,
            "skipped_steps": 0 if reading is None else reading.skipped,
            "divergence": self.divergence,
            "disagreement": self.disagreement,
            "checked_at_step": self._compared_at + 1,
            "stopped": self._stopped,
            "checkpoint": self.checkpoint,
            "saved_to": self.saved_to,
        }


def _gather_checksums(
    guard: GuardedUpdate, reading: GuardReading, *, local_replicas: int
) -> list[tuple[tuple[float, float], ...]]:
    """Every replica's checksums, by global replica id (one gather over several workers)."""
    if not topology.is_multi_worker(guard.strategy):
        return list(reading.checksums)
    strategy = guard.strategy
    parts = strategy.experimental_local_results(guard.checksums)

    def value(context: Any) -> Any:
        local = parts[context.replica_id_in_sync_group % local_replicas]
        return tf.expand_dims(tf.identity(local), 0)

    gathered = strategy.gather(
        strategy.experimental_distribute_values_from_function(value), axis=0
    ).numpy()
    return [tuple((float(row[0]), float(row[1])) for row in replica) for replica in gathered]
