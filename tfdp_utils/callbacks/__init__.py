"""Keras callbacks: thin adapters over the pure pieces of tfdp-utils.

Each callback subclasses the ``Callback`` class of the Keras that ``tf.keras`` resolves to
in this process (Keras 3, or tf_keras under ``TF_USE_LEGACY_KERAS=1``).
"""

from tfdp_utils._lazy import surface
from tfdp_utils.callbacks._divergence_guard import DivergenceGuard as DivergenceGuard
from tfdp_utils.callbacks._throughput_logger import ThroughputLogger as ThroughputLogger
from tfdp_utils.preemption._callback import PreemptionCheckpoint as PreemptionCheckpoint

# __all__ and dir() are the names imported above as `name as name` (see tfdp_utils._lazy).
__all__, __getattr__, __dir__ = surface(globals())
