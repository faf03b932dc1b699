"""Every environment variable tfdp-utils reads, by name: the one home of these strings. Pure.

Each module that reads a variable imports its name from here, and ``tfdp-utils env`` reports
:data:`REPORTED` (these and the variables of TensorFlow, Keras and the schedulers that decide
what ``auto_strategy()`` builds), so a new variable is added in one place.
"""

from __future__ import annotations

STRATEGY = "TFDP_STRATEGY"
"""Forces the choice of ``auto_strategy`` (``one_device``, ``mirrored``, ``multi_worker``...)."""

CLUSTER_TIMEOUT = "TFDP_CLUSTER_TIMEOUT"
"""Seconds to wait for the peers of a multi-worker cluster to start."""

COLLECTIVE_TIMEOUT = "TFDP_COLLECTIVE_TIMEOUT"
"""Seconds one multi-worker call may wait before the collective watchdog aborts it."""

SERVICE_TIMEOUT = "TFDP_SERVICE_TIMEOUT"
"""Seconds to wait for the tf.data service to answer."""

NO_KERAS_PATCHES = "TFDP_NO_KERAS_PATCHES"
"""``1`` turns every runtime change to Keras off."""

SLURM_PORT_BASE = "TFDP_SLURM_PORT_BASE"
"""The first port of a SLURM job's cluster."""

NUM_WORKERS = "TFDP_NUM_WORKERS"
"""The worker pods of a Kubernetes Indexed Job or JobSet (the manifest passes it)."""

PORT = "TFDP_PORT"
"""The port every worker pod of a Kubernetes job listens on."""

SUBDOMAIN = "TFDP_SUBDOMAIN"
"""The headless Service of a Kubernetes Indexed Job (the pod template's ``subdomain``)."""

HOSTS_OVERRIDE = "TFDP_HOSTS_OVERRIDE"
"""Testing aid: ``pod-dns-name=host:port,...`` replaces Kubernetes pods' addresses."""

JOBSET_NAME = "JOBSET_NAME"
"""A JobSet's name (label ``jobset.sigs.k8s.io/jobset-name``, passed by the downward API)."""

REPLICATED_JOB_NAME = "REPLICATED_JOB_NAME"
"""A JobSet pod's replicated job (label ``jobset.sigs.k8s.io/replicatedjob-name``)."""

REPLICATED_JOB_REPLICAS = "REPLICATED_JOB_REPLICAS"
"""A JobSet's replicated job's Jobs (label ``jobset.sigs.k8s.io/replicatedjob-replicas``)."""

JOB_INDEX = "JOB_INDEX"
"""A JobSet pod's Job index (annotation ``jobset.sigs.k8s.io/job-index``)."""

EXIT_GUARD = "TFDP_EXIT_GUARD"
"""``0`` keeps tfdp-utils from installing its exit guard (a crashed job always ends)."""

EXIT_GRACE = "TFDP_EXIT_GRACE"
"""Seconds a process may take to exit after an uncaught error before it is ended (0: never)."""

EXIT_BARRIER = "TFDP_EXIT_BARRIER"
"""Seconds a multi-worker job's worker waits at exit for its peers to exit too (0: no wait)."""

TRACEBACK = "TFDP_TRACEBACK"
"""``1`` makes the ``tfdp-utils`` command show full tracebacks instead of one-line errors."""

OURS: tuple[str, ...] = (
    STRATEGY,
    CLUSTER_TIMEOUT,
    COLLECTIVE_TIMEOUT,
    SERVICE_TIMEOUT,
    NO_KERAS_PATCHES,
    SLURM_PORT_BASE,
    NUM_WORKERS,
    PORT,
    SUBDOMAIN,
    HOSTS_OVERRIDE,
    EXIT_GUARD,
    EXIT_GRACE,
    EXIT_BARRIER,
    TRACEBACK,
)
"""Every variable of tfdp-utils' own."""

REPORTED: tuple[str, ...] = (
    "TF_CONFIG",
    "TF_USE_LEGACY_KERAS",
    *OURS,
    "CUDA_VISIBLE_DEVICES",
    "TPU_NAME",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "JOB_COMPLETION_INDEX",
    JOBSET_NAME,
)
"""What ``tfdp-utils env`` reports: the variables that decide what ``auto_strategy()`` builds."""
