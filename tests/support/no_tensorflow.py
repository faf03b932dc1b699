"""A pytest plugin (``-p support.no_tensorflow``) that makes TensorFlow impossible to import.

Loaded before the test modules are collected, it puts a meta-path finder first that refuses
``tensorflow``, ``keras`` and ``tf_keras`` and records each attempt; at the session's end, an
attempt (even one whose ImportError the code caught) or a loaded module fails the run and is
named. The pure test modules run under it: in their own pass of scripts/test, and in
tests/test_runs_without_tensorflow.py for a plain ``pytest``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

import pytest

BLOCKED = ("tensorflow", "keras", "tf_keras")


class Refuse:
    """The finder: refuses the blocked top-level packages and keeps every attempt."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name.partition(".")[0] in BLOCKED:
            self.attempts.append(name)
            raise ImportError(f"{name} is blocked: pure tests must run without TensorFlow")
        return None


REFUSE = Refuse()
sys.meta_path.insert(0, REFUSE)


def loaded() -> list[str]:
    return sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if REFUSE.attempts or loaded():
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (
            f"TensorFlow was blocked, yet imports were attempted: {REFUSE.attempts}; "
            f"loaded: {loaded()}"
        )
        if reporter is not None:
            reporter.write_line(message, red=True)
        else:
            print(message, file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
