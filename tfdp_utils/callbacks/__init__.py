"""Keras callbacks: thin adapters over the pure pieces of tfdp-utils.

Each callback subclasses the ``Callback`` class of the Keras that ``tf.keras`` resolves to
in this process (Keras 3, or tf_keras under ``TF_USE_LEGACY_KERAS=1``).
"""

from tfdp_utils.callbacks._throughput_logger import ThroughputLogger
from tfdp_utils.preemption._callback import PreemptionCheckpoint

__all__ = ["PreemptionCheckpoint", "ThroughputLogger"]
