"""Every runtime change tfdp-utils makes to Keras or TensorFlow: one registry, one kill switch.

:func:`status` lists each change with what it changes, why, when it was applied and by what,
and whether :func:`undo` can take it back out. There are three kinds:

- ``"workaround"``: the upstream Keras 3 bugs below, each fixed (or guarded) only where the
  installed Keras has it;
- ``"process"``: other changes seen by every object of the process: Keras'
  ``Model.fit``/``evaluate``/``predict`` wrapped (``"fit-binding"``, by the first builder dataset
  or ``ThroughputLogger``), a ``fit`` over a builder dataset kept at one iterator for all its
  epochs (``"fit-one-iterator"``, by the first builder dataset), tf_keras's dataset adapter
  taught builder datasets (``"tf_keras-datasets"``), MirroredStrategy's collective key base moved on
  (``"mirrored-collective-keys"``, by :func:`tfdp_utils.auto_strategy`);
- ``"object"``: changes to single objects tfdp-utils makes or is handed, counted: builder
  datasets' class (``"builder-dataset-class"``), a model's ``train_step`` under
  :func:`tfdp_utils.enable_gradient_accumulation` (``"accumulation-train-step"``), the choice kept
  on a strategy from :func:`tfdp_utils.auto_strategy` (``"strategy-choice"``).

The upstream workarounds:

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
- ``keras-lso-replicas`` (:mod:`.keras_lso_replicas`): under mixed precision on two or more
  Mirrored/MultiWorkerMirrored replicas, ``LossScaleOptimizer`` applies a step whose gradients
  overflow on a replica other than the first (NaN weights).

:func:`tfdp_utils.auto_strategy` applies the ones its strategy needs (through
:func:`apply_for_strategy`); :func:`apply` applies every one whose bug is present. Each is
applied at most once per process and logged once (logger ``tfdp_utils.compat``, a child of
``tfdp_utils``). These bugs live in Keras 3's TensorFlow trainer and optimizer; tf_keras is
never touched.

On tf_keras, :func:`apply_for_datasets` (:mod:`.tf_keras_datasets`) lets ``fit`` and
``evaluate`` take a dataset from :func:`tfdp_utils.build_distributed_dataset` without
``steps_per_epoch``, as Keras 3 does; the builder applies it.

Set ``TFDP_NO_KERAS_PATCHES=1`` to turn off every workaround and every process-wide Keras
change (the fit binding, one iterator per fit and the tf_keras adapter; one warning names the
features that are then off). The collective key base and the per-object changes stay: none of
them changes Keras' code.

Examples:
    >>> import tfdp_utils as tdu
    >>> tdu.compat.apply()  # doctest: +SKIP
    ('keras#20585', 'tensorflow#72388', 'keras#19246', 'keras#20582', 'keras-lso-replicas')
    >>> tdu.compat.applied()  # doctest: +SKIP
    ('keras#20585', 'tensorflow#72388', 'keras#19246', 'keras#20582', 'keras-lso-replicas')
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

from tfdp_utils._tf import require_supported
from tfdp_utils.compat import _changes as changes
from tfdp_utils.compat import _fit_binding as fit_binding
from tfdp_utils.compat import _keras_19246 as keras_19246
from tfdp_utils.compat import _keras_20582 as keras_20582
from tfdp_utils.compat import _keras_20585 as keras_20585
from tfdp_utils.compat import _keras_lso_replicas as keras_lso_replicas
from tfdp_utils.compat import _one_iterator as one_iterator
from tfdp_utils.compat import _resume_position as resume_position
from tfdp_utils.compat import _tf_72388 as tf_72388
from tfdp_utils.compat import _tf_keras_datasets as tf_keras_datasets
from tfdp_utils.compat._registry import (
    REGISTRY,
    AppliedChange,
    RuntimeChange,
    Workaround,
    is_mirrored_family,
    keras3_trainer_module,
    keras_version,
)
from tfdp_utils.compat._switch import DISABLE_VARIABLE, disabled, logger
from tfdp_utils.compat._switch import log_once as _log_once
from tfdp_utils.errors import KerasCompatError

WORKAROUNDS: tuple[Workaround, ...] = (
    keras_20585.WORKAROUND,
    tf_72388.WORKAROUND,
    keras_19246.WORKAROUND,
    keras_20582.WORKAROUND,
    keras_lso_replicas.WORKAROUND,
)
_BY_ISSUE = {w.issue: w for w in WORKAROUNDS}

CHANGES: tuple[RuntimeChange, ...] = (
    *(w.change for w in WORKAROUNDS),
    fit_binding.CHANGE,
    one_iterator.CHANGE,
    tf_keras_datasets.CHANGE,
    *changes.CHANGES,
    resume_position.CHANGE,
)
"""Every runtime change tfdp-utils can make, in the order :func:`status` lists them."""
_BY_NAME = {c.name: c for c in CHANGES}

_LOCK = REGISTRY.lock
_PROBED: dict[str, bool] = {}


@dataclasses.dataclass(frozen=True)
class WorkaroundStatus:
    """What tfdp-utils knows about one runtime change in this process (see :func:`status`).

    Named for the upstream workarounds it first described; the fields after ``applied`` cover
    every kind of change.

    Attributes:
        issue: the upstream issue for a workaround, e.g. ``"keras#19246"``; else the change's
            name, e.g. ``"fit-binding"`` (what :func:`undo` takes).
        summary: what fails without the workaround; for another change, what it changes.
        url: the upstream issue's address ("" for changes that are not workarounds).
        verified_on: Keras versions the workaround was verified on (empty for others).
        bug_present: whether the probe finds the bug in the Keras that ``tf.keras`` resolves
            to (always False on tf_keras, on non-TensorFlow Keras backends, and for changes
            that are not workarounds).
        applied: ``"fix"`` (patched), ``"guard"`` (a clear error before the first step where
            no safe fix exists), ``"change"`` (another change, made at least once), or None
            (not applied).
        kind: ``"workaround"``, ``"process"`` (a class or module, seen by every object) or
            ``"object"`` (single objects, counted in ``count``).
        changes: what is changed, e.g. ``"keras.Model.fit/evaluate/predict wrapped"``.
        why: what it is for and what fails without it.
        applied_at: when it was first applied (``time.time()``), or None.
        applied_by: what first applied it, e.g. ``"build_distributed_dataset()"``, or None.
        undoable: whether :func:`undo` can take it back out.
        kill_switch: whether ``TFDP_NO_KERAS_PATCHES=1`` turns it off.
        count: how many times it was applied: for ``"object"`` changes, the objects changed.
        patched: the attributes replaced now, e.g. ``("Model.fit", ...)``.
    """

    issue: str
    summary: str
    url: str
    verified_on: tuple[str, ...]
    bug_present: bool
    applied: str | None
    kind: str = "workaround"
    changes: str = ""
    why: str = ""
    applied_at: float | None = None
    applied_by: str | None = None
    undoable: bool = True
    kill_switch: bool = True
    count: int = 0
    patched: tuple[str, ...] = ()


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
            needed = [w.issue for w in selected if w.issue not in applied() and _bug_present(w)]
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
            if REGISTRY.get(workaround.issue) is not None or not _bug_present(workaround):
                continue
            mode, patches = workaround.install(trainer)
            REGISTRY.record(workaround.change, applied_by=reason, patches=patches, mode=mode)
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
        ('keras#19246', 'keras#20582', 'keras-lso-replicas')
    """
    return _apply(_select(issues), "tdu.compat.apply()")


