"""Workarounds for upstream Keras 3 bugs that break data-parallel training, and nothing else.

Each workaround lives in its own module named after its upstream issue, with the Keras
versions it was verified on and a probe that tells whether the installed Keras still has the
bug, so that a fixed Keras gets no patch:

- ``keras#20585`` (:mod:`.keras_20585`): ``fit``/``evaluate`` under MultiWorkerMirroredStrategy
  fail in ``_maybe_symbolic_build``.
- ``tensorflow#72388`` (:mod:`.tf_72388`): next, they fail in ``reduce_per_replica`` on scalar
  metric values.
- ``keras#19246`` (:mod:`.keras_19246`): ``steps_per_execution > 1`` on two or more
  Mirrored/MultiWorkerMirrored replicas fails with a placeholder error.
- ``keras#20582`` (:mod:`.keras_20582`): an optimizer with ``gradient_accumulation_steps``
  under Mirrored/MultiWorkerMirrored fails with ``merge_call called while defining a new
  graph``.

:func:`tfdp_utils.auto_strategy` applies the ones its strategy needs (through
:func:`apply_for_strategy`); :func:`apply` applies every one whose bug is present. Each is
applied at most once per process and logged once (logger ``tfdp_utils.compat``, a child of
``tfdp_utils``). These bugs live in Keras 3's TensorFlow trainer and optimizer; tf_keras is
never touched.

On tf_keras, :func:`apply_for_datasets` (:mod:`.tf_keras_datasets`) lets ``fit`` and
``evaluate`` take a dataset from :func:`tfdp_utils.build_distributed_dataset` without
``steps_per_epoch``, as Keras 3 does; the builder applies it.

Set ``TFDP_NO_KERAS_PATCHES=1`` to turn them all off.

Examples:
    >>> import tfdp_utils as tdu
    >>> tdu.compat.apply()  # doctest: +SKIP
    ('keras#20585', 'tensorflow#72388', 'keras#19246', 'keras#20582')
    >>> tdu.compat.applied()  # doctest: +SKIP
    ('keras#20585', 'tensorflow#72388', 'keras#19246', 'keras#20582')
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable
from typing import Any

from tfdp_utils import _variables
from tfdp_utils._validate import env_flag
from tfdp_utils.compat import _keras_19246 as keras_19246
from tfdp_utils.compat import _keras_20582 as keras_20582
from tfdp_utils.compat import _keras_20585 as keras_20585
from tfdp_utils.compat import _tf_72388 as tf_72388
from tfdp_utils.compat import _tf_keras_datasets as tf_keras_datasets
from tfdp_utils.compat._registry import (
    Patch,
    Workaround,
    is_mirrored_family,
    keras3_trainer_module,
    keras_version,
)
from tfdp_utils.errors import KerasCompatError

# A child of the package's "tfdp_utils" logger: configuring that one configures this too.
logger = logging.getLogger("tfdp_utils.compat")

DISABLE_VARIABLE = _variables.NO_KERAS_PATCHES
"""Environment variable: ``1`` turns every Keras workaround off."""

WORKAROUNDS: tuple[Workaround, ...] = (
    keras_20585.WORKAROUND,
    tf_72388.WORKAROUND,
    keras_19246.WORKAROUND,
    keras_20582.WORKAROUND,
)
_BY_ISSUE = {w.issue: w for w in WORKAROUNDS}

_LOCK = threading.RLock()
_APPLIED: dict[str, tuple[str, list[Patch]]] = {}
_PROBED: dict[str, bool] = {}
_LOGGED: set[str] = set()


@dataclasses.dataclass(frozen=True)
class WorkaroundStatus:
    """What tfdp-utils knows about one upstream bug in this process.

    Attributes:
        issue: the upstream issue, e.g. ``"keras#19246"``.
        summary: what fails without the workaround.
        url: the upstream issue's address.
        verified_on: Keras versions the workaround was verified on.
        bug_present: whether the probe finds the bug in the Keras that ``tf.keras`` resolves
            to (always False on tf_keras and on non-TensorFlow Keras backends).
        applied: ``"fix"`` (patched), ``"guard"`` (a clear error before the first step where
            no safe fix exists), or None (not applied).
    """

    issue: str
    summary: str
    url: str
    verified_on: tuple[str, ...]
    bug_present: bool
    applied: str | None


def disabled() -> bool:
    """Whether ``TFDP_NO_KERAS_PATCHES`` turns the workarounds off in this process."""
    return env_flag(DISABLE_VARIABLE)


def _log_once(key: str, level: int, message: str, *args: Any) -> None:
    if key not in _LOGGED:
        _LOGGED.add(key)
        logger.log(level, message, *args)


def _bug_present(workaround: Workaround) -> bool:
    trainer = keras3_trainer_module()
    if trainer is None:
        return False
    if workaround.issue not in _PROBED:
        try:
            _PROBED[workaround.issue] = bool(workaround.probe(trainer))
        except Exception as exc:  # a probe must never break training; report and assume
            logger.warning(
                "tfdp_utils: the probe for %s failed on Keras %s (%s: %s); assuming the bug "
                "is present",
                workaround.issue,
                keras_version(),
                type(exc).__name__,
                exc,
            )
            _PROBED[workaround.issue] = True
    return _PROBED[workaround.issue]


def _select(issues: Iterable[str] | None) -> list[Workaround]:
    if issues is None:
        return list(WORKAROUNDS)
    if isinstance(issues, str):
        raise TypeError(f"issues={issues!r} is a string; pass a list such as [{issues!r}].")
    chosen = list(issues)
    unknown = [i for i in chosen if i not in _BY_ISSUE]
    if unknown:
        raise ValueError(
            f"unknown upstream issue(s) {unknown}; tfdp-utils has workarounds for "
            f"{sorted(_BY_ISSUE)}."
        )
    return [w for w in WORKAROUNDS if w.issue in chosen]


def _apply(selected: list[Workaround], reason: str) -> tuple[str, ...]:
    with _LOCK:
        if disabled():
            needed = [w.issue for w in selected if w.issue not in _APPLIED and _bug_present(w)]
            if needed:
                _log_once(
                    "disabled",
                    logging.WARNING,
                    "tfdp_utils: %s=1, so the Keras workarounds asked for by %s are off; "
                    "expect the upstream failures %s",
                    DISABLE_VARIABLE,
                    reason,
                    ", ".join(needed),
                )
            return applied()
        trainer = keras3_trainer_module()
        if trainer is None:
            return applied()
        for workaround in selected:
            if workaround.issue in _APPLIED or not _bug_present(workaround):
                continue
            mode, patches = workaround.install(trainer)
            _APPLIED[workaround.issue] = (mode, patches)
            if mode == "fix":
                _log_once(
                    workaround.issue,
                    logging.INFO,
                    "tfdp_utils: Keras %s has %s (%s); workaround applied (needed by %s). "
                    "%s=1 turns it off.",
                    keras_version(),
                    workaround.issue,
                    workaround.summary,
                    reason,
                    DISABLE_VARIABLE,
                )
            else:
                _log_once(
                    workaround.issue,
                    logging.WARNING,
                    "tfdp_utils: Keras %s has %s (%s) and tfdp-utils cannot patch this version; "
                    "affected fit/evaluate calls will raise KerasCompatError before the first "
                    "step.",
                    keras_version(),
                    workaround.issue,
                    workaround.summary,
                )
        return applied()


def apply(issues: Iterable[str] | None = None) -> tuple[str, ...]:
    """Apply the workarounds whose bugs are present in the installed Keras 3.

    Safe to call any number of times and from several threads: each workaround is applied
    once per process and logged once. Does nothing on tf_keras, on Keras 3 with a
    non-TensorFlow backend, for bugs the installed Keras no longer has, or when
    ``TFDP_NO_KERAS_PATCHES=1``. The patched code only changes behaviour in the affected
    settings (multi-worker strategies; ``steps_per_execution > 1`` on two or more
    Mirrored/MultiWorkerMirrored replicas) and leaves every other model to Keras.

    Args:
        issues: apply only these, e.g. ``["keras#19246"]``. Defaults to `None` (all).

    Returns:
        The issues worked around in this process so far, as :func:`applied` gives them.

    Raises:
        ValueError: an issue tfdp-utils has no workaround for.
        TypeError: ``issues`` is a single string.

    Examples:
        >>> import tfdp_utils as tdu
        >>> tdu.compat.apply(["keras#19246"])  # doctest: +SKIP
        ('keras#19246', 'keras#20582')
    """
    return _apply(_select(issues), "tdu.compat.apply()")


def needed_for(strategy: Any) -> tuple[str, ...]:
    """The workarounds a strategy can need, whether or not the installed Keras has the bugs.

    MultiWorkerMirroredStrategy needs keras#20585 and tensorflow#72388; MirroredStrategy or
    MultiWorkerMirroredStrategy with two or more replicas in sync needs keras#19246 (for
    ``steps_per_execution > 1``); either, on any number of replicas, needs keras#20582 (for
    ``gradient_accumulation_steps``). Pure: applies nothing.

    Args:
        strategy: a ``tf.distribute.Strategy``.

    Returns:
        Issue names, in the order :func:`apply` applies them.
    """
    from tfdp_utils._tf import tf

    needs: list[str] = []
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        needs += [keras_20585.ISSUE, tf_72388.ISSUE]
    if is_mirrored_family(strategy) and int(strategy.num_replicas_in_sync) >= 2:
        needs.append(keras_19246.ISSUE)
    if is_mirrored_family(strategy):
        needs.append(keras_20582.ISSUE)
    return tuple(needs)


def apply_for_strategy(strategy: Any) -> tuple[str, ...]:
    """Apply the workarounds that training under ``strategy`` needs (see :func:`needed_for`).

    :func:`tfdp_utils.auto_strategy` calls this for the strategy it builds. Same guarantees
    as :func:`apply`.

    Args:
        strategy: a ``tf.distribute.Strategy``.

    Returns:
        The issues worked around in this process so far, as :func:`applied` gives them.

    Examples:
        >>> import tfdp_utils as tdu
        >>> strategy = tf.distribute.MirroredStrategy(["/gpu:0", "/gpu:1"])  # doctest: +SKIP
        >>> tdu.compat.apply_for_strategy(strategy)  # doctest: +SKIP
        ('keras#19246', 'keras#20582')
    """
    needs = needed_for(strategy)
    if not needs:
        return applied()
    reason = f"{type(strategy).__name__} over {strategy.num_replicas_in_sync} replicas"
    return _apply(_select(needs), reason)


def apply_for_datasets() -> bool:
    """On tf_keras, let ``fit``/``evaluate`` take builder datasets without ``steps``.

    tf_keras refuses a distributed dataset without ``steps_per_epoch`` and keeps one
    iterator for all epochs. For a dataset from :func:`tfdp_utils.build_distributed_dataset`
    that ends each epoch (no ``repeat``) this makes tf_keras infer the epoch's steps from
    ``dataset.tfdp_info`` and start a fresh pass each epoch, as Keras 3 does. Other inputs
    keep tf_keras's behaviour. The builder calls this; calling it again does nothing.

    Returns:
        True when the tf_keras adapter is patched in this process; False on Keras 3, when
        ``TFDP_NO_KERAS_PATCHES=1``, or when this tf_keras has no adapter to patch.
    """
    from tfdp_utils._tf import IS_KERAS3

    with _LOCK:
        if IS_KERAS3:
            return False
        if tf_keras_datasets.installed():
            return True
        if disabled():
            _log_once(
                "disabled-datasets",
                logging.WARNING,
                "tfdp_utils: %s=1: on tf_keras, pass "
                "steps_per_epoch=dataset.tfdp_info.steps_per_epoch to fit",
                DISABLE_VARIABLE,
            )
            return False
        return tf_keras_datasets.install()


def applied() -> tuple[str, ...]:
    """The upstream issues worked around (fixed or guarded) in this process, in order applied.

    Returns:
        Issue names such as ``("keras#20585", "tensorflow#72388", "keras#19246")``; empty on
        tf_keras, when nothing was needed, or when ``TFDP_NO_KERAS_PATCHES=1``.
    """
    with _LOCK:
        return tuple(_APPLIED)


def status() -> tuple[WorkaroundStatus, ...]:
    """Every known upstream bug: whether this Keras has it and what tfdp-utils did about it.

    Runs the probes (cheap, no cluster, nothing patched).

    Returns:
        One :class:`WorkaroundStatus` per workaround.
    """
    with _LOCK:
        return tuple(
            WorkaroundStatus(
                issue=w.issue,
                summary=w.summary,
                url=w.url,
                verified_on=w.verified_on,
                bug_present=_bug_present(w),
                applied=_APPLIED[w.issue][0] if w.issue in _APPLIED else None,
            )
            for w in WORKAROUNDS
        )


def undo(issue: str) -> None:
    """Take one applied workaround back out: Keras' own code is restored.

    For code that needs Keras' own behaviour in-process after :func:`apply` (a reproduction
    of the upstream bug, a comparison); nothing happens when ``issue`` is not applied.

    Args:
        issue: the upstream issue, e.g. ``"keras#19246"``.
    """
    with _LOCK:
        entry = _APPLIED.pop(issue, None)
        if entry is not None:
            for patch in reversed(entry[1]):
                patch.undo()


__all__ = [
    "DISABLE_VARIABLE",
    "WORKAROUNDS",
    "KerasCompatError",
    "WorkaroundStatus",
    "applied",
    "apply",
    "apply_for_datasets",
    "apply_for_strategy",
    "disabled",
    "needed_for",
    "status",
    "undo",
]
