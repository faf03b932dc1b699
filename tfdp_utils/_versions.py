"""Installed distributions and their versions, read from package metadata. Pure (no TensorFlow).

The one home of "which TensorFlow flavour is installed": ``tfdp-utils env`` and ``doctor`` read
it without importing TensorFlow, and ``_tf`` names the flavour in use from it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
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


KERAS_DISTRIBUTIONS: tuple[str, ...] = ("keras", "keras-nightly")
"""Distributions that each install the ``keras`` Python package (Keras 3): TensorFlow 2.16-2.21
require ``keras``, TensorFlow 2.22 ``keras-nightly``. Two at once write the same files."""

TF_KERAS_DISTRIBUTIONS: tuple[str, ...] = ("tf-keras", "tf-keras-nightly")
"""Distributions that each install the ``tf_keras`` Python package."""


def installed_of(distributions: tuple[str, ...]) -> dict[str, str]:
    """Those of ``distributions`` installed here, with their versions, in the given order."""
    found = {name: installed_version(name) for name in distributions}
    return {name: version for name, version in found.items() if version}


def installed_flavours() -> dict[str, str]:
    """The TensorFlow distributions installed here, with their versions, specific ones first."""
    return installed_of(TENSORFLOW_FLAVOURS)


def installed_keras(*, legacy: bool = False) -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed Keras 3 (``legacy``: tf_keras), or None.

    ``keras`` or ``keras-nightly`` (``tf-keras`` or ``tf-keras-nightly``): with two installed
    at once (``doctor`` warns), the first of :data:`KERAS_DISTRIBUTIONS`.
    """
    found = installed_of(TF_KERAS_DISTRIBUTIONS if legacy else KERAS_DISTRIBUTIONS)
    return next(iter(found.items()), None)


def keras_requirement(requirements: Sequence[str]) -> str | None:
    """The Keras distribution that ``Requires-Dist`` lines name outside extras, pure.

    ``["keras>=3.12.0", ...]`` (TensorFlow 2.21) -> ``"keras"``;
    ``["keras-nightly>=3.12.0.dev", ...]`` (TensorFlow 2.22) -> ``"keras-nightly"``.
    """
    for line in requirements:
        if "extra ==" in line:
            continue
        name = re.split(r"[\s<>=!~;\[(]", line.strip(), maxsplit=1)[0]
        if name.lower().replace("_", "-") in KERAS_DISTRIBUTIONS:
            return name.lower().replace("_", "-")
    return None


def required_keras(tensorflow: str) -> str | None:
    """The Keras distribution the installed ``tensorflow`` distribution requires, or None."""
    try:
        return keras_requirement(metadata.requires(tensorflow) or [])
    except metadata.PackageNotFoundError:
        return None


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
"""The oldest Keras 3 supported, checked at first use (``pyproject.toml`` requires no Keras:
TensorFlow brings its own, ``keras`` or ``keras-nightly``): before 3.8 Keras trains
wrongly under MirroredStrategy (keras#19891), before 3.9 ``fit`` rejects the builder's datasets
(keras#20134), and 3.8-3.9 report wrong losses under MirroredStrategy. tf_keras is not bounded
beyond its TensorFlow."""


_STAGES = {"dev": 0, "a": 1, "alpha": 1, "b": 2, "beta": 2, "c": 3, "rc": 3, "pre": 3}
_STAGES.update(preview=3, post=5)
_FINAL = 4


def version_key(text: str) -> tuple[tuple[int, ...], int, int]:
    """A sort key for a version as pip orders them (the forms TensorFlow and Keras use), pure.

    The release padded to three numbers, the stage (development build, alpha, beta, release
    candidate, final, post release) and its number: ``"3.16.0.dev2026102704"`` ->
    ``((3, 16, 0), 0, 2026102704)``, after ``"3.15.1"`` and before ``"3.16.0rc1"`` and
    ``"3.16.0"``; ``"3.10"`` equals ``"3.10.0"``. Text without a number -> ``((), 4, 0)``.
    """
    match = re.match(r"v?(\d+(?:\.\d+)*)[.\-_]?([a-z]*)(\d*)", text.strip().lower())
    if not match:
        return (), _FINAL, 0
    release = tuple(int(part) for part in match.group(1).split("."))
    release += (0,) * (3 - len(release))
    stage = _STAGES.get(match.group(2), _FINAL)
    return release, stage, int(match.group(3) or 0) if stage != _FINAL else 0


def at_least(version: str, bound: str) -> bool:
    """Whether ``version`` is ``bound`` or later (``"3.16.0.dev1"`` is before ``"3.16"``)."""
    return version_key(version) >= version_key(bound)


def _below(version: str, floor: str) -> bool:
    return not at_least(version, floor)


def unsupported(
    *,
    tensorflow: str | None,
    keras: str | None,
    flavour: str = "tensorflow",
    keras3: bool = True,
    keras_distribution: str = "keras",
) -> str | None:
    """Why these installed versions are not supported, with the pip command that fixes it (pure).

    Args:
        tensorflow: the installed TensorFlow version, or None when unknown.
        keras: the installed Keras 3 version, or None when unknown.
        flavour: the TensorFlow distribution to name in the fix (``tensorflow-cpu``...).
        keras3: whether Keras 3 is the Keras in use (False: tf_keras, Keras 3 is not checked).
        keras_distribution: the distribution that installed it (``keras``, ``keras-nightly``),
            named in the fix so that the fix never installs a second Keras beside it.

    Returns:
        None when supported (or unknown), else the message.
    """
    problems: list[str] = []
    fixes: list[str] = []
    if tensorflow is not None and _below(tensorflow, OLDEST_TENSORFLOW):
        problems.append(f"TensorFlow {tensorflow} is installed")
        fixes.append(f'"{flavour}>={OLDEST_TENSORFLOW}"')
    if keras3 and keras is not None and _below(keras, OLDEST_KERAS):
        named = "" if keras_distribution == "keras" else f" ({keras_distribution})"
        problems.append(f"Keras {keras}{named} is installed")
        fixes.append(f'"{keras_distribution}>={OLDEST_KERAS}"')
    if not problems:
        return None
    return (
        f"{' and '.join(problems)}; tfdp-utils supports TensorFlow >= {OLDEST_TENSORFLOW} "
        f"with Keras >= {OLDEST_KERAS} (or tf_keras). Older Keras 3 releases train wrongly "
        f"under MirroredStrategy or reject distributed datasets. Fix: "
        f"pip install -U {' '.join(fixes)}"
    )
