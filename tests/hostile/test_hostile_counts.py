"""The campaign's counts in docs/errors.md, over every table of ``tests/hostile/``."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from support.hostile import Accepts, Case
from support.processes import REPO

HERE = Path(__file__).parent


def tables() -> dict[str, list[Case]]:
    """Each ``test_hostile_*.py`` table's cases (the module pytest imported, or a fresh load)."""
    found: dict[str, list[Case]] = {}
    for path in sorted(HERE.glob("test_hostile_*.py")):
        if path.resolve() == Path(__file__).resolve():
            continue
        spec = importlib.util.spec_from_file_location(f"hostile_table_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found[path.stem] = list(module.ALL_CASES)
    return found


def test_the_counts_in_the_docs() -> None:
    page = (REPO / "docs" / "errors.md").read_text()
    cases = [case for table in tables().values() for case in table]
    accepted = sum(isinstance(case[2], Accepts) for case in cases)
    expected = (
        f"{len(cases)} cases tried: {len(cases) - accepted} clear errors, "
        f"{accepted} documented acceptances, 0 hangs"
    )
    assert expected in page, f"docs/errors.md should say: {expected}"
    for name, _, outcome in cases:
        if isinstance(outcome, Accepts):
            assert re.search(re.escape(outcome.why), page), f"acceptance not documented: {name}"


def test_case_names_are_unique_across_tables() -> None:
    names = [case[0] for table in tables().values() for case in table]
    assert len(names) == len(set(names))


def test_docs_page_is_in_the_nav() -> None:
    assert "errors.md" in (REPO / "mkdocs.yml").read_text()
    assert Path(REPO / "docs" / "errors.md").exists()
