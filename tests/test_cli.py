"""The command line: report, env, exit statuses, and argument errors in one line.

These run again with TensorFlow refused (tests/test_runs_without_tensorflow.py): the
event files are written with TensorBoard's own TensorFlow-free writer. ``env`` with TensorFlow
runs in one child process for all its environments (TensorFlow imported once); the cases that
need the whole command (closed pipes, path arguments, a stand-in TensorFlow) run it as a child
process each, with a hard timeout.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from support.processes import REPO
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.util import tensor_util

from tfdp_utils import cli
from tfdp_utils.throughput import _tags as tags

pytestmark = pytest.mark.pure


def write_run(folder: Path, series: dict[str, list[tuple[int, float]]]) -> Path:
    """One event file in TensorBoard's record format (length, CRC, event, CRC), by hand."""
    scalars = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
    )
    events = [event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")]
    for tag, points in series.items():
        for step, value in points:
            proto = tensor_util.make_tensor_proto(np.float32(value))
            summary = summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=tag, tensor=proto, metadata=scalars)]
            )
            events.append(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
    data = b""
    for event in events:
        body = event.SerializeToString()
        header = struct.pack("<Q", len(body))
        data += header + struct.pack("<I", masked_crc32c(header))
        data += body + struct.pack("<I", masked_crc32c(body))
    folder.mkdir(parents=True)
    path = folder / "events.out.tfevents.1.localhost"
    path.write_bytes(data)
    return path


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    steps = [20, 40, 60, 64]
    write_run(
        tmp_path / tags.GLOBAL_RUN,
        {
            tags.EXAMPLES_PER_SEC: [(s, 1000.0 + s) for s in steps],
            tags.STEPS_PER_SEC: [(s, (1000.0 + s) / 64) for s in steps],
            tags.EXAMPLES: [(s, 64.0 * s) for s in steps],
        },
    )
    write_run(tmp_path / tags.replica_run(0), {tags.EXAMPLES_PER_SEC: [(s, 500.0) for s in steps]})
    write_run(tmp_path / tags.replica_run(1), {tags.EXAMPLES_PER_SEC: [(s, 520.0) for s in steps]})
    return tmp_path


def test_report_json_agrees_with_the_table(logs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(logs)]) == 0
    table = capsys.readouterr().out
    assert cli.main(["report", str(logs), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    row = next(line.split() for line in table.splitlines() if line.startswith(tags.GLOBAL_RUN))
    figures = data["runs"][tags.GLOBAL_RUN]
    rates = figures["examples_per_sec"]
    assert int(row[1]) == figures["windows"] == 4
    assert [float(v.replace(",", "")) for v in row[2:5]] == [
        pytest.approx(rates["median"], abs=0.05),
        pytest.approx(rates["min"], abs=0.05),
        pytest.approx(rates["max"], abs=0.05),
    ]
    assert rates["median"] == pytest.approx(1050.0)  # the written values: 1020..1064
    assert row[-1] == "-"  # the note column: nothing to say about a complete run
    assert row[-2] == "-" and figures["input_wait_share"] is None  # no input share logged
    assert int(row[-3].replace(",", "")) == figures["examples"] == 64 * 64
    skew = data["replica_skew"]
    assert skew == pytest.approx(20 / 520)
    assert f"{100 * skew:.1f}%" in table


def test_a_corrupt_event_file_is_named_and_fails(
    logs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = logs / tags.replica_run(1)
    (path,) = bad.glob("*tfevents*")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside a record
    path.write_bytes(bytes(data))
    assert cli.main(["report", str(logs)]) == 1
    captured = capsys.readouterr()
    assert f"{path}: corrupt: record" in captured.err
    assert tags.GLOBAL_RUN in captured.out  # the intact runs are still reported


def test_a_partial_last_record_is_noted_not_failed(
    logs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (path,) = (logs / tags.GLOBAL_RUN).glob("*tfevents*")
    path.write_bytes(path.read_bytes()[:-5])  # a writer caught mid-record
    assert cli.main(["report", str(logs), "--json"]) == 0
    captured = capsys.readouterr()
    assert "ends in a partial record" in captured.err
    assert json.loads(captured.out)["event_file_problems"]


def test_demo_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["demo", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for default in ("(default: 5)", "(default: 2)", "(default: 64)", "(default: mlp)"):
        assert default in out, default


@pytest.mark.parametrize("argv", [["--epochs", "0"], ["--batch-size", "x"], ["--replicas", "-2"]])
def test_demo_argument_errors_are_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["demo", *argv])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"argument {argv[0]}: expected a whole number >= 1" in err


def test_env_without_tensorflow_reports_it(tmp_path: Path) -> None:
    (tmp_path / "tensorflow.py").write_text("raise ImportError('No module named tensorflow')\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from tfdp_utils import cli\n"
        "raise SystemExit(cli.main(['env']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1, result.stderr[-3000:]  # no strategy; 2 is for arguments
    assert "Traceback" not in result.stderr
    assert "- TensorFlow: not installed" in result.stdout
    assert "No module named tensorflow" in result.stdout
    assert "pip install 'tfdp-utils[cpu]'" in result.stdout


@pytest.mark.parametrize(("package", "legacy"), [("keras", ""), ("tf_keras", "1")])
def test_a_missing_keras_names_the_one_tensorflow_requires(
    tmp_path: Path, package: str, legacy: str
) -> None:
    # tfdp-utils requires no Keras distribution (TensorFlow brings its own): when that Keras
    # cannot be imported, the error says which one to install.
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text(
        f"raise ModuleNotFoundError('No module named {package}', name={package!r})\n"
    )
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r})\nimport tfdp_utils._tf\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(TF_USE_LEGACY_KERAS=legacy, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 1
    tensorflow = metadata.version("tensorflow-cpu")
    minor = ".".join(tensorflow.split(".")[:2])
    errors = [line for line in result.stderr.splitlines() if line.startswith("ImportError: ")]
    assert errors, result.stderr[-3000:]
    last = errors[-1]
    assert last.startswith("ImportError: tfdp-utils trains with the Keras your TensorFlow brings")
    assert f"TensorFlow {tensorflow} (tensorflow-cpu) could not import" in last
    if legacy:
        assert f'pip install --no-deps "tf-keras~={minor}.0"' in last
    else:
        wanted = "keras-nightly" if minor == "2.22" else "keras"
        assert f'pip install "{wanted}>=3.10"' in last


# ------------------------------------------------- the real command, in child processes

CLI = [sys.executable, "-m", "tfdp_utils.cli"]


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``tfdp-utils ARGS`` in a child process under ``env`` (added to a clean environment)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TFDP_"))}
    for name in ("TF_CONFIG", "SLURM_PROCID"):
        full_env.pop(name, None)
    full_env.update({"TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO),
        env=full_env,
        check=False,
    )


# `tfdp-utils env` under several environments, in one child process that imports TensorFlow
# once: each case sets its variables, calls cli.main (which reads the environment at each call)
# with stdout and stderr captured, and records its return value as the exit status. An error
# escaping main is printed as a traceback into that case's stderr (the "Traceback" checks
# below). The closed-pipe and stand-in tests run the command itself, one process each.
ENV_CASES: dict[str, dict[str, str]] = {
    "cluster-timeout-abc": {"TFDP_CLUSTER_TIMEOUT": "abc"},
    "collective-timeout-negative": {"TFDP_COLLECTIVE_TIMEOUT": "-1"},
    **{f"exit-grace-{value}": {"TFDP_EXIT_GRACE": value} for value in ("abc", "-1", "nan", "inf")},
    "exit-grace-empty": {"TFDP_EXIT_GRACE": ""},
}
ENV_ARGV = {"collective-timeout-negative": ["env", "--json"]}

ENV_RUNNER = r"""
import contextlib, io, json, os, sys, traceback
from tfdp_utils import cli

cases, argvs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
base = dict(os.environ)
results = {}
for name, env in cases.items():
    os.environ.clear()
    os.environ.update({**base, **env})
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(argvs.get(name, ["env"]))
        except SystemExit as exit:
            status = exit.code
        except BaseException:
            traceback.print_exc()
            status = None
    results[name] = {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}
print("RESULTS " + json.dumps(results), flush=True)
"""


@pytest.fixture(scope="module")
def env_runs() -> dict[str, subprocess.CompletedProcess[str]]:
    """Each case of :data:`ENV_CASES`: ``tfdp-utils env``'s status, stdout and stderr."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TFDP_"))}
    for name in ("TF_CONFIG", "SLURM_PROCID"):
        full_env.pop(name, None)
    full_env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    child = subprocess.run(
        [sys.executable, "-c", ENV_RUNNER, json.dumps(ENV_CASES), json.dumps(ENV_ARGV)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
        env=full_env,
        check=False,
    )
    lines = [line for line in child.stdout.splitlines() if line.startswith("RESULTS ")]
    assert child.returncode == 0 and lines, child.stdout[-3000:] + child.stderr[-3000:]
    return {
        name: subprocess.CompletedProcess(
            ENV_ARGV.get(name, ["env"]), run["status"], run["stdout"], run["stderr"]
        )
        for name, run in json.loads(lines[-1][len("RESULTS ") :]).items()
    }


def test_env_names_no_strategy_auto_strategy_refuses_and_exits_1(
    env_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    # Before: exit 0 and "would build: OneDeviceStrategy", while auto_strategy() raised.
    result = env_runs["cluster-timeout-abc"]
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    out = result.stdout
    message = "TFDP_CLUSTER_TIMEOUT must be a number of seconds, but received"
    assert "- Environment check: 1 problem(s)" in out and message in out
    assert "- Strategy auto_strategy() would build: none, it raises here" in out
    assert "OneDeviceStrategy" not in out
    assert "- CPU devices (1)" in out  # the rest of the report is still there


def test_env_json_lists_the_problems_auto_strategy_raises(
    env_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = env_runs["collective-timeout-negative"]
    assert result.returncode == 1, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["strategy"] is None
    [problem] = report["environment_problems"]
    assert problem["variable"] == "TFDP_COLLECTIVE_TIMEOUT"
    assert problem["message"].startswith("TFDP_COLLECTIVE_TIMEOUT=-1.0 must be a positive")
    assert problem["message"] in report["reason"]


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("abc", "must be a number of seconds, but received TFDP_EXIT_GRACE='abc'. Set it to e.g."),
        ("-1", "must be a number of seconds >= 0, but received TFDP_EXIT_GRACE='-1'. Set it to"),
        ("nan", "must be a number of seconds >= 0, but received TFDP_EXIT_GRACE='nan'."),
        ("inf", "must be a number of seconds >= 0, but received TFDP_EXIT_GRACE='inf'."),
    ],
)
def test_env_refuses_the_exit_grace_the_exit_guard_refuses(
    value: str, named: str, env_runs: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    # Before: "Environment check: OK", exit 0 and "would build: OneDeviceStrategy", while
    # auto_strategy() raised this message when it installed the exit guard.
    from tfdp_utils import _exit_guard

    with pytest.raises(ValueError) as raised:  # the guard's own reading of the variable
        _exit_guard.grace({"TFDP_EXIT_GRACE": value})
    message = str(raised.value)
    assert message.startswith("TFDP_EXIT_GRACE ") and named in message
    result = env_runs[f"exit-grace-{value}"]
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    out = result.stdout
    assert "- Environment check: 1 problem(s); auto_strategy() raises the first:" in out
    assert f"  - TFDP_EXIT_GRACE: {message}\n" in out
    assert "- Strategy auto_strategy() would build: none, it raises here" in out
    assert f"- Why: auto_strategy() raises ValueError here: {message}\n" in out


def test_env_accepts_an_empty_exit_grace(
    env_runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    # An empty value counts as unset, for the guard (its default backstop) and for the check.
    result = env_runs["exit-grace-empty"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "- Environment check: OK" in result.stdout
    assert "- Strategy auto_strategy() would build: OneDeviceStrategy" in result.stdout


def test_env_prints_what_it_knows_before_importing_tensorflow(tmp_path: Path) -> None:
    # A stand-in TensorFlow that says when it is imported: the facts come out before it.
    (tmp_path / "tensorflow.py").write_text(
        "import sys\nprint('IMPORTING TENSORFLOW', flush=True)\nraise ImportError('stand-in')\n"
    )
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from tfdp_utils import cli\n"
        "raise SystemExit(cli.main(['env']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "TFDP_STRATEGY": "nonsense"},
    )
    out = result.stdout
    assert result.returncode == 1, result.stderr[-3000:]
    assert "IMPORTING TENSORFLOW" in out
    before = out[: out.index("IMPORTING TENSORFLOW")]
    for line in ("- Python:", "- Cluster: none", "- $TFDP_STRATEGY: nonsense"):
        assert line in before, out
    assert "TFDP_STRATEGY='nonsense' is not a strategy choice" in before
    # Without TensorFlow, the environment's problem is still the reason given (as
    # auto_strategy() checks the environment before it imports TensorFlow).
    assert "- Why: auto_strategy() raises ValueError here: TFDP_STRATEGY='nonsense'" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--log-dir", "{file}/logs"],
        ["demo", "--log-dir", "{file}"],
        ["data-service", "dispatcher", "--port", "0", "--work-dir", "{file}/journal"],
    ],
)
def test_a_path_argument_that_cannot_be_a_directory_is_one_line_before_any_work(
    argv: list[str], tmp_path: Path
) -> None:
    # Before: demo failed after training had started; the dispatcher after ~25 s of retries.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = [arg.format(file=blocker) for arg in argv]
    # A stand-in TensorFlow that says so when imported: the refusal must come before it.
    stand_in = tmp_path / "stand-in"
    stand_in.mkdir()
    (stand_in / "tensorflow.py").write_text(
        "print('IMPORTING TENSORFLOW', flush=True)\nraise ImportError('stand-in')\n"
    )
    result = run_cli(*args, env={"PYTHONPATH": str(stand_in)}, timeout=120)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"{args[-2]} must be a directory" in errors[0], result.stderr
    assert "IMPORTING TENSORFLOW" not in result.stdout


@pytest.mark.parametrize("argv", [["--help"], ["env"], ["report", "{logs}"]])
def test_a_closed_pipe_ends_quietly(argv: list[str], logs: Path) -> None:
    # `tfdp-utils report LOGDIR | head -1` ended in a BrokenPipeError traceback.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    process = subprocess.Popen(
        [*CLI, *(arg.format(logs=logs) for arg in argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
        env=env,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader goes away before the first line is written
    try:
        with process.stderr:
            err = process.stderr.read()
        code = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert "Traceback" not in err and "BrokenPipeError" not in err, err[-3000:]
    # cli.main ends any command this way (141, as a command stopped by SIGPIPE); argparse's
    # --help ends with its usual status.
    assert code == (0 if argv == ["--help"] else cli.EXIT_CLOSED_PIPE), err[-3000:]
