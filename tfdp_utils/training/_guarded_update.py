"""The optimizer update, guarded inside the step: a non-finite loss or gradient is never applied.

:class:`GuardedUpdate` replaces ``apply_gradients`` on one optimizer object (never its class;
recorded as the ``divergence-guard`` change). Each replica checks its own loss and gradients
for inf/NaN before the update; one all-reduce of a small vector (3 figures per replica: bad,
loss bad, the variable) makes every replica of every worker agree, so the update is applied
on all replicas or on none (the Keras update runs in a ``tf.cond`` taken in the cross-replica
context, as tf.distribute requires of a branch that synchronises). What happened stays in
replica-local variables the host reads when it likes: no host sync per step.

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


@dataclasses.dataclass(frozen=True)
class GuardReading:
    """What the guard's variables hold, read on the host.

    Attributes:
        steps: steps the guard has seen since it was last reset.
        skipped: steps whose update was not applied because a loss or gradient was non-finite.
        first_step: the 0-based guard step of the first non-finite step, -1 when none.
        bad_replicas: global ids of the replicas whose loss or gradients were non-finite then.
        loss_replicas: those of them whose loss was non-finite.
        variables: for each bad replica, the index of the variable whose gradient went
            non-finite first in backpropagation order (the last in the model's order), or -1.
        halted: the guard applies no more updates (policy "stop" after a non-finite step, or
            more skipped steps than allowed).
        checked_at: the guard step before whose update the last checksums were taken, -1.
        checksums: per local replica, per variable, ``(sum, sum of squares)``.
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
    ) -> None:
        self.optimizer, self.strategy, self.policy = optimizer, strategy, policy
        self.max_skipped_steps = max_skipped_steps
        self.check_replicas_every = check_replicas_every
        self.names = tuple(str(getattr(v, "path", None) or v.name) for v in variables)
        self.replicas = int(strategy.num_replicas_in_sync)
        self.loss_scaling = mixed_precision.is_loss_scale_optimizer(optimizer)
        self._losses: dict[int, Any] = {}  # per replica thread: the loss handed over last
        count = len(self.names)
        with strategy.scope():
            # steps seen, steps skipped, the first non-finite step (-1): one read, one write.
            self.counters = _replica_local(tf.constant(_FRESH, tf.int64), "guard_counters")
            self.record = _replica_local(tf.zeros([3 * self.replicas], tf.float32), "guard_record")
            self.checked_at = _replica_local(tf.constant(-1, tf.int64), "guard_checked_at")
            self.checksums = _replica_local(tf.zeros([count, 2], tf.float64), "guard_checksums")
            # Halting is for a fit the guard reads: a later fit without it is never held still.
            self.active = _replica_local(tf.constant(False), "guard_active")

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

    def steps_seen(self) -> int:
        """Steps the guard has seen since it was last reset (waits for the steps dispatched)."""
        return int(self.strategy.experimental_local_results(self.counters)[0].numpy()[0])

    def local_replicas(self) -> int:
        """Replicas this worker runs."""
        return len(self.strategy.experimental_local_results(self.counters))

    # --- inside the step (replica context) ----------------------------------------------

    def _loss_flag(self) -> Any:
        loss = self._losses.pop(threading.get_ident(), None)
        graph = tf.compat.v1.get_default_graph()
        if loss is None or getattr(loss, "graph", None) is not graph:
            return tf.constant(False)
        return _not_finite(loss)

    def _guarded_apply(self, pairs: list[Any], apply: Any) -> None:
        if len(pairs) != len(self.names):
            raise ValueError(
                f"DivergenceGuard watches {len(self.names)} variables of this optimizer, but "
                f"the step applies gradients to {len(pairs)}. Compile the model before fit, "
                "and let the guard see the model that fit trains."
            )
        step, skipped, first = tf.unstack(self.counters.read_value())
        self._checksum(step, [variable for _, variable in pairs])
        loss_bad = self._loss_flag()
        # One sum per gradient: an inf or NaN anywhere makes it non-finite (so would a sum past
        # 3e38, which no trainable gradient reaches); one is_finite over the sums.
        sums = [tf.constant(0.0) if g is None else _sum(g) for g, _ in pairs]
        bad_vars = tf.logical_not(tf.math.is_finite(tf.stack(sums)))
        index = tf.reduce_max(tf.where(bad_vars, tf.range(1, len(pairs) + 1), 0))
        bad = loss_bad if self.loss_scaling else tf.logical_or(loss_bad, index > 0)
        figures = tf.cast(
            tf.stack([tf.cast(bad, tf.int32), tf.cast(loss_bad, tf.int32), index]), tf.float32
        )
        any_bad, total = bad, figures
        if self.replicas > 1:  # every replica's 3 figures at its place, summed over all
            context = tf.distribute.get_replica_context()
            hot = tf.one_hot(context.replica_id_in_sync_group, self.replicas)
            total = context.all_reduce(
                tf.distribute.ReduceOp.SUM, tf.reshape(figures[:, None] * hot[None, :], [-1])
            )
            any_bad = tf.reduce_sum(total[: self.replicas]) > 0
        stop = self.policy == "stop"
        limit = first >= 0 if stop else skipped > self.max_skipped_steps
        halted = tf.logical_and(self.active.read_value(), limit)
        first_now = tf.logical_and(any_bad, first < 0)
        self.record.assign(tf.where(first_now, total, self.record.read_value()))
        counted = tf.cast(tf.logical_and(any_bad, tf.logical_not(halted)), tf.int64)
        self.counters.assign(
            tf.stack([step + 1, skipped + counted, tf.where(first_now, step, first)])
        )
        self._apply_where(tf.logical_not(tf.logical_or(any_bad, halted)), pairs, apply)

    def _checksum(self, step: Any, variables: list[Any]) -> None:
        def take() -> Any:
            self.checksums.assign(weight_checksums(variables))
            self.checked_at.assign(step)
            return tf.constant(True)

        # Replica-local writes only: a tf.cond in the replica context needs no merge_call.
        tf.cond(step % self.check_replicas_every == 0, take, lambda: tf.constant(False))

    def _apply_where(self, run: Any, pairs: list[Any], apply: Any) -> None:
        """Apply the Keras update on every replica when ``run`` (equal on all) holds."""
        present = [i for i, (g, _) in enumerate(pairs) if g is not None]
        gradients = [pairs[i][0] for i in present]

        def cross_replica(distribution: Any, run: Any, gradients: list[Any]) -> None:
            decision = distribution.experimental_local_results(run)[0]

            def branch(gradients: list[Any]) -> None:
                given = dict(zip(present, gradients, strict=True))
                apply([(given.get(i), v) for i, (_, v) in enumerate(pairs)])

            tf.cond(
                decision,
                lambda: distribution.extended.call_for_each_replica(branch, args=(gradients,)),
                lambda: None,
            )

        tf.distribute.get_replica_context().merge_call(cross_replica, args=(run, gradients))

    # --- on the host --------------------------------------------------------------------

    def read(self) -> GuardReading:
        """The guard's figures after the steps dispatched so far (waits for them)."""
        local = self.strategy.experimental_local_results
        record = [float(v) for v in local(self.record)[0].numpy()]
        count = self.replicas
        bad = tuple(r for r in range(count) if record[r] > 0)
        sums = tuple(
            tuple((float(row[0]), float(row[1])) for row in part.numpy())
            for part in local(self.checksums)
        )
        steps, skipped, first = (int(v) for v in local(self.counters)[0].numpy())
        halted = first >= 0 if self.policy == "stop" else skipped > self.max_skipped_steps
        return GuardReading(
            steps=steps,
            skipped=skipped,
            first_step=first,
            bad_replicas=bad,
            loss_replicas=tuple(r for r in bad if record[count + r] > 0),
            variables={r: int(record[2 * count + r]) - 1 for r in bad},
            halted=halted,
            checked_at=int(local(self.checked_at)[0].numpy()),
            checksums=sums,
        )
