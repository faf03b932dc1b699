"""The line env and doctor show when TensorFlow has its own auto_strategy. Pure: no TensorFlow."""

from __future__ import annotations

import types

import pytest

from tfdp_utils import cli
from tfdp_utils.strategy._upstream import UPSTREAM_NAME, upstream_auto_strategy, upstream_note

pytestmark = pytest.mark.pure


def _tensorflow(**experimental: object) -> types.SimpleNamespace:
    """A stand-in for the ``tensorflow`` module with these ``tf.distribute.experimental`` names."""
    return types.SimpleNamespace(
        distribute=types.SimpleNamespace(experimental=types.SimpleNamespace(**experimental))
    )


def test_a_tensorflow_with_its_own_auto_strategy_gets_one_line_naming_both() -> None:
    def auto_strategy() -> None:
        return None

    note = upstream_note(_tensorflow(auto_strategy=auto_strategy))
    assert note is not None
    assert "\n" not in note
    assert f"{UPSTREAM_NAME}()" in note
    assert "tdu.auto_strategy()" in note
    for difference in ("SLURM", "Kubernetes", "TFDP_STRATEGY", "bounds", "keras#20585"):
        assert difference in note
    assert note.endswith("(docs/upstream-auto-strategy.md)")


@pytest.mark.parametrize(
    "tensorflow",
    [
        _tensorflow(),  # TensorFlow <= 2.22: no such function
        _tensorflow(auto_strategy="not callable"),
        types.SimpleNamespace(distribute=types.SimpleNamespace()),
        types.SimpleNamespace(),
        None,
    ],
)
def test_no_line_without_the_upstream_function(tensorflow: object) -> None:
    assert upstream_auto_strategy(tensorflow) is None
    assert upstream_note(tensorflow) is None


def test_env_prints_the_line_when_the_report_has_it() -> None:
    report = {"strategy": "OneDeviceStrategy", "reason": "CPU only"}
    assert "Upstream:" not in cli._format_tensorflow({**report, "upstream_auto_strategy": None})
    note = upstream_note(_tensorflow(auto_strategy=lambda: None))
    shown = cli._format_tensorflow({**report, "upstream_auto_strategy": note})
    assert f"- Upstream: {note}" in shown.splitlines()
