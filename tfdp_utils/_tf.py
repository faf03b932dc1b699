"""The one place that imports TensorFlow and decides which Keras the user's models use.

Every other module imports ``tf`` and ``keras`` from here. ``keras`` is the object that
``tf.keras`` resolves to in this process: Keras 3 by default on TensorFlow >= 2.16, or
tf_keras when ``TF_USE_LEGACY_KERAS=1`` was set before TensorFlow resolved ``tf.keras``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, cast

from tfdp_utils._versions import (
    OLDEST_KERAS,
    installed_flavours,
    installed_keras,
    required_keras,
    tensorflow_flavour,
    unsupported,
    version_key,
)

_INSTALL_HINT = (
    "tfdp-utils needs TensorFlow, which it does not install by itself so that it never "
    "replaces the flavour you chose. Install one of:\n"
    "  pip install 'tfdp-utils[tensorflow]'   # tensorflow (GPU wheels on Linux)\n"
    "  pip install 'tfdp-utils[cpu]'          # tensorflow-cpu\n"
    "or install tensorflow, tensorflow-cpu, tensorflow[and-cuda] or tensorflow-tpu yourself."
)

try:
    import tensorflow
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(f"{_INSTALL_HINT}\n(import tensorflow failed: {exc})") from exc

tf: Any = tensorflow


_KERAS_HINT = (
    "tfdp-utils trains with the Keras your TensorFlow brings, and installs none itself (a second "
    "Keras distribution would overwrite the first's files). TensorFlow {version} ({flavour}) "
    "could not import {which}. Reinstall your TensorFlow with its dependencies, or install "
    "{fix}."
)


def _keras_hint(legacy: bool) -> str:
    """What to install when ``tf.keras`` fails to resolve: the Keras this TensorFlow requires."""
    major, minor = (version_key(str(tf.__version__))[0] + (0, 0))[:2]
    if legacy:
        which = "tf_keras (TF_USE_LEGACY_KERAS=1)"
        fix = (
            f'it without dependencies: pip install --no-deps "tf-keras~={major}.{minor}.0" (or '
            f'"tf-keras-nightly>={major}.{minor}.0.dev0,<{major}.{minor + 1}.0.dev0" while '
            f"tf-keras has no {major}.{minor} release)"
        )
    else:
        which = "Keras 3"
        distribution = next(iter(installed_flavours()), None)
        wanted = (required_keras(distribution) if distribution else None) or "keras"
        fix = f'the Keras it requires: pip install "{wanted}>={OLDEST_KERAS}"'
    return _KERAS_HINT.format(
        version=tf.__version__, flavour=tensorflow_flavour(), which=which, fix=fix
    )


def _resolve_keras() -> Any:
    """Return the Keras module that ``tf.keras`` gives this process's models."""
    try:
        keras_module = tf.keras
        # tf.keras is a lazy loader on TF >= 2.16; touch an attribute so it resolves now.
        _ = keras_module.callbacks
    except ImportError as exc:
        legacy = os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true")
        raise ImportError(f"{_keras_hint(legacy)}\n(TensorFlow said: {exc})") from exc
    return keras_module


keras: Any = _resolve_keras()


def _keras_version() -> str:
    """Version of the active Keras; tf.keras's lazy loader hides ``__version__`` for tf_keras."""
    version = getattr(keras, "__version__", None)
    if version:
        return str(version)
    name = str(getattr(keras, "__name__", ""))
    found = installed_keras(legacy=name.startswith("tf_keras"))  # -nightly ones too
    return found[1] if found else ""


KERAS_VERSION: str = _keras_version()
IS_KERAS3: bool = KERAS_VERSION.split(".")[0] == "3"
"""True when the active Keras is Keras 3, False for tf_keras (Keras 2)."""

KERAS_FLAVOUR: str = "keras3" if IS_KERAS3 else "tf_keras"


# ------------------------------------------------------------------ private TF/Keras APIs
# Every private TensorFlow or Keras name tfdp-utils reads goes through a helper below, so a
# TensorFlow upgrade can be checked here. (compat/ patches private Keras methods by design:
# each of its modules names the upstream issue and the method it replaces.)


def in_multi_worker_mode(strategy: Any) -> bool:
    """Whether ``strategy`` spans more than one worker (``extended._in_multi_worker_mode``)."""
    probe = getattr(getattr(strategy, "extended", None), "_in_multi_worker_mode", None)
    return bool(probe()) if callable(probe) else False


def input_context(strategy: Any) -> Any | None:
    """The ``tf.distribute.InputContext`` ``strategy`` gives this worker's input pipeline.

    ``extended._make_input_context`` is what ``distribute_datasets_from_function`` calls;
    None for a strategy without one.
    """
    make = getattr(getattr(strategy, "extended", None), "_make_input_context", None)
    return make() if make is not None else None


