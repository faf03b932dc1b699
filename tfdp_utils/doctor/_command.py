"""``tfdp-utils doctor``: is this installation safe for data-parallel training? Prove it.

Three sections, one verdict per line, as a table a user can paste into a bug report:

- **versions**: Python, TensorFlow and which flavour packages are installed (two at once is
  flagged), Keras, tf_keras, TensorBoard, Ray: read with ``importlib.metadata``, without
  importing TensorFlow; the environment variables ``auto_strategy()`` reads, checked by the
  same function it calls (a FAIL line per problem, and then no self-tests); then, from
  TensorFlow itself, its CUDA/cuDNN build and devices.
- **known issues**: :data:`tfdp_utils._known_issues.KNOWN_ISSUES` marked affected / fixed /
  worked around for the installed versions.
- **self-tests**: 2 logical CPU replicas against one device (with and without
  ``steps_per_execution``), the builder's exactly-once, the throughput logger's counts;
  ``--cluster`` adds a 2-worker localhost MultiWorkerMirroredStrategy job, ``--gpu`` /
  ``--tpu`` the same on the accelerators present.

The TensorFlow side runs in a child process (:mod:`tfdp_utils.doctor._checks`) that configures
its devices before TensorFlow starts, under a hard time bound. The exit code is 1 when a
check fails (FAIL), else 0; WARN lines do not change it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tfdp_utils._validate import positive_float
from tfdp_utils._versions import (
    KERAS_DISTRIBUTIONS,
    TF_KERAS_DISTRIBUTIONS,
    installed_flavours,
    installed_of,
    installed_version,
    required_keras,
)
from tfdp_utils._waiting import Deadline
from tfdp_utils.doctor._check import Check

DEFAULT_TIMEOUT = 180.0
"""Seconds the TensorFlow-side checks may take in all (``--timeout``)."""

DEFAULT_CLUSTER_JOB_TIMEOUT = 120.0
"""Seconds the doctor's whole 2-worker localhost job may take (``--cluster``); not the
peer-rendezvous bound of ``auto_strategy(cluster_timeout=...)``."""


def flavour_check(flavours: dict[str, str]) -> Check:
    """One line on the TensorFlow packages: none (FAIL), one (INFO), several (WARN)."""
    listed = " + ".join(f"{name} {version}" for name, version in flavours.items())
    if not flavours:
        return Check(
            "versions", "TensorFlow package", "FAIL", "none installed: pip install tensorflow"
        )
    if len(flavours) == 1:
        return Check("versions", "TensorFlow package", "INFO", listed)
    return Check(
        "versions",
        "TensorFlow package",
        "WARN",
        f"{listed}: {len(flavours)} flavours installed at once, one overwrites the other's "
        "files (tf-keras pulls in `tensorflow`; install it with pip install --no-deps)",
    )


def keras_check(label: str, found: dict[str, str], required: str | None = None) -> Check:
    """One line on the distributions that install one Keras package (``keras`` and
    ``keras-nightly``, or tf_keras's two): none or one (INFO), several (WARN, as
    :func:`flavour_check` for TensorFlow): they write the same files, the last one wins.

    Args:
        label: the line's name, ``"Keras"`` or ``"tf_keras"``.
        found: the installed distributions and their versions (``installed_of``).
        required: the one the installed TensorFlow requires (:func:`required_keras`), kept
            by the fix (:func:`tfdp_utils._versions.required_keras`), or None when unknown.
    """
    if not found:
        return Check("versions", label, "INFO", "not installed")
    listed = " + ".join(f"{name} {version}" for name, version in found.items())
    if len(found) == 1:
        name, version = next(iter(found.items()))
        plain = name in ("keras", "tf-keras")  # a -nightly one is named
        return Check("versions", label, "INFO", version if plain else listed)
    keep = required if required in found else None
    fix = (
        f"your TensorFlow requires {keep}: pip uninstall -y "
        f"{' '.join(name for name in found if name != keep)} && pip install --force-reinstall "
        f'--no-deps "{keep}=={found[keep]}"'
        if keep
        else "uninstall all of them, then reinstall (--force-reinstall --no-deps) the one your "
        "TensorFlow requires (pip show tensorflow lists it)"
    )
    return Check(
        "versions",
        label,
        "WARN",
        f"{listed}: {len(found)} distributions of one package installed at once, the later "
        f"overwrote the other's files; {fix}",
    )


ENVIRONMENT_CHECK = "environment variables"
"""The name of the doctor's line(s) on the variables ``auto_strategy()`` reads."""


def environment_checks(environ: Mapping[str, str] | None = None) -> list[Check]:
    """The variables ``auto_strategy()`` reads, checked as it checks them: one PASS line, or a
    FAIL line per problem with the message ``auto_strategy()`` raises and ``env`` prints."""
    from tfdp_utils.strategy._environment_check import CHECKED, check_environment

    problems = check_environment(environ)
    if not problems:
        return [Check("versions", ENVIRONMENT_CHECK, "PASS", f"valid: {', '.join(CHECKED)}")]
    return [
        Check("versions", f"{ENVIRONMENT_CHECK}: {problem.variable}", "FAIL", problem.message)
        for problem in problems
    ]


