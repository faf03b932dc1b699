"""keras#20582: ``gradient_accumulation_steps`` fails under Mirrored/MultiWorkerMirrored strategies.

Keras 3's ``BaseOptimizer._backend_apply_gradients`` decides "update or accumulate?" with an
``ops.cond`` in the replica context, and both branches reach a synchronisation point of the
TensorFlow optimizer (``_backend_update_step`` all-reduces the gradients and updates the
variables in a ``merge_call``; ``_backend_increment_gradient_accumulators`` updates the
accumulators in a ``merge_call``). MirroredStrategy and MultiWorkerMirroredStrategy do not
allow a ``merge_call`` inside control flow, so the first ``fit`` step fails with
``RuntimeError: `merge_call` called while defining a new graph or a tf.function``.

The workaround takes the same decision in the cross-replica context, as Keras'
``LossScaleOptimizer`` does with its own ``cond``: one ``merge_call``, a ``tf.cond`` on
``(iterations + 1) % gradient_accumulation_steps == 0``, and in each branch
``call_for_each_replica`` runs Keras' own code for that branch (its accumulators hold each
replica's own sum, as upstream intends; the update divides by the steps and all-reduces).
The result is Keras' documented semantics: every k-th step applies the mean of the k
micro-batch gradients. It acts only for an optimizer with ``gradient_accumulation_steps``
called in a replica context of MirroredStrategy or MultiWorkerMirroredStrategy; every other
call runs Keras' code unchanged. Only Keras 3's TensorFlow optimizer class is patched.

Verified on Keras 3.15.1 (TensorFlow 2.21); fix PR keras#23592 is not merged.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from types import ModuleType
from typing import Any

from tfdp_utils._tf import tf
from tfdp_utils.compat._registry import (
    Patch,
    Workaround,
    is_mirrored_family,
    replace_method,
    source_shows,
)

ISSUE = "keras#20582"

# The TF optimizer methods that synchronise replicas (merge_call / all-reduce).
SYNC_METHODS = frozenset(
    {"_backend_update_step", "_backend_increment_gradient_accumulators", "_apply_weight_decay"}
)


def tf_optimizer_class(trainer: ModuleType) -> Any | None:
    """Keras 3's ``TFOptimizer``, found next to its TensorFlow trainer module (never imported)."""
    package = trainer.__name__.rsplit(".", 1)[0] if hasattr(trainer, "__name__") else ""
    module = sys.modules.get(f"{package}.optimizer") if package else None
    return getattr(module, "TFOptimizer", None) or getattr(trainer, "TFOptimizer", None)


# ------------------------------------------------------------------------------------ probe


def _calls(node: ast.AST) -> set[str]:
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def sync_inside_replica_cond(source: str) -> bool:
    """True when ``source`` (a method) runs a synchronising method in a ``cond`` branch.

    Only a ``cond`` in the method's own body counts (the replica context); one inside a
    local function (e.g. passed to ``merge_call``, the cross-replica context) does not.
    """
    tree = ast.parse(textwrap.dedent(source))
    method = tree.body[0]
    local_defs = {
        node.name: node
        for node in ast.walk(method)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node is not method
    }
    syncing = {name for name, node in local_defs.items() if _calls(node) & SYNC_METHODS}
    nested = {id(sub) for node in local_defs.values() for sub in ast.walk(node)}
    for node in ast.walk(method):
        if id(node) in nested or not isinstance(node, ast.Call):
            continue
        if getattr(node.func, "attr", getattr(node.func, "id", "")) != "cond":
            continue
        for branch in [*node.args[1:], *(keyword.value for keyword in node.keywords)]:
            if _calls(branch) & (SYNC_METHODS | syncing):
                return True
            if isinstance(branch, ast.Name) and branch.id in syncing:
                return True
    return False


def probe(trainer: ModuleType) -> bool:
    """True when Keras' optimizer takes the accumulate-or-update decision in a replica ``cond``.

    A behavioural check needs a MirroredStrategy, which a probe must not create (it would
    start TensorFlow's runtime before the user configures devices), so the probe reads
    ``_backend_apply_gradients``. Without its source the bug is assumed present.
    """
    cls = tf_optimizer_class(trainer)
    method = getattr(cls, "_backend_apply_gradients", None)
    return source_shows(method, sync_inside_replica_cond)


# ------------------------------------------------------------------------------ the fix


def affected(optimizer: Any) -> bool:
    """Whether this call of ``optimizer.apply`` would hit keras#20582."""
    if not getattr(optimizer, "gradient_accumulation_steps", None):
        return False
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return False
    return is_mirrored_family(tf.distribute.get_strategy())


def _accumulate_or_update(optimizer: Any, grads: list[Any], variables: list[Any]) -> None:
    """Keras' two branches, chosen by a ``tf.cond`` in the cross-replica context."""
    steps = optimizer.gradient_accumulation_steps
    accumulators = [
        optimizer._accumulated_gradients[optimizer._get_variable_index(v)] for v in variables
    ]

    def update(grads: list[Any]) -> None:
        # As Keras' _update_step_fn: the mean of the k micro-batch gradients of this replica.
        grads = [(g + a) / steps for g, a in zip(grads, accumulators, strict=True)]
        grads = optimizer._clip_gradients(grads)
        optimizer._apply_weight_decay(variables)
        optimizer._backend_update_step(grads, variables, optimizer.learning_rate)
        optimizer._backend_reset_gradient_accumulators()

    def increment(grads: list[Any]) -> None:
        optimizer._backend_increment_gradient_accumulators(grads, accumulators)

    def cross_replica(distribution: Any, grads: list[Any]) -> None:
        # keras#20582: the cond sits in the cross-replica context, where merge_call-using
        # branches are allowed (as in Keras' LossScaleOptimizer).
        # The batch counter: ``_iterations`` on Keras >= 3.5 (``iterations`` then counts
        # updates), ``iterations`` itself before (Keras 3.0-3.4 have no ``_iterations``).
        batches = getattr(optimizer, "_iterations", optimizer.iterations)
        is_update_step = tf.equal((batches + 1) % steps, 0)
        tf.cond(
            is_update_step,
            lambda: distribution.extended.call_for_each_replica(update, args=(grads,)),
            lambda: distribution.extended.call_for_each_replica(increment, args=(grads,)),
        )

    tf.distribute.get_replica_context().merge_call(cross_replica, args=(list(grads),))


def install(trainer: ModuleType) -> tuple[str, list[Patch]]:
    """Replace ``TFOptimizer._backend_apply_gradients`` for affected calls only."""
    cls = tf_optimizer_class(trainer)
    if cls is None:  # nothing to patch (the probe found no such method either)
        return "fix", []
    original = cls._backend_apply_gradients

    def _backend_apply_gradients(self: Any, grads: Any, trainable_variables: Any) -> Any:
        if not affected(self) or self.use_ema:
            return original(self, grads, trainable_variables)
        _accumulate_or_update(self, list(grads), list(trainable_variables))
        return None

    patch = replace_method(cls, "_backend_apply_gradients", _backend_apply_gradients, change=ISSUE)
    return "fix", [patch]


WORKAROUND = Workaround(
    issue=ISSUE,
    verified_on=("3.15.1",),
    changes="keras TFOptimizer._backend_apply_gradients replaced (the accumulate-or-update "
    "decision moves to the cross-replica context under Mirrored strategies)",
    probe=probe,
    install=install,
)
