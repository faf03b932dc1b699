"""What ``check_replica_equivalence`` records and how it judges: the steps of both runs, the
report, and the comparison. Pure NumPy (no TensorFlow): the rule is tested on records alone.

Two values agree when both are finite and within ``OVERFLOW_BOUND`` and
``|a - b| <= atol + rtol * min(|a|, |b|)``: the rule is symmetric, and neither run's size widens
the tolerance. A NaN, an inf or a value beyond ``OVERFLOW_BOUND`` in either run is a divergence
whatever the other run holds; the report names the first step, the tensor and the run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfdp_utils._public import public

OVERFLOW_BOUND = 2.0**64
"""Magnitude (about 1.8e19) beyond which a weight or logged value counts as overflowing: its
square exceeds float32's largest value (3.4e38), so training in float32 has left the range
where its arithmetic means anything. Such a value is a divergence, as NaN and inf are."""

REFERENCE_RUN = "on one device"
DISTRIBUTED_RUN = "under the strategy"


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """What one run logged after one step (or one execution of ``steps_per_execution``).

    Attributes:
        step: steps trained so far (1 after the first step).
        logs: the loss and metrics Keras logged (running means over the steps so far).
        weights: every model weight, by variable name, in the model's order.
    """

    step: int
    logs: Mapping[str, float]
    weights: Mapping[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class NonFinite:
    """The first NaN, inf or overflowing value (beyond ``OVERFLOW_BOUND``) one run recorded.

    Attributes:
        run: ``"on one device"`` or ``"under the strategy"``.
        step: the recorded step at which it appeared.
        name: the weight (checked first) or logged value that held it.
        value: the value: NaN, inf, -inf, or a finite number beyond ``OVERFLOW_BOUND``.
    """

    run: str
    step: int
    name: str
    value: float

    def describe(self) -> str:
        """``"under the strategy: step 3, dense/kernel = inf"``."""
        shown = f"{self.value:.3g}"
        if math.isfinite(self.value):
            shown += f" (beyond +-{OVERFLOW_BOUND:.2g})"
        return f"{self.run}: step {self.step}, {self.name} = {shown}"


@public("tfdp_utils")
@dataclasses.dataclass(frozen=True)
class EquivalenceReport:
    """How training under a strategy compared with training on one device.

    Attributes:
        strategy: the strategy's class name.
        num_replicas: replicas in sync under it (2 or more: a 1-replica strategy is refused).
        steps: global batches both runs trained on.
        recorded_steps: the steps after which both were compared.
        loss_reference: the logged loss of the one-device run at each recorded step.
        loss_distributed: the logged loss under the strategy at each recorded step.
        max_loss_difference: the largest absolute difference of the logged losses.
        log_differences: largest absolute difference per logged value (loss and metrics);
            inf where either run held a NaN or inf.
        weight_differences: largest absolute difference per weight, over all recorded steps;
            inf where either run held a NaN or inf.
        max_weight_difference: the largest of ``weight_differences``.
        largest_weight: the largest magnitude of any weight in either run at any recorded
            step (NaNs left out): the scale the relative tolerance worked at.
        first_divergent_step: the first recorded step at which a logged value or a weight
            was outside the tolerance, or NaN, inf or overflowing in either run; or None.
        divergent: names of the logged values and weights that went outside the tolerance.
        nan_step_reference: the first recorded step with a NaN, inf or overflowing value
            (beyond ``OVERFLOW_BOUND``) in the one-device run.
        nan_step_distributed: the same under the strategy.
        non_finite: for each run that had one, its first NaN, inf or overflowing value (step,
            tensor, value); empty when both runs stayed finite.
        random_in_training: two training-mode forward passes on the same input differ.
        replicas_share_random_numbers: every replica produced the same training-mode output
            from the same input although the model is random: the replicas draw the same
            random numbers.
        trajectory_compared: False when the model is random in training, so that the two
            runs cannot agree and only the random draws (and NaN, inf, overflow) were judged.
        rtol: relative tolerance used.
        atol: absolute tolerance used.
    """

    strategy: str
    num_replicas: int
    steps: int
    recorded_steps: tuple[int, ...]
    loss_reference: tuple[float, ...]
    loss_distributed: tuple[float, ...]
    max_loss_difference: float
    log_differences: Mapping[str, float]
    weight_differences: Mapping[str, float]
    max_weight_difference: float
    largest_weight: float
    first_divergent_step: int | None
    divergent: tuple[str, ...]
    nan_step_reference: int | None
    nan_step_distributed: int | None
    non_finite: tuple[NonFinite, ...]
    random_in_training: bool
    replicas_share_random_numbers: bool
    trajectory_compared: bool
    rtol: float
    atol: float

    @property
    def ok(self) -> bool:
        """True when nothing diverged, neither run held a NaN, inf or overflowing value, and
        the replicas draw their own random numbers."""
        diverged = self.trajectory_compared and self.first_divergent_step is not None
        return not (diverged or self.non_finite or self.replicas_share_random_numbers)

    def summary(self) -> str:
        """A few lines for a log or a bug report."""
        head = (
            f"{self.strategy} with {self.num_replicas} replicas vs one device, "
            f"{self.steps} steps (rtol={self.rtol:g}, atol={self.atol:g}): "
            f"{'the same' if self.ok else 'DIVERGED'}"
        )
        lines = [
            head,
            f"  max loss difference: {self.max_loss_difference:.3g}",
            f"  max weight difference: {self.max_weight_difference:.3g} "
            f"(largest |weight|: {self.largest_weight:.3g})",
        ]
        if self.first_divergent_step is not None:
            names = ", ".join(self.divergent[:5]) + (" ..." if len(self.divergent) > 5 else "")
            lines.append(f"  first divergent step: {self.first_divergent_step} ({names})")
        if self.non_finite:
            lines.append(
                "  training blew up (a NaN, inf or overflowing value is a divergence whatever "
                "the other run holds):"
            )
            lines += [f"    {found.describe()}" for found in self.non_finite]
        if self.replicas_share_random_numbers:
            lines.append(
                "  every replica draws the same random numbers (a fixed op seed in a layer?): "
                "the replicas train on correlated noise"
            )
        elif not self.trajectory_compared:
            lines.append(
                "  the model is random in training (Dropout, noise): trajectories not judged; "
                "the replicas draw their own random numbers"
            )
        return "\n".join(lines)


# ------------------------------------------------------------------------ pure comparison


def _blown(values: np.ndarray) -> np.ndarray:
    """Elementwise: NaN, inf, or beyond :data:`OVERFLOW_BOUND`."""
    with np.errstate(invalid="ignore"):
        return np.asarray(~np.isfinite(values) | (np.abs(values) > OVERFLOW_BOUND))


def agree(a: Any, b: Any, *, rtol: float, atol: float) -> np.ndarray:
    """Elementwise, whether ``a`` and ``b`` agree (the rule the report applies).

    Both must be finite and within :data:`OVERFLOW_BOUND`, and
    ``|a - b| <= atol + rtol * min(|a|, |b|)``. The rule is symmetric (which run is the
    reference does not matter) and takes the smaller magnitude, so a run whose values grew
    does not widen its own tolerance.

    Examples:
        >>> bool(agree(1.0, 1.0 + 1e-6, rtol=1e-4, atol=0.0))
        True
        >>> bool(agree(1e22, 1e22, rtol=1e-4, atol=0.0))  # overflowing: never agrees
        False
    """
    first, second = np.asarray(a, np.float64), np.asarray(b, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.abs(second - first) <= atol + rtol * np.minimum(np.abs(first), np.abs(second))
    return np.asarray(close & ~_blown(first) & ~_blown(second))


def _difference(a: np.ndarray, b: np.ndarray) -> float:
    """The largest ``|a - b|``; inf where either holds a NaN or inf (incomparable)."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(np.isfinite(a) & np.isfinite(b), np.abs(b - a), np.inf)
    return float(np.max(diff)) if diff.size else 0.0


