"""scripts/compare_upstream.py: its scenarios are what they claim, and the committed table is the
committed measurement's. Pure: the script's parent imports no TensorFlow."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tfdp_utils.cluster import cluster_from_environment

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "compare_upstream", ROOT / "scripts" / "compare_upstream.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


script = _script()
PORTS = script.Ports(free=(23456, 23457), closed=23458, silent=23459)


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("tf_config_2workers", "TF_CONFIG"),
        ("slurm", "SLURM"),
        ("k8s_indexed_job", "Kubernetes Indexed Job"),
        ("k8s_jobset", "Kubernetes JobSet"),
    ],
)
def test_two_task_scenarios_are_2_worker_clusters_on_loopback(name: str, source: str) -> None:
    scenario = next(s for s in script.SCENARIOS if s.name == name)
    assert scenario.tasks == 2
    for index in range(2):
        config = cluster_from_environment(scenario.env(PORTS, index))
        assert config is not None
        assert config.source.startswith(source)
        assert config.task_index == index
        workers = config.cluster["worker"]
        assert len(workers) == 2
        # SLURM names nodes: the fake srun's node is localhost.
        assert all(address.startswith(("127.0.0.1:", "localhost:")) for address in workers)


def test_every_address_a_scenario_names_is_on_loopback() -> None:
    for scenario in script.SCENARIOS:
        for index in range(scenario.tasks):
            for value in scenario.env(PORTS, index).values():
                for port in (*PORTS.free, PORTS.closed, PORTS.silent):
                    if f":{port}" in value:
                        assert f"127.0.0.1:{port}" in value, (scenario.name, value)


def test_the_committed_table_is_the_committed_measurement() -> None:
    recorded = json.loads((ROOT / "scripts" / "compare_upstream.out.json").read_text())
    assert [r["name"] for r in recorded["results"]] == [s.name for s in script.SCENARIOS]
    page = (ROOT / "docs" / "upstream-auto-strategy.md").read_text()
    shown = page.split(script.TABLE_START)[1].split(script.TABLE_END)[0]
    expected = f"\n{recorded['header']}\n\n{script.table(recorded['results'], 60.0)}\n"
    assert shown == expected


def test_a_hang_is_a_result() -> None:
    hung = {"call": {"hung": True, "seconds": 60.0}, "fit": None}
    assert script._returns(hung, 60.0) == "nothing: did not return in 60 s"
    assert script._seconds(hung, 60.0) == "> 60 (killed)"
    assert script._said("upstream", hung) == "nothing (hung)"
    assert script._fit_cell([hung]) == "no strategy to fit on"
