"""pytest's hooks and fixtures for the suite; importing this module imports no TensorFlow.

tests/ mirrors the package: ``tests/<pillar>/`` holds the tests of ``tfdp_utils/<pillar>/``.
A test module marked ``pytestmark = pytest.mark.pure`` needs no TensorFlow and never imports it
(``pytest -m pure`` runs them all in seconds, and ``test_runs_without_tensorflow`` runs them
again with TensorFlow refused). Every other test module gets one TensorFlow per test process
with 4 logical CPU devices: logical devices must be configured before TensorFlow initialises its
runtime, so :func:`pytest_collectstart` configures them before such a module is imported.
Helpers (child processes, ports, TF_CONFIG) live in the plain module ``support.processes``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
from support.processes import NUM_LOGICAL_CPUS, is_pure_module

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
for _name in ("TF_CONFIG", "TFDP_STRATEGY", "TPU_NAME", "SLURM_PROCID", "TFDP_CLUSTER_TIMEOUT"):
    os.environ.pop(_name, None)


def configure_tensorflow() -> None:
    """Import TensorFlow and split the CPU into ``NUM_LOGICAL_CPUS`` devices (once)."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    if len(tf.config.get_logical_device_configuration(cpu) or []) != NUM_LOGICAL_CPUS:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(NUM_LOGICAL_CPUS)]
        )


def pytest_collectstart(collector: pytest.Collector) -> None:
    # Runs before a test module is imported: every module not marked pure may use TensorFlow.
    if isinstance(collector, pytest.Module) and not is_pure_module(collector.path):
        configure_tensorflow()


@pytest.fixture
def logical_cpus() -> int:
    return NUM_LOGICAL_CPUS


@pytest.fixture(autouse=True)
def _fresh_collective_keys():
    # Several MirroredStrategy objects over different devices in one process reuse collective
    # group keys and abort ("joining a group with size 4, but that group has size 2"); TF's
    # own strategy_combinations.py moves the key base the same way between tests.
    # Moved after each test too: a module-scoped strategy fixture is created before the next
    # test's own move, and must not share the keys of the previous test's strategies.
    if "tensorflow" in sys.modules:
        fresh_collective_keys()
    yield
    if "tensorflow" in sys.modules:
        fresh_collective_keys()


def fresh_collective_keys() -> None:
    import tensorflow as tf

    tf.distribute.MirroredStrategy._collective_key_base += 100_000


@pytest.fixture(scope="session")
def two_worker_phases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 2-worker cluster of this pass's Keras flavour runs every module's phases once."""
    from support import two_worker_cluster

    return two_worker_cluster.launch(tmp_path_factory.mktemp("two-worker-phases"))


# Each test file's seconds (setup, call and teardown of its tests), written at the session's end
# to the JSON file named by TFDP_TEST_TIMES: scripts/test records them to balance its lanes.
_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


# With TFDP_TEST_CPU (a folder), each test's CPU seconds as well: the test process's own, its
# ended child processes' and the preloaded jobs' (support.preloaded), one JSON line per test in
# a file per test process (scripts/suite_cpu.py adds them up): the suite's cores are its bound.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    folder = os.environ.get("TFDP_TEST_CPU")
    if not folder:
        yield
        return
    import json
    import resource
    import time

    from support.preloaded import JOBS_CPU

    def now() -> tuple[float, float, float, float]:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (
            time.monotonic(),
            time.process_time(),
            children.ru_utime + children.ru_stime,
            JOBS_CPU["seconds"],
        )

    before = now()
    yield
    after = now()
    wall, own, children, jobs = (round(b - a, 3) for a, b in zip(before, after, strict=True))
    record = {
        "test": item.nodeid,
        "flavour": (
            "pure"  # the pure pass refuses TensorFlow (support.no_tensorflow)
            if "tensorflow" not in sys.modules
            else "tf_keras"
            if os.environ.get("TF_USE_LEGACY_KERAS") == "1"
            else "keras3"
        ),
        "wall": wall,
        "own": own,
        "children": children,
        "jobs": jobs,
    }
    with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as handle:
        handle.write(json.dumps(record) + "\n")


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("TFDP_TEST_TIMES")
    if target:
        import json

        with open(target, "w") as handle:
            json.dump({path: round(s, 1) for path, s in sorted(_file_seconds.items())}, handle)