def needed_for(strategy: Any) -> tuple[str, ...]:
    """The workarounds a strategy can need, whether or not the installed Keras has the bugs.

    MultiWorkerMirroredStrategy needs keras#20585 and tensorflow#72388; MirroredStrategy or
    MultiWorkerMirroredStrategy with two or more replicas in sync needs keras#19246 (for
    ``steps_per_execution > 1``) and keras-lso-replicas (for mixed precision); either, on any
    number of replicas, needs keras#20582 (for ``gradient_accumulation_steps``). Pure: applies
    nothing.

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
    if is_mirrored_family(strategy) and int(strategy.num_replicas_in_sync) >= 2:
        needs.append(keras_lso_replicas.ISSUE)
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
        ('keras#19246', 'keras#20582', 'keras-lso-replicas')
    """
    require_supported()
    changes.skip_autograph_for_tf_keras(applied_by="apply_for_strategy()")
    needs = needed_for(strategy)
    if not needs:
        return applied()
    reason = (
        f"apply_for_strategy() for {type(strategy).__name__} over "
        f"{strategy.num_replicas_in_sync} replicas"
    )
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
    return changes.teach_tf_keras(applied_by="tdu.compat.apply_for_datasets()")


def apply_for_resume() -> tuple[str, ...]:
    """Apply what a ``fit`` that starts mid-epoch needs (``PreemptionCheckpoint``).

    Its first step can be an epoch's partial last step, cut unevenly over the replicas, which
    Keras 3's symbolic build cannot average (``AddN`` of unequal shapes): the keras#20585
    workaround builds from the first replica's batch there.

    Returns:
        The issues worked around in this process so far.
    """
    return _apply(_select([keras_20585.ISSUE]), "PreemptionCheckpoint (a resume mid-epoch)")


