"""Every example script runs with no arguments, and the demo works end to end."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import REPO

EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.py") if p.name != "ray_train.py")
# Examples that start processes of their own run as they are, each in its own process.
MULTI_PROCESS = {
    name
    for name in EXAMPLES
    if re.search(
        r"^\s*(import|from) (subprocess|multiprocessing)\b",
        (REPO / "examples" / name).read_text(),
        re.M,
    )
}

# Runs every single-process example in one fresh process, one after another, each as
# `python examples/NAME.py` would: runpy with run_name="__main__", fresh globals, sys.argv of
# its own, MirroredStrategy's collective keys moved on between them (as conftest does between
# tests). Each result is written to the report file as soon as it is known.
RUNNER = r"""
import contextlib, io, json, os, runpy, sys, traceback
import tensorflow as tf
report, scripts = sys.argv[1], sys.argv[2:]
results = {}
for path in scripts:
    tf.distribute.MirroredStrategy._collective_key_base += 100_000
    sys.argv = [path]
    out = io.StringIO()
    status = "ok"
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            status = f"exited with {exc.code!r}"
    except BaseException:
        status = traceback.format_exc()
    results[os.path.basename(path)] = {"status": status, "output": out.getvalue()[-3000:]}
    with open(report + ".tmp", "w") as file:
        json.dump(results, file)
    os.replace(report + ".tmp", report)
"""


@pytest.fixture(scope="module")
def single_process_results(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, dict[str, str]], str]:
    """Every single-process example run in one process; each one's result, and the output."""
    report = tmp_path_factory.mktemp("examples") / "report.json"
    scripts = [str(REPO / "examples" / name) for name in EXAMPLES if name not in MULTI_PROCESS]
    try:
        result = subprocess.run(
            [sys.executable, "-c", RUNNER, str(report), *scripts],
            capture_output=True,
            text=True,
            timeout=540,
            cwd=str(REPO),
            check=False,
        )
        output = f"runner rc={result.returncode}\n{result.stdout[-3000:]}{result.stderr[-5000:]}"
    except subprocess.TimeoutExpired as error:
        output = f"runner still running after 540 s, killed\n{error.stderr!r}"[-5000:]
    results = json.loads(report.read_text()) if report.exists() else {}
    return results, output


@pytest.mark.slow
@pytest.mark.keras
@pytest.mark.parametrize("script", EXAMPLES)
def test_example_runs(script: str, request: pytest.FixtureRequest) -> None:
    if script in MULTI_PROCESS:
        result = subprocess.run(
            [sys.executable, str(REPO / "examples" / script)],
            capture_output=True,
            text=True,
            timeout=400,
            cwd=str(REPO),
            check=False,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
        return
    results, runner_output = request.getfixturevalue("single_process_results")
    assert script in results, f"{script}: the runner died before or in it\n{runner_output}"
    assert results[script]["status"] == "ok", (
        f"{script}: {results[script]['status']}\n{results[script]['output']}"
    )


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


@pytest.mark.slow
def test_demo_refuses_a_bad_batch_in_one_line() -> None:
    # Valid for argparse, refused by the builder's check: one line, exit status 2.
    result = subprocess.run(
        [sys.executable, "-m", "tfdp_utils.cli", "demo", "--batch-size", "3", "--replicas", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
        check=False,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "tfdp-utils demo: error: global_batch_size=3 is not divisible" in result.stderr
