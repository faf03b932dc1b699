"""Child Python processes forked from one that has already imported TensorFlow.

A plain module (imported through ``support.processes``); importing it imports no TensorFlow.

``import tensorflow`` costs about 5 s of CPU in every fresh process, most of what a short test
job costs (a stopped preemption job: 5.9 s in all). A *preloader* is one child of the test
process that imports numpy and TensorFlow (which brings the Keras that
``TF_USE_LEGACY_KERAS`` selects) once, then forks one process per job on request. Each job is
still a process of its own: its own pid, TensorFlow runtime, devices, cluster, signal handlers,
exit status, and stdout and stderr files; it starts after the import instead of before it.
Nothing of tfdp_utils is imported before the fork, so the package's import-time state (the
process start time goodput counts from) is the job's own.

In the job, as in ``python -c CODE ARGS``: ``sys.argv`` is ``["-c", *ARGS]``, the code runs
as a fresh ``__main__``, its environment and working folder are the ones asked for, and
its end is Python's own exit: ``SystemExit`` carries the child out of the preloader's loop
with the code's status (1 and a traceback for an uncaught exception), and Python joins the
non-daemon threads, runs the ``atexit`` handlers and tears down the interpreter and TensorFlow,
where a process can still abort as a fresh one would (only Ctrl-C's end skips the teardown).
The variables TensorFlow reads at import (:data:`IMPORT_TIME`) are set before the preloader's
import: a job that sets other values gets a preloader of its own.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

IMPORT_TIME = (
    "TF_USE_LEGACY_KERAS",
    "TF_CPP_MIN_LOG_LEVEL",
    "TF_ENABLE_ONEDNN_OPTS",
    "KERAS_BACKEND",
    "CUDA_VISIBLE_DEVICES",
    "PYTHONPATH",
)
"""Variables read while Python starts or TensorFlow is imported: a preloader per set of values."""

START_TIMEOUT = 120.0
"""Seconds the preloader may take to import TensorFlow, or to answer a request to fork."""

PRELOADER = r"""
import atexit, json, os, select, signal, sys, threading, traceback, types
import numpy
import tensorflow

children = set()


def job(request):  # in the forked child: ends the process through Python's own exit
    status = 1
    try:
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["out"], os.O_WRONLY),
                                (2, request["err"], os.O_WRONLY)):
            opened = os.open(path, flags | (os.O_APPEND if fd else 0))
            os.dup2(opened, fd)
            os.close(opened)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["-c", *request["args"]]
        numpy.random.seed()  # a fresh process's unseeded draws, not the preloader's
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
    except BaseException:
        traceback.print_exc()
        os._exit(status)
    try:
        exec(compile(request["code"], "<string>", "exec"), main.__dict__)
    except SystemExit:
        raise  # Python ends the process with its status, as after `python -c`
    except BaseException as error:
        error.with_traceback(error.__traceback__.tb_next)  # from the job's frame on
        # As Python's top level does with an uncaught error (the exit guard and the exit
        # barrier read sys.last_*), then its hook prints it.
        sys.last_type, sys.last_value, sys.last_traceback = type(error), error, error.__traceback__
        sys.excepthook(type(error), error, error.__traceback__)
        if isinstance(error, KeyboardInterrupt):  # as Python: ended by SIGINT after its exit
            threading._shutdown()  # (its teardown skipped: the Ctrl-C tests start python -c)
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        raise SystemExit(1) from None
    # The code's end: SystemExit carries the child out of the preloader's loop to Python's own
    # exit (non-daemon threads joined, atexit, then the interpreter's and TensorFlow's
    # teardown, where a process can still abort), as a fresh `python -c` ends.
    raise SystemExit(0)


def reply(line):
    os.write(1, (line + "\n").encode())


def handle(request):
    if request["op"] == "signal":
        if request["pid"] in children:  # never a pid already reaped (and maybe reused)
            os.kill(request["pid"], request["signal"])
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        job(request)
    children.add(pid)
    reply(f"started {pid}")


def reap():
    while children:
        pid, status, usage = os.wait4(-1, os.WNOHANG)
        if pid == 0:
            return
        children.discard(pid)
        cpu = usage.ru_utime + usage.ru_stime
        reply(f"exit {pid} {os.waitstatus_to_exitcode(status)} {cpu:.3f}")


