"""The pure test modules run with TensorFlow (and Keras) made impossible to import.

Every other pure module runs again in a fresh ``pytest`` process under the plugin
``support.no_tensorflow``, which refuses ``tensorflow``, ``keras`` and ``tf_keras`` and fails the
run when a module even tries to import them (code that catches the ImportError counts).
scripts/test runs the pure modules under that plugin in their own pass instead, and leaves this
module out of its lanes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.processes import REPO, pure_modules


def _pytest_without_tensorflow(
    *args: str, cwd: Path = REPO, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "support.no_tensorflow", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(cwd),
        env=env,
        check=False,
    )


def test_pure_tests_pass_without_tensorflow() -> None:
    this = Path(__file__).resolve()
    others = [str(p) for p in pure_modules() if p.resolve() != this]
    assert len(others) >= 5, others
    done = _pytest_without_tensorflow("-q", "-p", "no:cacheprovider", *others)
    output = done.stdout[-5000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    assert " passed" in done.stdout and "skipped" not in done.stdout, output
    assert "blocked, yet" not in done.stdout, output


def test_an_import_of_tensorflow_fails_the_run_even_when_caught(tmp_path: Path) -> None:
    (tmp_path / "test_sneaky.py").write_text(
        "def test_caught():\n"
        "    try:\n"
        "        import tensorflow  # noqa: F401\n"
        "    except ImportError:\n"
        "        pass\n"
    )
    done = _pytest_without_tensorflow(
        "-q", "-p", "no:cacheprovider", "test_sneaky.py", cwd=tmp_path, timeout=120
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed" in done.stdout  # the test itself passed: the plugin failed the run
    assert "imports were attempted: ['tensorflow']" in done.stdout, done.stdout
