"""What :func:`~tfdp_utils.choose_strategy` decides: the kind of strategy, its devices, and why.

Pure: a record the decision returns and the builder reads, apart from both.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from tfdp_utils._public import public
from tfdp_utils.cluster._config import ClusterConfig

StrategyKind = Literal["tpu", "multi_worker", "mirrored", "one_device", "parameter_server"]


_CLASS_NAMES = {
    "tpu": "TPUStrategy",
    "multi_worker": "MultiWorkerMirroredStrategy",
    "mirrored": "MirroredStrategy",
    "one_device": "OneDeviceStrategy",
    "parameter_server": "ParameterServerStrategy",
}


@public("tfdp_utils")
@dataclasses.dataclass(frozen=True)
class StrategyChoice:
    """The outcome of :func:`choose_strategy`.

    Attributes:
        kind: ``"tpu"``, ``"multi_worker"``, ``"mirrored"``, ``"one_device"`` or
            ``"parameter_server"`` (the chief of a cluster with ``ps`` tasks).
        devices: the local devices the strategy runs on.
        reason: one line saying why, e.g. ``"2 GPUs visible, no cluster -> mirrored"``.
        cluster: the cluster for ``multi_worker`` and ``parameter_server``, else None.
    """

    kind: StrategyKind
    devices: tuple[str, ...]
    reason: str
    cluster: ClusterConfig | None = None

    @property
    def class_name(self) -> str:
        """The ``tf.distribute`` class this choice builds."""
        return _CLASS_NAMES[self.kind]
