"""The public line: ``tfdp_utils.__all__`` and the documented subpackage surfaces, nothing else.

``docs/api.md`` pins ``__all__`` (tests/test_docs.py); these pin what a user can reach and see:
tab completion shows exactly the API, the modules behind it are private, and every exception a
user may catch comes from ``tfdp_utils.errors`` under one base.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import tfdp_utils as tdu
from tfdp_utils import errors

pytestmark = pytest.mark.pure

PACKAGE = Path(tdu.__file__).parent

# Subpackages whose surfaces are documented and import without TensorFlow.
PURE_SURFACES = (
    "cluster",
    "data",
    "errors",
    "strategy",
    "throughput",
    "training",
    "doctor",
    "preemption",
)

# Public-named modules: the documented subpackages' __init__, and these top-level modules.
PUBLIC_MODULES = {"batching.py", "schedules.py", "cli.py", "demo.py", "errors.py"}


def test_dir_shows_exactly_the_api() -> None:
    assert dir(tdu) == sorted(tdu.__all__)


@pytest.mark.parametrize("name", PURE_SURFACES)
def test_each_subpackage_shows_exactly_its_surface(name: str) -> None:
    package = importlib.import_module(f"tfdp_utils.{name}")
    assert dir(package) == sorted(package.__all__)
    assert package.__all__ == sorted(package.__all__, key=lambda n: (not n[0].isupper(), n))


@pytest.mark.parametrize(
    "old", ["fit_binding", "throughput_tags", "rendezvous", "construction", "dataset_info"]
)
def test_internal_modules_are_not_attributes_of_the_package(old: str) -> None:
    # No find_spec fallback: a module name is not an attribute of tfdp_utils.
    with pytest.raises(AttributeError, match=f"has no attribute '{old}'"):
        getattr(tdu, old)


def test_every_module_behind_the_api_is_private() -> None:
    public_looking = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py"
        and not path.name.startswith("_")
        and not (path.parent == PACKAGE and path.name in PUBLIC_MODULES)
    )
    assert public_looking == []


@pytest.mark.parametrize("name", [n for n in errors.__all__ if not n.endswith("Warning")])
def test_every_error_has_one_base_and_is_importable_from_the_top(name: str) -> None:
    error = getattr(errors, name)
    assert issubclass(error, errors.TfdpError)
    assert getattr(tdu, name) is error


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("ClusterTimeoutError", TimeoutError),
        ("ServiceTimeoutError", TimeoutError),
        ("TPUProbeError", RuntimeError),
        ("KerasCompatError", RuntimeError),
        ("ReplicaDivergenceError", RuntimeError),
        ("EndlessEpochError", ValueError),
        ("StrategyMismatchError", ValueError),
        ("ResumeMismatchError", ValueError),
    ],
)
def test_errors_are_still_the_builtin_a_user_caught_before(
    name: str, builtin: type[Exception]
) -> None:
    assert issubclass(getattr(errors, name), builtin)
