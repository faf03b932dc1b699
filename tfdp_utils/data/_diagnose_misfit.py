"""The first train step's error, in words, when the dataset's elements do not fit the model:
another shape, strings for a numeric input, or x without the targets its loss compares.

:func:`fitting` wraps the model's first call on a batch (inside
:func:`~tfdp_utils.diagnose_input`): an error that says the elements do not fit becomes a
``ValueError`` naming the element spec, what the model takes and the fix (the original
chained); any other error passes as it is. TensorFlow glue.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from tfdp_utils._tf import tf


def _input_shapes(model: Any) -> list[tuple[int | None, ...]] | None:
    """The shapes the model's inputs declare (batch dimension first), or None when it declares
    none (a subclassed model, a Sequential without ``keras.Input`` not built yet)."""
    try:
        inputs = list(model.inputs or [])
    except (AttributeError, TypeError, ValueError):
        return None
    shapes = [tf.TensorShape(tensor.shape).as_list() for tensor in inputs]
    # The batch dimension is any size (a model built by fit can record its first batch's).
    return [(None, *shape[1:]) if shape else () for shape in shapes] or None


def _x_specs(element_spec: Any) -> list[Any]:
    """The specs of an element's x: the first part of an ``(x, y, ...)`` tuple, else all."""
    x = element_spec[0] if isinstance(element_spec, tuple) and element_spec else element_spec
    return list(tf.nest.flatten(x))


def _shape_text(shape: Any) -> str:
    return str(tuple(tf.TensorShape(shape).as_list()))


_RAISED = re.compile(r"^(?:\w+Error|\(\d+\) [A-Z_]+):\s+")
"""The head of a line that holds an error's own words: ``ValueError: ...`` in a trace that
tf_keras puts in its message ("in user code: ..."), ``(0) UNIMPLEMENTED: ...`` in TensorFlow's."""


def _what_failed(error: BaseException) -> str:
    """The line of ``error``'s message that says what did not fit (no colour codes): one that
    says "incompatible", else the innermost error raised in a trace, else TensorFlow's first
    root error, else the first line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    named = [line for line in lines if "incompatible" in line.lower()]
    raised = [line for line in lines if re.match(r"\w+Error:\s", line)]
    roots = [line for line in lines if re.match(r"\(\d+\) [A-Z_]+:\s", line)]
    line = (named or raised[-1:] or roots or lines or [type(error).__name__])[0]
    return _RAISED.sub("", line).rstrip(".")


def _input_dtypes(model: Any) -> list[Any] | None:
    """The dtypes the model's inputs declare, or None when it declares none."""
    try:
        inputs = list(model.inputs or [])
        return [tf.as_dtype(tensor.dtype) for tensor in inputs] or None
    except (AttributeError, TypeError, ValueError):
        return None


def _loss_name(loss: Any) -> str:
    if isinstance(loss, str):
        return repr(loss)
    return str(getattr(loss, "name", None) or getattr(loss, "__name__", type(loss).__name__))


def _strings_error(
    expected: list[tuple[int | None, ...]] | None,
    dtypes: list[Any],
    element_spec: Any,
    error: BaseException,
) -> ValueError:
    shapes: list[Any] = list(expected) if expected is not None else [None] * len(dtypes)
    takes = " and ".join(
        f"dtype {dtype.name}" + ("" if shape is None else f" and shape {_shape_text(shape)}")
        for dtype, shape in zip(dtypes, shapes, strict=False)
    )
    return ValueError(
        f"dataset's elements do not fit the model: the dataset gives {element_spec}, whose x "
        f"holds strings, but the model takes x of {takes}; its train step failed on the first "
        f"batch with {type(error).__name__}: {_what_failed(error)}. Turn the strings into "
        "numbers before the model: in the pipeline (dataset.map with a "
        "keras.layers.StringLookup or TextVectorization adapted to the data), or in the model "
        "(keras.Input(dtype='string') followed by such a layer)."
    )


def _no_targets_error(loss: Any, element_spec: Any, error: BaseException) -> ValueError:
    return ValueError(
        f"dataset's elements do not fit the model: the dataset gives {element_spec}, x alone "
        f"without targets, but the model was compiled with loss={_loss_name(loss)}, which "
        f"compares targets y with its output; its train step failed on the first batch with "
        f"{type(error).__name__}: {_what_failed(error)}. Make the dataset give (x, y) pairs, "
        "e.g. tf.data.Dataset.from_tensor_slices((x, y)).batch(64), or compile without loss= "
        "for a model that adds its own (add_loss)."
    )


def _misfit_error(
    expected: list[tuple[int | None, ...]] | None,
    element_spec: Any,
    error: BaseException,
    *,
    dtypes: list[Any] | None = None,
    loss: Any = None,
) -> ValueError | None:
    """A clear error when ``error`` (from the model's first call on a batch) says the dataset's
    elements do not fit the model, whose inputs declared the shapes ``expected`` and the
    ``dtypes`` and which was compiled with ``loss``; None when it says something else
    (re-raised as it is)."""
    x_specs = _x_specs(element_spec)
    if (
        dtypes is not None
        and len(dtypes) == len(x_specs)
        and any(
            getattr(spec, "dtype", None) == tf.string and dtype != tf.string
            for dtype, spec in zip(dtypes, x_specs, strict=True)
        )
    ):
        return _strings_error(expected, dtypes, element_spec, error)
    x_misfits = (
        expected is not None
        and len(expected) == len(x_specs)
        and not all(
            tf.TensorShape(shape).is_compatible_with(getattr(spec, "shape", None))
            for shape, spec in zip(expected, x_specs, strict=True)
        )
    )
    if not x_misfits and "incompatible" not in str(error).lower():
        if loss is None or (isinstance(element_spec, tuple) and len(element_spec) >= 2):
            return None
        return _no_targets_error(loss, element_spec, error)  # x alone, for a compiled loss
    if expected is None:
        takes = "the model declares no input shape (it has no keras.Input)"
    else:
        shapes = " and ".join(_shape_text(shape) for shape in expected)
        takes = f"the model takes x of shape {shapes} (batch dimension first)"
    if x_misfits and expected is not None:
        fix = f"Make the dataset give x of shape {shapes} (e.g. fix the map that makes it)"
        if len(x_specs) == 1:
            features = tuple(tf.TensorShape(x_specs[0].shape).as_list()[1:])
            fix += f", or build the model for this data: keras.Input(shape={features})"
    else:
        fix = (
            "Make the dataset give what fit takes for this model: (x, y) with x of the shape "
            "the model takes and y of the shape its loss compares with the model's output"
        )
    return ValueError(
        f"dataset's elements do not fit the model: the dataset gives {element_spec}, "
        f"{'but' if x_misfits else 'and'} {takes}; its train step failed on the first batch "
        f"with {type(error).__name__}: {_what_failed(error)}. {fix}."
    )


@contextlib.contextmanager
def fitting(model: Any, element_spec: Any) -> Iterator[None]:
    """Turn an error that says the elements do not fit the model into a clear ValueError (the
    original chained); other errors pass as they are."""
    expected = _input_shapes(model)  # before the call: tf_keras relaxes a Sequential's inputs
    dtypes = _input_dtypes(model)
    try:
        yield
    except (ValueError, tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as exc:
        loss = getattr(model, "loss", None)
        error = _misfit_error(expected, element_spec, exc, dtypes=dtypes, loss=loss)
        if error is None:
            raise
        raise error from exc
