"""The docs: every Python code block runs, the site builds strictly, the API page is complete."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_python

import tfdp_utils

DOCS = REPO / "docs"
PAGES = sorted(p.name for p in DOCS.glob("*.md"))
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)

# Runs one page's Python blocks in a fresh process with 2 logical CPUs (so examples show data
# parallelism), in order, in one namespace, in an empty folder: as a reader pasting them would.
RUNNER = r"""
import contextlib, io, json, sys, traceback
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
page, blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__docs__"}
status = "ok"
for number, block in enumerate(blocks, 1):
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(block, f"{page}[block {number}]", "exec"), namespace)
    except BaseException:
        status = f"block {number} failed:\n{block}\n{traceback.format_exc()}"
        break
print("RESULT " + json.dumps(status), flush=True)
"""


def python_blocks(page: str) -> list[str]:
    return FENCE.findall((DOCS / page).read_text())


@pytest.mark.slow
@pytest.mark.keras
@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)])
def test_code_blocks_run(page: str, tmp_path: Path) -> None:
    try:
        result = subprocess.run(
            [sys.executable, "-c", RUNNER],
            input=json.dumps([page, python_blocks(page)]),
            capture_output=True,
            text=True,
            timeout=300,
            cwd=str(tmp_path),
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        tail = (error.stderr or b"")[-3000:]
        raise AssertionError(f"{page}: code blocks still running after 300 s\n{tail!r}") from None
    line = next((x for x in result.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, (
        f"{page}: runner died (rc={result.returncode})\n{result.stderr[-5000:]}"
    )
    assert json.loads(line[len("RESULT ") :]) == "ok", json.loads(line[len("RESULT ") :])


def test_every_nav_page_exists() -> None:
    nav = re.findall(r":\s*([\w.-]+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), re.M)
    assert nav, "mkdocs.yml has no nav"
    missing = [page for page in nav if not (DOCS / page).exists()]
    assert not missing, f"mkdocs.yml lists pages that do not exist: {missing}"


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(REPO),
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert (tmp_path / "site" / "api" / "index.html").exists()


def test_exported_members_match_the_api_reference() -> None:
    documented = re.findall(r"^::: tfdp_utils\.(\w+)\s*$", (DOCS / "api.md").read_text(), re.M)
    exported = [name for name in tfdp_utils.__all__ if not name.startswith("__")]
    assert sorted(documented) == sorted(exported)
    assert len(set(tfdp_utils.__all__)) == len(tfdp_utils.__all__)  # its order: ruff's RUF022
    for name in tfdp_utils.__all__:
        assert hasattr(tfdp_utils, name), name


@pytest.mark.slow
def test_import_without_tensorflow_names_the_extra(tmp_path: Path) -> None:
    # A stub that makes `import tensorflow` fail, as on a machine without TensorFlow.
    (tmp_path / "tensorflow.py").write_text("raise ImportError('No module named tensorflow')\n")
    result = run_python(
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import tfdp_utils",
    )
    assert result.returncode != 0
    assert "pip install 'tfdp-utils[tensorflow]'" in result.stderr
    assert "pip install 'tfdp-utils[cpu]'" in result.stderr
