"""The pure layer never imports TensorFlow: each module is imported with TensorFlow blocked.

A meta-path finder refuses ``tensorflow``, ``keras`` and ``tf_keras`` in a fresh process, as
on a machine where none is installed; importing a pure module (and ``import tfdp_utils``
itself) must still work, and nothing TensorFlow-related may end up in ``sys.modules``.
"""

from __future__ import annotations

import json

import pytest
from support.processes import run_python

PURE_MODULES = (
    "tfdp_utils",
    "tfdp_utils._validate",
    "tfdp_utils._variables",
    "tfdp_utils._versions",
    "tfdp_utils._lazy",
    "tfdp_utils.errors",
    "tfdp_utils.cluster",
    "tfdp_utils.cluster._slurm",
    "tfdp_utils.cluster._environments",
    "tfdp_utils.throughput",
    "tfdp_utils.strategy",
    "tfdp_utils.training",
    "tfdp_utils.doctor",
    "tfdp_utils.cluster._config",
    "tfdp_utils.cluster._rendezvous",
    "tfdp_utils.cluster._topology",
    "tfdp_utils.throughput._meter",
    "tfdp_utils.throughput._tags",
    "tfdp_utils.throughput._counts",
    "tfdp_utils.throughput._input_wait",
    "tfdp_utils.throughput._report",
    "tfdp_utils.throughput._events",
    "tfdp_utils.throughput._summary",
    "tfdp_utils.throughput._plot",
    "tfdp_utils.throughput._restarts",
    "tfdp_utils.throughput._count_source",
    "tfdp_utils._dataset_info",
    "tfdp_utils._checkpoint_files",
    "tfdp_utils.strategy._resuming",
    "tfdp_utils.cli",
    "tfdp_utils._waiting",
    "tfdp_utils.strategy._xla",
    "tfdp_utils.strategy._stuck",
    "tfdp_utils.strategy._phase_board",
    "tfdp_utils.strategy._phase_tracker",
    "tfdp_utils._known_issues",
    "tfdp_utils.doctor._command",
    "tfdp_utils.doctor._check",
    # The pure parts of the data package, and the package itself (its builders are lazy).
    "tfdp_utils.data",
    "tfdp_utils.data._sharding",
    "tfdp_utils.data._epochs",
    "tfdp_utils.data._diagnostics",
    "tfdp_utils.data._input_report",
    "tfdp_utils.data._input_figures",
    "tfdp_utils.data._input_advice",
    "tfdp_utils.data.service._watch",
    # The pure parts of PreemptionCheckpoint.
    "tfdp_utils.preemption._position",
    "tfdp_utils.preemption._elastic",
    "tfdp_utils.preemption._mismatch",
    "tfdp_utils.preemption._arguments",
    "tfdp_utils.preemption._run",
    # The pure part of DivergenceGuard.
    "tfdp_utils.training._divergence_report",
    # Glue that imports TensorFlow only when first used.
    "tfdp_utils.strategy._choice",
    "tfdp_utils.strategy._build",
    "tfdp_utils.strategy._detect",
)

BLOCKER = """
import importlib.abc, json, sys

BLOCKED = ("tensorflow", "keras", "tf_keras")

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, Blocker())
results = {}
for name in json.loads(sys.argv[1]):
    try:
        __import__(name)
        results[name] = "ok"
    except Exception as exc:
        results[name] = f"{type(exc).__name__}: {exc}"
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps({"results": results, "leaked": leaked}))
"""


@pytest.mark.slow
def test_pure_modules_import_without_tensorflow() -> None:
    result = run_python(
        f"import sys; sys.argv[1:] = [{json.dumps(json.dumps(PURE_MODULES))}]\n{BLOCKER}",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    failures = {name: why for name, why in report["results"].items() if why != "ok"}
    assert failures == {}, failures
    assert report["leaked"] == []
