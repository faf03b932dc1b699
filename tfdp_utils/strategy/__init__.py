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
``strategy/_upstream.py``     TensorFlow's own auto_strategy beside ours, in one line (pure)
============================  =============================================================

Importing this package imports no TensorFlow; each name loads its module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfdp_utils._lazy import surface

if TYPE_CHECKING:
    from tfdp_utils.errors import TPUProbeError as TPUProbeError
    from tfdp_utils.strategy._backup_dir import worker_backup_dir as worker_backup_dir
    from tfdp_utils.strategy._build import run_server as run_server
    from tfdp_utils.strategy._choice import auto_strategy as auto_strategy
    from tfdp_utils.strategy._choice import choose_strategy as choose_strategy
    from tfdp_utils.strategy._choice import explain as explain
    from tfdp_utils.strategy._detect import Environment as Environment
    from tfdp_utils.strategy._detect import detect_environment as detect_environment
    from tfdp_utils.strategy._faults import CollectiveWatchdog as CollectiveWatchdog
    from tfdp_utils.strategy._strategy_choice import StrategyChoice as StrategyChoice

# __all__ and dir() are the names imported above as `name as name` (see tfdp_utils._lazy).
__all__, __getattr__, __dir__ = surface(globals())
