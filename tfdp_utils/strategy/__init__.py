"""Which strategy: choose (pure) -> detect -> build, with every probe and wait bounded.

============================  =============================================================
``strategy/_choice.py``       ``choose_strategy`` (pure), ``auto_strategy``, ``explain``
``strategy/_detect.py``       what devices, TPU hints and cluster this process sees
``strategy/_build.py``        building the strategy, every probe and wait bounded
``strategy/_faults.py``       the collective watchdog; backup folders per worker
``strategy/_stuck.py``        who holds up a stuck step: a worker's phase, the diagnosis (pure)
``strategy/_phase_board.py``  each worker's phase and abort mark, in the coordination store
``strategy/_phase_tracker.py`` the watchdog's sampling of the training thread
``strategy/_xla.py``          whether Keras will compile with XLA under a strategy (pure)
============================  =============================================================

Importing this package imports no TensorFlow; each name loads its module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfdp_utils._lazy import surface

if TYPE_CHECKING:
    from tfdp_utils.errors import TPUProbeError
    from tfdp_utils.strategy._backup_dir import worker_backup_dir
    from tfdp_utils.strategy._build import run_server
    from tfdp_utils.strategy._choice import auto_strategy, choose_strategy, explain
    from tfdp_utils.strategy._detect import Environment, detect_environment
    from tfdp_utils.strategy._faults import CollectiveWatchdog
    from tfdp_utils.strategy._strategy_choice import StrategyChoice

_HOMES = {
    "CollectiveWatchdog": "tfdp_utils.strategy._faults",
    "Environment": "tfdp_utils.strategy._detect",
    "StrategyChoice": "tfdp_utils.strategy._strategy_choice",
    "TPUProbeError": "tfdp_utils.errors",
    "auto_strategy": "tfdp_utils.strategy._choice",
    "choose_strategy": "tfdp_utils.strategy._choice",
    "detect_environment": "tfdp_utils.strategy._detect",
    "explain": "tfdp_utils.strategy._choice",
    "run_server": "tfdp_utils.strategy._build",
    "worker_backup_dir": "tfdp_utils.strategy._backup_dir",
}

__all__ = [
    "CollectiveWatchdog",
    "Environment",
    "StrategyChoice",
    "TPUProbeError",
    "auto_strategy",
    "choose_strategy",
    "detect_environment",
    "explain",
    "run_server",
    "worker_backup_dir",
]

__getattr__, __dir__ = surface(__name__, _HOMES, globals(), __all__)
