"""The pure test modules run with TensorFlow (and Keras) made impossible to import.

Every other test in this folder runs again in a fresh ``pytest`` process in which a meta-path
finder refuses ``tensorflow``, ``keras`` and ``tf_keras`` and records each attempt: the run must
pass and no module may even try to import them (code that catches the ImportError counts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support.processes import REPO, pure_modules

BLOCKED = ("tensorflow", "keras", "tf_keras")

RUNNER = """
import json, sys

class Refuse:
    attempts = []

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            self.attempts.append(name)
            raise ImportError(f"{{name}} is blocked: pure tests must run without TensorFlow")
        return None

refuse = Refuse()
sys.meta_path.insert(0, refuse)
import pytest

pytestmark = pytest.mark.pure

code = pytest.main(sys.argv[2:])
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in {blocked!r})
with open(sys.argv[1], "w") as file:
    json.dump({{"code": int(code), "attempts": refuse.attempts, "loaded": loaded}}, file)
"""


def test_pure_tests_pass_without_tensorflow(tmp_path: Path) -> None:
    this = Path(__file__).resolve()
    others = [str(p) for p in pure_modules() if p.resolve() != this]
    assert len(others) >= 5, others
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(RUNNER).format(blocked=BLOCKED),
            str(report),
            "-q",
            "-p",
            "no:cacheprovider",
            *others,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
        env=env,
        check=False,
    )
    output = done.stdout[-5000:] + done.stderr[-3000:]
    assert report.exists(), output
    result = json.loads(report.read_text())
    assert result["attempts"] == [], f"imported with TensorFlow blocked: {result['attempts']}"
    assert result["loaded"] == []
    assert result["code"] == 0, output
    assert " passed" in done.stdout and "skipped" not in done.stdout, output
