"""``check_replica_equivalence``: does the user's model train the same on N replicas as on one?

Distributed training that goes wrong rarely crashes: it trains *differently*. This builds the
user's model twice from ``model_fn`` (on one device, and under the strategy), gives both the
same initial weights, trains both through ``fit`` (so the user's own ``train_step``, loss and
metrics run) on the same global batches, and compares the logged loss and metrics and every
weight after every step (every execution under ``steps_per_execution``).

A model that draws random numbers in training (Dropout, noise layers) cannot follow the same
trajectory on one device and on N replicas; for such a model the trajectory is reported but
not judged, and a probe checks instead that the replicas do not all draw the *same* random
numbers (a layer with a fixed op seed does: every replica gets the first replica's noise).

The comparison is pure NumPy (:func:`compare_records`); only :func:`check_replica_equivalence`
touches TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from tfdp_utils._validate import positive_float, positive_int
from tfdp_utils.errors import ReplicaDivergenceError, ReplicaDivergenceWarning

OnDivergence = Literal["raise", "warn", "ignore"]


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
class EquivalenceReport:
    """How training under a strategy compared with training on one device.

    Attributes:
        strategy: the strategy's class name.
        num_replicas: replicas in sync under it.
        steps: global batches both runs trained on.
        recorded_steps: the steps after which both were compared.
        loss_reference: the logged loss of the one-device run at each recorded step.
        loss_distributed: the logged loss under the strategy at each recorded step.
        max_loss_difference: the largest absolute difference of the logged losses.
        log_differences: largest absolute difference per logged value (loss and metrics).
        weight_differences: largest absolute difference per weight, over all recorded steps.
        max_weight_difference: the largest of ``weight_differences``.
        first_divergent_step: the first recorded step at which a logged value or a weight
            was outside the tolerance, or None.
        divergent: names of the logged values and weights that went outside the tolerance.
        nan_step_reference: the first recorded step with a NaN or inf in the one-device run.
        nan_step_distributed: the same under the strategy.
        random_in_training: two training-mode forward passes on the same input differ.
        replicas_share_random_numbers: every replica produced the same training-mode output
            from the same input although the model is random: the replicas draw the same
            random numbers.
        trajectory_compared: False when the model is random in training, so that the two
            runs cannot agree and only the random draws were judged.
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
    first_divergent_step: int | None
    divergent: tuple[str, ...]
    nan_step_reference: int | None
    nan_step_distributed: int | None
    random_in_training: bool
    replicas_share_random_numbers: bool
    trajectory_compared: bool
    rtol: float
    atol: float

    @property
    def ok(self) -> bool:
        """True when nothing diverged, no NaN appeared only under the strategy, and the
        replicas draw their own random numbers."""
        nan_only_distributed = (
            self.nan_step_distributed is not None and self.nan_step_reference is None
        )
        diverged = self.trajectory_compared and self.first_divergent_step is not None
        return not (diverged or nan_only_distributed or self.replicas_share_random_numbers)

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
            f"  max weight difference: {self.max_weight_difference:.3g}",
        ]
        if self.first_divergent_step is not None:
            names = ", ".join(self.divergent[:5]) + (" ..." if len(self.divergent) > 5 else "")
            lines.append(f"  first divergent step: {self.first_divergent_step} ({names})")
        if self.nan_step_distributed is not None or self.nan_step_reference is not None:
            lines.append(
                f"  first NaN/inf: step {self.nan_step_distributed} under the strategy, "
                f"step {self.nan_step_reference} on one device"
            )
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


def _finite(record: StepRecord) -> bool:
    values = [*record.logs.values(), *(float(np.max(np.abs(w))) for w in record.weights.values())]
    return all(math.isfinite(v) for v in values)


def _close(reference: np.ndarray, other: np.ndarray, rtol: float, atol: float) -> bool:
    return bool(np.all(np.abs(other - reference) <= atol + rtol * np.abs(reference)))


