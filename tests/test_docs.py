"""The docs: every Python code block runs, the site builds strictly, the API page is complete."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import REPO, run_python

import tfdp_utils

DOCS = REPO / "docs"
PAGES = sorted(p.name for p in DOCS.glob("*.md"))
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)

# Runs every page's Python blocks in one fresh process with 2 logical CPUs (so examples show data
# parallelism): each page in order, in its own fresh namespace, in its own empty folder, as a
# reader pasting them would; MirroredStrategy's collective keys move on between pages (as
# conftest does between tests). Each page's result is written to the report file as soon as it
# is known, so a runner that dies still reports the pages before. pytest cannot be imported
# there: a reader runs the examples with plain python.
RUNNER = r"""
import contextlib, io, json, os, sys, traceback

class NoPytest:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("pytest", "_pytest"):
            raise ImportError(f"{name}: the docs' examples must run with plain python, no pytest")
        return None

sys.meta_path.insert(0, NoPytest())
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
report, root = sys.argv[1], sys.argv[2]
pages = json.loads(sys.stdin.read())
results, printed = {}, {}
for page, blocks in pages.items():
    tf.distribute.MirroredStrategy._collective_key_base += 100_000
    folder = os.path.join(root, page)
    os.makedirs(folder)
    os.chdir(folder)
    namespace = {"__name__": "__docs__"}
    status = "ok"
    printed[page] = []
    for number, block in enumerate(blocks, 1):
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(block, f"{page}[block {number}]", "exec"), namespace)
        except BaseException:
            status = (
                f"block {number} failed:\n{block}\nit printed:\n{out.getvalue()}\n"
                f"{traceback.format_exc()}"
            )
            break
        finally:
            printed[page].append(out.getvalue())
    results[page] = status
    with open(report + ".tmp", "w") as file:
        json.dump({"results": results, "printed": printed}, file)
    os.replace(report + ".tmp", report)
"""


def python_blocks(page: str) -> list[str]:
    return FENCE.findall((DOCS / page).read_text())


PAGES_WITH_CODE = [p for p in PAGES if python_blocks(p)]

# What a page shows a Python block prints: a text block right after it, marked with a comment
# that mkdocs does not render; `output: keras3` / `output: tf_keras` for one Keras flavour.
SHOWN_OUTPUT = re.compile(
    r"\A\s*<!-- output(?:: (keras3|tf_keras))? -->\n```text\n(.*?)^```\n", re.S | re.M
)


def shown_outputs(page: str) -> list[tuple[int, str | None, str]]:
    """(number of the Python block, Keras flavour or None for both, text shown) of a page."""
    text = (DOCS / page).read_text()
    shown = []
    for number, block in enumerate(FENCE.finditer(text), 1):
        rest = text[block.end() :]
        while match := SHOWN_OUTPUT.match(rest):
            shown.append((number, match.group(1), match.group(2)))
            rest = rest[match.end() :]
    return shown


PAGES_WITH_SHOWN_OUTPUT = [p for p in PAGES_WITH_CODE if shown_outputs(p)]


@pytest.fixture(scope="module")
def page_results(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, str], dict[str, list[str]], str]:
    """Every page's blocks run in one process: each page's status, what each of its blocks
    printed, and the runner's output."""
    root = tmp_path_factory.mktemp("docs")
    report = root / "report.json"
    pages = {page: python_blocks(page) for page in PAGES_WITH_CODE}
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(report), str(root / "pages")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=str(root),
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
    )
    try:
        output, _ = runner.communicate(json.dumps(pages), timeout=540)
    except subprocess.TimeoutExpired:
        runner.kill()
        output, _ = runner.communicate()
        output = "runner still running after 540 s, killed\n" + output
    ran = json.loads(report.read_text()) if report.exists() else {}
    runner_output = f"runner rc={runner.returncode}\n{output[-5000:]}"
    return ran.get("results", {}), ran.get("printed", {}), runner_output


@pytest.mark.slow
@pytest.mark.keras
@pytest.mark.parametrize("page", PAGES_WITH_CODE)
def test_code_blocks_run(
    page: str, page_results: tuple[dict[str, str], dict[str, list[str]], str]
) -> None:
    results, _, runner_output = page_results
    assert page in results, f"{page}: the runner died before or in this page\n{runner_output}"
    assert results[page] == "ok", results[page]


@pytest.mark.slow
@pytest.mark.keras
@pytest.mark.parametrize("page", PAGES_WITH_SHOWN_OUTPUT)
def test_shown_output_is_what_the_code_prints(
    page: str, page_results: tuple[dict[str, str], dict[str, list[str]], str]
) -> None:
    # docs/compat.md showed ('keras#19246',) for tdu.compat.applied() long after keras#20582's
    # workaround was applied to MirroredStrategy too.
    from tfdp_utils._tf import KERAS_FLAVOUR

    results, printed, runner_output = page_results
    assert results.get(page) == "ok", results.get(page, runner_output)
    for number, flavour, shown in shown_outputs(page):
        if flavour in (None, KERAS_FLAVOUR):
            assert printed[page][number - 1] == shown, (
                f"{page}: block {number} prints (on {KERAS_FLAVOUR}):\n"
                f"{printed[page][number - 1]}but the page shows:\n{shown}"
            )


def test_shown_outputs_are_found() -> None:
    # The marker is read as intended (a typo would leave a page's output unchecked).
    assert {flavour for _, flavour, _ in shown_outputs("compat.md")} == {"keras3", "tf_keras"}
    for page in PAGES:
        markers = (DOCS / page).read_text().count("<!-- output")
        assert markers == len(shown_outputs(page)), f"{page}: an output marker is not read"


PYTEST_USE = re.compile(r"^\s*(?:import|from)\s+_?pytest\b|\bpytest\.", re.M)


@pytest.mark.parametrize("page", PAGES_WITH_CODE)
def test_code_blocks_need_no_pytest(page: str) -> None:
    # A reader copies the examples into plain python, where pytest.raises does not exist
    # (docs/strategy.md's TF_CONFIG example used it).
    for number, block in enumerate(python_blocks(page), 1):
        assert not PYTEST_USE.search(block), f"{page} block {number} uses pytest:\n{block}"


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
    # `import tfdp_utils` is lazy and needs no TensorFlow (the CLI's --help and --version, the
    # pure modules); the first name that needs TensorFlow says which extra installs it.
    prefix = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
    bare = run_python(prefix + "import tfdp_utils; print(tfdp_utils.__version__)")
    assert bare.returncode == 0, bare.stderr[-3000:]
    assert bare.stdout.strip() == tfdp_utils.__version__
    result = run_python(prefix + "import tfdp_utils; tfdp_utils.auto_strategy()")
    assert result.returncode != 0
    assert "pip install 'tfdp-utils[tensorflow]'" in result.stderr
    assert "pip install 'tfdp-utils[cpu]'" in result.stderr
