"""What ``DivergenceGuard`` guards beyond one batch per step, and what it refuses by name.

Keras 3's ``steps_per_execution > 1`` over several replicas and its optimizers'
``gradient_accumulation_steps`` are guarded batch by batch (the guard's check runs in every
step of an execution, and before every micro-batch is accumulated) where Keras 3 itself runs
them: under a Mirrored strategy that needs tfdp-utils' workarounds for keras#19246 and
keras#20582, so the guard refuses them when those are not applied, naming the fix. tf_keras'
``tdu.enable_gradient_accumulation`` is refused: its step hands the optimizer the mean of k
batches, so the guard would see updates, not batches.
"""

from __future__ import annotations

from typing import Any

from tfdp_utils._tf import IS_KERAS3
from tfdp_utils.training import _accumulation as accumulation


def refuse_crossings(model: Any, *, fit: bool) -> None:
    """Refuse, by name, what the guard cannot guard (see docs/wrong-numbers.md)."""
    steps = accumulation.accumulation_steps(model)
    strategy = getattr(model, "distribute_strategy", None)
    if steps > 1 and not IS_KERAS3:
        raise ValueError(
            f"DivergenceGuard cannot guard a model trained with "
            f"tdu.enable_gradient_accumulation(model, {steps}): its step sums the gradients "
            "of k batches in accumulators of its own and hands the optimizer their mean every "
            "k-th batch, so the guard would check updates, not batches (it could neither name "
            "the batch nor skip it alone). Train without accumulation while you look for the "
            "bad step (the same global batch in one step, or a smaller one)."
        )
    if steps > 1:
        _refuse_unpatched("keras#20582", strategy, f"gradient_accumulation_steps={steps}")
    replicas = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    spe = getattr(model, "steps_per_execution", 1) if IS_KERAS3 else 1
    if fit and replicas > 1 and isinstance(spe, int) and spe > 1:
        _refuse_unpatched(
            "keras#19246", strategy, f"steps_per_execution={spe} over {replicas} replicas"
        )


def _refuse_unpatched(issue: str, strategy: Any, what: str) -> None:
    """Keras 3 itself fails on ``what`` under this strategy (upstream ``issue``) unless
    tfdp-utils' workaround is applied: refuse before the first step, naming the fix (with
    it, the guard checks every batch)."""
    from tfdp_utils import compat

    if strategy is None or issue not in compat.needed_for(strategy):
        return
    if issue in compat.applied():
        return
    if not any(s.issue == issue and s.bug_present for s in compat.status()):
        return
    raise ValueError(
        f"DivergenceGuard: Keras 3's {what} fails under {type(strategy).__name__} without "
        f"tfdp-utils' workaround for {issue}, which is not applied in this process. Build the "
        "strategy with tdu.auto_strategy(), or call tdu.compat.apply_for_strategy(strategy) "
        "before fit (with TFDP_NO_KERAS_PATCHES unset): the guard then checks every batch "
        "of it."
    )
