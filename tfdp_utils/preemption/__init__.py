"""Preemption: save on a notice, exit to be run again, resume mid-epoch exactly. Pure.

=================================  ==========================================================
``preemption/_signals.py``         the notice: which signals, a handler that only notes it,
                                   the exit status (75)
``preemption/_store.py``           the checkpoint folder: atomic saves, the latest good one
``preemption/_agreement.py``       how the workers agree on the step to stop at
``preemption/_callback.py``        ``PreemptionCheckpoint``, the Keras callback (TensorFlow)
=================================  ==========================================================

``PreemptionCheckpoint`` is also ``tdu.callbacks.PreemptionCheckpoint``; it loads TensorFlow
when first used.
"""

from tfdp_utils._lazy import surface
from tfdp_utils.preemption._signals import PREEMPTED_EXIT_STATUS

__all__ = ["PREEMPTED_EXIT_STATUS", "PreemptionCheckpoint"]

__getattr__, __dir__ = surface(
    __name__, {"PreemptionCheckpoint": "tfdp_utils.preemption._callback"}, globals(), __all__
)
