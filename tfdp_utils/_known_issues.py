"""Upstream bugs that affect data-parallel training, as data, and how they apply here.

Pure Python, no TensorFlow: :data:`KNOWN_ISSUES` is the table ``tfdp-utils doctor`` prints,
and :func:`assess` marks one entry for the installed versions (and, for the bugs
:mod:`tfdp_utils.compat` works around, what its probe found). Add a bug by adding a
:class:`KnownIssue`; the doctor and the docs read it from here.

Example:
>>> [i.issue for i in KNOWN_ISSUES][:3]
['keras#20585', 'tensorflow#72388', 'keras#19246']
>>> assess(ISSUES["keras#20611"], Installed(keras="3.15.1", tensorflow="2.21.0")).verdict
'fixed'
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from tfdp_utils._versions import at_least

Package = Literal["keras", "tensorflow"]
Verdict = Literal["affected", "fixed", "worked around", "not affected", "not applicable"]


@dataclasses.dataclass(frozen=True)
class KnownIssue:
    """One upstream bug and the versions it affects.

    Attributes:
        issue: ``"keras#19246"``, or a name when tfdp-utils knows no issue number.
        title: what goes wrong, in a user's words.
        package: the package whose versions decide: ``"keras"`` (Keras 3 only; tf_keras is a
            different code base) or ``"tensorflow"``.
        affected_from: the first version known to have the bug.
        fixed_in: the first release with the fix, or None when none is known.
        workaround: how tfdp-utils works around it: ``"compat"`` (a patch in
            :mod:`tfdp_utils.compat`, applied when its probe finds the bug), ``"always"`` (the
            toolkit avoids the construct), or None.
        hardware: ``"gpu"`` or ``"tpu"`` when the bug needs that hardware to show, else None.
        url: the upstream issue, or the documentation of the affected API.
        note: what to do about it, or what else is known.
    """

    issue: str
    title: str
    package: Package
    affected_from: str
    fixed_in: str | None
    workaround: Literal["compat", "always"] | None
    hardware: Literal["gpu", "tpu"] | None
    url: str
    note: str = ""


KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        issue="keras#20585",
        title="Keras 3 fit/evaluate fail under MultiWorkerMirroredStrategy (_maybe_symbolic_build)",
        package="keras",
        affected_from="3.0",
        fixed_in=None,
        workaround="compat",
        hardware=None,
        url="https://github.com/keras-team/keras/issues/20585",
    ),
    KnownIssue(
        issue="tensorflow#72388",
        title="Keras 3 fit under MultiWorkerMirroredStrategy fails in reduce_per_replica",
        package="keras",
        affected_from="3.0",
        fixed_in=None,
        workaround="compat",
        hardware=None,
        url="https://github.com/tensorflow/tensorflow/issues/72388",
    ),
    KnownIssue(
        issue="keras#19246",
        title="steps_per_execution > 1 fails on 2 or more Mirrored/MultiWorkerMirrored replicas",
        package="keras",
        affected_from="3.0",
        fixed_in=None,
        workaround="compat",
        hardware=None,
        url="https://github.com/keras-team/keras/issues/19246",
    ),
    KnownIssue(
        issue="keras#20582",
        title="optimizer gradient_accumulation_steps under MirroredStrategy",
        package="keras",
        affected_from="3.0",
        fixed_in=None,
        workaround="compat",
        hardware=None,
        url="https://github.com/keras-team/keras/issues/20582",
        note="accumulate with a larger global batch instead; check_replica_equivalence "
        "shows whether your setup trains the same",
    ),
    KnownIssue(
        issue="keras-lso-replicas",
        title="mixed precision on 2+ Mirrored replicas: a step whose gradients overflow on a "
        "replica other than the first is applied (NaN weights)",
        package="keras",
        affected_from="3.0",
        fixed_in=None,
        workaround="compat",
        hardware=None,
        url="https://github.com/keras-team/keras/blob/master/keras/src/optimizers/"
        "loss_scale_optimizer.py",
        note="LossScaleOptimizer takes the first replica's finiteness check; tfdp-utils decides "
        "over every replica and worker (tf_keras already does)",
    ),
    KnownIssue(
        issue="keras#21061",
        title="distributed training produces NaN losses under MirroredStrategy",
        package="keras",
        affected_from="3.7",
        fixed_in="3.10",
        workaround=None,
        hardware=None,
        url="https://github.com/keras-team/keras/issues/21061",
        note="reported again on 3.10 with 4 GPUs; doctor's self-tests watch for NaNs",
    ),
    KnownIssue(
        issue="tensorflow#90686",
        title="NaN loss on multi-GPU MirroredStrategy since TensorFlow 2.16",
        package="tensorflow",
        affected_from="2.16",
        fixed_in=None,
        workaround=None,
        hardware="gpu",
        url="https://github.com/tensorflow/tensorflow/issues/90686",
        note="open upstream; run `tfdp-utils doctor --gpu` and check_replica_equivalence "
        "on your GPUs",
    ),
    KnownIssue(
        issue="keras#20611",
        title="a model with Dropout cannot be built under MirroredStrategy",
        package="keras",
        affected_from="3.7",
        fixed_in="3.8",
        workaround=None,
        hardware=None,
        url="https://github.com/keras-team/keras/issues/20611",
        note="since the fix, every replica draws the same Dropout mask (the seed state is "
        "not per replica); check_replica_equivalence reports it",
    ),
    KnownIssue(
        issue="keras#20763",
        title="MirroredStrategy with XLA (jit_compile) and mixed precision fails or hangs",
        package="keras",
        affected_from="3.0",
        fixed_in=None,
        workaround=None,
        hardware="gpu",
        url="https://github.com/keras-team/keras/issues/20763",
        note="under MirroredStrategy, compile with jit_compile=False or train in float32",
    ),
    KnownIssue(
        issue="tpu-metadata-wait",
        title="TPUClusterResolver waits on the GCE metadata server with no timeout off GCP",
        package="tensorflow",
        affected_from="2.0",
        fixed_in=None,
        workaround="always",
        hardware=None,
        url="https://www.tensorflow.org/api_docs/python/tf/distribute/cluster_resolver/TPUClusterResolver",
        note="auto_strategy bounds the probe (probe_timeout, 5 s by default)",
    ),
    KnownIssue(
        issue="tf_keras-autograph",
        title="tf_keras on TensorFlow 2.16: the first step of fit/evaluate/predict takes "
        "10-80 s (autograph converts tf_keras itself)",
        package="tensorflow",
        affected_from="2.16",
        fixed_in="2.17",
        workaround="always",
        hardware=None,
        url="https://github.com/tensorflow/tensorflow/blob/v2.17.0/tensorflow/python/autograph/core/config.py",
        note="upstream: TensorFlow 2.16's autograph has keras but not tf_keras on its "
        "do-not-convert list (added in 2.17); tdu.compat's tf_keras-autograph change adds it "
        "on tf_keras (demo: 15.7 s -> 0.8 s), off with TFDP_NO_KERAS_PATCHES=1",
    ),
)

ISSUES: dict[str, KnownIssue] = {entry.issue: entry for entry in KNOWN_ISSUES}
""":data:`KNOWN_ISSUES` by issue name."""


@dataclasses.dataclass(frozen=True)
class Installed:
    """The versions and workaround state that :func:`assess` judges against.

    Attributes:
        keras: the Keras 3 version ``tf.keras`` resolves to, or None (tf_keras active or no
            Keras).
        tensorflow: the TensorFlow version, or None.
        bug_present: for the bugs :mod:`tfdp_utils.compat` works around, whether its probe
            found the bug, by issue (an issue listed here counts as worked around).
        workarounds_disabled: ``TFDP_NO_KERAS_PATCHES=1``.
        gpus: GPUs visible. tpus: TPU cores visible.
    """

    keras: str | None
    tensorflow: str | None
    bug_present: dict[str, bool] = dataclasses.field(default_factory=dict)
    workarounds_disabled: bool = False
    gpus: int = 0
    tpus: int = 0


@dataclasses.dataclass(frozen=True)
class Assessment:
    """One known issue, marked for this installation.

    Attributes:
        issue: the :class:`KnownIssue`.
        verdict: affected / fixed / worked around / not affected / not applicable.
        reason: why, in a few words.
        here: whether this machine has what the bug needs to show (its hardware).
    """

    issue: KnownIssue
    verdict: Verdict
    reason: str
    here: bool


def parse_version(text: str) -> tuple[int, ...]:
    """The leading numbers of a version: ``"2.21.0rc1"`` -> ``(2, 21, 0)``."""
    numbers = []
    for part in text.split("."):
        match = re.match(r"\d+", part)
        if not match:
            break
        numbers.append(int(match.group()))
        if match.group() != part:
            break
    return tuple(numbers)


def _at_least(version: str, bound: str) -> bool:
    # A development build or release candidate of the fixing release is not yet the fix.
    return at_least(version, bound)


def _not_applied(release: str, version: str) -> str:
    """The reason for a bug tdu.compat would patch that this release has fixed."""
    return f"fixed upstream in {release}, patch not applied (probe: bug absent in {version})"


def assess(issue: KnownIssue, installed: Installed) -> Assessment:
    """Mark ``issue`` as affected / fixed / worked around for ``installed`` (pure).

    Args:
        issue: an entry of :data:`KNOWN_ISSUES`.
        installed: the versions and workaround state here.

    Returns:
        An :class:`Assessment`.
    """
    here = {"gpu": installed.gpus > 0, "tpu": installed.tpus > 0, None: True}[issue.hardware]
    version = installed.keras if issue.package == "keras" else installed.tensorflow
    if version is None:
        what = "Keras 3 is not active (tf_keras or none)" if issue.package == "keras" else ""
        return Assessment(issue, "not applicable", what or "TensorFlow not installed", here)
    if not _at_least(version, issue.affected_from):
        return Assessment(issue, "not affected", f"{version} < {issue.affected_from}", here)
    if issue.fixed_in is not None and _at_least(version, issue.fixed_in):
        if issue.workaround == "compat":
            return Assessment(issue, "fixed", _not_applied(issue.fixed_in, version), here)
        return Assessment(issue, "fixed", f"fixed in {issue.fixed_in}, have {version}", here)
    if issue.workaround == "always":
        return Assessment(issue, "worked around", "tfdp-utils avoids it", here)
    # A bug tdu.compat has a probe for is judged by the probe, whatever the table says.
    if issue.workaround == "compat" or issue.issue in installed.bug_present:
        if not installed.bug_present.get(issue.issue, True):
            release = ".".join(str(n) for n in parse_version(version)[:2])
            return Assessment(issue, "fixed", _not_applied(release, version), here)
        if installed.workarounds_disabled:
            return Assessment(
                issue, "affected", "probe: bug present; TFDP_NO_KERAS_PATCHES=1", here
            )
        return Assessment(issue, "worked around", "probe: bug present; tdu.compat", here)
    return Assessment(issue, "affected", f"{version} in the affected range, no fix known", here)
