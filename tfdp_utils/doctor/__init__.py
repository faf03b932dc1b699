"""Checking: ``tfdp-utils doctor``, the known upstream bugs, ``check_replica_equivalence``.

============================  =============================================================
``doctor/_command.py``        ``tfdp-utils doctor``: versions without TensorFlow, self-tests
                              in a bounded child process
``doctor/_checks.py``         the self-tests the child runs
``_known_issues.py``          upstream bugs as data (in the package's floor, beside the
                              compat registry that names them), assessed here
``doctor/_equivalence.py``    ``check_replica_equivalence``: N replicas vs one device
``doctor/_comparison.py``     its records, report and comparison rule (pure NumPy)
``doctor/_check.py``          one line of the doctor's table (pure)
============================  =============================================================

Importing this package imports no TensorFlow; each name loads its module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfdp_utils._lazy import surface

if TYPE_CHECKING:
    from tfdp_utils.doctor._comparison import EquivalenceReport as EquivalenceReport
    from tfdp_utils.doctor._equivalence import (
        check_replica_equivalence as check_replica_equivalence,
    )
    from tfdp_utils.errors import ReplicaDivergenceError as ReplicaDivergenceError

# __all__ and dir() are the names imported above as `name as name` (see tfdp_utils._lazy).
__all__, __getattr__, __dir__ = surface(globals())
