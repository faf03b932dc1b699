"""A custom-loop training step that averages the loss over the *global* batch.

Inside ``strategy.run`` each replica sees only its share of the batch, and the gradients
of all replicas are **summed** when applied. ``tf.reduce_mean`` over the replica's examples
therefore makes the applied gradient ``num_replicas_in_sync`` times too large. The step built
here divides the per-example losses by the number of examples in the whole global batch
(``tf.nn.compute_average_loss``), divides regularization losses by the number of replicas
(``tf.nn.scale_regularization_loss``), and reduces the reported loss with SUM, so 1, 2 or 4
replicas train the same model on the same global batches to the same weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfdp_utils._public import public
from tfdp_utils._tf import tf
from tfdp_utils._validate import positive_int
from tfdp_utils._validate import strategy as check_strategy
from tfdp_utils.compat import _changes
from tfdp_utils.training import _mixed_precision as mixed_precision
from tfdp_utils.training._accumulation import GradientAccumulator
from tfdp_utils.training._step_arguments import (
    REDUCTION_FIX,
    JitCompile,
    check_objects,
    check_setup,
    resolve_jit_compile,
    resolve_loss,
    resolve_metrics,
)


def _unpack(batch: Any) -> tuple[Any, Any, Any]:
    if isinstance(batch, (tuple, list)) and len(batch) in (2, 3):
        x, y = batch[0], batch[1]
        weight = batch[2] if len(batch) == 3 else None
        return x, y, weight
    raise TypeError(
        "The distributed batch must be a tuple (x, y) or (x, y, sample_weight), as a "
        "dataset of (features, labels) gives, but received "
        f"{type(batch).__name__}: {batch!r}. Map the dataset to (x, y) pairs before "
        "strategy.experimental_distribute_dataset."
    )


def _per_example(values: Any, sample_weight: Any) -> Any:
    """Loss values of shape (batch, ...) -> one weighted value per example, in float32."""
    values = tf.cast(tf.convert_to_tensor(values), tf.float32)
    rank = values.shape.rank
    if rank == 0:
        raise ValueError(
            "The loss returned a scalar, but make_distributed_train_step needs one loss per "
            "example (shape (batch,)). "
            + REDUCTION_FIX.format(example="keras.losses.MeanSquaredError(reduction='none')")
        )
    if sample_weight is not None:
        weight = tf.cast(tf.convert_to_tensor(sample_weight), tf.float32)
        # Match Keras: a (batch, 1) weight applies to a (batch,) loss and vice versa.
        while weight.shape.rank > rank and weight.shape[-1] == 1:
            weight = tf.squeeze(weight, axis=-1)
        while weight.shape.rank < rank:
            weight = tf.expand_dims(weight, axis=-1)
        values = values * weight
    if rank > 1:
        # As Keras' "sum_over_batch_size": every element of an example counts equally.
        values = tf.reduce_mean(values, axis=list(range(1, rank)))
    return values


def _values(gradient: Any) -> Any:
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _add_to(gradient: Any, value: Any) -> Any:
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(
            gradient.values + tf.cast(value, gradient.dtype), gradient.indices, gradient.dense_shape
        )
    return gradient + tf.cast(value, gradient.dtype)


@public("tfdp_utils")
class DistributedTrainStep:
    """The step :func:`make_distributed_train_step` returns: ``step(distributed_batch) -> loss``.

    Call it from Python (eagerly), once per element of
    ``strategy.experimental_distribute_dataset(...)``: with ``accumulation_steps=k`` every
    k-th call applies the optimizer, and the step keeps count of the calls in Python.

    Attributes:
        accumulation_steps: micro-batches per optimizer update.
        jit_compile: whether each replica's forward and backward pass is compiled with XLA.
        pending_micro_steps: micro-batches accumulated since the last update; they carry over
            to the next call (as Keras 3's ``gradient_accumulation_steps`` carries over epochs).
    """

    def __init__(
        self,
        model: Any,
        *,
        loss_fn: Callable[..., Any],
        optimizer: Any,
        strategy: Any,
        fixed_size: int | None,
        metrics: list[Any],
        accumulation_steps: int,
        jit_compile: bool,
    ) -> None:
        self.model, self.optimizer, self.strategy = model, optimizer, strategy
        self._loss_fn, self._fixed_size, self._metrics = loss_fn, fixed_size, metrics
        self.accumulation_steps = accumulation_steps
        self.jit_compile = jit_compile
        self.pending_micro_steps = 0
        self._loss_scaling = mixed_precision.is_loss_scale_optimizer(optimizer)
        self._local_replicas = len(strategy.extended.worker_devices)
        with strategy.scope():
            self._skipped = None
            if self._loss_scaling:
                self._skipped = tf.Variable(
                    tf.constant(0, tf.int64),
                    trainable=False,
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                    name="skipped_steps",
                )
            self._accumulator = None
            if accumulation_steps > 1:
                self._accumulator = GradientAccumulator(model.trainable_variables)
        self._gradients = self._replica_gradients
        if jit_compile:
            self._gradients = tf.function(self._replica_gradients, jit_compile=True)
        self._accumulate = tf.function(self._accumulate_step)
        self._apply = tf.function(self._apply_step)

    @property
    def skipped_steps(self) -> int:
        """Optimizer updates skipped because a gradient was inf/NaN (loss scaling only)."""
        return 0 if self._skipped is None else int(self._skipped.numpy())

    def __call__(self, distributed_batch: Any) -> Any:
        """Train on one distributed (micro-)batch; returns its loss (a scalar tensor)."""
        self._check_distributed(distributed_batch)
        if self.pending_micro_steps + 1 < self.accumulation_steps:
            loss = self._accumulate(distributed_batch)
            self.pending_micro_steps += 1
        else:
            loss = self._apply(distributed_batch)
            self.pending_micro_steps = 0
        return loss

    def _check_distributed(self, batch: Any) -> None:
        if self.accumulation_steps > 1 and tf.inside_function():
            raise RuntimeError(
                f"accumulation_steps={self.accumulation_steps}: call the step from Python, not "
                "inside a tf.function: it counts micro-batches in Python to know when to "
                "apply the optimizer. The step compiles itself."
            )
        distributed = [
            v for v in tf.nest.flatten(batch) if isinstance(v, tf.distribute.DistributedValues)
        ]
        for value in distributed:
            parts = len(getattr(value, "values", ()))
            if parts and parts != self._local_replicas:
                raise ValueError(
                    f"The step received a batch split into {parts} per-replica parts, but "
                    f"{type(self.strategy).__name__} runs {self._local_replicas} replica(s) "
                    "here: the dataset was built for another strategy. Build it with the "
                    "strategy the step was made for (strategy.experimental_distribute_dataset, "
                    "or tdu.build_distributed_dataset(..., strategy=strategy))."
                )
        if self._local_replicas < 2 or distributed:
            return
        raise ValueError(
            f"The step received a batch of plain tensors ({type(batch).__name__}), not a "
            f"distributed batch, so each of the {self._local_replicas} replicas of "
            f"{type(self.strategy).__name__} would train on the whole batch. Pass the elements "
            "of strategy.experimental_distribute_dataset(dataset) (or of "
            "tdu.build_distributed_dataset(...)), batched with the global batch size."
        )

    # --- per replica ---------------------------------------------------------------------

    def _examples(self, y: Any) -> Any:
        if self._fixed_size is not None:
            return tf.constant(float(self._fixed_size), tf.float32)
        # Count this global batch over all replicas: a partial last batch is averaged right.
        local = tf.cast(tf.shape(y)[0], tf.float32)
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local)

    def _replica_gradients(
        self, x: Any, y: Any, sample_weight: Any, divide_by: Any, regularize: bool
    ) -> tuple[Any, ...]:
        """Gradients of the (scaled) summed loss / ``divide_by`` (+ regularization)."""
        with tf.GradientTape() as tape:
            y_pred = self.model(x, training=True)
            loss_sum = tf.reduce_sum(_per_example(self._loss_fn(y, y_pred), sample_weight))
            regularization = tf.constant(0.0, tf.float32)
            if self.model.losses:
                regularization = tf.nn.scale_regularization_loss(
                    tf.add_n([tf.cast(value, tf.float32) for value in self.model.losses])
                )
            objective = loss_sum / divide_by
            if regularize:
                objective += regularization
            scaled = mixed_precision.scale_loss(self.optimizer, objective)
        gradients = tape.gradient(scaled, self.model.trainable_variables)
        return gradients, y_pred, loss_sum, regularization

    def _replica_accumulate(self, x: Any, y: Any, sample_weight: Any) -> Any:
        examples = self._examples(y)
        gradients, y_pred, loss_sum, regularization = self._gradients(
            x, y, sample_weight, tf.constant(1.0), False
        )
        assert self._accumulator is not None  # built whenever accumulation_steps > 1
        guard = self._divergence_guard()
        if guard is not None:  # checked where it happens, so the report names this micro-batch
            guard.check_micro_batch(gradients)
        self._accumulator.add(gradients, examples)
        for metric in self._metrics:
            metric.update_state(y, y_pred, sample_weight=sample_weight)
        return loss_sum / examples + regularization

    def _replica_apply(self, x: Any, y: Any, sample_weight: Any) -> Any:
        examples = self._examples(y)
        total, sums = examples, None
        if self._accumulator is not None:
            sums, before = self._accumulator.read()
            total = examples + tf.cast(before, tf.float32)
        gradients, y_pred, loss_sum, regularization = self._gradients(
            x, y, sample_weight, total, True
        )
        if sums is not None:
            gradients = [
                g if g is None else _add_to(tf.convert_to_tensor(g), s / total)
                for g, s in zip(gradients, sums, strict=True)
            ]
        gradients = self._guard_non_finite(gradients)
        gradients = mixed_precision.gradients_to_apply(self.optimizer, gradients)
        guard = self._divergence_guard()
        if guard is not None and self._accumulator is not None:
            guard.hand_over_window()  # it skips the whole window's update, then we reset
        self.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables, strict=True))
        if self._accumulator is not None:
            self._accumulator.reset()
        for metric in self._metrics:
            metric.update_state(y, y_pred, sample_weight=sample_weight)
        return loss_sum / examples + regularization

    def _divergence_guard(self) -> Any:
        """The ``DivergenceGuard`` update watching this optimizer (``guard.watch``), or None."""
        return getattr(self.optimizer, "_tfdp_guard", None)

    def _guard_non_finite(self, gradients: list[Any]) -> list[Any]:
        """With loss scaling: count a non-finite update and make every replica see it.

        The LossScaleOptimizer skips an update whose gradients are not finite, but Keras 3
        checks only the first replica's; a NaN added on every replica makes them agree.
        """
        if self._skipped is None:
            return gradients
        finite = [tf.reduce_all(tf.math.is_finite(_values(g))) for g in gradients if g is not None]
        local_bad = tf.cast(tf.logical_not(tf.reduce_all(tf.stack(finite))), tf.float32)
        context = tf.distribute.get_replica_context()
        bad = context.all_reduce(tf.distribute.ReduceOp.SUM, local_bad) > 0
        self._skipped.assign_add(tf.cast(bad, tf.int64))
        poison = tf.where(bad, tf.constant(float("nan")), tf.constant(0.0))
        return [None if g is None else _add_to(g, poison) for g in gradients]

    # --- across replicas -----------------------------------------------------------------

    def _accumulate_step(self, distributed_batch: Any) -> Any:
        x, y, sample_weight = _unpack(distributed_batch)
        per_replica = self.strategy.run(self._replica_accumulate, args=(x, y, sample_weight))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def _apply_step(self, distributed_batch: Any) -> Any:
        x, y, sample_weight = _unpack(distributed_batch)
        per_replica = self.strategy.run(self._replica_apply, args=(x, y, sample_weight))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


@public("tfdp_utils")
def make_distributed_train_step(
    model: Any,
    *,
    loss: Any,
    optimizer: Any,
    strategy: Any = None,
    global_batch_size: int | None = None,
    metrics: Any = None,
    accumulation_steps: int = 1,
    jit_compile: JitCompile = False,
) -> DistributedTrainStep:
    """Build a step that trains ``model`` on one distributed batch (or micro-batch).

    Per replica the step computes the per-example loss, divides its sum by the number of
    examples in the global batch (``tf.nn.compute_average_loss``), adds the model's
    regularization losses divided by the number of replicas
    (``tf.nn.scale_regularization_loss``), applies the gradients with ``optimizer`` (which
    sums them over replicas), and updates ``metrics`` with ``(y, y_pred, sample_weight)`` as
    ``fit`` does. It returns the loss averaged over the global batch (regularization
    included), the same number on every replica count.

    With ``accumulation_steps=k`` each replica sums its gradients over k micro-batches in
    replica-local accumulators and the optimizer is applied on every k-th call, with the
    mean gradient over all examples of the k micro-batches on all replicas: the same update
    as one step on their concatenation, also when a micro-batch is partial.

    With a ``LossScaleOptimizer`` (``mixed_float16``) the step scales the loss and has the
    optimizer unscale the gradients, on Keras 3 and tf_keras; an update with an inf/NaN
    gradient on any replica is skipped (the optimizer lowers the scale) and counted in
    ``step.skipped_steps``.

    Build the model, optimizer and metrics under ``strategy.scope()``. On Keras 3 the step
    creates the optimizer's variables under the scope (``optimizer.build``) if they do not
    exist yet, because Keras 3 cannot create them inside the ``tf.function`` on 2+ replicas.

    Args:
        model: a built Keras model whose variables were created under ``strategy.scope()``.
        loss: ``loss(y_true, y_pred)`` returning one value per example (shape ``(batch,)``
            or ``(batch, ...)``, averaged over the trailing axes), e.g.
            ``keras.losses.sparse_categorical_crossentropy`` (or its name as a string), or a
            Keras loss object with ``reduction="none"``. A Keras loss that reduces is rejected.
        optimizer: a Keras optimizer created under ``strategy.scope()``; a
            ``keras.mixed_precision.LossScaleOptimizer`` for a ``mixed_float16`` model.
        strategy: a ``tf.distribute.Strategy``. Defaults to `None` (the strategy in scope).
        global_batch_size: divide every micro-batch's loss by this many examples. Defaults
            to `None`: the number of examples actually in each global batch, counted over
            all replicas, so a partial last batch is averaged correctly.
        metrics: Keras metric objects (created under the scope) to update each step.
            Defaults to `None`.
        accumulation_steps: micro-batches per optimizer update. Defaults to `1`.
        jit_compile: compile each replica's forward and backward pass with XLA (the
            cross-replica sum and the update run outside XLA): True, False, or ``"auto"``
            (XLA when the replicas are GPUs or TPUs). Defaults to `False`.

    Returns:
        A :class:`DistributedTrainStep` ``step(distributed_batch) -> loss``.
        ``distributed_batch`` is one element of ``strategy.experimental_distribute_dataset``:
        ``(x, y)`` or ``(x, y, sample_weight)``; ``loss`` is a scalar tensor.

    Raises:
        ValueError: a Keras loss whose reduction is not ``"none"``, a model that is not
            built, variables created outside the strategy's scope, a float16 model without
            loss scaling, or an optimizer that accumulates itself as well.
        TypeError: ``loss`` is not callable, ``metrics`` are not Keras metrics, or a size or
            ``jit_compile`` has the wrong type.

    Examples:
        >>> import numpy as np
        >>> import tensorflow as tf
        >>> import tfdp_utils as tdu
        >>> strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
        >>> with strategy.scope():
        ...     model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
        ...     optimizer = tf.keras.optimizers.SGD(0.1)
        >>> step = tdu.make_distributed_train_step(
        ...     model,
        ...     loss=tf.keras.losses.SparseCategoricalCrossentropy(
        ...         from_logits=True, reduction="none"),
        ...     optimizer=optimizer,
        ...     strategy=strategy,
        ... )
        >>> data = tf.data.Dataset.from_tensor_slices(
        ...     (np.ones((10, 4), "float32"), np.zeros(10, "int64"))).batch(4)
        >>> batches = strategy.experimental_distribute_dataset(data)
        >>> losses = [float(step(batch)) for batch in batches]
        >>> len(losses)
        3
    """
    strategy = tf.distribute.get_strategy() if strategy is None else check_strategy(strategy)
    check_objects(model, optimizer)
    loss_fn = resolve_loss(loss)
    metric_list = resolve_metrics(metrics)
    fixed_size = None
    if global_batch_size is not None:
        fixed_size = positive_int(global_batch_size, "global_batch_size")
    steps = positive_int(accumulation_steps, "accumulation_steps")
    if steps > 1 and getattr(optimizer, "gradient_accumulation_steps", None):
        raise ValueError(
            f"accumulation_steps={steps} and an optimizer with gradient_accumulation_steps="
            f"{optimizer.gradient_accumulation_steps} would accumulate twice. Use one: "
            "accumulation_steps= here (exact over partial micro-batches) or the optimizer's."
        )
    check_setup(model, optimizer, strategy, metric_list)
    _changes.guard_exits(applied_by="make_distributed_train_step()")  # crashes end
    return DistributedTrainStep(
        model,
        loss_fn=loss_fn,
        optimizer=optimizer,
        strategy=strategy,
        fixed_size=fixed_size,
        metrics=metric_list,
        accumulation_steps=steps,
        jit_compile=resolve_jit_compile(jit_compile, strategy),
    )
