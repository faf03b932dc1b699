"""Installed distributions and their versions, read from package metadata. Pure (no TensorFlow).

The one home of "which TensorFlow flavour is installed": ``tfdp-utils env`` and ``doctor`` read
it without importing TensorFlow, and ``_tf`` names the flavour in use from it.
"""

from __future__ import annotations

import re
from importlib import metadata

TENSORFLOW_FLAVOURS: tuple[str, ...] = (
    "tensorflow-cpu",
    "tensorflow-tpu",
    "tensorflow-gpu",
    "tensorflow-intel",
    "tensorflow-macos",
    "tf-nightly-cpu",
    "tf-nightly",
    "tensorflow",
)
"""Distributions that each install the ``tensorflow`` Python package, the specific ones first
(``tensorflow-cpu`` may pull in ``tensorflow``'s metadata too)."""


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def installed_flavours() -> dict[str, str]:
    """The TensorFlow distributions installed here, with their versions, specific ones first."""
    found = {name: installed_version(name) for name in TENSORFLOW_FLAVOURS}
    return {name: version for name, version in found.items() if version}


def tensorflow_flavour() -> str:
    """Name of the installed TensorFlow distribution (``tensorflow-cpu``, ``tensorflow``, ...).

    ``tensorflow`` with NVIDIA's cuDNN wheel beside it is ``tensorflow[and-cuda]``; none
    installed is ``"unknown"``.
    """
    flavours = installed_flavours()
    if not flavours:
        return "unknown"
    name = next(iter(flavours))
    if name == "tensorflow" and installed_version("nvidia-cudnn-cu12"):
        return "tensorflow[and-cuda]"
    return name


OLDEST_TENSORFLOW = "2.16"
"""The oldest TensorFlow release tfdp-utils supports (``pyproject.toml``'s extras agree)."""

OLDEST_KERAS = "3.10"
"""The oldest Keras 3 supported (``pyproject.toml``'s ``keras>=3.10``): before 3.8 Keras trains
wrongly under MirroredStrategy (keras#19891), before 3.9 ``fit`` rejects the builder's datasets
(keras#20134), and 3.8-3.9 report wrong losses under MirroredStrategy. tf_keras is not bounded
beyond its TensorFlow."""


def _release(text: str) -> tuple[int, ...]:
    """``"3.16.0.dev2026"`` -> ``(3, 16, 0)``: the leading numeric parts, at most three."""
    match = re.match(r"\d+(?:\.\d+){0,2}", text)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def _below(version: str, floor: str) -> bool:
    return _release(version) < _release(floor)


def unsupported(
    *, tensorflow: str | None, keras: str | None, flavour: str = "tensorflow", keras3: bool = True
) -> str | None:
    """Why these installed versions are not supported, with the pip command that fixes it (pure).

    Args:
        tensorflow: the installed TensorFlow version, or None when unknown.
        keras: the installed Keras 3 version, or None when unknown.
        flavour: the TensorFlow distribution to name in the fix (``tensorflow-cpu``...).
        keras3: whether Keras 3 is the Keras in use (False: tf_keras, Keras 3 is not checked).

    Returns:
        None when supported (or unknown), else the message.
    """
    problems: list[str] = []
    fixes: list[str] = []
    if tensorflow is not None and _below(tensorflow, OLDEST_TENSORFLOW):
        problems.append(f"TensorFlow {tensorflow} is installed")
        fixes.append(f'"{flavour}>={OLDEST_TENSORFLOW}"')
    if keras3 and keras is not None and _below(keras, OLDEST_KERAS):
        problems.append(f"Keras {keras} is installed")
        fixes.append(f'"keras>={OLDEST_KERAS}"')
    if not problems:
        return None
    return (
        f"{' and '.join(problems)}; tfdp-utils supports TensorFlow >= {OLDEST_TENSORFLOW} "
        f"with Keras >= {OLDEST_KERAS} (or tf_keras). Older Keras 3 releases train wrongly "
        f"under MirroredStrategy or reject distributed datasets. Fix: "
        f"pip install -U {' '.join(fixes)}"
    )
