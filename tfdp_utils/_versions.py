"""Installed distributions and their versions, read from package metadata. Pure (no TensorFlow).

The one home of "which TensorFlow flavour is installed": ``tfdp-utils env`` and ``doctor`` read
it without importing TensorFlow, and ``_tf`` names the flavour in use from it.
"""

from __future__ import annotations

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
