"""Training steps: the custom step over the global batch, accumulation, mixed precision.

============================  =============================================================
``training/_step.py``         ``make_distributed_train_step``: a loss averaged over the
                              global batch
``training/_accumulation.py`` replica-local gradient accumulation (custom step, tf_keras fit)
``training/_mixed_precision.py``  loss scaling on both Kerases
============================  =============================================================

Importing this package imports no TensorFlow; each name loads its module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfdp_utils._lazy import surface

if TYPE_CHECKING:
    from tfdp_utils.training._accumulation import (
        enable_gradient_accumulation as enable_gradient_accumulation,
    )
    from tfdp_utils.training._step import DistributedTrainStep as DistributedTrainStep
    from tfdp_utils.training._step import make_distributed_train_step as make_distributed_train_step

# __all__ and dir() are the names imported above as `name as name` (see tfdp_utils._lazy).
__all__, __getattr__, __dir__ = surface(globals())