def bump_collective_keys(strategy_class: Any, stride: int) -> bool:
    """Move ``strategy_class``'s collective key base by ``stride`` (``_collective_key_base``).

    Several MirroredStrategy objects over different devices in one process otherwise reuse
    collective group keys and abort; TensorFlow's own tests move the base the same way. Made
    through :func:`tfdp_utils.compat._changes.bump_collective_keys`, which records it.

    Returns:
        Whether the base was moved (False when this TensorFlow has no such integer).
    """
    base = getattr(strategy_class, "_collective_key_base", None)
    if not isinstance(base, int):
        return False
    strategy_class._collective_key_base = base + stride
    return True


def dataset_graph_ops(dataset: Any) -> set[str]:
    """Op names in ``dataset``'s serialized graph (``Dataset._as_serialized_graph``)."""
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(dataset._as_serialized_graph().numpy())
    ops = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        ops.update(node.op for node in function.node_def)
    return ops


def dataset_input(dataset: Any) -> Any | None:
    """The dataset ``dataset`` transforms (``_input_dataset``), or None for a source."""
    return getattr(dataset, "_input_dataset", None)


MAX_CHAIN_DEPTH = 64
"""Transformations walked back from the end of a dataset before giving up."""


def dataset_chain(dataset: Any) -> Iterator[tuple[str, Any]]:
    """``(class name, dataset)`` from the last transformation of ``dataset`` back to its source.

    Follows ``_input_dataset`` (the first input of each transformation), at most
    :data:`MAX_CHAIN_DEPTH` steps: the one walker of a tf.data chain in tfdp-utils.
    """
    node = dataset
    for _ in range(MAX_CHAIN_DEPTH):
        if node is None:
            return
        yield dataset_class_name(node), node
        node = dataset_input(node)


def batch_arguments(dataset: Any) -> tuple[int | None, bool]:
    """A ``batch`` transformation's size and drop_remainder (``_batch_size``,
    ``_drop_remainder``); None for a size that is not a constant."""
    size = tf.get_static_value(getattr(dataset, "_batch_size", None))
    drop = tf.get_static_value(getattr(dataset, "_drop_remainder", None))
    return (None if size is None else int(size)), bool(drop)


def dataset_class_name(dataset: Any) -> str:
    """The private tf.data class implementing ``dataset`` (``_MapDataset``, ``_BatchDataset``)."""
    return type(dataset).__name__


def dataset_parallelism(dataset: Any) -> int | None:
    """Parallel calls (``_num_parallel_calls``) or reads (``_num_parallel_reads``) of a
    transformation: -1 for AUTOTUNE, None for one at a time or unknown."""
    for attribute in ("_num_parallel_calls", "_num_parallel_reads"):
        value = getattr(dataset, attribute, None)
        if value is not None:
            static = tf.get_static_value(value)
            return None if static is None else int(static)
    return None


def dataset_function_ops(dataset: Any) -> set[str]:
    """Op names in the function a transformation applies (``_map_func``), nested functions
    included; empty for a transformation without one."""
    wrapper = getattr(dataset, "_map_func", None)
    function = getattr(wrapper, "function", None)
    graph = getattr(function, "graph", None)
    if graph is None:
        return set()
    graph_def = graph.as_graph_def()
    ops = {node.op for node in graph_def.node}
    for nested in graph_def.library.function:
        ops.update(node.op for node in nested.node_def)
    return ops


def dataset_file_count(dataset: Any) -> int | None:
    """Files a reader dataset reads (its ``_filenames`` dataset's size), or None."""
    filenames = getattr(dataset, "_filenames", None)
    if filenames is None or not hasattr(filenames, "cardinality"):
        return None
    count = int(filenames.cardinality())
    return count if count >= 0 else None


def distributed_pipelines(dataset: Any) -> list[Any] | None:
    """The ``tf.data.Dataset`` behind a distributed dataset: the per-worker datasets of
    ``distribute_datasets_from_function`` (``_datasets``) or the dataset given to
    ``experimental_distribute_dataset`` (``_original_dataset``); None when neither."""
    datasets = getattr(dataset, "_datasets", None)
    if datasets:
        return list(datasets)
    original = getattr(dataset, "_original_dataset", None)
    return None if original is None else [original]


def distributed_from_function(dataset: Any) -> bool:
    """Whether a distributed dataset came from ``distribute_datasets_from_function``
    (per-worker datasets of per-replica batches, ``_datasets``)."""
    return bool(getattr(dataset, "_datasets", None))


def variable_strategy(variable: Any) -> Any | None:
    """The strategy that made ``variable`` (``_distribute_strategy``), or None (no strategy)."""
    inner = distributed_variable(variable)
    return None if inner is None else inner._distribute_strategy


