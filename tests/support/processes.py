"""Helpers shared by the tests: child processes with hard timeouts, ports, TF_CONFIG.

A plain module (imported as ``support.processes``), not conftest: conftest holds pytest's hooks
and fixtures only. Importing this module imports no TensorFlow.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

from support.preloaded import ForkedPopen, preloader

NUM_LOGICAL_CPUS = 4
"""Logical CPU devices every TensorFlow test process gets (conftest configures them)."""

REPO = Path(__file__).resolve().parents[2]

PURE_MARK = "pytestmark = pytest.mark.pure"
"""The line that marks a test module pure: it never imports TensorFlow (tests/conftest.py)."""


def is_pure_module(path: Path) -> bool:
    """Whether the test module at ``path`` is marked pure (read from its text, before import)."""
    return path.suffix == ".py" and PURE_MARK in path.read_text()


def pure_modules() -> list[Path]:
    """Every pure test module under tests/."""
    return sorted(p for p in (REPO / "tests").rglob("test_*.py") if is_pure_module(p))


_GIVEN_PORTS: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and never one this process
    was given before: the kernel may hand a port just released out again, and two of them in
    one TF_CONFIG make an invalid cluster ("address ... appears twice")."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port


def _child_env(env: Mapping[str, str | None] | None) -> dict[str, str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)  # None removes the variable
        else:
            full_env[key] = value
    return full_env


def run_python(
    code: str,
    *,
    env: Mapping[str, str | None] | None = None,
    timeout: float = 180,
    cwd: Path | None = None,
    args: Sequence[str] = (),
    preloaded: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (with ``args`` in ``sys.argv``) in a fresh Python process (own TensorFlow
    runtime) with a hard timeout. ``preloaded``: forked after TensorFlow's import, as
    :func:`start_python`'s (a process that imports TensorFlow and whose checks do not depend on
    when it did); past the timeout it is killed and ``subprocess.TimeoutExpired`` raised, as
    without."""
    if preloaded:
        process = start_python(code, env=env, args=args, cwd=cwd, preloaded=True)
        argv = [sys.executable, "-c", "...", *args]
        try:
            [outcome] = wait_all([process], timeout=timeout, check=False)
        except TimeoutError as error:
            raise subprocess.TimeoutExpired(argv, timeout, output=str(error)) from None
        return subprocess.CompletedProcess(argv, *outcome)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=_child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(cwd or REPO),
        check=False,
    )


class Process:
    """A child Python process whose stdout and stderr go to files, never to pipes.

    A pipe that nobody reads fills up and blocks the child; files never do, so any number of
    processes can be polled together and read at any time (:meth:`stdout`).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str | None] | None = None,
        cwd: Path | None = None,
        preloaded: bool = False,
    ) -> None:
        # Append mode: the child writes at the end whatever offset this process reads at.
        self._out: IO[bytes] = tempfile.NamedTemporaryFile(mode="a+b")  # noqa: SIM115
        self._err: IO[bytes] = tempfile.NamedTemporaryFile(mode="a+b")  # noqa: SIM115
        self.popen: subprocess.Popen[bytes] | ForkedPopen
        if preloaded:  # argv is [python, "-c", code, *args]
            full_env, folder = _child_env(env), cwd or REPO
            owner = preloader(full_env, folder)
            code, args = argv[2], list(argv[3:])
            pid = owner.fork(code, args, full_env, folder, self._out.name, self._err.name)
            self.popen = ForkedPopen(owner, pid)
        else:
            self.popen = subprocess.Popen(
                list(argv),
                env=_child_env(env),
                stdin=subprocess.DEVNULL,
                stdout=self._out,
                stderr=self._err,
                cwd=str(cwd or REPO),
            )
        self.pid = self.popen.pid

    @staticmethod
    def _read(file: IO[bytes]) -> str:
        fd = file.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def stdout(self) -> str:
        return self._read(self._out)

    def stderr(self) -> str:
        return self._read(self._err)

    def poll(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()

    def close(self) -> None:
        self.kill()
        self._out.close()
        self._err.close()

    def tail(self, chars: int = 4000) -> str:
        return (
            f"--- pid {self.pid} rc={self.popen.returncode}\n"
            f"[stdout]\n{self.stdout()[-chars:]}\n[stderr]\n{self.stderr()[-chars:]}"
        )


class Outcome(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def start_python(
    code: str,
    *,
    env: Mapping[str, str | None] | None = None,
    args: Sequence[str] = (),
    cwd: Path | None = None,
    preloaded: bool = False,
) -> Process:
    """Start ``code`` in a fresh Python process; pair with :func:`wait_all`.

    ``preloaded``: forked from a process that has imported TensorFlow already
    (:mod:`support.preloaded`), which saves the job about 5 s of CPU; for a job that imports
    TensorFlow anyway and whose checks do not depend on when it did."""
    argv = [sys.executable, "-c", textwrap.dedent(code), *args]
    return Process(argv, env=env, cwd=cwd, preloaded=preloaded)


def _tails(processes: Sequence[Process]) -> str:
    return "\n".join(process.tail() for process in processes)


def wait_all(processes: Sequence[Process], *, timeout: float, check: bool = True) -> list[Outcome]:
    """Wait for every process within one shared deadline, polling them all together.

    Returns ``(returncode, stdout, stderr)`` per process. With ``check`` (fail fast), the first
    process that exits non-zero gets every other one killed at once (they would wait for it in
    a collective) and raises ``AssertionError`` with every process's output tail. When the
    deadline passes, kills every process and raises ``TimeoutError`` with their outputs.
    """
    deadline = time.monotonic() + timeout
    try:
        while True:
            codes = [process.poll() for process in processes]
            if check and any(code not in (None, 0) for code in codes):
                for process in processes:
                    process.kill()
                raise AssertionError(
                    f"a process failed (return codes {codes}); killed the others:\n"
                    + _tails(processes)
                )
            if all(code is not None for code in codes):
                break
            if time.monotonic() > deadline:
                for process in processes:
                    process.kill()
                raise TimeoutError(
                    f"processes did not finish within {timeout} s:\n" + _tails(processes)
                )
            time.sleep(0.1)
        return [
            Outcome(process.popen.returncode, process.stdout(), process.stderr())
            for process in processes
        ]
    finally:
        for process in processes:
            process.close()


def result_line(outcome: Outcome, tag: str = "RESULT") -> Any:
    """The JSON after the last ``TAG `` line of a process's stdout."""
    lines = [line for line in outcome.stdout.splitlines() if line.startswith(tag + " ")]
    assert lines, (
        f"no {tag} line (rc={outcome.returncode}):\n"
        f"{outcome.stdout[-3000:]}\n{outcome.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len(tag) + 1 :])


def tf_config(ports: list[int], index: int, task_type: str = "worker") -> str:
    """TF_CONFIG for a localhost cluster of workers on ``ports``."""
    return json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": task_type, "index": index},
        }
    )
