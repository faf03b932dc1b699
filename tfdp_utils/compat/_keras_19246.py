"""keras#19246: ``steps_per_execution > 1`` fails on two or more Mirrored/MultiWorker replicas.

Keras 3 runs the ``steps_per_execution`` loop as a ``tf.while_loop`` whose body calls the
step (``strategy.run``) inside a ``tf.cond`` ("is there another batch?"). MirroredStrategy and
MultiWorkerMirroredStrategy trace each replica in its own thread; inside that ``tf.cond``
the captured inputs end up as unfed placeholders, and the first execution fails with
``InvalidArgumentError: You must feed a value for placeholder tensor 'while/cond/Placeholder'``.

The workaround builds the loop so that no step runs inside a ``tf.cond``: the first step of
each execution runs unconditionally on ``iterator.get_next()`` (end of data raises
``OutOfRangeError``, which Keras turns into the end of the epoch, as it does for
``steps_per_execution=1``), and the remaining steps run in a ``tf.while_loop`` whose
*condition* checks that the next batch exists. Only the fetch of the next batch sits in a
``tf.cond``, so an execution never consumes more than ``steps_per_execution`` batches, and a
short last execution at the end of an epoch runs exactly the batches that are left. The
results are those of ``steps_per_execution=1``. The replacement only acts for compiled
(non-eager) functions with ``steps_per_execution > 1`` on MirroredStrategy or
MultiWorkerMirroredStrategy with two or more replicas; everything else uses Keras' code.
Keras' ``unrolled_steps_per_execution`` (a tracing-time unrolling knob) is not used by it.

Where this Keras is too different for the replacement to be safe (its private helpers are
gone), :func:`install` installs a guard instead: ``make_train_function`` and
``make_test_function`` raise :class:`KerasCompatError`, before the first step, naming this
issue and the alternatives.

Verified on Keras 3.15.1 (TensorFlow 2.21); the loop is unchanged on Keras master (3.16.0.dev).
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import textwrap
from types import ModuleType
from typing import Any

from tfdp_utils._tf import tf
from tfdp_utils._validate import positive_int
from tfdp_utils.compat._registry import (
    Patch,
    Workaround,
    is_mirrored_family,
    keras_version,
    replace_method,
    source_shows,
    trainer_class,
)
from tfdp_utils.errors import KerasCompatError

ISSUE = "keras#19246"


# ------------------------------------------------------------------------------------ probe


def _called_names(node: ast.AST) -> set[str]:
    """Names of the functions and methods called anywhere under ``node``."""
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            if isinstance(sub.func, ast.Name):
                names.add(sub.func.id)
            elif isinstance(sub.func, ast.Attribute):
                names.add(sub.func.attr)
    return names


def step_inside_cond(source: str) -> bool:
    """True when ``source`` (a function) passes a branch to ``tf.cond`` that runs the step.

    "Runs the step" means it calls ``strategy.run`` directly or through other functions
    defined in ``source``. This is the construct that fails on mirrored replicas.
    """
    tree = ast.parse(textwrap.dedent(source))
    local_defs = {
        node.name: node
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    calls = {name: _called_names(node) for name, node in local_defs.items()}
    runs_step = {name for name, called in calls.items() if "run" in called}
    changed = True
    while changed:
        grown = {name for name, called in calls.items() if called & runs_step}
        changed = not grown <= runs_step
        runs_step |= grown
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "cond"
        ):
            continue
        branches = [*node.args[1:], *(kw.value for kw in node.keywords)]
        for branch in branches:
            if isinstance(branch, ast.Name) and branch.id in runs_step:
                return True
            if isinstance(branch, ast.Lambda) and _called_names(branch) & (runs_step | {"run"}):
                return True
    return False


def probe(trainer: ModuleType) -> bool:
    """True when Keras' ``steps_per_execution`` loop runs the step inside a ``tf.cond``.

    A behavioural check needs two local replicas, which a process cannot add after
    TensorFlow has started (and a multi-worker process usually has one), so the probe reads
    the loop Keras traces: ``TensorFlowTrainer._make_function``. When the source is not
    available the bug is assumed present; the replacement gives the same results either way.
    """
    method = getattr(trainer_class(trainer), "_make_function", None)
    # None: the loop is traced elsewhere in this Keras, nothing known to work around.
    return source_shows(method, step_inside_cond)


# ------------------------------------------------------------------------------ the fix


def affected(model: Any) -> bool:
    """Whether this compiled model would hit keras#19246 in ``fit``/``evaluate``."""
    steps = getattr(model, "steps_per_execution", 1)
    if not isinstance(steps, int) or steps <= 1 or getattr(model, "run_eagerly", False):
        return False
    strategy = model.distribute_strategy
    return is_mirrored_family(strategy) and int(strategy.num_replicas_in_sync) >= 2


def _fixable(trainer: ModuleType) -> bool:
    cls = trainer_class(trainer)
    if cls is None or not hasattr(trainer, "reduce_per_replica"):
        return False
    make_function = getattr(cls, "_make_function", None)
    # _autoconvert_optionals (Keras >= 3.12) is used when present: Keras 3.8-3.11 have the
    # same loop without it.
    if make_function is None:
        return False
    try:
        parameters = list(inspect.signature(make_function).parameters)
    except (TypeError, ValueError):
        return False
    return parameters == ["self", "step_function"]