def compare_records(
    reference: Sequence[StepRecord],
    distributed: Sequence[StepRecord],
    *,
    rtol: float,
    atol: float,
) -> dict[str, Any]:
    """Compare two runs step by step (pure NumPy).

    Args:
        reference: the one-device run's records.
        distributed: the records under the strategy, at the same steps.
        rtol: relative tolerance (``|a - b| <= atol + rtol * |reference|``).
        atol: absolute tolerance.

    Returns:
        The comparison fields of :class:`EquivalenceReport`, as a dict.

    Raises:
        ValueError: the two runs recorded different steps or different weights.
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
        pairs = [(k, np.float64(ref.logs[k]), np.float64(dist.logs[k])) for k in ref.logs]
        pairs += [(k, ref.weights[k], dist.weights[k]) for k in ref.weights]
        for name, a, b in pairs:
            if name not in dist.logs and name not in dist.weights:
                continue
            diff = float(np.max(np.abs(np.asarray(b, np.float64) - a)))
            table = log_diff if name in ref.logs else weight_diff
            table[name] = max(table.get(name, 0.0), diff)
            if not _close(np.asarray(a), np.asarray(b), rtol, atol) and name not in divergent:
                divergent.append(name)
                first = ref.step if first is None else first
    nan_ref = next((r.step for r in reference if not _finite(r)), None)
    nan_dist = next((r.step for r in distributed if not _finite(r)), None)
    return {
        "recorded_steps": tuple(r.step for r in reference),
        "loss_reference": tuple(float(r.logs.get("loss", math.nan)) for r in reference),
        "loss_distributed": tuple(float(r.logs.get("loss", math.nan)) for r in distributed),
        "max_loss_difference": log_diff.get("loss", math.nan),
        "log_differences": log_diff,
        "weight_differences": weight_diff,
        "max_weight_difference": max(weight_diff.values(), default=0.0),
        "first_divergent_step": first,
        "divergent": tuple(divergent),
        "nan_step_reference": nan_ref,
        "nan_step_distributed": nan_dist,
    }


# ------------------------------------------------------------------------ TensorFlow part


def _batches(dataset: Any, steps: int) -> list[Any]:
    """The first ``steps`` global batches of ``dataset``, materialised so both runs see them."""
    from tfdp_utils._tf import tf

    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"dataset must be a tf.data.Dataset of global batches, such as "
            f"tf.data.Dataset.from_tensor_slices((x, y)).batch(64), but received "
            f"{type(dataset).__name__}. A distributed dataset cannot be replayed on one "
            "device: pass the dataset before distribution."
        )
    batches = list(dataset.take(steps))
    if not batches:
        raise ValueError("dataset gave no batch; pass a dataset with at least one batch.")
    return batches


def _replay(batches: list[Any]) -> Any:
    from tfdp_utils._tf import tf

    replay = tf.data.Dataset.from_tensors(batches[0])
    for batch in batches[1:]:
        replay = replay.concatenate(tf.data.Dataset.from_tensors(batch))
    return replay


def _compared(model: Any) -> list[int]:
    """Indices in ``model.weights`` of the model's own weights: not metric state (tf_keras
    lists a subclassed model's metric variables among its weights)."""
    metric_variables = {id(v) for m in getattr(model, "metrics", []) for v in m.variables}
    return [i for i, v in enumerate(model.weights) if id(v) not in metric_variables]


def _weight_names(model: Any) -> list[str]:
    names: list[str] = []
    for index in _compared(model):
        variable = model.weights[index]
        name = str(getattr(variable, "path", None) or variable.name)
        names.append(name if name not in names else f"{name}#{index}")
    return names


def _weight_values(model: Any) -> list[np.ndarray]:
    values = model.get_weights()
    return [values[i] for i in _compared(model)]


