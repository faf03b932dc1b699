"""The supported-versions check: what it refuses and what its message says (pure)."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

from tfdp_utils import _versions

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    ("tensorflow", "keras", "keras3", "supported"),
    [
        ("2.16.2", "3.10.0", True, True),
        ("2.21.0", "3.16.0.dev2026", True, True),
        ("2.16.2", "3.9.0", True, False),
        ("2.15.1", "3.10.0", True, False),
        ("2.16.2", "3.0.5", False, True),  # tf_keras in use: Keras 3 is not what trains
        ("2.15.1", None, False, False),
        (None, None, True, True),
    ],
)
def test_unsupported_versions_are_refused(
    tensorflow: str | None, keras: str | None, keras3: bool, supported: bool
) -> None:
    message = _versions.unsupported(tensorflow=tensorflow, keras=keras, keras3=keras3)
    assert (message is None) == supported


def test_the_message_names_installed_supported_and_the_pip_command() -> None:
    message = _versions.unsupported(tensorflow="2.16.2", keras="3.9.0", flavour="tensorflow-cpu")
    assert message is not None
    assert "Keras 3.9.0 is installed" in message
    assert "TensorFlow >= 2.16 with Keras >= 3.10" in message
    assert message.endswith('pip install -U "keras>=3.10"')
    both = _versions.unsupported(tensorflow="2.15.0", keras="3.3.3", flavour="tensorflow-cpu")
    assert both is not None and both.endswith('pip install -U "tensorflow-cpu>=2.16" "keras>=3.10"')


def test_the_floor_is_the_one_pyproject_declares() -> None:
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert re.search(rf'"tensorflow-cpu>={re.escape(_versions.OLDEST_TENSORFLOW)}"', text)


def test_pyproject_requires_no_keras_distribution() -> None:
    # TensorFlow brings its own (keras, or keras-nightly for 2.22): a requirement here installed
    # a second one beside it. The floor is checked at first use instead (tests above).
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    requirements = re.findall(r'^\s*"([A-Za-z0-9_.\-\[\]]+)\s*[<>=~!;"]', text, re.MULTILINE)
    assert requirements, "no requirement found in pyproject.toml"
    named = {re.split(r"\[", name)[0].lower() for name in requirements}
    assert not named & {"keras", "keras-nightly"}, named


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("3.15.1", "3.16.0.dev2026102704"),
        ("3.16.0.dev2026102704", "3.16.0"),
        ("3.16.0.dev2026102704", "3.16.0.dev2026102800"),
        ("3.16.0.dev2026102704", "3.16.0rc1"),
        ("3.16.0rc1", "3.16.0"),
        ("2.21.0", "2.22.0rc0"),
        ("2.22.0rc0", "2.22.0"),
        ("3.9.9", "3.10"),
        ("3.10", "3.10.1"),
        ("3.16.0", "3.16.0.post1"),
    ],
)
def test_versions_compare_as_pip_orders_them(earlier: str, later: str) -> None:
    assert _versions.version_key(earlier) < _versions.version_key(later)
    assert _versions.at_least(later, earlier)
    assert not _versions.at_least(earlier, later)


def test_equal_versions_and_text_without_numbers() -> None:
    assert _versions.version_key("3.10") == _versions.version_key("3.10.0")
    assert _versions.version_key("3.16.0.dev2026102704") == ((3, 16, 0), 0, 2026102704)
    assert _versions.version_key("") == ((), 4, 0)


def test_keras_nightly_passes_the_floor_and_a_refusal_names_it() -> None:
    assert _versions.unsupported(tensorflow="2.22.0rc0", keras="3.16.0.dev2026102704") is None
    message = _versions.unsupported(
        tensorflow="2.22.0rc0", keras="3.9.0.dev2025", keras_distribution="keras-nightly"
    )
    assert message is not None
    assert "Keras 3.9.0.dev2025 (keras-nightly) is installed" in message
    assert message.endswith('pip install -U "keras-nightly>=3.10"')


def _only(installed: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    def version(name: str) -> str:
        if name in installed:
            return installed[name]
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_versions.metadata, "version", version)


@pytest.mark.parametrize(
    ("installed", "keras", "tf_keras"),
    [
        ({"keras": "3.15.1", "tf-keras": "2.21.0"}, ("keras", "3.15.1"), ("tf-keras", "2.21.0")),
        (
            {"keras-nightly": "3.16.0.dev2026102704", "tf-keras-nightly": "2.22.0.dev2026101709"},
            ("keras-nightly", "3.16.0.dev2026102704"),
            ("tf-keras-nightly", "2.22.0.dev2026101709"),
        ),
        ({"keras": "3.15.1", "keras-nightly": "3.16.0.dev1"}, ("keras", "3.15.1"), None),
        ({}, None, None),
    ],
)
def test_the_installed_keras_is_found_under_either_distribution(
    installed: dict[str, str],
    keras: tuple[str, str] | None,
    tf_keras: tuple[str, str] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _only(installed, monkeypatch)
    assert _versions.installed_keras() == keras
    assert _versions.installed_keras(legacy=True) == tf_keras


@pytest.mark.parametrize(
    ("requires", "expected"),
    [
        (["absl-py>=1.0.0", "keras>=3.12.0", "numpy>=1.26.0"], "keras"),  # TensorFlow 2.21
        (["keras-nightly>=3.12.0.dev", "numpy>=1.26.0"], "keras-nightly"),  # 2.22.0rc0
        (["Keras_Nightly (>=3.12.0.dev)"], "keras-nightly"),
        (['keras>=3.5; extra == "and-cuda"', "numpy"], None),
        ([], None),
    ],
)
def test_the_keras_tensorflow_requires_is_read_from_its_metadata(
    requires: list[str], expected: str | None
) -> None:
    assert _versions.keras_requirement(requires) == expected
