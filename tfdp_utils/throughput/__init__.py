"""Throughput: the meter, exact example counts, the TensorBoard schema, the report. Pure.

============================  =============================================================
``throughput/_meter.py``      ``ThroughputMeter`` and the window rule
``throughput/_counts.py``     examples per replica over a range of steps
``throughput/_tags.py``       the TensorBoard schema shared by the logger, report and tests
``throughput/_report.py``     ``tfdp-utils report``: event files read back, tables and plots
============================  =============================================================

The Keras adapter that feeds these is :class:`tfdp_utils.callbacks.ThroughputLogger`.
"""

from tfdp_utils._lazy import surface
from tfdp_utils.throughput._meter import ThroughputMeter as ThroughputMeter
from tfdp_utils.throughput._meter import ThroughputWindow as ThroughputWindow

# __all__ and dir() are the names imported above as `name as name` (see tfdp_utils._lazy).
__all__, __getattr__, __dir__ = surface(globals())
