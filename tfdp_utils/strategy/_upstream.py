"""TensorFlow's own ``tf.distribute.experimental.auto_strategy()`` beside ours: one line. Pure.

TensorFlow 2.23 (tf-nightly) adds a function of the same name. ``tfdp-utils env`` and
``doctor`` say in one line that both exist and how they differ, when the running TensorFlow
has it; docs/upstream-auto-strategy.md has the measurements behind the words.
"""

from __future__ import annotations

from typing import Any

UPSTREAM_NAME = "tf.distribute.experimental.auto_strategy"

UPSTREAM_DIFFERENCE = (
    f"TensorFlow's own {UPSTREAM_NAME}() exists too; tdu.auto_strategy() differs: it also "
    "reads SLURM, Kubernetes and TFDP_STRATEGY, bounds every TPU probe and peer wait "
    "(upstream's can hang), mirrors logical CPUs, does not fall back to one device on a "
    "malformed or parameter-server TF_CONFIG, fixes Keras 3 fit over 2+ workers "
    "(keras#20585), and says why it chose (docs/upstream-auto-strategy.md)"
)
"""What the line says: the differences measured by scripts/compare_upstream.py."""


def upstream_auto_strategy(tf_module: Any) -> Any:
    """``tf_module.distribute.experimental.auto_strategy`` when it is there, else None."""
    experimental = getattr(getattr(tf_module, "distribute", None), "experimental", None)
    function = getattr(experimental, "auto_strategy", None)
    return function if callable(function) else None


def upstream_note(tf_module: Any) -> str | None:
    """One line saying both functions exist and how they differ; None when TensorFlow (the
    module given, normally ``tensorflow``) has no ``tf.distribute.experimental.auto_strategy``.

    Examples:
        >>> import types
        >>> fake = types.SimpleNamespace(distribute=types.SimpleNamespace(
        ...     experimental=types.SimpleNamespace(auto_strategy=lambda: None)))
        >>> upstream_note(fake).startswith("TensorFlow's own")
        True
        >>> upstream_note(types.SimpleNamespace()) is None
        True
    """
    return UPSTREAM_DIFFERENCE if upstream_auto_strategy(tf_module) is not None else None
