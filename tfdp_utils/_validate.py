"""Argument and environment-variable checks with one message form, pure Python.

Every message says what was received, what was expected and, where there is one, how to fix
it: ``"{name} must be {expected}, but received {value!r} ...{hint}"``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
"""Values of a flag variable that turn it on (``TFDP_NO_KERAS_PATCHES=1``), case-insensitive."""

FALSE_WORDS = frozenset({"0", "false", "no", "off", "none"})
"""Values that turn a flag or a bound off (``TFDP_COLLECTIVE_TIMEOUT=off``), case-insensitive."""
"""Values of an environment flag that mean "on" (compared after strip() and lower())."""


def _suffix(hint: str) -> str:
    return f" {hint}" if hint else ""


def positive_int(value: Any, name: str, *, minimum: int = 1, hint: str = "") -> int:
    """``value`` as an ``int`` when it is a whole number >= ``minimum``, else a clear error.

    Args:
        value: a Python or NumPy integer (not a bool, not a float).
        name: the argument name shown in the message.
        minimum: the smallest value allowed. Defaults to `1`.
        hint: a sentence appended to the message: how to fix it. Defaults to `""`.

    Returns:
        ``value`` as a Python ``int``.

    Raises:
        TypeError: ``value`` is not an integer (e.g. ``64.0`` or ``"64"``).
        ValueError: ``value`` is smaller than ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fix = hint
        if isinstance(value, float) and value.is_integer():
            fix = f"Pass {name}={int(value)}."
        raise TypeError(
            f"{name} must be an integer, but received {value!r} of type "
            f"{type(value).__name__}.{_suffix(fix)}"
        )
    number = int(value)
    if number < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {what}, but received {name}={number}.{_suffix(hint)}")
    return number


def positive_float(
    value: Any, name: str, *, allow_zero: bool = False, hint: str = "", unit: str = "number"
) -> float:
    """``value`` as a finite ``float`` > 0 (or >= 0 with ``allow_zero``), else a clear error.

    Args:
        value: a real number (not a bool).
        name: the argument name shown in the message.
        allow_zero: whether 0 is accepted. Defaults to `False`.
        hint: a sentence appended to the message: how to fix it. Defaults to `""`.
        unit: what the number counts, for the message ("number of seconds"). Defaults to
            `"number"`.

    Returns:
        ``value`` as a Python ``float``.

    Raises:
        TypeError: ``value`` is not a real number.
        ValueError: ``value`` is negative, zero (unless allowed), NaN or infinite.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a {unit}, but received {value!r} of type "
            f"{type(value).__name__}.{_suffix(hint)}"
        )
    number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        what = f"a finite {unit} >= 0" if allow_zero else f"a positive finite {unit}"
        raise ValueError(f"{name} must be {what}, but received {name}={value!r}.{_suffix(hint)}")
    return number


def boolean(value: Any, name: str) -> bool:
    """``value`` when it is a bool (or NumPy bool), else a clear error: ``"no"`` is not False."""
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):  # NumPy 1 / 2
        return bool(value)
    raise TypeError(
        f"{name} must be True or False, but received {value!r} of type {type(value).__name__}."
    )


def text(value: Any, name: str, *, hint: str = "") -> str:
    """``value`` when it is a string, else a clear error."""
    if isinstance(value, str):
        return value
    raise TypeError(
        f"{name} must be a string, but received {value!r} of type "
        f"{type(value).__name__}.{_suffix(hint)}"
    )


def mapping(value: Any, name: str, *, hint: str = "") -> Mapping[str, Any]:
    """``value`` when it is a mapping (``os.environ``, a dict), else a clear error."""
    if isinstance(value, Mapping):
        return value
    raise TypeError(
        f"{name} must be a mapping such as os.environ or a dict, but received {value!r} of "
        f"type {type(value).__name__}.{_suffix(hint)}"
    )


def strategy(value: Any, name: str = "strategy") -> Any:
    """``value`` when it looks like a ``tf.distribute.Strategy``, else a clear error.

    Checked by its attributes, so this module needs no TensorFlow.
    """
    if hasattr(value, "num_replicas_in_sync") and hasattr(value, "extended"):
        return value
    raise TypeError(
        f"{name} must be a tf.distribute.Strategy (e.g. strategy = tdu.auto_strategy()), but "
        f"received {value!r} of type {type(value).__name__}. Build the strategy first and "
        f"pass the object, or pass {name}=None to use the strategy in scope."
    )


def env_flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment variable ``name`` is set to a "true" word (1, true, yes, on)."""
    import os

    source = os.environ if environ is None else environ
    return source.get(name, "").strip().lower() in TRUE_WORDS


def is_off_word(text: str) -> bool:
    """Whether a variable's value turns its feature off (one of :data:`FALSE_WORDS`)."""
    return text.strip().lower() in FALSE_WORDS


def env_seconds(name: str, text: str, *, example: float) -> float:
    """The seconds in environment variable ``name`` (its value ``text``), or a clear error."""
    try:
        return float(text)
    except ValueError:
        raise ValueError(
            f"{name} must be a number of seconds, but received {name}={text!r}. "
            f"Set it to e.g. {example:g}."
        ) from None


def directory_path(value: Any, name: str, *, example: str) -> str:
    """``value`` as a string when it names a directory that exists or can be created here.

    Checked before any work starts, so a command does not train (or wait on a server) for
    minutes before failing to write its first file. Pure: reads the file system, creates
    nothing.

    Args:
        value: a ``str`` or ``os.PathLike``.
        name: the argument name shown in the message (``"--log-dir"``, ``"log_dir"``).
        example: a valid value for the message, e.g. ``"logs"``.

    Returns:
        ``value`` as a string.

    Raises:
        TypeError: ``value`` is not a path.
        ValueError: ``value`` is empty, is a file, lies under a file, or its nearest existing
            directory is not writable.
    """
    import os
    from pathlib import Path

    shown = f"{name} {example}" if name.startswith("--") else f"{name}={example!r}"
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"{name} must be a directory path (a str or pathlib.Path), but received {value!r} "
            f"of type {type(value).__name__}. Pass e.g. {shown}."
        )
    text_value = os.fspath(value)
    if not isinstance(text_value, str) or not text_value.strip():
        raise ValueError(
            f"{name} must be a directory path, but received {value!r}. Pass e.g. {shown}."
        )
    path = Path(text_value)
    fix = f"Pass a directory that exists or can be created, e.g. {shown}."
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"{name} must be a directory, but received {text_value!r}, which is a file. {fix}"
        )
    existing = next(candidate for candidate in (path, *path.parents) if candidate.exists())
    if not existing.is_dir():
        raise ValueError(
            f"{name} must be a directory that exists or can be created, but received "
            f"{text_value!r}, which lies under the file {str(existing)!r}: no directory can be "
            f"made there. {fix}"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"{name} must be a directory this user can write to, but received {text_value!r}, "
            f"and {str(existing)!r} is not writable. {fix}"
        )
    return text_value
