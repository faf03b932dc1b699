"""Every example script runs with no arguments, and the demo works end to end."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.py") if p.name != "ray_train.py")


@pytest.mark.slow
@pytest.mark.keras
@pytest.mark.parametrize("script", EXAMPLES)
def test_example_runs(script: str) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / script)],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=str(REPO),
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]


def _readme_command(marker: str) -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(rf"<!-- {marker} -->\s*```bash\n(.*?)\n```", text, re.S)
    assert match, f"README.md has no command after <!-- {marker} -->"
    return match.group(1).strip()


def test_readme_gives_the_two_commands() -> None:
    demo = _readme_command("demo-command")
    tests = _readme_command("test-command")
    assert "pip install" in demo and demo.endswith("tfdp-utils demo")
    assert "pip install" in tests and "scripts/test" in tests
    ci = (REPO / ".ci" / "run").read_text()
    assert "test-command" in ci  # CI runs the README's test command, read from the README


@pytest.mark.slow
@pytest.mark.keras
def test_readme_demo_command_end_to_end(tmp_path: Path) -> None:
    """The README's demo command in a fresh folder, with this environment standing in for the
    pip step (CI has just run that step; this keeps the test offline and quick)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    demo = _readme_command("demo-command")
    run_part = demo.rsplit("&&", 1)[1].strip()
    assert run_part == ".venv/bin/tfdp-utils demo"
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "bin").symlink_to(Path(sys.executable).parent)
    result = subprocess.run(
        ["bash", "-c", run_part + " --epochs 2 --log-dir logs"],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=str(tmp_path),
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-5000:]
    accuracy = float(re.search(r"Test accuracy:\s+([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    assert accuracy > 0.3, out  # chance is 0.1 for ten digits
    assert "MirroredStrategy with 2 replica(s)" in out
    log_dir = (tmp_path / "logs").resolve()
    assert f"tensorboard --logdir {log_dir} --host 127.0.0.1" in out
    runs = sorted(p.name for p in log_dir.iterdir() if p.is_dir())
    assert {"global", "replica_0", "replica_1"} <= set(runs), runs
    events = EventAccumulator(str(log_dir / "global"), size_guidance={"tensors": 0})
    events.Reload()
    assert "throughput/examples_per_sec" in events.Tags()["tensors"]
