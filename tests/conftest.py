"""Shared test setup: one TensorFlow per test process, with 4 logical CPU devices.

Logical devices must be configured before TensorFlow initialises its runtime, so this runs
at import, before any test module. Tests that need another device layout (1 CPU, a cluster)
start a fresh subprocess with :func:`run_python`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
for _name in ("TF_CONFIG", "TFDP_STRATEGY", "TPU_NAME", "SLURM_PROCID", "TFDP_CLUSTER_TIMEOUT"):
    os.environ.pop(_name, None)

NUM_LOGICAL_CPUS = 4

import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(NUM_LOGICAL_CPUS)]
)

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_python(
    code: str,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 180,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh Python process (own TensorFlow runtime) with a hard timeout."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(cwd or REPO),
        check=False,
    )


@pytest.fixture
def logical_cpus() -> int:
    return NUM_LOGICAL_CPUS


@pytest.fixture(autouse=True)
def _fresh_collective_keys():
    # Several MirroredStrategy objects over different devices in one process reuse collective
    # group keys and abort ("joining a group with size 4, but that group has size 2"); TF's
    # own strategy_combinations.py moves the key base the same way between tests.
    tf.distribute.MirroredStrategy._collective_key_base += 100_000
    yield


def start_python(code: str, *, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """Start ``code`` in a fresh Python process; pair with :func:`wait_all`."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    full_env.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
    )


def wait_all(
    processes: list[subprocess.Popen[str]], *, timeout: float
) -> list[tuple[int, str, str]]:
    """Wait for every process within one shared deadline; kill them all if it passes.

    Returns ``(returncode, stdout, stderr)`` per process. Raises ``TimeoutError`` (with the
    processes' output) when the deadline passes, after killing every process.
    """
    import time

    deadline = time.monotonic() + timeout
    results: list[tuple[int, str, str]] = []
    try:
        for process in processes:
            remaining = max(deadline - time.monotonic(), 0.1)
            out, err = process.communicate(timeout=remaining)
            results.append((process.returncode, out, err))
    except subprocess.TimeoutExpired:
        outputs = []
        for process in processes:
            process.kill()
            out, err = process.communicate()
            outputs.append(f"--- pid {process.pid} rc={process.returncode}\n{out}\n{err[-3000:]}")
        raise TimeoutError(
            f"processes did not finish within {timeout} s:\n" + "\n".join(outputs)
        ) from None
    return results


def tf_config(ports: list[int], index: int, task_type: str = "worker") -> str:
    """TF_CONFIG for a localhost cluster of workers on ``ports``."""
    import json

    return json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": task_type, "index": index},
        }
    )
