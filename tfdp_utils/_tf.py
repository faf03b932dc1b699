"""The one place that imports TensorFlow and decides which Keras the user's models use.

Every other module imports ``tf`` and ``keras`` from here. ``keras`` is the object that
``tf.keras`` resolves to in this process: Keras 3 by default on TensorFlow >= 2.16, or
tf_keras when ``TF_USE_LEGACY_KERAS=1`` was set before TensorFlow resolved ``tf.keras``.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

_INSTALL_HINT = (
    "tfdp-utils needs TensorFlow, which it does not install by itself so that it never "
    "replaces the flavour you chose. Install one of:\n"
    "  pip install 'tfdp-utils[tensorflow]'   # tensorflow (GPU wheels on Linux)\n"
    "  pip install 'tfdp-utils[cpu]'          # tensorflow-cpu\n"
    "or install tensorflow, tensorflow-cpu, tensorflow[and-cuda] or tensorflow-tpu yourself."
)

try:
    import tensorflow as tf
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(f"{_INSTALL_HINT}\n(import tensorflow failed: {exc})") from exc


def _resolve_keras() -> Any:
    """Return the Keras module that ``tf.keras`` gives this process's models."""
    keras_module = tf.keras
    # tf.keras is a lazy loader on TF >= 2.16; touch an attribute so it resolves now.
    _ = keras_module.callbacks
    return keras_module


keras: Any = _resolve_keras()


def _keras_version() -> str:
    """Version of the active Keras; tf.keras's lazy loader hides ``__version__`` for tf_keras."""
    version = getattr(keras, "__version__", None)
    if version:
        return str(version)
    from importlib import metadata

    name = str(getattr(keras, "__name__", ""))
    distribution = "tf-keras" if name.startswith("tf_keras") else "keras"
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:  # pragma: no cover - Keras ships as a distribution
        return ""


KERAS_VERSION: str = _keras_version()
IS_KERAS3: bool = KERAS_VERSION.split(".")[0] == "3"
"""True when the active Keras is Keras 3, False for tf_keras (Keras 2)."""

KERAS_FLAVOUR: str = "keras3" if IS_KERAS3 else "tf_keras"


def legacy_keras_requested() -> bool:
    """Whether ``TF_USE_LEGACY_KERAS`` asks for tf_keras in this process."""
    return os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")


def tensorflow_flavour() -> str:
    """Name of the installed TensorFlow distribution (``tensorflow-cpu``, ``tensorflow``, ...).

    The specific flavours are checked first: ``tensorflow-cpu`` may pull in ``tensorflow``'s
    metadata too.
    """
    from importlib import metadata

    def installed(name: str) -> bool:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            return False
        return True

    for name in (
        "tensorflow-cpu",
        "tensorflow-tpu",
        "tensorflow-gpu",
        "tensorflow-intel",
        "tensorflow-macos",
        "tf-nightly-cpu",
        "tf-nightly",
    ):
        if installed(name):
            return name
    if installed("tensorflow"):
        return "tensorflow[and-cuda]" if installed("nvidia-cudnn-cu12") else "tensorflow"
    return "unknown"


def optional_import(name: str) -> Any | None:
    """Import ``name`` or return None when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


__all__ = [
    "IS_KERAS3",
    "KERAS_FLAVOUR",
    "KERAS_VERSION",
    "keras",
    "legacy_keras_requested",
    "optional_import",
    "tensorflow_flavour",
    "tf",
]
