"""The bound on one multi-worker call: its default, its variable, its value and its message.

Pure: read by ``auto_strategy()`` (its argument and ``TFDP_COLLECTIVE_TIMEOUT``), by the
environment check and by the collective watchdog (:mod:`._faults`), which enforces it.
"""

from __future__ import annotations

import os

from tfdp_utils import _variables
from tfdp_utils._validate import is_off_word

DEFAULT_COLLECTIVE_TIMEOUT = 600.0
"""Seconds one multi-worker call may wait before the watchdog aborts collectives."""

COLLECTIVE_TIMEOUT_VARIABLE = _variables.COLLECTIVE_TIMEOUT
"""Environment variable that replaces :data:`DEFAULT_COLLECTIVE_TIMEOUT`; ``0`` turns it off."""


def resolve_collective_timeout(
    value: float | None, environ: dict[str, str] | None = None
) -> float | None:
    """The collective bound in force: the argument, or ``TFDP_COLLECTIVE_TIMEOUT`` for the default.

    Args:
        value: seconds, :data:`DEFAULT_COLLECTIVE_TIMEOUT`, or None / 0 / ``inf`` for no
            bound.
        environ: variables to read instead of ``os.environ``. Defaults to `None`.

    Returns:
        Seconds, or None when collectives are unbounded.

    Raises:
        ValueError: a negative or non-numeric bound, naming where it came from.
    """
    environ = dict(os.environ) if environ is None else environ
    source = "collective_timeout"
    if value == DEFAULT_COLLECTIVE_TIMEOUT and environ.get(COLLECTIVE_TIMEOUT_VARIABLE, "").strip():
        text = environ[COLLECTIVE_TIMEOUT_VARIABLE].strip()
        source = COLLECTIVE_TIMEOUT_VARIABLE
        if is_off_word(text):
            return None
        try:
            value = float(text)
        except ValueError:
            raise ValueError(
                f"{COLLECTIVE_TIMEOUT_VARIABLE}={text!r} is not a number of seconds; set it to "
                f"e.g. {DEFAULT_COLLECTIVE_TIMEOUT:g}, or 0 to wait without a bound."
            ) from None
    if value is None or value == 0 or value == float("inf"):
        return None  # "inf" waits without a bound, as 0 / "off" do
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            f"{source}={value!r} must be a positive number of seconds, or 0 / None to wait "
            "without a bound."
        )
    return float(value)


def timeout_message(timeout: float, waited: float, where: str) -> str:
    """The error text for a collective that waited past the bound."""
    return (
        f"tfdp_utils: this worker waited {waited:.0f} s inside one TensorFlow call ({where}) "
        f"with collective_timeout={timeout:g} s, so its collectives were aborted: a peer worker "
        "is stuck or gone (check the other tasks' logs). Restart every task to recover (with "
        "BackupAndRestore, training resumes). If a step, the first trace or a save really "
        "takes that long, raise the bound with auto_strategy(collective_timeout=SECONDS) or "
        f"{COLLECTIVE_TIMEOUT_VARIABLE}=SECONDS (0 turns it off)."
    )