def _skipped_self_tests() -> Check:
    return Check(
        "self-tests",
        "TensorFlow checks",
        "SKIP",
        "not run: auto_strategy() refuses this environment (the FAIL above), and the "
        "self-tests would run TensorFlow under it. Fix or unset that variable, then run "
        "tfdp-utils doctor again.",
    )


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def version_checks() -> list[Check]:
    """Versions of Python and the packages that matter, without importing TensorFlow."""
    from tfdp_utils import __version__

    flavours = installed_flavours()
    checks = [
        Check("versions", "tfdp-utils", "INFO", __version__),
        Check("versions", "Python", "INFO", f"{platform.python_version()} ({platform.platform()})"),
        flavour_check(flavours),
    ]
    legacy = os.environ.get("TF_USE_LEGACY_KERAS", "")
    tensorflow = next(iter(flavours), None)
    required = required_keras(tensorflow) if tensorflow else None
    checks.append(keras_check("Keras", installed_of(KERAS_DISTRIBUTIONS), required))
    tf_kerases = installed_of(TF_KERAS_DISTRIBUTIONS)
    checks.append(keras_check("tf_keras", tf_kerases))
    tf_version = next(iter(flavours.values()), None)
    tf_keras = next(iter(tf_kerases.values()), None)
    if tf_keras and tf_version and _minor(tf_keras) != _minor(tf_version):
        checks.append(
            Check(
                "versions",
                "tf_keras matches TensorFlow",
                "WARN",
                f"tf-keras {tf_keras} with TensorFlow {tf_version}: install tf-keras "
                f"~={_minor(tf_version)}.0",
            )
        )
    checks.append(Check("versions", "TF_USE_LEGACY_KERAS", "INFO", legacy or "unset"))
    for label, distribution in (("TensorBoard", "tensorboard"), ("Ray", "ray")):
        checks.append(
            Check("versions", label, "INFO", installed_version(distribution) or "not installed")
        )
    checks.append(tensorboard_command_check())
    return checks


def tensorboard_command_check(path: str | None = None) -> Check:
    """Whether the ``tensorboard`` command is on ``path`` (``PATH`` by default), and how else
    to view ThroughputLogger's logs (TensorFlow 2.21 no longer installs TensorBoard)."""
    found = shutil.which("tensorboard", path=path)
    if found:
        return Check("versions", "tensorboard command", "INFO", f"{found} --logdir LOGDIR")
    package = installed_version("tensorboard")
    install = (
        f"the tensorboard {package} package is installed but its command is not on PATH: run "
        f"'{sys.executable} -m tensorboard.main --logdir LOGDIR'"
        if package
        else "not installed (TensorFlow >= 2.21 does not install it): pip install tensorboard"
    )
    return Check(
        "versions",
        "tensorboard command",
        "WARN",
        f"not on PATH; {install}, or summarise the logs with 'tfdp-utils report LOGDIR' "
        "(its --plot needs pip install 'tfdp-utils[report]')",
    )


# ------------------------------------------------------------------------ child processes


def _read_checks(path: Path) -> list[Check]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [Check(**json.loads(line)) for line in lines if line.strip()]


def _tail(path: Path, limit: int = 600) -> str:
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    lines = [ln for ln in text.splitlines() if ln.strip() and "WARNING: All log" not in ln]
    return " | ".join(lines[-3:])[-limit:]


