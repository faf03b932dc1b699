"""What hardware and cluster this process sees, as a frozen value the strategy decision reads.

:func:`detect_environment` gathers it without initialising TensorFlow's runtime (so logical
devices and collective ops can still be configured afterwards); tests build
:class:`Environment` values by hand to describe machines they do not have.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from tfdp_utils import _variables
from tfdp_utils._public import public
from tfdp_utils._validate import mapping, text
from tfdp_utils.cluster._config import ClusterConfig
from tfdp_utils.cluster._environments import cluster_from_environment

STRATEGY_VARIABLE = _variables.STRATEGY

# Variables whose presence means a TPU is evidently meant to be used.
TPU_VARIABLES: tuple[str, ...] = (
    "TPU_NAME",
    "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS",
    "COLAB_TPU_ADDR",
    "TPU_WORKER_HOSTNAMES",
    "TPU_ACCELERATOR_TYPE",
)


@public("tfdp_utils")
@dataclasses.dataclass(frozen=True)
class Environment:
    """The devices, TPU hints and cluster spec visible to this process.

    Attributes:
        gpus: logical GPU device names, e.g. ``("/device:GPU:0", "/device:GPU:1")``.
        cpus: logical CPU device names; more than one only when the user configured
            logical CPU devices (a common way to test data parallelism on a laptop).
        tpus: local TPU device names (a TPU VM), if any.
        tpu_hint: why a TPU is evidently meant, e.g. ``"TPU_NAME='my-tpu'"``; None if not.
        tpu_address: what to hand to ``TPUClusterResolver(tpu=...)`` ("" means its default).
        cluster: the multi-process cluster this task belongs to, or None.
        forced_strategy: the value of ``TFDP_STRATEGY`` when set.
    """

    gpus: tuple[str, ...] = ()
    cpus: tuple[str, ...] = ("/device:CPU:0",)
    tpus: tuple[str, ...] = ()
    tpu_hint: str | None = None
    tpu_address: str | None = None
    cluster: ClusterConfig | None = None
    forced_strategy: str | None = None

    def describe(self) -> str:
        parts = [
            f"{len(self.gpus)} GPU(s)",
            f"{len(self.cpus)} logical CPU device(s)",
        ]
        if self.tpus:
            parts.append(f"{len(self.tpus)} local TPU device(s)")
        if self.tpu_hint:
            parts.append(f"TPU hint {self.tpu_hint}")
        parts.append(self.cluster.describe() if self.cluster else "no cluster")
        return ", ".join(parts)


def _logical_names(device_type: str) -> tuple[str, ...]:
    """Logical device names of one type, without initialising the runtime when possible."""
    from tfdp_utils import _tf
    from tfdp_utils._tf import tf

    if _tf.runtime_initialized():
        # After a cluster connects, names carry "/job:worker/..."; keep the local part.
        names = [d.name.rsplit("/", 1)[-1] for d in tf.config.list_logical_devices(device_type)]
        return tuple(f"/{name}" if name.startswith("device:") else name for name in names)
    count = 0
    for physical in tf.config.list_physical_devices(device_type):
        if not _visible(physical):
            continue
        configs = tf.config.get_logical_device_configuration(physical)
        count += len(configs) if configs else 1
    return tuple(f"/device:{device_type}:{i}" for i in range(count))


def _visible(physical: object) -> bool:
    from tfdp_utils._tf import tf

    try:
        visible = tf.config.get_visible_devices(getattr(physical, "device_type", "CPU"))
    except RuntimeError:  # pragma: no cover - visibility can only be read, never fails in practice
        return True
    return physical in visible


def local_devices() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """``(gpus, cpus, tpus)``: the logical device names of this process, as
    :func:`detect_environment` lists them (without initialising TensorFlow's runtime)."""
    return (
        _logical_names("GPU"),
        _logical_names("CPU") or ("/device:CPU:0",),
        _logical_names("TPU"),
    )


def tpu_hint_from(
    environ: Mapping[str, str], tpu: str | None = None
) -> tuple[str | None, str | None]:
    """Return ``(hint, address)`` when an argument or variable says a TPU is meant."""
    if tpu is not None:
        return f"tpu={tpu!r}", tpu
    if environ.get("COLAB_TPU_ADDR"):
        return f"COLAB_TPU_ADDR={environ['COLAB_TPU_ADDR']!r}", "grpc://" + environ[
            "COLAB_TPU_ADDR"
        ]
    for name in TPU_VARIABLES:
        value = environ.get(name)
        if value:
            address = value if name in ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS") else ""
            return f"{name}={value!r}", address
    return None, None


@public("tfdp_utils")
def detect_environment(
    *, tpu: str | None = None, environ: Mapping[str, str] | None = None
) -> Environment:
    """Describe what this process sees: devices, TPU hints, cluster spec and overrides.

    Reads TF_CONFIG and SLURM variables (validating them: a malformed TF_CONFIG raises here,
    before any network wait) and lists devices without initialising TensorFlow's runtime.

    Args:
        tpu: a TPU name or ``grpc://`` address, as for ``TPUClusterResolver``. Defaults to `None`.
        environ: variables to read instead of ``os.environ``. Defaults to `None`.

    Returns:
        An :class:`Environment`.

    Raises:
        ValueError: when TF_CONFIG or the SLURM variables are malformed.
    """
    environ = os.environ if environ is None else mapping(environ, "environ")
    if tpu is not None:
        text(tpu, "tpu", hint="Pass a TPU name or a 'grpc://host:port' address.")
    hint, address = tpu_hint_from(environ, tpu)
    forced = environ.get(STRATEGY_VARIABLE, "").strip() or None
    gpus, cpus, tpus = local_devices()
    return Environment(
        gpus=gpus,
        cpus=cpus,
        tpus=tpus,
        tpu_hint=hint,
        tpu_address=address,
        cluster=cluster_from_environment(environ),
        forced_strategy=forced,
    )
