"""The kill switch ``TFDP_NO_KERAS_PATCHES``, and the log messages of the compat package.

One variable turns every change that :mod:`tfdp_utils.compat` marks ``kill_switch=True`` off:
the upstream workarounds, the ``fit``/``evaluate``/``predict`` binding and tf_keras's dataset
adapter. The features that depend on them then stop working, and :func:`warn_features_off`
says which, once per process.
"""

from __future__ import annotations

import logging
from typing import Any

from tfdp_utils import _variables
from tfdp_utils._public import public
from tfdp_utils._tf import IS_KERAS3
from tfdp_utils._validate import env_flag

# A child of the package's "tfdp_utils" logger: configuring that one configures this too.
logger = logging.getLogger("tfdp_utils.compat")

DISABLE_VARIABLE = _variables.NO_KERAS_PATCHES
"""Environment variable: ``1`` turns every Keras workaround and process-wide Keras change off."""

_LOGGED: set[str] = set()

FEATURES_OFF = (
    "exact example counts of ThroughputLogger from the builder dataset fit trains on "
    "(pass ThroughputLogger(..., dataset=<the builder dataset>) or global_batch_size=)",
    "the endless-epoch check (EndlessEpochError): a builder dataset that repeats without end, "
    "given to fit without steps_per_epoch=, is not refused, and on Keras 3 its first epoch "
    "never ends; pass steps_per_epoch= to fit (validation_steps= with validation_data, "
    "steps= to evaluate/predict)",
    "the strategy-mismatch check (StrategyMismatchError): a dataset built for another number "
    "of replicas fails inside Keras' step instead; build it under the model's strategy",
    "the validation_split refusal naming the fix: Keras raises its own error for a dataset "
    "instead; split the source with tdu.split_for_validation",
)
TF_KERAS_FEATURES_OFF = (
    "on tf_keras, fit/evaluate taking the steps of a builder dataset themselves; pass "
    "steps_per_epoch=dataset.tfdp_info.steps_per_epoch to fit (steps= to evaluate), with "
    "repeat='epochs'",
)


@public("tfdp_utils.compat")
def disabled() -> bool:
    """Whether ``TFDP_NO_KERAS_PATCHES`` turns the workarounds and Keras changes off here."""
    return env_flag(DISABLE_VARIABLE)


def log_once(key: str, level: int, message: str, *args: Any) -> None:
    """Log ``message`` on ``tfdp_utils.compat`` the first time ``key`` is seen in the process."""
    if key not in _LOGGED:
        _LOGGED.add(key)
        logger.log(level, message, *args)


def warn_features_off(asked_by: str) -> None:
    """The one warning (per process) naming what ``TFDP_NO_KERAS_PATCHES=1`` turns off."""
    features = FEATURES_OFF if IS_KERAS3 else FEATURES_OFF + TF_KERAS_FEATURES_OFF
    log_once(
        "features-off",
        logging.WARNING,
        "tfdp_utils: %s=1, so Keras' Model.fit/evaluate/predict are left unwrapped (%s asked "
        "for them) and these features are off: %s.",
        DISABLE_VARIABLE,
        asked_by,
        "; ".join(f"({n}) {f}" for n, f in enumerate(features, 1)),
    )