def _first_blowup(records: Sequence[StepRecord], run: str) -> NonFinite | None:
    """The first NaN, inf or overflowing value in ``records``: weights first, then logs."""
    for record in records:
        for name, value in [*record.weights.items(), *record.logs.items()]:
            array = np.asarray(value, np.float64)
            bad = array[_blown(array)]
            if bad.size:
                nans, infs = bad[np.isnan(bad)], bad[np.isinf(bad)]
                worst = nans[0] if nans.size else infs[0] if infs.size else bad[0]
                return NonFinite(run=run, step=record.step, name=name, value=float(worst))
    return None


def _largest(records: Sequence[StepRecord]) -> float:
    sizes = [np.abs(np.asarray(w, np.float64)) for r in records for w in r.weights.values()]
    kept = [s[~np.isnan(s)] for s in sizes]
    return max((float(np.max(s)) for s in kept if s.size), default=0.0)


def compare_records(
    reference: Sequence[StepRecord],
    distributed: Sequence[StepRecord],
    *,
    rtol: float,
    atol: float,
) -> dict[str, Any]:
    """Compare two runs step by step (pure NumPy).

    Two values agree by :func:`agree`: both finite and within :data:`OVERFLOW_BOUND`, and
    ``|a - b| <= atol + rtol * min(|a|, |b|)``.

    Args:
        reference: the one-device run's records.
        distributed: the records under the strategy, at the same steps.
        rtol: relative tolerance.
        atol: absolute tolerance.

    Returns:
        The comparison fields of :class:`EquivalenceReport`, as a dict.

    Raises:
        ValueError: the two runs recorded different steps.
    """
    if [r.step for r in reference] != [r.step for r in distributed]:
        raise ValueError(
            f"the runs recorded different steps: {[r.step for r in reference]} vs "
            f"{[r.step for r in distributed]}"
        )
    log_diff: dict[str, float] = {}
    weight_diff: dict[str, float] = {}
    divergent: list[str] = []
    first: int | None = None
    for ref, dist in zip(reference, distributed, strict=True):
        pairs: list[tuple[str, Any, Any, dict[str, float]]] = [
            (k, ref.logs[k], dist.logs[k], log_diff) for k in ref.logs if k in dist.logs
        ]
        pairs += [
            (k, ref.weights[k], dist.weights[k], weight_diff)
            for k in ref.weights
            if k in dist.weights
        ]
        for name, a, b, table in pairs:
            first_values, second_values = np.asarray(a, np.float64), np.asarray(b, np.float64)
            diff = _difference(first_values, second_values)
            table[name] = max(table.get(name, 0.0), diff)
            same = agree(first_values, second_values, rtol=rtol, atol=atol)
            if not np.all(same) and name not in divergent:
                divergent.append(name)
                first = ref.step if first is None else first
    found = [_first_blowup(reference, REFERENCE_RUN), _first_blowup(distributed, DISTRIBUTED_RUN)]
    non_finite = tuple(sorted((f for f in found if f is not None), key=lambda f: f.step))
    return {
        "recorded_steps": tuple(r.step for r in reference),
        "loss_reference": tuple(float(r.logs.get("loss", math.nan)) for r in reference),
        "loss_distributed": tuple(float(r.logs.get("loss", math.nan)) for r in distributed),
        "max_loss_difference": log_diff.get("loss", math.nan),
        "log_differences": log_diff,
        "weight_differences": weight_diff,
        "max_weight_difference": max(weight_diff.values(), default=0.0),
        "largest_weight": max(_largest(reference), _largest(distributed)),
        "first_divergent_step": first,
        "divergent": tuple(divergent),
        "nan_step_reference": found[0].step if found[0] else None,
        "nan_step_distributed": found[1].step if found[1] else None,
        "non_finite": non_finite,
    }
