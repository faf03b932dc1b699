"""Distributed datasets that see every example exactly once, with equal steps on every worker.

Pure planning apart from tf.data glue, one concept per module:

============================  =============================================================
``data/sharding.py``          which worker reads which data, and why (pure)
``data/epochs.py``            steps per epoch and what each replica receives (pure)
``data/diagnostics.py``       what the builder warns about, as data (pure)
``data/sources.py``           what a source is: kind, files, size, reads files, batched
``data/pipeline.py``          the per-worker tf.data pipeline, one stage per function
``data/self_batched.py``      sources whose elements come out of ``.batch()``
``data/attach.py``            ``tfdp_info`` and the epoch's step count for Keras
``data/single_device.py``     the same data as one ``tf.data.Dataset``, for one device
``data/splits.py``            ``split_for_validation``: Keras' ``validation_split``
``data/builder.py``           ``build_distributed_dataset`` and ``plan_sharding``
============================  =============================================================

Why the builder shards by itself instead of relying on tf.data's autoshard rewrite: AUTO
silently falls back to DATA (every worker reads everything), FILE on a non-file source
raises NotFoundError with a graph dump, one file with two workers errors on one worker while
the other blocks in a collective (tensorflow#35878, #36153, #37112, #26222). Sharding the
unbatched stream explicitly makes the split a partition by construction, and TensorFlow's
distributed iterator (which all-reduces "has data" across workers every step when batches
may be partial) keeps the step count equal: a worker that runs out first feeds empty
batches until every worker is done.

The pure names import no TensorFlow; the TensorFlow ones (the builders, ``resolve_files``,
``count_records``) load their module on first use, so ``tfdp_utils.data.sharding`` can be
imported where TensorFlow is not installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tfdp_utils.data.epochs import EpochLayout, epoch_layout, split_evenly
from tfdp_utils.data.sharding import (
    DEFAULT_SHUFFLE_SEED,
    SHARD_POLICIES,
    ShardingPlan,
    assign_files,
    check_policy,
    decide_policy,
    file_imbalance,
    split_examples,
)

if TYPE_CHECKING:
    from tfdp_utils.data.builder import build_distributed_dataset, plan_sharding
    from tfdp_utils.data.single_device import single_device_dataset
    from tfdp_utils.data.sources import count_records, resolve_files
    from tfdp_utils.data.splits import split_for_validation

# TensorFlow name -> the module that defines it, imported on first use.
_TF_HOMES: dict[str, str] = {
    "build_distributed_dataset": "tfdp_utils.data.builder",
    "count_records": "tfdp_utils.data.sources",
    "plan_sharding": "tfdp_utils.data.builder",
    "resolve_files": "tfdp_utils.data.sources",
    "single_device_dataset": "tfdp_utils.data.single_device",
    "split_for_validation": "tfdp_utils.data.splits",
}


def __getattr__(name: str) -> Any:
    if name not in _TF_HOMES:
        raise AttributeError(f"module 'tfdp_utils.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(_TF_HOMES[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "DEFAULT_SHUFFLE_SEED",
    "SHARD_POLICIES",
    "EpochLayout",
    "ShardingPlan",
    "assign_files",
    "build_distributed_dataset",
    "check_policy",
    "count_records",
    "decide_policy",
    "epoch_layout",
    "file_imbalance",
    "plan_sharding",
    "resolve_files",
    "single_device_dataset",
    "split_evenly",
    "split_examples",
    "split_for_validation",
]