def _start(argv: list[str], folder: Path, name: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start ``python -m tfdp_utils.doctor._checks argv``; output to files in ``folder``."""
    env = {**env, "TF_CPP_MIN_LOG_LEVEL": env.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    with open(folder / f"{name}.out", "w") as out, open(folder / f"{name}.err", "w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "tfdp_utils.doctor._checks", *argv],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
        )


def wait_all(processes: Sequence[subprocess.Popen[str]], timeout: float) -> str | None:
    """Wait for every process; on the first failure or at ``timeout``, kill them all.

    Returns:
        None when all exited 0, else what went wrong ("worker 1 exited with 3", "timeout").
    """
    deadline = Deadline(timeout)
    problem = None
    while problem is None:
        codes = [p.poll() for p in processes]
        failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            problem = f"process {failed[0]} exited with {codes[failed[0]]}"
        elif all(code == 0 for code in codes):
            return None
        elif deadline.passed():
            problem = f"still running after the {timeout:g} s bound"
        else:
            time.sleep(0.1)
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()
    return problem


def _free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def run_cluster(folder: Path, timeout: float) -> tuple[str | None, Check | None]:
    """The 2-worker localhost MultiWorkerMirroredStrategy job; (chief's result, failure)."""
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    result = folder / "cluster.json"
    workers = []
    for index in range(2):
        config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        env = {**os.environ, "TF_CONFIG": config}
        argv = ["--cluster-worker", "--out", str(result)]
        workers.append(_start(argv, folder, f"worker{index}", env))
    problem = wait_all(workers, timeout)
    if problem is None and result.exists():
        return str(result), None
    detail = f"{problem or 'no result written'}: {_tail(folder / 'worker0.err')}"
    name = "2 workers (MultiWorkerMirrored) = 1 device"
    return None, Check("self-tests", name, "FAIL", detail)


@dataclasses.dataclass(frozen=True)
class DoctorOptions:
    """What ``tfdp-utils doctor`` runs.

    Attributes:
        cluster: add the 2-worker localhost job. gpu / tpu: the self-tests on accelerators.
        timeout: bound in seconds on the TensorFlow-side checks together.
        cluster_timeout: bound in seconds on the 2-worker job.
    """

    cluster: bool = False
    gpu: bool = False
    tpu: bool = False
    timeout: float = DEFAULT_TIMEOUT
    cluster_timeout: float = DEFAULT_CLUSTER_JOB_TIMEOUT


def _tensorflow_checks(options: DoctorOptions, folder: Path) -> list[Check]:
    checks: list[Check] = []
    cluster_result = None
    if options.cluster:
        cluster_result, failure = run_cluster(folder, options.cluster_timeout)
        checks += [failure] if failure else []
    argv = ["--out", str(folder / "checks.jsonl")]
    argv += ["--gpu"] * options.gpu + ["--tpu"] * options.tpu
    argv += ["--cluster-result", cluster_result] if cluster_result else []
    child = _start(argv, folder, "checks", dict(os.environ))
    problem = wait_all([child], options.timeout)
    found = _read_checks(folder / "checks.jsonl")
    if problem is not None:
        last = found[-1].name if found else "start-up"
        detail = f"{problem}; last finished: {last}; {_tail(folder / 'checks.err')}"
        found.append(Check("self-tests", "TensorFlow checks", "FAIL", detail))
    return found + checks


def run_doctor(options: DoctorOptions | None = None, *, in_process: bool = False) -> list[Check]:
    """Every check ``tfdp-utils doctor`` prints, in order.

    Args:
        options: what to run. Defaults to `None` (``DoctorOptions()``).
        in_process: run the TensorFlow side in this process (its devices must already hold 2
            logical CPUs) instead of a child process. Defaults to `False`.

    Returns:
        The checks; :func:`exit_code` turns them into the command's exit code.
    """
    options = options or DoctorOptions()
    checks = version_checks()
    environment = environment_checks()
    checks += environment
    if exit_code(environment):
        # An environment auto_strategy() refuses: say so now, not after TensorFlow's import
        # (TensorFlow itself fails on a malformed TF_CONFIG, with a raw JSONDecodeError).
        return [*checks, _skipped_self_tests()]
    if in_process:
        from tfdp_utils.doctor import _checks as doctor_checks

        doctor_checks.run_checks(
            checks.append, gpu=options.gpu, tpu=options.tpu, cluster_result=None
        )
        return checks
    with tempfile.TemporaryDirectory(prefix="tfdp-doctor-") as folder:
        checks += _tensorflow_checks(options, Path(folder))
    order = {"versions": 0, "known issues": 1, "self-tests": 2}
    return sorted(checks, key=lambda c: order.get(c.section, 3))


def exit_code(checks: Sequence[Check]) -> int:
    """1 when any check failed, else 0."""
    return 1 if any(c.status == "FAIL" for c in checks) else 0


def format_table(checks: Sequence[Check]) -> str:
    """The checks as a plain-text table, one verdict per line, grouped by section."""
    width = max((len(c.name) for c in checks), default=10)
    lines = ["tfdp-utils doctor (paste this into bug reports)"]
    section = None
    for check in checks:
        if check.section != section:
            section = check.section
            lines += ["", section]
        took = f" ({check.seconds:.1f} s)" if check.seconds is not None else ""
        first, *more = f"{check.detail}{took}".splitlines() or [""]
        lines.append(f"  {check.status:<4}  {check.name:<{width}}  {first}")
        lines += [f"  {'':<4}  {'':<{width}}  {line}" for line in more]
    counts = {s: sum(c.status == s for c in checks) for s in ("FAIL", "WARN", "PASS", "SKIP")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    verdict = "FAILED" if exit_code(checks) else "OK"
    lines += ["", f"verdict: {verdict} ({summary})"]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the doctor's options to an argument parser."""
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--cluster", action="store_true", help="add a 2-worker localhost MultiWorkerMirrored run"
    )
    parser.add_argument("--gpu", action="store_true", help="run the self-tests on the GPUs too")
    parser.add_argument("--tpu", action="store_true", help="run the self-tests on a TPU too")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"bound on the TensorFlow checks, in seconds (default {DEFAULT_TIMEOUT:g})",
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Run the doctor from parsed arguments, print the table (or JSON), return the exit code."""
    timeout = positive_float(args.timeout, "--timeout", unit="number of seconds")
    options = DoctorOptions(cluster=args.cluster, gpu=args.gpu, tpu=args.tpu, timeout=timeout)
    checks = run_doctor(options)
    code = exit_code(checks)
    if args.json:
        print(json.dumps({"exit_code": code, "checks": [c.as_dict() for c in checks]}, indent=2))
    else:
        print(format_table(checks))
    return code
