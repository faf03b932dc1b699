"""Hostile environments and CLI paths: every variable auto_strategy() reads, given wrong values.

Each environment row runs ``auto_strategy()`` itself under the variables (the error comes from
the environment check, before TensorFlow's devices are touched), and
:func:`test_env_doctor_and_auto_strategy_agree` runs the same environments through
``tfdp-utils env``'s report and ``tfdp-utils doctor``'s checks: the same verdict and the same
message in all three. The path rows give ``demo`` and ``data-service`` a directory that cannot
be made, which must be refused before any work starts. The CLI's own subprocess cases (exit
statuses, a closed pipe) live in tests/test_cli.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.hostile import Accepts, Case, Raises, check_case, parametrize, scratch_folder

import tfdp_utils as tdu
from tfdp_utils import cli, demo
from tfdp_utils.data.service import _servers as service_servers
from tfdp_utils.doctor import _command as doctor
from tfdp_utils.strategy._environment_check import check_environment

SLURM = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "n[1-2]"}
TWO_WORKERS = (
    '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", '
    '"index": 0}}'
)

# Every variable the environment check reads: each case sets its own and unsets the others.
CHECKED_VARIABLES = (
    "TF_CONFIG",
    "TFDP_STRATEGY",
    "TFDP_CLUSTER_TIMEOUT",
    "TFDP_COLLECTIVE_TIMEOUT",
    "TFDP_SERVICE_TIMEOUT",
    "TFDP_SLURM_PORT_BASE",
    "TFDP_EXIT_GRACE",
    "TFDP_EXIT_GUARD",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_NTASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
)


def _under(patch: pytest.MonkeyPatch, variables: dict[str, str]) -> None:
    for key in CHECKED_VARIABLES:
        patch.delenv(key, raising=False)
    for key, value in variables.items():
        patch.setenv(key, value)


def _in_environment(variables: dict[str, str], call: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with pytest.MonkeyPatch.context() as patch:
            _under(patch, variables)
            return call()

    return run


def _accepted(variables: dict[str, str]) -> None:
    """Nothing to refuse: the check auto_strategy(), env and doctor share finds no problem."""
    problems = check_environment({**variables})
    if problems:
        raise AssertionError(f"refused: {problems}")


# (name, variables, outcome): run as auto_strategy() for Raises, as the shared check for Accepts.
ENVIRONMENTS: list[tuple[str, dict[str, str], Raises | Accepts]] = [
    (
        "env: TFDP_CLUSTER_TIMEOUT=abc",
        {"TFDP_CLUSTER_TIMEOUT": "abc"},
        Raises(ValueError, r"TFDP_CLUSTER_TIMEOUT must be a number of seconds.*'abc'.*e\.g\. 300"),
    ),
    (
        "env: TFDP_CLUSTER_TIMEOUT=0",
        {"TFDP_CLUSTER_TIMEOUT": "0"},
        Raises(ValueError, "TFDP_CLUSTER_TIMEOUT must be a positive finite number of seconds"),
    ),
    (
        "env: TFDP_CLUSTER_TIMEOUT=nan",
        {"TFDP_CLUSTER_TIMEOUT": "nan"},
        Raises(ValueError, "TFDP_CLUSTER_TIMEOUT must be a positive finite number.*nan"),
    ),
    (
        "env: TFDP_CLUSTER_TIMEOUT=inf",
        {"TFDP_CLUSTER_TIMEOUT": "inf"},
        Raises(ValueError, "TFDP_CLUSTER_TIMEOUT must be a positive finite number.*inf"),
    ),
    (
        "env: TFDP_COLLECTIVE_TIMEOUT=-1",
        {"TFDP_COLLECTIVE_TIMEOUT": "-1"},
        Raises(ValueError, r"TFDP_COLLECTIVE_TIMEOUT=-1\.0 must be a positive number of seconds"),
    ),
    (
        "env: TFDP_COLLECTIVE_TIMEOUT=nan",
        {"TFDP_COLLECTIVE_TIMEOUT": "nan"},
        Raises(ValueError, "TFDP_COLLECTIVE_TIMEOUT=nan must be a positive number of seconds"),
    ),
    (
        "env: TFDP_STRATEGY=nonsense",
        {"TFDP_STRATEGY": "nonsense"},
        Raises(ValueError, "TFDP_STRATEGY='nonsense' is not a strategy choice.*unset it"),
    ),
    (
        "env: TFDP_STRATEGY=' Mirrored '",
        {"TFDP_STRATEGY": " Mirrored "},
        Accepts("case and surrounding spaces are ignored, as for prefer="),
    ),
    (
        "env: TFDP_STRATEGY=''",
        {"TFDP_STRATEGY": ""},
        Accepts("an empty TFDP_STRATEGY counts as unset: auto_strategy() chooses"),
    ),
    (
        "env: TFDP_SERVICE_TIMEOUT=abc",
        {"TFDP_SERVICE_TIMEOUT": "abc"},
        Raises(ValueError, "TFDP_SERVICE_TIMEOUT must be a number of seconds.*'abc'"),
    ),
    (
        "env: TFDP_SERVICE_TIMEOUT=-3",
        {"TFDP_SERVICE_TIMEOUT": "-3"},
        Raises(ValueError, "TFDP_SERVICE_TIMEOUT must be a positive finite number of seconds"),
    ),
    (
        "env: TFDP_SLURM_PORT_BASE=70000 outside SLURM",
        {"TFDP_SLURM_PORT_BASE": "70000"},
        Raises(ValueError, r"TFDP_SLURM_PORT_BASE='70000' is not a usable port.*1\.\.65535"),
    ),
    (
        "env: TFDP_SLURM_PORT_BASE=65535 for 2 tasks per node",
        {**SLURM, "SLURM_STEP_NODELIST": "n1", "TFDP_SLURM_PORT_BASE": "65535"},
        Raises(ValueError, r"TFDP_SLURM_PORT_BASE='65535' is not a usable port.*1\.\.65534"),
    ),
    (
        "env: SLURM_STEP_NUM_TASKS=0",
        {**SLURM, "SLURM_STEP_NUM_TASKS": "0"},
        Raises(ValueError, "SLURM_STEP_NUM_TASKS must be the number of tasks.*at least 1.*'0'"),
    ),
    (
        "env: SLURM_NTASKS=0",
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "0"},
        Raises(ValueError, "SLURM_NTASKS must be the number of tasks.*at least 1.*'0'"),
    ),
    (
        "env: SLURM_STEP_NUM_TASKS=-2",
        {**SLURM, "SLURM_STEP_NUM_TASKS": "-2"},
        Raises(ValueError, "SLURM_STEP_NUM_TASKS must be a whole number.*'-2'"),
    ),
    (
        "env: SLURM_PROCID=5 of 2 tasks",
        {**SLURM, "SLURM_PROCID": "5"},
        Raises(
            ValueError,
            r"SLURM_PROCID=5 is outside 0\.\.1: SLURM_PROCID must be this task's rank.*"
            r"SLURM_STEP_NUM_TASKS=2.*run the script with srun",
        ),
    ),
    (
        "env: SLURM host list with an unbalanced '['",
        {**SLURM, "SLURM_STEP_NODELIST": "n[1-2"},
        Raises(
            ValueError,
            r"SLURM_STEP_NODELIST must be a SLURM host list such as .*but received "
            r"SLURM_STEP_NODELIST='n\[1-2'.*unbalanced '\['.*srun",
        ),
    ),
    (
        "env: SLURM host list with an unbalanced ']'",
        {**SLURM, "SLURM_JOB_NODELIST": "n1-2]", "SLURM_STEP_NODELIST": ""},
        Raises(ValueError, r"SLURM_JOB_NODELIST must be a SLURM host list.*unbalanced '\]'"),
    ),
    (
        "env: SLURM host list with a reversed range",
        {**SLURM, "SLURM_STEP_NODELIST": "n[3-1]"},
        Raises(ValueError, r"SLURM_STEP_NODELIST must be a SLURM host list.*range '3-1'"),
    ),
    (
        "env: SLURM tasks-per-node for fewer nodes than the host list",
        {**SLURM, "SLURM_STEP_TASKS_PER_NODE": "2"},
        Raises(ValueError, r"SLURM_STEP_TASKS_PER_NODE must list one task count per node.*'2'"),
    ),
    (
        "env: SLURM tasks-per-node in a bad notation",
        {**SLURM, "SLURM_STEP_TASKS_PER_NODE": "1(2),1"},
        Raises(ValueError, r"SLURM_STEP_TASKS_PER_NODE must be SLURM's tasks-per-node notation"),
    ),
    (
        "env: TF_CONFIG='[]'",
        {"TF_CONFIG": "[]"},
        Raises(ValueError, "TF_CONFIG is invalid: it is a JSON list, not an object"),
    ),
    (
        "env: TF_CONFIG with an unknown task type",
        {"TF_CONFIG": '{"cluster": {"gpu": ["h:1"]}, "task": {"type": "gpu", "index": 0}}'},
        Raises(ValueError, "TF_CONFIG is invalid: cluster has unknown task type 'gpu'"),
    ),
    (
        "env: TF_CONFIG naming one address twice",
        {"TF_CONFIG": '{"cluster": {"worker": ["h:1", "h:1"]}, "task": {"type": "worker"}}'},
        Raises(ValueError, "TF_CONFIG is invalid: address 'h:1' appears twice"),
    ),
    (
        "env: TF_CONFIG=' '",
        {"TF_CONFIG": " "},
        Accepts("a blank TF_CONFIG means no cluster, as an unset one does"),
    ),
    (
        "env: TF_CONFIG beside malformed SLURM variables",
        {"TF_CONFIG": TWO_WORKERS, **SLURM, "SLURM_PROCID": "9"},
        Accepts("TF_CONFIG wins over SLURM: srun's variables are not read when it names a cluster"),
    ),
    (
        "env: two problems at once",
        {"TFDP_CLUSTER_TIMEOUT": "soon", "TF_CONFIG": "{"},
        Raises(ValueError, "TF_CONFIG is invalid: it is not valid JSON"),  # the first, as listed
    ),
]


# The exit guard's variable, which auto_strategy() reads when it installs the guard: the same
# agreement test, outside the campaign's counted table (docs/errors.md states its counts).
EXIT_GUARD_ENVIRONMENTS: list[tuple[str, dict[str, str], Raises | Accepts]] = [
    (
        "env: TFDP_EXIT_BARRIER=abc",
        {"TFDP_EXIT_BARRIER": "abc"},
        Raises(
            ValueError,
            r"TFDP_EXIT_BARRIER must be a number of seconds, but received "
            r"TFDP_EXIT_BARRIER='abc'\. Set it to e\.g\. 60\.",
        ),
    ),
    (
        "env: TFDP_EXIT_BARRIER=-1",
        {"TFDP_EXIT_BARRIER": "-1"},
        Raises(
            ValueError,
            r"TFDP_EXIT_BARRIER must be a finite number of seconds >= 0, but received "
            r"TFDP_EXIT_BARRIER='-1'\. Set it to e\.g\. 60, or 0",
        ),
    ),
    (
        "env: TFDP_EXIT_BARRIER=nan",
        {"TFDP_EXIT_BARRIER": "nan"},
        Raises(ValueError, r"TFDP_EXIT_BARRIER must be a finite number of seconds >= 0"),
    ),
    (
        "env: TFDP_EXIT_BARRIER=off",
        {"TFDP_EXIT_BARRIER": "off"},
        Accepts("'off' (or 0) lets each worker exit on its own, as documented"),
    ),
    (
        "env: TFDP_EXIT_GRACE=abc",
        {"TFDP_EXIT_GRACE": "abc"},
        Raises(
            ValueError,
            r"TFDP_EXIT_GRACE must be a number of seconds, but received TFDP_EXIT_GRACE='abc'\. "
            r"Set it to e\.g\. 8\.",
        ),
    ),
    (
        "env: TFDP_EXIT_GRACE=-1",
        {"TFDP_EXIT_GRACE": "-1"},
        Raises(
            ValueError,
            r"TFDP_EXIT_GRACE must be a number of seconds >= 0, but received "
            r"TFDP_EXIT_GRACE='-1'\. Set it to e\.g\. 8, or 0 to turn the backstop off\.",
        ),
    ),
    (
        "env: TFDP_EXIT_GRACE=''",
        {"TFDP_EXIT_GRACE": ""},
        Accepts("an empty TFDP_EXIT_GRACE counts as unset: the backstop's default"),
    ),
    (
        "env: TFDP_EXIT_GRACE=0",
        {"TFDP_EXIT_GRACE": "0"},
        Accepts("0 turns the exit guard's backstop off"),
    ),
    (
        "env: TFDP_EXIT_GRACE=abc with TFDP_EXIT_GUARD=0",
        {"TFDP_EXIT_GRACE": "abc", "TFDP_EXIT_GUARD": "0"},
        Accepts("the exit guard is never installed, so its grace is never read"),
    ),
]


def _environment_case(
    name: str, variables: dict[str, str], outcome: Raises | Accepts
) -> tuple[str, Callable[[], Any], Raises | Accepts]:
    if isinstance(outcome, Accepts):
        return (name, _in_environment(variables, lambda: _accepted(variables)), outcome)
    return (name, _in_environment(variables, lambda: tdu.auto_strategy(verbose=False)), outcome)


_FOLDER = scratch_folder("tfdp-hostile-environment-")


def _a_file() -> str:
    """A path that is a file, so nothing can be made under it."""
    path = _FOLDER / "a-file"
    path.write_text("not a directory\n")
    return str(path)


def _dispatcher(work_dir: Any) -> int:
    args = argparse.Namespace(
        role="dispatcher", port=0, host="127.0.0.1", work_dir=work_dir, worker_timeout=None
    )
    return service_servers.run_from_args(args)


PATH_CASES: list[Case] = [
    (
        "demo.run(log_dir=<a path under a file>)",
        lambda: demo.run(log_dir=Path(_a_file()) / "logs"),
        Raises(ValueError, "log_dir must be a directory that exists or can be created.*file"),
    ),
    (
        "demo.run(log_dir=<a file>)",
        lambda: demo.run(log_dir=_a_file()),
        Raises(ValueError, "log_dir must be a directory, but received .*which is a file"),
    ),
    (
        "demo.run(log_dir=3)",
        lambda: demo.run(log_dir=3),  # type: ignore[arg-type]
        Raises(TypeError, "log_dir must be a directory path .*received 3 of type int"),
    ),
    (
        "demo.run(log_dir='')",
        lambda: demo.run(log_dir=""),
        Raises(ValueError, "log_dir must be a directory path, but received ''"),
    ),
    (
        "data-service dispatcher --work-dir <a path under a file>",
        lambda: _dispatcher(str(Path(_a_file()) / "journal")),
        Raises(ValueError, "--work-dir must be a directory that exists or can be created.*file"),
    ),
    (
        "check_environment(environ='TF_CONFIG')",
        lambda: check_environment("TF_CONFIG"),  # type: ignore[arg-type]
        Raises(TypeError, "environ must be a mapping such as os.environ"),
    ),
]

ALL_CASES: list[Case] = [_environment_case(*row) for row in ENVIRONMENTS] + PATH_CASES


@parametrize(ALL_CASES)
def test_hostile_input(call: Callable[[], Any], outcome: Raises | Accepts) -> None:
    check_case(call, outcome)


@parametrize([_environment_case(*row) for row in EXIT_GUARD_ENVIRONMENTS])
def test_the_exit_guards_variables(call: Callable[[], Any], outcome: Raises | Accepts) -> None:
    # Before: auto_strategy() refused TFDP_EXIT_GRACE=abc only when it installed the guard,
    # after building the strategy, while `env` and `doctor` said the environment was valid.
    check_case(call, outcome)


@pytest.mark.parametrize(
    ("variables", "outcome"),
    [row[1:] for row in ENVIRONMENTS + EXIT_GUARD_ENVIRONMENTS],
    ids=[row[0] for row in ENVIRONMENTS + EXIT_GUARD_ENVIRONMENTS],
)
def test_env_doctor_and_auto_strategy_agree(
    variables: dict[str, str], outcome: Raises | Accepts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One environment, one verdict and one message: auto_strategy(), `env` and `doctor`."""
    _under(monkeypatch, variables)
    facts = cli.environment_facts()
    report = {**facts, **cli._tensorflow_report(facts)}
    checks = doctor.environment_checks()
    failed = [check for check in checks if check.status == "FAIL"]
    if isinstance(outcome, Accepts):
        assert facts["environment_problems"] == [] and not failed
        assert [check.status for check in checks] == ["PASS"]
        assert report["strategy"] is not None, report["reason"]
        return
    with pytest.raises(ValueError) as raised:
        tdu.auto_strategy(verbose=False)
    message = str(raised.value)
    assert facts["environment_problems"][0]["message"] == message
    assert report["strategy"] is None and message in report["reason"]
    assert failed[0].detail == message
    assert doctor.exit_code(checks) == 1
    assert len(failed) == len(facts["environment_problems"])


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "", "0", " 2.5 "])
def test_the_exit_grace_verdict_is_the_exit_guards(value: str) -> None:
    # One rule: the check calls the guard's own reading of the variable (what auto_strategy()
    # installs), so the check refuses exactly what the guard refuses, in its words.
    from tfdp_utils import _exit_guard

    environ = {"TFDP_EXIT_GRACE": value}
    problems = check_environment(environ)
    try:
        _exit_guard.grace(environ)
    except ValueError as exc:
        assert [(p.variable, p.message) for p in problems] == [("TFDP_EXIT_GRACE", str(exc))]
    else:
        assert problems == ()


@pytest.mark.parametrize("value", ["abc", "-3", "0", "nan"])
def test_the_service_timeout_message_is_the_one_the_builder_raises(value: str) -> None:
    # The check cannot import the builder's check_service (it imports TensorFlow), so it
    # repeats its two steps: the two messages must stay the same.
    from tfdp_utils.data.service._modes import DEFAULT_SERVICE_TIMEOUT, check_service
    from tfdp_utils.strategy._environment_check import SERVICE_TIMEOUT_EXAMPLE

    environ = {"TFDP_SERVICE_TIMEOUT": value}
    [problem] = check_environment(environ)
    with pytest.raises(ValueError) as raised:
        check_service("grpc://127.0.0.1:5050", "synchronous", None, environ)
    assert problem.message == str(raised.value)
    assert SERVICE_TIMEOUT_EXAMPLE == DEFAULT_SERVICE_TIMEOUT