def applied() -> tuple[str, ...]:
    """The upstream issues worked around (fixed or guarded) in this process, in order applied.

    Returns:
        Issue names such as ``("keras#20585", "tensorflow#72388", "keras#19246")``; empty on
        tf_keras, when nothing was needed, or when ``TFDP_NO_KERAS_PATCHES=1``. The other
        changes are in :func:`status`.
    """
    return REGISTRY.applied("workaround")


def _status(change: RuntimeChange) -> WorkaroundStatus:
    workaround = _BY_ISSUE.get(change.name)
    entry: AppliedChange | None = REGISTRY.get(change.name)
    patches = entry.patches if entry is not None else []
    return WorkaroundStatus(
        issue=change.name,
        summary=workaround.summary if workaround is not None else change.changes,
        url=workaround.url if workaround is not None else "",
        verified_on=workaround.verified_on if workaround is not None else (),
        bug_present=_bug_present(workaround) if workaround is not None else False,
        applied=entry.mode if entry is not None else None,
        kind=change.kind,
        changes=change.changes,
        why=change.why,
        applied_at=entry.applied_at if entry is not None else None,
        applied_by=entry.applied_by if entry is not None else None,
        undoable=change.undoable,
        kill_switch=change.kill_switch,
        count=entry.count if entry is not None else 0,
        patched=tuple(p.describe() for p in patches if p.installed()),
    )


def status() -> tuple[WorkaroundStatus, ...]:
    """Every runtime change tfdp-utils can make: what, why, whether and when it was made.

    The upstream workarounds first (with whether this Keras has each bug: the probes are
    cheap, need no cluster and patch nothing), then the process-wide changes, then the
    per-object ones. Each entry says what it changes, why, when and by what it was first
    applied, whether :func:`undo` can take it out, and whether ``TFDP_NO_KERAS_PATCHES=1``
    turns it off.

    Returns:
        One :class:`WorkaroundStatus` per change, applied or not, in the order of
        :data:`CHANGES`.

    Examples:
        >>> import tfdp_utils as tdu
        >>> [s.issue for s in tdu.compat.status() if s.applied]  # doctest: +SKIP
        ['keras#19246', 'keras#20582', 'keras-lso-replicas', 'fit-binding', ...]
    """
    with _LOCK:
        return tuple(_status(change) for change in CHANGES)


def undo(issue: str) -> None:
    """Take one applied change back out: Keras' (or tf_keras's) own code is restored.

    For code that needs Keras' own behaviour in-process after a change (a reproduction of an
    upstream bug, a comparison, a test): any workaround, ``"fit-binding"`` (Keras' own
    ``Model.fit``/``evaluate``/``predict``) or ``"tf_keras-datasets"``. Nothing happens when
    the change is not applied. A later call that needs the change (a builder dataset, a
    ``ThroughputLogger``, :func:`apply`) makes it again.

    Args:
        issue: the change's name, as :attr:`WorkaroundStatus.issue` gives it, e.g.
            ``"keras#19246"`` or ``"fit-binding"``.

    Raises:
        ValueError: a name tfdp-utils has no change for, or one that cannot be undone
            (:attr:`WorkaroundStatus.why` says why).

    Examples:
        >>> import tfdp_utils as tdu
        >>> tdu.compat.undo("fit-binding")  # doctest: +SKIP
    """
    change = _BY_NAME.get(issue)
    if change is None:
        raise ValueError(
            f"tfdp-utils makes no runtime change called {issue!r}; the changes are "
            f"{[c.name for c in CHANGES]}."
        )
    if not change.undoable:
        raise ValueError(f"{issue} ({change.changes}) cannot be undone: {change.why}.")
    REGISTRY.undo(issue)


__all__ = [
    "CHANGES",
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
