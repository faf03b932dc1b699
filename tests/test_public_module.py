"""Public names read as public: reprs, tracebacks and pickles show ``tfdp_utils.StrategyChoice``.

Every class and function of a public surface (``tfdp_utils.__all__`` and each subpackage's)
names as its ``__module__`` the public module that exports it (set where it is defined, with
``tfdp_utils._public.public``), so that a value the user never asked for by its public name (a
``StrategyChoice`` from ``choose_strategy``) prints the public path, and pickle finds the class
again through that module's lazy surface.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import json
import pickle
import traceback
from pathlib import Path
from typing import Any

import pytest
from support.processes import run_python

import tfdp_utils as tdu
from tfdp_utils import errors

PACKAGE = Path(tdu.__file__).parent
SURFACES = (
    "tfdp_utils",
    "tfdp_utils.errors",
    *sorted(
        f"tfdp_utils.{path.parent.name}"
        for path in PACKAGE.glob("*/__init__.py")
        if not path.parent.name.startswith("_")
    ),
)


def _public_definitions() -> dict[str, Any]:
    """``surface.name`` -> every class and function the public surfaces export."""
    found = {}
    for surface in SURFACES:
        module = importlib.import_module(surface)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) or inspect.isfunction(value):
                found[f"{surface}.{name}"] = value
    return found


def _is_public(module: str) -> bool:
    return not any(part.startswith("_") for part in module.split("."))


@pytest.mark.keras  # resolves every name: the callbacks subclass the Keras of this pass
def test_every_public_class_and_function_reports_its_public_module() -> None:
    found = _public_definitions()
    assert {"tfdp_utils.StrategyChoice", "tfdp_utils.callbacks.ThroughputLogger"} <= set(found)
    private = {where: v.__module__ for where, v in found.items() if not _is_public(v.__module__)}
    assert private == {}
    # The module named exports the name (pickle looks it up there), in its __all__.
    unexported = [
        f"{where}: {v.__module__}.{v.__qualname__}"
        for where, v in found.items()
        if v.__qualname__ not in importlib.import_module(v.__module__).__all__
        or getattr(importlib.import_module(v.__module__), v.__qualname__) is not v
    ]
    assert unexported == []


def test_names_shared_by_two_surfaces_read_the_one_the_docs_name() -> None:
    assert tdu.StrategyChoice.__module__ == "tfdp_utils"  # also tdu.strategy.StrategyChoice
    assert tdu.strategy.CollectiveWatchdog.__module__ == "tfdp_utils.strategy"
    assert tdu.cluster.parse_slurm.__module__ == "tfdp_utils.cluster"
    assert tdu.ThroughputMeter.__module__ == "tfdp_utils"
    assert tdu.ClusterTimeoutError.__module__ == "tfdp_utils.errors"


def test_a_returned_choice_prints_its_public_path_though_the_name_was_never_used() -> None:
    # A fresh process that never resolves tdu.StrategyChoice, only the function returning one.
    result = run_python(
        """
        import json, pickle, sys
        import tfdp_utils as tdu

        choice = tdu.choose_strategy(tdu.Environment(gpus=("/gpu:0", "/gpu:1")))
        print(json.dumps({
            "resolved": "StrategyChoice" in vars(tdu),
            "type": repr(type(choice)),
            "repr": repr(choice),
            "round_trip": pickle.loads(pickle.dumps(choice)) == choice,
            "tensorflow": "tensorflow" in sys.modules,
        }))
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["resolved"] is False
    assert seen["type"] == "<class 'tfdp_utils.StrategyChoice'>"
    assert seen["repr"].startswith("StrategyChoice(kind='mirrored'")
    assert seen["round_trip"] is True
    assert seen["tensorflow"] is False


def test_objects_and_errors_print_no_private_path() -> None:
    meter = tdu.ThroughputMeter(num_replicas=2)
    assert repr(meter).startswith("<tfdp_utils.ThroughputMeter object at ")
    assert (
        repr(tdu.strategy.CollectiveWatchdog) == "<class 'tfdp_utils.strategy.CollectiveWatchdog'>"
    )
    try:
        raise errors.ClusterTimeoutError("worker 1 never answered", missing=(), timeout=5.0)
    except errors.ClusterTimeoutError as error:
        shown = traceback.format_exception(error)
    assert shown[-1] == "tfdp_utils.errors.ClusterTimeoutError: worker 1 never answered\n"
    assert "._" not in repr(type(tdu.choose_strategy(tdu.Environment())))


def _report() -> Any:
    return tdu.EquivalenceReport(
        strategy="MirroredStrategy",
        num_replicas=2,
        steps=3,
        recorded_steps=(1, 2, 3),
        loss_reference=(1.0, 0.9, 0.8),
        loss_distributed=(1.0, 0.9, 0.5),
        max_loss_difference=0.3,
        log_differences={"loss": 0.3},
        weight_differences={"dense/kernel": 0.2},
        max_weight_difference=0.2,
        largest_weight=1.0,
        first_divergent_step=3,
        divergent=("loss",),
        nan_step_reference=None,
        nan_step_distributed=None,
        non_finite=(),
        random_in_training=False,
        replicas_share_random_numbers=False,
        trajectory_compared=True,
        rtol=1e-4,
        atol=1e-5,
    )


def _error(cls: type[Exception]) -> Exception:
    if cls is errors.ClusterTimeoutError:
        return cls("2 of 3 peers answered", missing=[("worker", 2, "10.0.0.3:2222")], timeout=5)
    if cls is errors.ReplicaDivergenceError:
        return cls(_report())
    return cls(f"a {cls.__name__}")


@pytest.mark.parametrize(
    "name", [n for n in errors.__all__ if issubclass(getattr(errors, n), Exception)]
)
def test_every_public_error_survives_pickle_and_copy(name: str) -> None:
    error = _error(getattr(errors, name))
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert type(again) is type(error)
        assert str(again) == str(error)
        assert vars(again) == vars(error)


def _frozen_dataclasses() -> dict[str, type]:
    return {
        where: value
        for where, value in _public_definitions().items()
        if dataclasses.is_dataclass(value) and value.__dataclass_params__.frozen  # type: ignore[attr-defined]
    }


def test_every_public_frozen_dataclass_survives_pickle_and_copy() -> None:
    found = _frozen_dataclasses()
    assert {"tfdp_utils.StrategyChoice", "tfdp_utils.EquivalenceReport"} <= set(found)
    for where, cls in found.items():
        # Pickle's part is the class look-up (by __module__ and __qualname__) and the state,
        # so every field holds a plain value of its own.
        value = object.__new__(cls)
        for number, field in enumerate(dataclasses.fields(cls)):
            object.__setattr__(value, field.name, (field.name, number))
        for again in (pickle.loads(pickle.dumps(value)), copy.copy(value), copy.deepcopy(value)):
            assert type(again) is cls, where
            assert again == value, where


def test_returned_values_survive_pickle() -> None:
    made = [
        tdu.choose_strategy(tdu.Environment(gpus=("/gpu:0", "/gpu:1"))),
        tdu.cluster.parse_tf_config(
            json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker"}})
        ),
        _report(),
    ]
    for value in made:
        assert pickle.loads(pickle.dumps(value)) == value