def distributed_strategy(dataset: Any) -> Any | None:
    """The strategy a distributed dataset was made by (``_strategy``), or None."""
    return getattr(dataset, "_strategy", None)


def distributed_input_options(dataset: Any) -> Any | None:
    """The ``tf.distribute.InputOptions`` a distributed dataset was made with (``_options``)."""
    return getattr(dataset, "_options", None)


def steps_per_execution(model: Any) -> int:
    """Train steps one call of the model's train function runs (Keras 3's
    ``steps_per_execution``, tf_keras' ``_steps_per_execution`` variable); 1 when unset."""
    value: Any = getattr(model, "_steps_per_execution", None) if not IS_KERAS3 else None
    if value is None:
        value = getattr(model, "steps_per_execution", 1)
    if hasattr(value, "numpy"):  # tf_keras: a variable
        value = value.numpy()
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        return 1


def build_for_training(model: Any, data_batch: Any) -> None:
    """Build ``model``'s layers, compiled metrics, loss and optimizer as ``fit`` does before its
    first step: Keras 3's ``Trainer._maybe_symbolic_build`` from one replica's batch. tf_keras
    builds them in its first step; there the model is called once and the optimizer built."""
    strategy = model.distribute_strategy
    if IS_KERAS3:
        model._maybe_symbolic_build(data_batch=data_batch)
        return
    if not model.built:
        x = data_batch[0] if isinstance(data_batch, tuple) else data_batch
        with strategy.scope():
            model(x)
    optimizer = getattr(model, "optimizer", None)
    build = getattr(optimizer, "build", None)
    if callable(build) and not getattr(optimizer, "_built", False):
        with strategy.scope():
            build(model.trainable_variables)


def eager_context() -> Any:
    """TensorFlow's eager context module (``tensorflow.python.eager.context``)."""
    from tensorflow.python.eager import context

    return context


def initialized_tpu_systems() -> dict[str, Any]:
    """The TPU systems this process initialised, by TPU name (``tensorflow.python.tpu.
    tpu_strategy_util.get_initialized_tpu_systems``; empty where TensorFlow lacks it)."""
    try:
        from tensorflow.python.tpu import tpu_strategy_util
    except ImportError:  # pragma: no cover - every supported TensorFlow has it
        return {}
    return dict(getattr(tpu_strategy_util, "get_initialized_tpu_systems", dict)())


def framework_errors() -> Any:
    """TensorFlow's ``tensorflow.python.framework.errors`` (``UnavailableError`` and kin)."""
    from tensorflow.python.framework import errors

    return errors


def service_distribute(address: str, *, task_refresh_interval_ms: int) -> Any:
    """``tf.data.experimental.service.distribute("distributed_epoch", address)`` with the
    client's task refresh interval set (``data_service_ops._distribute``'s
    ``task_refresh_interval_hint_ms``, not in the public function).

    The client learns that a job's tasks are done by asking the dispatcher at this interval
    (TensorFlow's default 1 s), so every epoch ends up to one interval late. Falls back to the
    public function when the private one is gone.
    """
    try:
        from tensorflow.python.data.experimental.ops import data_service_ops

        return data_service_ops._distribute(
            "distributed_epoch", address, task_refresh_interval_hint_ms=task_refresh_interval_ms
        )
    except (ImportError, AttributeError, TypeError):
        return tf.data.experimental.service.distribute("distributed_epoch", address)


def distributed_variable(variable: Any) -> Any | None:
    """The ``tf.Variable`` behind ``variable`` (Keras 3 wraps it in ``.value``), or None.

    A variable is recognised by the ``_distribute_strategy`` attribute tf.distribute gives it.
    """
    if hasattr(variable, "_distribute_strategy"):
        return variable
    inner = getattr(variable, "value", None)
    return inner if hasattr(inner, "_distribute_strategy") else None


def runtime_initialized() -> bool:
    """Whether TensorFlow's eager context already holds its devices (``_context_handle``)."""
    try:
        return eager_context().context()._context_handle is not None
    except AttributeError:  # pragma: no cover - private API moved
        return False


def accept_tensor_logs(callback: Any) -> None:
    """Let tf_keras pass ``callback`` its logs as tensors (``_supports_tf_logs``).

    Keras' own callbacks set it too; without it tf_keras copies the logs to the host every
    batch. Keras 3 ignores it.
    """
    callback._supports_tf_logs = True


def optimizer_batch_counter(optimizer: Any) -> Any:
    """The variable counting every batch an optimizer was applied to, accumulation or not.

    Keras 3 optimizers with ``gradient_accumulation_steps=k`` report ``iterations`` as
    updates (their batch counter floor-divided by k); the batch counter itself is the
    private ``_iterations``. Without accumulation (and on tf_keras) it is ``iterations``.
    """
    # Keras 3's LossScaleOptimizer holds the accumulating optimizer (its own counters and
    # gradient_accumulation_steps are unset) and reports the inner one's iterations.
    inner = getattr(optimizer, "inner_optimizer", optimizer) if IS_KERAS3 else optimizer
    if getattr(inner, "gradient_accumulation_steps", None):
        return getattr(inner, "_iterations", inner.iterations)
    return optimizer.iterations


