"""The supported-versions check: what it refuses and what its message says (pure)."""

from __future__ import annotations

import re
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
    assert f'"keras>={_versions.OLDEST_KERAS}"' in text
    assert re.search(rf'"tensorflow-cpu>={re.escape(_versions.OLDEST_TENSORFLOW)}"', text)