def _recorder(records: list[StepRecord], names: list[str], last_step: int) -> Any:
    from tfdp_utils._tf import keras

    class _Recorder(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
            values = {k: float(np.asarray(v)) for k, v in (logs or {}).items()}
            weights = dict(zip(names, _weight_values(self.model), strict=True))
            # Keras numbers a short last execution as if it were whole: cap at the steps run.
            step = min(int(batch) + 1, last_step)
            records.append(StepRecord(step=step, logs=values, weights=weights))

    return _Recorder()


def _build(model_fn: Callable[[], Any], strategy: Any, first_x: Any) -> Any:
    with strategy.scope():
        model = model_fn()
        if not getattr(model, "compiled_loss", None) and not getattr(model, "optimizer", None):
            raise TypeError(
                "model_fn must return a compiled Keras model (call model.compile(...) inside "
                f"model_fn), but it returned {type(model).__name__} without an optimizer."
            )
        if not model.built:
            model(first_x)
    return model


def _train(model: Any, batches: list[Any], names: list[str]) -> list[StepRecord]:
    records: list[StepRecord] = []
    callbacks = [_recorder(records, names, len(batches))]
    model.fit(_replay(batches), epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    return records


def _random_draws(model: Any, strategy: Any, x: Any) -> tuple[bool, bool]:
    """(random in training, every replica drew the same numbers) for ``model`` on ``x``.

    Every replica gets the same input; a model that is random in training must then give
    different outputs on different replicas.
    """
    from tfdp_utils._tf import tf

    @tf.function  # type: ignore[untyped-decorator]
    def forward(inputs: Any) -> Any:
        return strategy.run(lambda t: model(t, training=True), args=(inputs,))

    def flat(outputs: Any) -> list[np.ndarray]:
        per_replica = strategy.experimental_local_results(outputs)
        return [np.concatenate([np.ravel(t) for t in tf.nest.flatten(r)]) for r in per_replica]

    first, second = flat(forward(x)), flat(forward(x))
    random = not np.array_equal(first[0], second[0])
    same = len(first) > 1 and all(np.array_equal(first[0], other) for other in first[1:])
    return random, random and same


def _reference_strategy(strategy: Any) -> Any:
    from tfdp_utils._tf import tf

    try:
        device = str(strategy.extended.worker_devices[0])
    except (AttributeError, IndexError, RuntimeError, NotImplementedError):
        device = "/cpu:0"
    if "TPU" in device.upper():
        device = "/cpu:0"  # one TPU core is not a plain device; the CPU is the reference
    return tf.distribute.OneDeviceStrategy(device)


def _resolve_strategy(strategy: Any) -> Any:
    from tfdp_utils import _validate
    from tfdp_utils._tf import tf

    if tf.distribute.has_strategy():
        raise RuntimeError(
            "check_replica_equivalence builds its own models under a one-device strategy and "
            "under the strategy to check; call it outside strategy.scope() and pass "
            "strategy=strategy."
        )
    if strategy is not None:
        return _validate.strategy(strategy)
    from tfdp_utils.strategy._choice import auto_strategy

    return auto_strategy(verbose=False)


def check_replica_equivalence(
    model_fn: Callable[[], Any],
    dataset: Any,
    *,
    strategy: Any = None,
    steps: int = 5,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    on_divergence: OnDivergence = "raise",
) -> EquivalenceReport:
    """Check that ``model_fn``'s model trains the same under ``strategy`` as on one device.

    Builds the model twice (under a one-device strategy on the strategy's first device, and
    under ``strategy``), copies the first model's initial weights into the second, trains both
    with ``fit`` on the same first ``steps`` global batches of ``dataset`` and compares the
    logged loss and metrics and every weight after each step (each execution when the model
    was compiled with ``steps_per_execution``). Catches a ``train_step`` that averages the loss
    over the per-replica batch, metrics aggregated wrongly across replicas, NaNs that appear
    only under the strategy, and layers that draw the same random numbers on every replica.

    Use the optimizer you train with, and keep ``steps`` small: every weight is kept for every
    step. Adam-like optimizers hide a gradient scaled by a constant (the update is scale-free),
    so that bug shows only in the logged loss or with SGD.

    Args:
        model_fn: builds and compiles a fresh model; called once per run, inside the run's
            strategy scope.
        dataset: a ``tf.data.Dataset`` of global batches, as ``fit`` takes them.
        strategy: the strategy to check. Defaults to `None` (``tdu.auto_strategy()``).
        steps: global batches to train on. Defaults to `5`.
        rtol: relative tolerance. Defaults to `1e-4`.
        atol: absolute tolerance. Defaults to `1e-5`.
        on_divergence: ``"raise"`` a :class:`ReplicaDivergenceError`, ``"warn"`` with a
            :class:`ReplicaDivergenceWarning`, or ``"ignore"``. Defaults to `"raise"`.

    Returns:
        An :class:`EquivalenceReport`; ``report.ok`` says whether the runs agreed.

    Raises:
        ReplicaDivergenceError: the runs diverged and ``on_divergence="raise"``.
        TypeError: ``dataset`` is not a ``tf.data.Dataset``, or the model is not compiled.
        RuntimeError: called inside a strategy scope.

    Examples:
    ```python
    def model_fn():
        model = tdu.demo.build_model("mlp")
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        return model

    report = tdu.check_replica_equivalence(model_fn, dataset, strategy=strategy)
    print(report.summary())
    ```
    """
    steps = positive_int(steps, "steps", hint="Pass the number of global batches, e.g. 5.")
    rtol = positive_float(rtol, "rtol", allow_zero=True)
    atol = positive_float(atol, "atol", allow_zero=True)
    if on_divergence not in ("raise", "warn", "ignore"):
        raise ValueError(
            f"on_divergence must be 'raise', 'warn' or 'ignore', but received {on_divergence!r}."
        )
    strategy = _resolve_strategy(strategy)
    batches = _batches(dataset, steps)
    first_x = batches[0][0] if isinstance(batches[0], tuple) else batches[0]
    reference = _build(model_fn, _reference_strategy(strategy), first_x)
    distributed = _build(model_fn, strategy, first_x)
    names = _weight_names(reference)  # the two builds' auto-names differ (dense, dense_1)
    if len(_compared(distributed)) != len(names):
        raise ValueError(
            f"model_fn built a model with {len(names)} weights on one device and "
            f"{len(_compared(distributed))} under the strategy; it must build the same model."
        )
    distributed.set_weights(reference.get_weights())
    reference_records = _train(reference, batches, names)
    distributed_records = _train(distributed, batches, names)
    random, shared = _random_draws(distributed, strategy, first_x)
    report = EquivalenceReport(
        strategy=type(strategy).__name__,
        num_replicas=int(strategy.num_replicas_in_sync),
        steps=len(batches),
        random_in_training=random,
        replicas_share_random_numbers=shared,
        trajectory_compared=not random,
        rtol=rtol,
        atol=atol,
        **compare_records(reference_records, distributed_records, rtol=rtol, atol=atol),
    )
    if not report.ok and on_divergence == "raise":
        raise ReplicaDivergenceError(report)
    if not report.ok and on_divergence == "warn":
        warnings.warn(report.summary(), ReplicaDivergenceWarning, stacklevel=2)
    return report
