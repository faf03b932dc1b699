"""What a ``fit`` / ``evaluate`` / ``predict`` call runs on, checked and handed to its callbacks.

Keras gives callbacks the model, never the data ``fit`` iterates. A callback that counts
examples exactly needs the training data's layout (a builder dataset's ``DatasetInfo``), and it
must be *that call's* training data: not its validation data, not a dataset another model
iterated last. So ``Model.fit`` is wrapped once per process (by the first builder dataset or
``ThroughputLogger``): before the real ``fit`` runs, each callback of the call that has a
``bind_fit_data(x)`` method receives the call's ``x``, and after the call it receives None.
Nothing is kept between calls.

The same wrappers stop an endless epoch before it starts: a builder dataset that repeats without
end (``repeat=True``, or an infinite source) given to ``fit`` without ``steps_per_epoch`` (or as
``validation_data`` without ``validation_steps``, or to ``evaluate``/``predict`` without
``steps``) raises at once, with the number of steps that covers the data once where the builder
knows it. So does a builder dataset given to a model of another strategy (one replica part per
step for a different number of replicas: Keras would fail deep inside its step, "Only input
tensors may be passed as positional arguments ... PerReplica"), and ``validation_split`` with a
builder dataset (Keras splits only arrays): each error names the fix.

The wrapping is recorded as ``"fit-binding"`` in the compat registry: :func:`tfdp_utils.compat.undo`
puts Keras' own methods back. ``TFDP_NO_KERAS_PATCHES=1`` keeps it off; then the checks above and
the counts that need the call's data are off too, which one warning says (once per process).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from tfdp_utils._dataset_info import DatasetInfo, info_of
from tfdp_utils.compat import _one_iterator as one_iterator
from tfdp_utils.compat._registry import REGISTRY, RuntimeChange, change_of, replace_method
from tfdp_utils.compat._switch import disabled, warn_features_off
from tfdp_utils.errors import EndlessEpochError, StrategyMismatchError

_METHODS = ("fit", "evaluate", "predict")
# For each method: (argument holding the data, argument holding its step count).
_DATA_AND_STEPS = {
    "fit": (("x", "steps_per_epoch"), ("validation_data", "validation_steps")),
    "evaluate": (("x", "steps"),),
    "predict": (("x", "steps"),),
}


CHANGE = RuntimeChange(
    name="fit-binding",
    kind="process",
    changes="keras.Model.fit/evaluate/predict wrapped (every model in the process)",
    why="Keras gives callbacks the model, never the data: the wrappers hand each fit call's x "
    "to its callbacks (ThroughputLogger's exact counts), and stop a builder dataset that never "
    "ends without steps_per_epoch (EndlessEpochError), one built for another number of "
    "replicas (StrategyMismatchError) and validation_split with a builder dataset, before the "
    "first step. Other inputs go straight to Keras. TFDP_NO_KERAS_PATCHES=1 keeps it off",
    undoable=True,
)


class StopFit(BaseException):
    """Raised by a callback to end ``fit`` at once (a preemption, after its checkpoint).

    A ``BaseException``, so that ``except Exception`` in other callbacks or user code does not
    swallow it. The ``fit`` wrapper ends the call: with ``exit_status`` set, the process exits
    with it (``SystemExit``, bounded by a backstop); otherwise ``fit`` returns the model's
    ``History``.
    """

    def __init__(
        self, message: str, *, exit_status: int | None, batches: int | None = None
    ) -> None:
        super().__init__(message)
        self.exit_status = exit_status
        self.batches = batches
        """The job's batches trained when the stop came (Keras' batch positions from its first
        step), for loggers whose own batch hook for the last batch did not run; or None."""


@runtime_checkable
class FitCallAdapter(Protocol):
    """A callback that prepares for the ``fit`` call it belongs to: ``PreemptionCheckpoint``
    positions it; ``ThroughputLogger`` notes which of its callbacks time their saves;
    ``DivergenceGuard`` keeps its arguments while it runs (it reads the ``x`` it trains on)."""

    def prepare_fit(
        self, model: Any, arguments: dict[str, Any]
    ) -> contextlib.AbstractContextManager[Any]:
        """Change ``arguments`` (the call's bound arguments) before ``fit`` runs; the returned
        context manager wraps the call."""


@runtime_checkable
class FitDataConsumer(Protocol):
    """A callback that wants to know what the ``fit`` call it belongs to trains on."""

    def bind_fit_data(self, x: Any) -> None:
        """Called with ``fit``'s ``x`` before training starts, and with None after it ends."""


def callback_list(callbacks: Any) -> list[Any]:
    """The callbacks of a ``fit`` call's ``callbacks=`` (a list, a ``CallbackList`` or one)."""
    if callbacks is None:
        return []
    inner = getattr(callbacks, "callbacks", None)  # a keras CallbackList
    if isinstance(inner, list):
        return inner
    if not isinstance(callbacks, Iterable) or isinstance(callbacks, (str, bytes)):
        return [callbacks]
    return list(callbacks)


def _consumers(callbacks: Any) -> list[FitDataConsumer]:
    return [c for c in callback_list(callbacks) if isinstance(c, FitDataConsumer)]


def _adapters(callbacks: Any) -> list[FitCallAdapter]:
    return [c for c in callback_list(callbacks) if isinstance(c, FitCallAdapter)]


def _covering_steps(info: DatasetInfo) -> int | None:
    if info.steps_per_epoch is not None:
        return info.steps_per_epoch
    if info.examples_per_epoch:
        return math.ceil(info.examples_per_epoch / info.global_batch_size)
    return None


def endless_epoch_error(
    method: str, data_argument: str, steps_argument: str, info: DatasetInfo
) -> EndlessEpochError:
    """The error for an endless builder dataset given to ``method`` without a step count."""
    steps = _covering_steps(info)
    if steps is not None:
        fix = (
            f"Pass {steps_argument}={steps} (dist.tfdp_info.steps_per_epoch: one pass over "
            f"the {info.examples_per_epoch} examples at {info.global_batch_size} per step)"
            if info.steps_per_epoch is not None
            else f"Pass {steps_argument}={steps} (ceil({info.examples_per_epoch} examples / "
            f"{info.global_batch_size} per step): about one pass over the data)"
        )
    else:
        fix = (
            f"Pass {steps_argument}=<the steps you want per epoch> (the dataset's size is "
            "unknown, so no count covers it)"
        )
    # repeat='epochs' needs the epoch's steps, which the builder knows only for counted sources.
    epochs = " or repeat='epochs'" if steps is not None else ""
    return EndlessEpochError(
        f"{method}() received a dataset from build_distributed_dataset that never ends "
        "(built with repeat=True, or from an infinite source) as "
        f"{data_argument}= and no {steps_argument}=, so its epoch would never end. {fix}, or "
        "build the dataset with repeat=False (one pass per epoch; Keras then re-iterates it "
        f"every epoch){epochs}."
    )


def check_steps(method: str, arguments: dict[str, Any]) -> None:
    """Raise :class:`EndlessEpochError` for an endless builder dataset without a step count."""
    for data_argument, steps_argument in _DATA_AND_STEPS[method]:
        data = arguments.get(data_argument)
        info = info_of(data)
        if info is None or not info.repeat or arguments.get(steps_argument) is not None:
            continue
        if steps_argument == "validation_steps" and isinstance(data, tuple):
            continue  # (x, y) arrays, not a dataset
        raise endless_epoch_error(method, data_argument, steps_argument, info)


def _model_replicas(model: Any) -> int | None:
    strategy = getattr(model, "distribute_strategy", None)
    replicas = getattr(strategy, "num_replicas_in_sync", None)
    return int(replicas) if isinstance(replicas, int) else None


def _is_plain_dataset(data: Any) -> bool:
    from tfdp_utils._tf import tf

    return isinstance(data, tf.data.Dataset)


def check_strategy(method: str, model: Any, arguments: dict[str, Any]) -> None:
    """Raise :class:`StrategyMismatchError` for a builder dataset of another strategy's replicas.

    A plain ``tf.data.Dataset`` from the builder (one replica, built without a strategy) is
    left to Keras, which distributes it itself.
    """
    for data_argument, _ in _DATA_AND_STEPS[method]:
        data = arguments.get(data_argument)
        info = info_of(data)
        if info is None or _is_plain_dataset(data):
            continue
        replicas = _model_replicas(model)
        if replicas is None or replicas == info.num_replicas_in_sync:
            continue
        strategy = type(getattr(model, "distribute_strategy", None)).__name__
        runs = (
            "without a strategy (TensorFlow's default, 1 replica)"
            if strategy == "_DefaultDistributionStrategy"
            else f"under {strategy} with {replicas} replica(s)"
        )
        raise StrategyMismatchError(
            f"{method}() received as {data_argument}= a dataset from build_distributed_dataset "
            f"for {info.num_replicas_in_sync} replicas, but the model runs {runs} (e.g. a "
            "model loaded or built outside the strategy's scope), so Keras would fail inside "
            "its step. Pass "
            f"tdu.single_device_dataset({data_argument}) (the same data as one tf.data.Dataset "
            "of global batches, for a model without the strategy), or load/build and compile "
            "the model inside `with strategy.scope():` of the strategy the dataset was built "
            "with."
        )


def check_validation_split(method: str, arguments: dict[str, Any]) -> None:
    """Raise ``ValueError`` for ``fit(builder_dataset, validation_split=...)``, with the fix."""
    split = arguments.get("validation_split")
    data = arguments.get("x")
    if method != "fit" or not split or info_of(data) is None:
        return
    raise ValueError(
        f"fit() received validation_split={split!r} with a dataset from "
        "build_distributed_dataset; Keras splits only arrays and tensors. Split the source "
        "before building, as Keras splits arrays (the last fraction, before shuffling): "
        f"train, val = tdu.split_for_validation(source, validation_split={split!r}, "
        "strategy=strategy, global_batch_size=...), then fit(train, validation_data=val)."
    )


def _wrap(method: str, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind_partial(*args, **kwargs)
        except TypeError:  # let Keras word its own error for arguments it does not take
            return original(*args, **kwargs)
        arguments = bound.arguments  # adapters change the call through it
        model = arguments.get("self")
        with contextlib.ExitStack() as stack:
            if method == "fit":
                for adapter in _adapters(arguments.get("callbacks")):
                    stack.enter_context(adapter.prepare_fit(model, arguments))
            check_steps(method, arguments)
            check_validation_split(method, arguments)
            check_strategy(method, model, arguments)
            consumers = _consumers(arguments.get("callbacks")) if method == "fit" else []
            for consumer in consumers:
                consumer.bind_fit_data(arguments.get("x"))
            # After the callbacks have the dataset passed: they count with its info.
            if method == "fit" and not one_iterator.swap_for_stream(model, arguments):
                stack.enter_context(one_iterator.learning_steps(model, arguments))
            stack.enter_context(one_iterator.quiet_end_of_data(method, arguments))
            try:
                return original(*bound.args, **bound.kwargs)
            except StopFit as stop:
                if method != "fit":
                    raise  # fit's own validation: the fit that runs it ends
                return _stopped(model, stop, arguments.get("callbacks"))
            finally:
                for consumer in consumers:
                    consumer.bind_fit_data(None)

    return wrapper


def _finish_loggers(callbacks: Any, batches: int | None = None) -> None:
    """Let the call's loggers write what they hold before a stopped ``fit`` ends.

    ``on_train_end`` is not called (it means "training finished": Keras' BackupAndRestore
    deletes its backup there); a callback with ``on_fit_stopped(batches)`` (ThroughputLogger:
    its last point) gets that, with the batches trained when the stop came (see
    :attr:`StopFit.batches`), and Keras' TensorBoard callback has its writers closed, which
    flushes them.
    """
    for callback in callback_list(callbacks):
        stopped = getattr(callback, "on_fit_stopped", None)
        if callable(stopped):
            stopped(batches=batches)
        elif type(callback).__name__ == "TensorBoard":
            close = getattr(callback, "_close_writers", None)
            if callable(close):
                close()


def _stopped(model: Any, stop: StopFit, callbacks: Any) -> Any:
    """End a ``fit`` a callback stopped: exit the process, or return the ``History``."""
    _finish_loggers(callbacks, stop.batches)
    end_stopped(stop)
    return getattr(model, "history", None)


def end_stopped(stop: StopFit) -> None:
    """Release what a stopped training loop holds; exit the process when ``stop`` says so.

    The traceback holds the loop's frames, and with them the dataset iterator: they are let
    go now, not at interpreter shutdown (see :mod:`tfdp_utils._exit_guard`).

    Raises:
        SystemExit: with ``stop.exit_status``, when it is set.
    """
    from tfdp_utils import _exit_guard as exit_guard

    exit_guard.clear_frames(stop)
    stop.__traceback__ = None
    if stop.exit_status is not None:
        exit_guard.exit_within(stop.exit_status)
        raise SystemExit(stop.exit_status) from None


def _model_class() -> Any:
    from tfdp_utils._tf import keras

    return keras.Model


def install(*, applied_by: str) -> bool:
    """Wrap the active Keras' ``Model.fit``/``evaluate``/``predict`` once; idempotent.

    Subclasses that do not override them inherit the wrappers. With ``TFDP_NO_KERAS_PATCHES=1``
    nothing is wrapped, and one warning (per process) names the features that are then off.

    Args:
        applied_by: what asks for it, e.g. ``"build_distributed_dataset()"``.

    Returns:
        Whether the methods are wrapped.
    """
    model_class = _model_class()
    with REGISTRY.lock:
        if installed():
            return True
        if disabled():
            warn_features_off(applied_by)
            return False
        patches = [
            replace_method(model_class, method, _wrap(method, current), change=CHANGE.name)
            for method in _METHODS
            if change_of(current := getattr(model_class, method)) != CHANGE.name
        ]
        REGISTRY.record(CHANGE, applied_by=applied_by, patches=patches)
        return True


def installed() -> bool:
    """Whether the active Keras' ``Model.fit``/``evaluate``/``predict`` are wrapped."""
    model_class = _model_class()
    return all(change_of(getattr(model_class, m)) == CHANGE.name for m in _METHODS)