def _make_function_factory(trainer: ModuleType, original: Any) -> Any:
    def _make_function(self: Any, step_function: Any) -> Any:
        if not affected(self):
            return original(self, step_function)
        steps = int(self.steps_per_execution)

        @tf.autograph.experimental.do_not_convert  # type: ignore[untyped-decorator]
        def one_step_on_data(data: Any) -> Any:
            outputs = self.distribute_strategy.run(step_function, args=(data,))
            # Looked up on each trace so that the tensorflow#72388 workaround applies too.
            return trainer.reduce_per_replica(outputs, self.distribute_strategy, reduction="auto")

        one_step_on_data = tf.function(
            one_step_on_data, reduce_retracing=True, jit_compile=self.jit_compile
        )
        autoconvert = getattr(self, "_autoconvert_optionals", None)  # Keras >= 3.12
        if autoconvert is not None:
            one_step_on_data = autoconvert(one_step_on_data)

        @tf.autograph.experimental.do_not_convert  # type: ignore[untyped-decorator]
        def multi_step_on_iterator(iterator: Any) -> Any:
            # keras#19246: no step inside a tf.cond. Step 1 runs unconditionally (end of data
            # raises OutOfRangeError, the end of the epoch); steps 2..k run while the next
            # batch exists, and only the fetch of that batch is conditional.
            outputs = one_step_on_data(iterator.get_next())

            def more(step: Any, outputs: Any, next_inputs: Any) -> Any:
                return tf.logical_and(tf.less(step, steps), next_inputs.has_value())

            def body(step: Any, outputs: Any, next_inputs: Any) -> Any:
                outputs = one_step_on_data(next_inputs.get_value())
                next_inputs = tf.cond(
                    tf.less(step + 1, steps),
                    iterator.get_next_as_optional,
                    lambda: next_inputs,
                )
                return step + 1, outputs, next_inputs

            _, outputs, _ = tf.while_loop(
                more, body, [tf.constant(1), outputs, iterator.get_next_as_optional()]
            )
            return outputs

        multi_step_on_iterator = tf.function(multi_step_on_iterator, reduce_retracing=True)

        def function(iterator: Any) -> Any:
            if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
                return multi_step_on_iterator(iterator)
            # Python iterables (train_on_batch, test_on_batch): as Keras does.
            outputs = None
            for data in itertools.islice(iterator, steps):
                outputs = one_step_on_data(data)
            return outputs

        return function

    return _make_function


def refusal(model: Any) -> KerasCompatError:
    """The error raised before the first step where no safe fix exists."""
    strategy = model.distribute_strategy
    return KerasCompatError(
        f"steps_per_execution={model.steps_per_execution} with {type(strategy).__name__} over "
        f"{strategy.num_replicas_in_sync} replicas fails in Keras {keras_version()} "
        f"({ISSUE}: 'You must feed a value for placeholder tensor'), and tfdp-utils cannot "
        "work around it in this Keras version. Compile with steps_per_execution=1, or use "
        "tf_keras (pip install tf-keras, and set TF_USE_LEGACY_KERAS=1 before importing "
        "TensorFlow), or run_eagerly=True."
    )


def _guard_factory(original: Any) -> Any:
    def make_function(self: Any, force: bool = False) -> Any:
        if affected(self):
            raise refusal(self)
        return original(self, force=force)

    return make_function


def install_guard(trainer: ModuleType) -> tuple[str, list[Patch]]:
    """Make affected ``fit``/``evaluate`` calls fail before the first step with a clear error."""
    cls = trainer_class(trainer)
    patches = [
        replace_method(cls, name, _guard_factory(getattr(cls, name)), change=ISSUE)
        for name in ("make_train_function", "make_test_function")
    ]
    return "guard", patches


def check_steps_per_execution(value: Any) -> int:
    """``steps_per_execution`` as a positive int, else a clear error (before Keras' raw one)."""
    return positive_int(
        value,
        "steps_per_execution",
        hint="Pass the number of batches each compiled execution runs, e.g. "
        "model.compile(..., steps_per_execution=1) (the default) or 32.",
    )


def _compile_factory(original: Any) -> Any:
    try:
        signature: inspect.Signature | None = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    # functools.wraps also copies Keras' own marks (``_is_default``: load_model compiles a
    # model from its saved config only when compile is Keras' default one).
    @functools.wraps(original)
    def compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        if signature is not None:
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError:
                bound = None  # Keras words its own signature error
            if bound is not None and "steps_per_execution" in bound.arguments:
                check_steps_per_execution(bound.arguments["steps_per_execution"])
        return original(self, *args, **kwargs)

    return compile


def install(trainer: ModuleType) -> tuple[str, list[Patch]]:
    """Replace ``TensorFlowTrainer._make_function``, or install the guard if that is unsafe.

    Either way ``compile`` checks ``steps_per_execution`` first: the replaced loop owns it,
    and Keras' own errors for 0, -1, 2.5 or ``"auto"`` name neither the argument nor the fix.
    """
    cls = trainer_class(trainer)
    # On the class that defines compile (Keras' Trainer): load_model compiles a restored
    # model only when ``type(model).compile`` is ``Trainer.compile``.
    owner = next(c for c in cls.__mro__ if "compile" in vars(c))
    check = replace_method(owner, "compile", _compile_factory(owner.compile), change=ISSUE)
    if not _fixable(trainer):
        mode, patches = install_guard(trainer)
        return mode, [check, *patches]
    replacement = _make_function_factory(trainer, cls._make_function)
    return "fix", [check, replace_method(cls, "_make_function", replacement, change=ISSUE)]


WORKAROUND = Workaround(
    issue=ISSUE,
    verified_on=("3.15.1",),
    changes="keras Trainer.compile wrapped (checks steps_per_execution) and "
    "TensorFlowTrainer._make_function replaced (the steps_per_execution loop); where that is "
    "unsafe, make_train_function/make_test_function guarded instead",
    probe=probe,
    install=install,
)