def batches_trained(model: Any) -> int:
    """Batches (micro-batches under accumulation) ``fit`` has trained ``model`` on: steps as
    users count them (Keras' batch indices, the progress bar, ThroughputLogger's step axis).

    ``optimizer.iterations`` counts updates; under accumulation every update covers k batches.
    A model whose ``train_step`` accumulates (tf_keras, ``enable_gradient_accumulation``)
    carries the state that knows its pending batches (``_tfdp_accumulation``).
    """
    state = getattr(model, "_tfdp_accumulation", None)
    trained = getattr(state, "batches_trained", None)
    if callable(trained):
        return int(trained(model.optimizer))
    return int(read_variable(optimizer_batch_counter(model.optimizer)))


def read_variable(variable: Any) -> Any:
    """The value of ``variable`` on the host (what ``variable.numpy()`` returns).

    A plain resource variable (Keras 3's variables hold one) is read with one eager op, about
    a quarter of ``numpy()``'s cost (which adds a name scope and an identity op); any other
    variable (a distributed one, a read inside a function) through ``numpy()``.
    """
    from tensorflow.python.eager import context
    from tensorflow.python.ops import gen_resource_variable_ops, resource_variable_ops

    inner: Any = variable if isinstance(variable, tf.Variable) else getattr(variable, "value", None)
    if type(inner) is resource_variable_ops.ResourceVariable and context.executing_eagerly():
        return gen_resource_variable_ops.read_variable_op(inner.handle, inner.dtype).numpy()
    return variable.numpy()


def traced_as_written(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` for a tf.data transformation, traced as written: AutoGraph does not rewrite it.

    For tfdp-utils' own pipeline functions, whose branches are on Python values only:
    AutoGraph rewrites a function's source once per process (0.1-0.3 s each here, several
    per positioned stream: most of a resume's data side). The functions ``fn`` hands to tf.data
    in turn (a user's ``map_fn`` or ``reader``) are converted as tf.data converts them
    anywhere: inside ``fn`` the conversion status is the unspecified one of eager code, not
    the disabled one of ``tf.autograph.experimental.do_not_convert``. Where TensorFlow's
    private AutoGraph modules are missing, ``fn`` is returned as it is (converted as before).
    """
    try:
        from tensorflow.python.autograph.core import ag_ctx
        from tensorflow.python.autograph.impl import api as autograph_api
    except ImportError:  # pragma: no cover - private modules moved
        return fn

    def as_written(*args: Any) -> Any:
        with ag_ctx.ControlStatusCtx(status=ag_ctx.Status.UNSPECIFIED):
            return fn(*args)

    return cast(Callable[..., Any], autograph_api.autograph_artifact(as_written))


def autograph_rules_without_tf_keras() -> tuple[Any, tuple[Any, ...]] | None:
    """Autograph's conversion-rule module and its rules plus ``DoNotConvert('tf_keras')``.

    None when the rules already name tf_keras (TensorFlow >= 2.17) or this TensorFlow has no
    such private module. TensorFlow 2.16 lists ``keras`` but not ``tf_keras``.
    """
    try:
        from tensorflow.python.autograph.core import config as autograph_config
    except ImportError:  # pragma: no cover - private module moved
        return None
    rules = tuple(getattr(autograph_config, "CONVERSION_RULES", ()))
    do_not_convert = getattr(autograph_config, "DoNotConvert", None)
    if do_not_convert is None or any(
        isinstance(rule, do_not_convert) and getattr(rule, "_prefix", None) == "tf_keras"
        for rule in rules
    ):
        return None
    return autograph_config, (*rules, do_not_convert("tf_keras"))


def require_supported() -> None:
    """Raise when the installed TensorFlow or Keras 3 in use is older than supported.

    Called at first use (a strategy, a builder dataset), not at import, so that
    ``tfdp-utils env`` and ``doctor`` still report on an unsupported installation.

    Raises:
        RuntimeError: the installed versions are not supported; the message names them,
            the supported ones and the pip command.
    """
    flavour = tensorflow_flavour()
    distribution = installed_keras() if IS_KERAS3 else None
    message = unsupported(
        tensorflow=tf.__version__,
        keras=KERAS_VERSION if IS_KERAS3 else None,
        flavour=flavour if flavour != "unknown" else "tensorflow",
        keras3=IS_KERAS3,
        keras_distribution=distribution[0] if distribution else "keras",
    )
    if message is not None:
        raise RuntimeError(message)
