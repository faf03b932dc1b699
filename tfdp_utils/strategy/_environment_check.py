"""The one check of the environment variables tfdp-utils reads, as data. Pure (no TensorFlow).

:func:`check_environment` is shared by :func:`tfdp_utils.auto_strategy` (which raises the
first problem as a ``ValueError``), ``tfdp-utils env`` (which prints every problem and names no
strategy) and ``tfdp-utils doctor`` (a FAIL line per problem), so the same environment gets the
same verdict and the same words in all three. Each check calls the code that reads the
variable when it is used (``parse_tf_config``, ``parse_slurm``, the timeout resolvers, the exit
guard's ``grace``), so the message is the one a job would meet later, only earlier.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping

from tfdp_utils import _exit_barrier, _exit_guard, _variables
from tfdp_utils._validate import env_seconds, mapping, positive_float
from tfdp_utils.cluster._environments import ENVIRONMENTS
from tfdp_utils.cluster._slurm import slurm_port_base
from tfdp_utils.strategy._build import DEFAULT_CLUSTER_TIMEOUT, resolve_cluster_timeout
from tfdp_utils.strategy._collective_bound import (
    DEFAULT_COLLECTIVE_TIMEOUT,
    resolve_collective_timeout,
)

STRATEGY_KINDS: tuple[str, ...] = (
    "tpu",
    "multi_worker",
    "mirrored",
    "one_device",
    "parameter_server",
)
"""What :func:`tfdp_utils.auto_strategy` can build."""

PREFER_CHOICES: tuple[str, ...] = ("auto", *STRATEGY_KINDS)
"""The values of ``prefer=`` and ``TFDP_STRATEGY``."""

SERVICE_TIMEOUT_EXAMPLE = 300.0
"""The example the ``TFDP_SERVICE_TIMEOUT`` message gives: the tf.data service's default bound
(``DEFAULT_SERVICE_TIMEOUT`` of ``tfdp_utils.data.service._modes``, which imports TensorFlow)."""

CHECKED: tuple[str, ...] = (
    "TF_CONFIG",
    "SLURM_*",
    f"Kubernetes ({_variables.NUM_WORKERS}, {_variables.PORT}, ...)",
    _variables.STRATEGY,
    _variables.CLUSTER_TIMEOUT,
    _variables.COLLECTIVE_TIMEOUT,
    _variables.SERVICE_TIMEOUT,
    _variables.SLURM_PORT_BASE,
    _variables.EXIT_GRACE,
    _variables.EXIT_BARRIER,
)
"""The variables :func:`check_environment` checks, in its order."""


@dataclasses.dataclass(frozen=True)
class EnvironmentProblem:
    """One environment variable that :func:`tfdp_utils.auto_strategy` refuses.

    Attributes:
        variable: the variable (or family) to fix: ``"TF_CONFIG"``, ``"SLURM_*"``,
            ``"TFDP_CLUSTER_TIMEOUT"``...
        message: what was received, what was expected and how to fix it: the text
            ``auto_strategy()`` raises and ``tfdp-utils env`` / ``doctor`` print.
    """

    variable: str
    message: str

    def error(self) -> ValueError:
        """The error :func:`tfdp_utils.auto_strategy` raises for this problem."""
        return ValueError(self.message)


def check_prefer(prefer: object, source: str) -> str:
    """``prefer`` normalised (stripped, lower case) when it names a strategy choice.

    Raises:
        ValueError: naming ``source`` (``"prefer"`` or ``"TFDP_STRATEGY"``), the value and
            every valid choice.
    """
    value = prefer.strip().lower() if isinstance(prefer, str) else prefer
    if value not in PREFER_CHOICES:
        fix = (
            f" Set {source} to one of them, or unset it to let auto_strategy() choose."
            if source == _variables.STRATEGY
            else ""
        )
        raise ValueError(
            f"{source}={prefer!r} is not a strategy choice; expected one of "
            f"{', '.join(repr(c) for c in PREFER_CHOICES)}.{fix}"
        )
    return str(value)


def _cluster(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """The first cluster environment that is malformed, as (variable, message), else None.

    The same order as ``cluster_from_environment``: once one environment describes a cluster,
    the later ones are not read (TF_CONFIG wins over SLURM), so they are not checked either.
    """
    for environment in ENVIRONMENTS:
        try:
            config = environment.parse(environ)
        except ValueError as exc:
            # Each message starts with the variable to fix ("SLURM_PROCID=5 is outside ...").
            named = re.match(r"[A-Z][A-Z0-9_]*", str(exc))
            return (named.group(0) if named else environment.name), str(exc)
        if config is not None:
            return None
    return None


def _strategy(environ: Mapping[str, str]) -> None:
    forced = environ.get(_variables.STRATEGY, "").strip()
    if forced:
        check_prefer(forced, _variables.STRATEGY)


def _cluster_timeout(environ: Mapping[str, str]) -> None:
    resolve_cluster_timeout(DEFAULT_CLUSTER_TIMEOUT, environ)


def _collective_timeout(environ: Mapping[str, str]) -> None:
    resolve_collective_timeout(DEFAULT_COLLECTIVE_TIMEOUT, dict(environ))


def _service_timeout(environ: Mapping[str, str]) -> None:
    # The same two steps as the builder's check_service, so the message is the one it raises.
    raw = environ.get(_variables.SERVICE_TIMEOUT, "").strip()
    if raw:
        seconds = env_seconds(_variables.SERVICE_TIMEOUT, raw, example=SERVICE_TIMEOUT_EXAMPLE)
        positive_float(seconds, _variables.SERVICE_TIMEOUT, unit="number of seconds")


def _slurm_port_base(environ: Mapping[str, str]) -> None:
    if environ.get(_variables.SLURM_PORT_BASE, "").strip():
        slurm_port_base(environ)


def _exit_grace(environ: Mapping[str, str]) -> None:
    # The exit guard's own reading, made where auto_strategy() installs the guard; with
    # TFDP_EXIT_GUARD off the guard is never installed and the value is never read.
    if _exit_guard.wanted(dict(environ)):
        _exit_guard.grace(dict(environ))


def _exit_barrier_bound(environ: Mapping[str, str]) -> None:
    # The exit barrier's own reading (auto_strategy() installs it for 2 or more workers).
    _exit_barrier.bound(environ)


_VARIABLE_CHECKS: tuple[tuple[str, Callable[[Mapping[str, str]], None]], ...] = (
    (_variables.STRATEGY, _strategy),
    (_variables.CLUSTER_TIMEOUT, _cluster_timeout),
    (_variables.COLLECTIVE_TIMEOUT, _collective_timeout),
    (_variables.SERVICE_TIMEOUT, _service_timeout),
    (_variables.SLURM_PORT_BASE, _slurm_port_base),
    (_variables.EXIT_GRACE, _exit_grace),
    (_variables.EXIT_BARRIER, _exit_barrier_bound),
)


def check_environment(environ: Mapping[str, str] | None = None) -> tuple[EnvironmentProblem, ...]:
    """Every problem with the variables tfdp-utils reads, in the order of :data:`CHECKED`.

    TF_CONFIG, srun's ``SLURM_*`` variables, ``TFDP_STRATEGY``, ``TFDP_CLUSTER_TIMEOUT``,
    ``TFDP_COLLECTIVE_TIMEOUT``, ``TFDP_SERVICE_TIMEOUT``, ``TFDP_SLURM_PORT_BASE``,
    ``TFDP_EXIT_GRACE`` (unless ``TFDP_EXIT_GUARD`` turns the exit guard off) and
    ``TFDP_EXIT_BARRIER``. Reads nothing
    but ``environ``: no TensorFlow, no network.

    Args:
        environ: the variables to check. Defaults to `None` (``os.environ``).

    Returns:
        The problems, empty when ``auto_strategy()`` accepts the environment.

    Examples:
        >>> check_environment({"TFDP_CLUSTER_TIMEOUT": "soon"})[0].variable
        'TFDP_CLUSTER_TIMEOUT'
        >>> check_environment({})
        ()
    """
    environ = os.environ if environ is None else mapping(environ, "environ")
    problems: list[EnvironmentProblem] = []
    cluster = _cluster(environ)
    if cluster is not None:
        problems.append(EnvironmentProblem(*cluster))
    for variable, check in _VARIABLE_CHECKS:
        if any(problem.variable == variable for problem in problems):
            continue  # TFDP_SLURM_PORT_BASE, already named by the SLURM check
        try:
            check(environ)
        except ValueError as exc:
            problems.append(EnvironmentProblem(variable, str(exc)))
    return tuple(problems)


def raise_first_problem(environ: Mapping[str, str] | None = None) -> None:
    """Raise the first problem :func:`check_environment` finds, as ``auto_strategy()`` does.

    Raises:
        ValueError: the first problem's message.
    """
    problems = check_environment(environ)
    if problems:
        raise problems[0].error()