reply("ready")
pending = b""
while True:
    if select.select([0], [], [], 0.05)[0]:
        chunk = os.read(0, 1 << 20)
        if not chunk:  # the test process closed the pipe: it ended, so do its jobs
            break
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            handle(json.loads(line))
    reap()
for pid in children:
    os.kill(pid, signal.SIGKILL)
"""


class Preloader:
    """One preloading process: forks jobs on request and reports how each one ended."""

    def __init__(self, env: Mapping[str, str], cwd: Path) -> None:
        self._log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self.popen = subprocess.Popen(
            [sys.executable, "-c", PRELOADER],
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=str(cwd),
        )
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self._in, self._out = self.popen.stdin, self.popen.stdout.fileno()
        os.set_blocking(self._out, False)
        self._pending = b""
        self.exits: dict[int, int] = {}
        self._started: list[int] = []
        self._wait_for("ready")

    def _lines(self, timeout: float) -> list[str]:
        """The preloader's complete lines so far, after waiting up to ``timeout`` for one."""
        if select.select([self._out], [], [], timeout)[0]:
            try:
                chunk = os.read(self._out, 1 << 16)
            except BlockingIOError:  # woken, but nothing to read after all
                chunk = None
            if chunk == b"":
                raise RuntimeError(f"the preloader ended:\n{self.log()}")
            self._pending += chunk or b""
        *lines, self._pending = self._pending.split(b"\n")
        return [line.decode() for line in lines]

    def _take(self, lines: list[str]) -> None:
        for line in lines:
            word, *rest = line.split()
            if word == "exit":
                self.exits[int(rest[0])] = int(rest[1])
                JOBS_CPU["seconds"] += float(rest[2])
            elif word == "started":
                self._started.append(int(rest[0]))

    def _wait_for(self, word: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            lines = self._lines(0.5)
            if word in lines:
                self._take([line for line in lines if line != word])
                return
            self._take(lines)
            if word == "started" and self._started:
                return
        said = f"the preloader did not say {word!r} within {START_TIMEOUT} s"
        raise TimeoutError(f"{said}:\n{self.log()}")

    def log(self) -> str:
        fd = self._log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")[-4000:]

    def _send(self, request: dict[str, object]) -> None:
        self._in.write(json.dumps(request).encode() + b"\n")
        self._in.flush()

    def fork(
        self, code: str, args: list[str], env: Mapping[str, str], cwd: Path, out: str, err: str
    ) -> int:
        """Fork a job writing to the files ``out`` and ``err``; its pid."""
        request = {"code": code, "args": args, "env": dict(env), "cwd": str(cwd)}
        self._send({"op": "fork", **request, "out": out, "err": err})
        self._wait_for("started")
        return self._started.pop(0)

    def returncode(self, pid: int) -> int | None:
        """The job's exit status (negative: the signal that ended it), or None while it runs."""
        if pid not in self.exits:
            self._take(self._lines(0))
        return self.exits.get(pid)

    def send_signal(self, pid: int, signum: int) -> None:
        self._send({"op": "signal", "pid": pid, "signal": int(signum)})

    def close(self) -> None:
        """Close the preloader's input (it kills its jobs still running and ends), bounded."""
        self._in.close()
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        assert self.popen.stdout is not None
        self.popen.stdout.close()
        self._log.close()


JOBS_CPU = {"seconds": 0.0}
"""CPU seconds (user + system) of the forked jobs seen ending so far (the suite's CPU record)."""

_PRELOADERS: dict[tuple[str | None, ...], Preloader] = {}


@atexit.register
def _close_all() -> None:
    """End every preloader with the test process: its jobs are killed when its input closes."""
    for found in _PRELOADERS.values():
        found.close()


def preloader(env: Mapping[str, str], cwd: Path) -> Preloader:
    """The preloader for ``env``'s import-time variables, started on first use."""
    key = tuple(env.get(name) for name in IMPORT_TIME)
    found = _PRELOADERS.get(key)
    if found is None or found.popen.poll() is not None:
        found = _PRELOADERS[key] = Preloader(env, cwd)
    return found


class ForkedPopen:
    """The part of ``subprocess.Popen`` that :class:`support.processes.Process` uses, for a
    job forked by a preloader."""

    def __init__(self, owner: Preloader, pid: int) -> None:
        self._owner, self.pid = owner, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._owner.returncode(self.pid)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            self._owner.send_signal(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"forked job {self.pid} still running after {timeout} s")
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode
