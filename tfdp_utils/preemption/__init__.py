"""Preemption: save on a notice, exit to be run again, resume mid-epoch exactly. Pure.

=================================  ==========================================================
``preemption/_signals.py``         the notice: which signals, a handler that only notes it,
                                   the exit status (75)
``preemption/_store.py``           the checkpoint folder: atomic saves, the latest good one
``preemption/_agreement.py``       how the workers agree on the step to stop at
``preemption/_position.py``        the saved position and its arithmetic
``preemption/_mismatch.py``        whether a checkpoint is this run's
``preemption/_elastic.py``         a checkpoint resumed on another number of replicas or workers
``preemption/_arguments.py``       the arguments checked, and what is said about them
``preemption/_run.py``             one prepared ``fit`` and its grace monitor
``preemption/_restore.py``         where a run starts, the checkpoint read back (TensorFlow)
``preemption/_saving.py``          the saves and the stop after a notice (TensorFlow)
``preemption/_ordering.py``        the callback's hooks first among a fit's (TensorFlow)
``preemption/_loop.py``            a custom loop's batches, positioned and saved
``preemption/_callback.py``        ``PreemptionCheckpoint``, the Keras callback (TensorFlow)
=================================  ==========================================================

``PreemptionCheckpoint`` is also ``tdu.callbacks.PreemptionCheckpoint``; it loads TensorFlow
when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfdp_utils._lazy import surface
from tfdp_utils.preemption._signals import PREEMPTED_EXIT_STATUS as PREEMPTED_EXIT_STATUS

if TYPE_CHECKING:
    from tfdp_utils.preemption._callback import PreemptionCheckpoint as PreemptionCheckpoint

# __all__ and dir() are the names imported above as `name as name` (see tfdp_utils._lazy).
__all__, __getattr__, __dir__ = surface(globals())
