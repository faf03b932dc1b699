"""The tf.data service behind ``build_distributed_dataset(service=...)``.

============================  =============================================================
``service/_modes.py``         the service's processing modes and the start-up check
``service/_watch.py``         the bound on a request the service leaves unanswered (pure)
``service/_servers.py``       ``tfdp-utils data-service dispatcher|worker``
============================  =============================================================

Users reach it through ``build_distributed_dataset(service=..., service_mode=...)`` and the
``tfdp-utils data-service`` command; :class:`tfdp_utils.errors.ServiceTimeoutError` is what a
silent service raises.
"""

__all__: list[str] = []
