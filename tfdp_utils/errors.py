"""Every exception and warning a user of tfdp-utils may catch, under one base.

Each error is also the built-in class a user would catch without knowing tfdp-utils
(``ValueError``, ``TimeoutError``, ``RuntimeError``), so ``except ValueError`` clauses written
before these classes existed keep working; ``except tdu.errors.TfdpError`` catches them all.
Pure: imports no TensorFlow.

Examples:
    >>> import tfdp_utils as tdu
    >>> issubclass(tdu.ClusterTimeoutError, (tdu.errors.TfdpError, TimeoutError))
    True
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Protocol


class _Summarized(Protocol):
    """What the error needs of its report (a ``tdu.EquivalenceReport``): its summary. Named by
    shape, so that this module (the floor every pillar imports) imports none of them."""

    def summary(self) -> str: ...


class TfdpError(Exception):
    """The base of every exception tfdp-utils raises on purpose."""


class ClusterTimeoutError(TfdpError, TimeoutError):
    """Peers of a multi-worker cluster did not become reachable in time.

    Attributes:
        missing: ``(task_type, task_index, address)`` for each task that never answered.
        timeout: the bound in seconds that was exceeded.
    """

    def __init__(self, message: str, *, missing: Sequence[tuple[str, int, str]], timeout: float):
        super().__init__(message)
        self.missing = tuple(missing)
        self.timeout = timeout

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle and copy rebuild an exception from its args; the keywords are not among them
        rebuild = functools.partial(type(self), missing=self.missing, timeout=self.timeout)
        return rebuild, self.args, self.__dict__


class TPUProbeError(TfdpError, RuntimeError):
    """A TPU was asked for explicitly but could not be reached within the probe timeout."""


class KerasCompatError(TfdpError, RuntimeError):
    """A Keras bug that tfdp-utils knows of and cannot work around in this setting."""


class EndlessEpochError(TfdpError, ValueError):
    """A dataset that never ends was given to Keras without a number of steps."""


class StrategyMismatchError(TfdpError, ValueError):
    """A builder dataset was given to a model whose strategy has another number of replicas."""


class ServiceTimeoutError(TfdpError, TimeoutError):
    """The tf.data service did not answer, or sent nothing, within ``service_timeout``."""


class ResumeMismatchError(TfdpError, ValueError):
    """A checkpoint was saved by another training setup than the one resuming from it."""


class ReplicaDivergenceError(TfdpError, RuntimeError):
    """Training on N replicas diverged from training on one device (see ``.report``, the
    ``tdu.EquivalenceReport``)."""

    def __init__(self, report: _Summarized) -> None:
        super().__init__(report.summary())
        self.report = report

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle and copy rebuild an exception from its args: the summary, not the report
        return type(self), (self.report,), self.__dict__


class ReplicaDivergenceWarning(UserWarning):
    """Training on N replicas diverged from one device (``on_divergence="warn"``)."""


__all__ = [
    "ClusterTimeoutError",
    "EndlessEpochError",
    "KerasCompatError",
    "ReplicaDivergenceError",
    "ReplicaDivergenceWarning",
    "ResumeMismatchError",
    "ServiceTimeoutError",
    "StrategyMismatchError",
    "TPUProbeError",
    "TfdpError",
]


def __dir__() -> list[str]:
    return sorted(__all__)  # tab completion shows the API only
