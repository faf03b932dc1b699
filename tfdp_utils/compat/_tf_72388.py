"""tensorflow#72388 (after keras#20585): Keras 3 cannot reduce scalar step outputs across workers.

Once ``fit`` is past keras#20585, Keras 3's ``reduce_per_replica`` reduces every output of
a train/test step (the metric results: scalars) with ``strategy.reduce("MEAN", v, axis=0)``
when MultiWorkerMirroredStrategy spans several workers. A scalar has no axis 0, so tracing
the train function fails with ``ValueError: Invalid reduction dimension 0 for input with 0
dimensions``; the ``"sum"`` branch omits ``axis`` altogether. The workaround reduces across
replicas only (``axis=None``), which is what Keras does for single-worker MirroredStrategy
(the mean over replicas of each output), so every worker logs the same values.

Verified on Keras 3.15.1 (TensorFlow 2.21); the code is unchanged on Keras master (3.16.0.dev).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from tfdp_utils._tf import tf
from tfdp_utils.cluster._topology import is_multi_worker
from tfdp_utils.compat._registry import Patch, Workaround, replace_method

ISSUE = "tensorflow#72388"


class _ExtendedStub:
    worker_devices = ("/job:worker/replica:0/task:0/device:CPU:0",)

    def _in_multi_worker_mode(self) -> bool:
        return True


class _MultiWorkerStub(tf.distribute.MultiWorkerMirroredStrategy):  # type: ignore[misc]
    """A MultiWorkerMirroredStrategy in multi-worker mode as far as Keras can tell; no cluster.

    ``reduce`` checks its arguments as TensorFlow's does and records each call.
    """

    def __init__(self) -> None:  # no super().__init__: that would join a cluster
        self._stub_extended = _ExtendedStub()
        self.failures: list[str] = []

    @property
    def extended(self) -> Any:
        return self._stub_extended

    def reduce(self, reduce_op: Any, value: Any, axis: Any = "missing") -> Any:
        if axis == "missing":
            self.failures.append("reduce() called without the required axis argument")
            return value
        if axis is not None and tf.convert_to_tensor(value).shape.rank == 0:
            self.failures.append(f"reduce(axis={axis}) of a scalar")
        return value


def probe(trainer: ModuleType) -> bool:
    """True when Keras' ``reduce_per_replica`` mis-reduces a scalar under multi-worker MWMS.

    Calls Keras' own function with a stand-in strategy that reports what it was asked to do;
    no cluster is needed.
    """
    reduce_per_replica = getattr(trainer, "reduce_per_replica", None)
    if reduce_per_replica is None:
        return False
    strategy = _MultiWorkerStub()
    for reduction in ("auto", "sum"):
        reduce_per_replica({"loss": tf.constant(1.0)}, strategy, reduction)
    return bool(strategy.failures)


def install(trainer: ModuleType) -> tuple[str, list[Patch]]:
    """Replace ``reduce_per_replica`` in Keras' TF trainer module for multi-worker strategies."""
    original = trainer.reduce_per_replica

    def reduce_per_replica(values: Any, strategy: Any, reduction: Any) -> Any:
        if reduction not in ("auto", "mean", "sum") or not is_multi_worker(strategy):
            return original(values, strategy, reduction)
        # tensorflow#72388: reduce across replicas only, as Keras does for MirroredStrategy;
        # axis=0 fails on the scalar metric results.
        op = "SUM" if reduction == "sum" else "MEAN"
        return tf.nest.map_structure(
            lambda v: v if v is None else strategy.reduce(op, v, axis=None), values
        )

    return "fix", [replace_method(trainer, "reduce_per_replica", reduce_per_replica, change=ISSUE)]


WORKAROUND = Workaround(
    issue=ISSUE,
    verified_on=("3.15.1",),
    changes="keras.src.backend.tensorflow.trainer.reduce_per_replica replaced (multi-worker "
    "strategies reduce step outputs across replicas with axis=None)",
    probe=probe,
    install=install,
)
