"""The optimizer update, guarded inside the step: a non-finite loss or gradient is never applied.

:class:`GuardedUpdate` replaces ``apply_gradients`` on one optimizer object (never its class;
recorded as the ``divergence-guard`` change). Each replica adds up its loss and the sum of each
gradient and checks that one figure for inf/NaN (any inf or NaN makes it non-finite); over
several replicas one scalar all-reduce makes every replica of every worker agree. Then one
conditional with three branches, taken in the cross-replica context (as tf.distribute requires
of a branch that synchronises): the update; a weight checksum, then the update; or the rare
step, non-finite somewhere (or after the guard halted), which applies no update and alone
works out who went bad and where (per replica: the loss, the variable whose gradient went
non-finite first, the micro-batch; one all-reduce of four figures per replica). What happened
stays in replica-local variables the host reads when it likes: no host sync per step.

A step that accumulates micro-batches (``make_distributed_train_step(...,
accumulation_steps=k)``) hands each micro-batch it only accumulates to
:meth:`GuardedUpdate.check_micro_batch` (a finite check and one replica-local write, no
conditional), and says so before the ``apply_gradients`` that closes the window: the update
of a window with a non-finite micro-batch anywhere on any replica is not applied, and the
report counts micro-batches (the step's calls), naming the first non-finite one.

Every ``check_replicas_every`` steps (and at the guard's first step), before the update, each
replica also writes a checksum of its own copy of the weights (their sum and sum of squares,
in float64) to a replica-local variable, which the host compares across replicas and workers.

Under a ``LossScaleOptimizer`` a non-finite *gradient* of a finite loss is the loss scale's
business (it skips the update and lowers the scale): only a non-finite loss counts.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

from tfdp_utils._tf import IS_KERAS3, tf
from tfdp_utils.training import _mixed_precision as mixed_precision

POLICIES = ("stop", "skip")
_LOSS_METHOD = "scale_loss" if IS_KERAS3 else "minimize"  # where each Keras hands over the loss
_FRESH = [0, 0, -1]  # the counters of a guard that has seen no step
# A loop that accumulates micro-batches (make_distributed_train_step's accumulation_steps):
# micro-batches seen, those pending in the open window, the offset in it of this replica's
# first non-finite one (-1).
_FRESH_WINDOW = [0, 0, -1]


@dataclasses.dataclass(frozen=True)
class GuardReading:
    """What the guard's variables hold, read on the host.

    For a step that accumulates micro-batches, ``steps``, ``first_step`` and ``checked_at``
    count micro-batches (the step's calls) and ``skipped`` counts updates (windows).

    Attributes:
        steps: steps the guard has seen since it was last reset.
        skipped: steps whose update was not applied because a loss or gradient was non-finite.
        first_step: the 0-based guard step of the first non-finite step, -1 when none.
        bad_replicas: global ids of the replicas whose loss or gradients were non-finite then
            (in a window, those whose first non-finite micro-batch came first).
        loss_replicas: those of them whose loss was non-finite.
        variables: for each bad replica, the index of the variable whose gradient went
            non-finite first in backpropagation order (the last in the model's order), or -1.
        halted: the guard applies no more updates (policy "stop" after a non-finite step, or
            more skipped steps than allowed).
        checked_at: the guard step before whose update the last checksums were taken, -1.
        checksums: per local replica, per variable, ``(sum, sum of squares)`` (empty when
            not read: no newer than the caller's last).
    """

    steps: int
    skipped: int
    first_step: int
    bad_replicas: tuple[int, ...]
    loss_replicas: tuple[int, ...]
    variables: dict[int, int]
    halted: bool
    checked_at: int
    checksums: tuple[tuple[tuple[float, float], ...], ...]


def _replica_local(initial: Any, name: str) -> Any:
    return tf.Variable(
        initial,
        trainable=False,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        name=name,
    )


def _values(gradient: Any) -> Any:
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _sum(gradient: Any) -> Any:
    total = tf.reduce_sum(_values(gradient))
    return total if total.dtype == tf.float32 else tf.cast(total, tf.float32)


def _not_finite(value: Any) -> Any:
    return tf.logical_not(tf.reduce_all(tf.math.is_finite(_values(value))))


def weight_checksums(variables: Sequence[Any]) -> Any:
    """``(sum, sum of squares)`` of each variable, in float64: shape ``(len(variables), 2)``."""
    rows = []
    for variable in variables:
        value = tf.cast(tf.convert_to_tensor(variable), tf.float64)
        rows.append(tf.stack([tf.reduce_sum(value), tf.reduce_sum(value * value)]))
    return tf.stack(rows)


class GuardedUpdate:
    """The guard's state on one optimizer, and the ``apply_gradients`` that consults it.

    Create it under the model's strategy (its variables are replica-local), then
    :meth:`install` it. All replicas keep identical counters, since every decision comes from
    the all-reduced vector.

    Args:
        optimizer: the optimizer whose updates are guarded.
        variables: the variables it updates (``model.trainable_variables``), in order.
        strategy: the model's ``tf.distribute.Strategy``.
        policy: ``"stop"`` (no update after the first non-finite step) or ``"skip"``.
        max_skipped_steps: under ``"skip"``, more skipped steps than this halt the updates.
        check_replicas_every: steps between weight checksums (the first step included).
        snapshot: keep each replica's weights of the first non-finite step (before its
            update, which is not applied) in replica-local copies, for ``directory=``.
    """

    def __init__(
        self,
        optimizer: Any,
        variables: Sequence[Any],
        *,
        strategy: Any,
        policy: str,
        max_skipped_steps: int,
        check_replicas_every: int,
        snapshot: bool = False,
    ) -> None:
        self.optimizer, self.strategy, self.policy = optimizer, strategy, policy
        self.max_skipped_steps = max_skipped_steps
        self.check_replicas_every = check_replicas_every
        self.names = tuple(str(getattr(v, "path", None) or v.name) for v in variables)
        self.replicas = int(strategy.num_replicas_in_sync)
        self.loss_scaling = mixed_precision.is_loss_scale_optimizer(optimizer)
        self._losses: dict[int, Any] = {}  # per replica thread: the loss handed over last
        self._windows: dict[int, bool] = {}  # per replica thread: the update closes a window
        self.counts_micro_batches = False  # an accumulating step hands over its micro-batches
        count = len(self.names)
        with strategy.scope():
            # steps seen, steps skipped, the first non-finite step (-1): one read, one write.
            self.counters = _replica_local(tf.constant(_FRESH, tf.int64), "guard_counters")
            self.record = _replica_local(tf.zeros([4 * self.replicas], tf.float32), "guard_record")
            self.micro = _replica_local(tf.constant(_FRESH_WINDOW, tf.int64), "guard_micro")
            # The first micro-batch of the window of the first non-finite update (-1).
            self.first_window = _replica_local(tf.constant(-1, tf.int64), "guard_first_window")
            self.checked_at = _replica_local(tf.constant(-1, tf.int64), "guard_checked_at")
            self.checksums = _replica_local(tf.zeros([count, 2], tf.float64), "guard_checksums")
            # Halting is for a fit the guard reads: a later fit without it is never held still.
            self.active = _replica_local(tf.constant(False), "guard_active")
            # False once halted: every step then takes the rare branch, without an update.
            self.open = _replica_local(tf.constant(True), "guard_open")
            self.before = [
                _replica_local(tf.zeros(tuple(v.shape), tf.as_dtype(v.dtype)), "guard_before")
                for v in (variables if snapshot else ())
            ]

    # --- installing -------------------------------------------------------------------

    def install(self, *, applied_by: str) -> None:
        """Replace ``apply_gradients`` (and the method the loss passes through) on the optimizer."""
        from tfdp_utils.compat import _changes as compat_changes

        original_apply = self.optimizer.apply_gradients
        original_loss = getattr(self.optimizer, _LOSS_METHOD)

        def apply_gradients(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
            pairs = list(grads_and_vars)
            self._guarded_apply(pairs, lambda p: original_apply(p, *args, **kwargs))
            return self.optimizer.iterations

        def hand_over_loss(loss: Any, *args: Any, **kwargs: Any) -> Any:
            if tf.inside_function():
                self._losses[threading.get_ident()] = loss
            return original_loss(loss, *args, **kwargs)

        apply_gradients.__wrapped__ = original_apply  # type: ignore[attr-defined]
        hand_over_loss.__wrapped__ = original_loss  # type: ignore[attr-defined]
        compat_changes.guard_optimizer(
            self.optimizer,
            {"apply_gradients": apply_gradients, _LOSS_METHOD: hand_over_loss},
            applied_by=applied_by,
        )
        self.optimizer._tfdp_guard = self

    def reset(self) -> None:
        """Start counting again (a new ``fit``): no step seen, none skipped, nothing halted."""
        local_results = self.strategy.experimental_local_results
        for local in local_results(self.counters):
            local.assign(tf.constant(_FRESH, tf.int64))
        for local in local_results(self.checked_at):
            local.assign(tf.constant(-1, tf.int64))
        for local in local_results(self.first_window):
            local.assign(tf.constant(-1, tf.int64))
        for local in local_results(self.micro):
            local.assign(tf.constant(_FRESH_WINDOW, tf.int64))
        for local in local_results(self.record):
            local.assign(tf.zeros_like(local))
        self._set_active(True)

    def release(self) -> None:
        """The fit the guard reads has ended: no more halting (non-finite updates are still
        never applied, by a fit that retraces the step or reuses it)."""
        self._set_active(False)

    def _set_active(self, active: bool) -> None:
        for local in self.strategy.experimental_local_results(self.active):
            local.assign(tf.constant(active))
        for local in self.strategy.experimental_local_results(self.open):
            local.assign(tf.constant(True))

    def steps_seen(self) -> int:
        """Steps (micro-batches, for an accumulating step) the guard has seen since it was last
        reset (waits for the steps dispatched)."""
        counted = self.micro if self.counts_micro_batches else self.counters
        return int(self.strategy.experimental_local_results(counted)[0].numpy()[0])

    def local_replicas(self) -> int:
        """Replicas this worker runs."""
        return len(self.strategy.experimental_local_results(self.counters))

    # --- inside the step (replica context) ----------------------------------------------

    def _take_loss(self) -> Any:
        loss = self._losses.pop(threading.get_ident(), None)
        graph = tf.compat.v1.get_default_graph()
        return loss if loss is not None and getattr(loss, "graph", None) is graph else None

    def _watched_total(self, gradients: Sequence[Any], loss: Any) -> Any:
        """One figure that is finite only when the loss and every gradient are."""
        watched = [] if self.loss_scaling else [_sum(g) for g in gradients if g is not None]
        if loss is not None:
            watched.append(tf.cast(tf.reduce_sum(loss), tf.float32))
        return tf.add_n(watched) if len(watched) > 1 else (watched or [tf.constant(0.0)])[0]

    def check_micro_batch(self, gradients: Sequence[Any]) -> None:
        """A micro-batch the step accumulates without an update (replica context): note
        whether its loss or gradients are non-finite, and where in the open window."""
        self.counts_micro_batches = True
        finite = tf.math.is_finite(self._watched_total(gradients, self._take_loss()))
        seen, pending, first = tf.unstack(self.micro.read_value())
        first = tf.where(tf.logical_and(tf.logical_not(finite), first < 0), pending, first)
        self.micro.assign(tf.stack([seen + 1, pending + 1, first]))

    def hand_over_window(self) -> None:
        """The next ``apply_gradients`` on this replica closes a window of micro-batches."""
        self.counts_micro_batches = True
        self._windows[threading.get_ident()] = True

    def _guarded_apply(self, pairs: list[Any], apply: Any) -> None:
        """The step's few ops: one finite check of a sum of sums, then one ``tf.switch_case``.

        Every step pays for a sum per gradient, their ``add_n`` and one ``is_finite`` (an inf or
        NaN anywhere makes the sum non-finite; so would a sum past 3e38, which no trainable
        gradient reaches), a scalar all-reduce over several replicas, and one conditional with
        three branches: update, checksum then update, or the rare non-finite (or halted) step,
        which alone works out what went wrong where.
        """
        if len(pairs) != len(self.names):
            raise ValueError(
                f"DivergenceGuard watches {len(self.names)} variables of this optimizer, but "
                f"the step applies gradients to {len(pairs)}. Compile the model before fit, "
                "and let the guard see the model that fit trains."
            )
        loss = self._take_loss()
        present = [i for i, (g, _) in enumerate(pairs) if g is not None]
        gradients = [pairs[i][0] for i in present]
        finite = tf.math.is_finite(self._watched_total(gradients, loss))
        finite_everywhere = finite
        if self.replicas > 1:
            agreeing = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, tf.cast(finite, tf.float32)
            )
            finite_everywhere = agreeing > self.replicas - 0.5
        step = self.counters.read_value()[0]
        due = tf.cast(tf.equal(step % self.check_replicas_every, 0), tf.int32)
        branch = tf.where(tf.logical_and(finite_everywhere, self.open.read_value()), due, 2)
        has_loss = loss is not None
        window: tuple[Any, ...] = ()
        if self._windows.pop(threading.get_ident(), False):  # closes a window: count it
            window = (self.micro.read_value(),)
            self.micro.assign(tf.stack([window[0][0] + 1, 0, -1]))

        def cross_replica(distribution: Any, *args: Any) -> None:
            # Python values by closure (thread 0's), tensors as merge_call's per-replica args.
            self._cross_replica(distribution, args, present, pairs, apply, has_loss=has_loss)

        tf.distribute.get_replica_context().merge_call(
            cross_replica,
            args=(branch, finite, tf.constant(0.0) if loss is None else loss, gradients, *window),
        )

    def _cross_replica(
        self,
        distribution: Any,
        tensors: tuple[Any, ...],
        present: list[int],
        pairs: list[Any],
        apply: Any,
        *,
        has_loss: bool,
    ) -> None:
        branch, finite, loss, gradients, *window = tensors
        variables = [variable for _, variable in pairs]

        def update(gradients: list[Any], checksum: bool, *window: Any) -> None:
            if checksum:
                self._take_checksum(variables, window[0][0] if window else None)
            given = dict(zip(present, gradients, strict=True))
            apply([(given.get(i), v) for i, (_, v) in enumerate(pairs)])
            self.counters.assign_add(tf.constant([1, 0, 0], tf.int64))

        def rare(finite: Any, loss: Any, gradients: list[Any], *window: Any) -> None:
            given = dict(zip(present, gradients, strict=True))
            every = [given.get(i) for i in range(len(pairs))]
            self._rare_step(finite, loss if has_loss else None, every, variables, *window)

        def each(function: Any, *args: Any) -> Any:
            def run() -> Any:
                distribution.extended.call_for_each_replica(function, args=args)
                return tf.constant(True)

            return run

        tf.switch_case(
            distribution.experimental_local_results(branch)[0],
            [
                each(update, gradients, False, *window),
                each(update, gradients, True, *window),
                each(rare, finite, loss, gradients, *window),
            ],
        )

    def _take_checksum(self, variables: list[Any], micro_batch: Any = None) -> None:
        self.checksums.assign(weight_checksums(variables))
        at = self.counters.read_value()[0] if micro_batch is None else micro_batch
        self.checked_at.assign(at)

    def _rare_step(
        self, finite: Any, loss: Any, gradients: list[Any], variables: list[Any], *window: Any
    ) -> None:
        """A replica's side of a step some replica found non-finite, or of a halted guard: no
        update; record who went bad and where (the first such step), count it, maybe halt.
        ``window``: the micro-batch counts of a window this update closes (none without)."""
        step, skipped, first = tf.unstack(self.counters.read_value())
        due = tf.equal(step % self.check_replicas_every, 0)
        counts = window[0] if window else tf.constant(_FRESH_WINDOW, tf.int64)
        seen, pending, offset = tf.unstack(counts)
        at = seen if window else None
        tf.cond(due, lambda: self._checksum_now(variables, at), lambda: tf.constant(False))
        loss_bad = tf.constant(False) if loss is None else _not_finite(loss)
        sums = [tf.constant(0.0) if g is None else _sum(g) for g in gradients]
        bad_vars = tf.logical_not(tf.math.is_finite(tf.stack(sums)))
        index = tf.reduce_max(tf.where(bad_vars, tf.range(1, len(sums) + 1), 0))
        # This replica's first non-finite micro-batch in the window: an accumulated one, else
        # the one closing it.
        offset = tf.cast(tf.where(offset >= 0, offset, pending), tf.int32)
        bad, loss_bad = tf.cast(tf.logical_not(finite), tf.int32), tf.cast(loss_bad, tf.int32)
        figures = tf.cast(tf.stack([bad, loss_bad, index, offset]), tf.float32)
        any_bad, total = tf.logical_not(finite), figures
        if self.replicas > 1:  # every replica's 4 figures at its place, summed over all
            context = tf.distribute.get_replica_context()
            hot = tf.one_hot(context.replica_id_in_sync_group, self.replicas)
            total = context.all_reduce(
                tf.distribute.ReduceOp.SUM, tf.reshape(figures[:, None] * hot[None, :], [-1])
            )
            any_bad = tf.reduce_sum(total[: self.replicas]) > 0
        halted = tf.logical_not(self.open.read_value())
        first_now = tf.logical_and(any_bad, first < 0)
        if self.before:
            self._snapshot(first_now, variables)
        if window:
            start = tf.where(first_now, seen - pending, self.first_window.read_value())
            self.first_window.assign(start)
        self.record.assign(tf.where(first_now, total, self.record.read_value()))
        counted = tf.cast(tf.logical_and(any_bad, tf.logical_not(halted)), tf.int64)
        skipped, first = skipped + counted, tf.where(first_now, step, first)
        self.counters.assign(tf.stack([step + 1, skipped, first]))
        limit = first >= 0 if self.policy == "stop" else skipped > self.max_skipped_steps
        self.open.assign(tf.logical_not(tf.logical_or(halted, self._halting(limit))))

    def _halting(self, limit: Any) -> Any:
        return tf.logical_and(self.active.read_value(), limit)

    def _checksum_now(self, variables: list[Any], micro_batch: Any = None) -> Any:
        self._take_checksum(variables, micro_batch)
        return tf.constant(True)

    def _snapshot(self, now: Any, variables: list[Any]) -> None:
        def take() -> Any:
            for copy, variable in zip(self.before, variables, strict=True):
                copy.assign(tf.convert_to_tensor(variable))
            return tf.constant(True)

        tf.cond(now, take, lambda: tf.constant(False))

    def weights_before(self, local_replica: int) -> list[Any]:
        """Local replica ``local_replica``'s weights of the first non-finite step (numpy)."""
        local = self.strategy.experimental_local_results
        return [local(copy)[local_replica].numpy() for copy in self.before]

    # --- on the host --------------------------------------------------------------------

    def read(self, *, checksums_after: int = -2) -> GuardReading:
        """The guard's figures after the steps dispatched so far (waits for them).

        Args:
            checksums_after: read the checksums only when they were taken after this guard
                step (one device read fewer at most reads); the default reads them always.
        """
        local = self.strategy.experimental_local_results
        steps, skipped, first = (int(v) for v in local(self.counters)[0].numpy())
        checked_at = int(local(self.checked_at)[0].numpy())
        count = self.replicas
        record = [0.0] * (4 * count)
        if first >= 0:  # written by the same step, before the counters
            record = [float(v) for v in local(self.record)[0].numpy()]
        bad = tuple(r for r in range(count) if record[r] > 0)
        halted = first >= 0 if self.policy == "stop" else skipped > self.max_skipped_steps
        if self.counts_micro_batches:  # count micro-batches, as the step's caller does
            steps = int(local(self.micro)[0].numpy()[0])
            if bad:
                offsets = {r: int(record[3 * count + r]) for r in bad}
                earliest = min(offsets.values())
                bad = tuple(r for r in bad if offsets[r] == earliest)
                first = int(local(self.first_window)[0].numpy()) + earliest
        sums: tuple[tuple[tuple[float, float], ...], ...] = ()
        if checked_at > checksums_after:
            sums = tuple(
                tuple((float(row[0]), float(row[1])) for row in part.numpy())
                for part in local(self.checksums)
            )
        return GuardReading(
            steps=steps,
            skipped=skipped,
            first_step=first,
            bad_replicas=bad,
            loss_replicas=tuple(r for r in bad if record[count + r] > 0),
            variables={r: int(record[2 * count + r]) - 1 for r in bad},
            halted=halted,
            checked_at=checked_at,
            checksums=sums,
        )
