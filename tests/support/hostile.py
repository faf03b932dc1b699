"""The hostile-input campaign's vocabulary: a case, its expected outcome, and how it is judged.

Each table of the campaign (``tests/hostile/test_hostile_*.py``) is a module-level ``CASES``
list of ``(name, call, outcome)``; ``tests/hostile/test_hostile_counts.py`` adds the tables up
and checks the counts docs/errors.md states.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


class Raises:
    """The case must raise ``error`` (exactly that class) with a message matching ``pattern``."""

    def __init__(self, error: type[Exception], pattern: str) -> None:
        self.error, self.pattern = error, pattern


class Accepts:
    """The input is legitimate: ``why`` documents it (docs/errors.md lists every one)."""

    def __init__(self, why: str) -> None:
        self.why = why


Case = tuple[str, Callable[[], Any], "Raises | Accepts"]


def check_case(call: Callable[[], Any], outcome: Raises | Accepts) -> None:
    """Run one case and judge it: an acceptance must not raise; an error must be ours."""
    if isinstance(outcome, Accepts):
        call()
        return
    with pytest.raises(outcome.error, match=outcome.pattern) as raised:
        call()
    # Ours, not Python's: no AttributeError / bare conversion errors reach the user.
    assert type(raised.value) is outcome.error


def parametrize(cases: list[Case]) -> Any:
    """``pytest.mark.parametrize`` over a table, each case named by its first field."""
    return pytest.mark.parametrize(
        ("call", "outcome"), [case[1:] for case in cases], ids=[case[0] for case in cases]
    )


def scratch_folder(prefix: str) -> Path:
    """A folder for a module's cases, removed when the test process ends.

    The case tables are built at collection time, so a fixture's ``tmp_path`` comes too late.
    """
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, True)
    return folder
