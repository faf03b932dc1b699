"""Distributed datasets that see every example exactly once, with equal steps on every worker.

Pure planning apart from tf.data glue, one concept per module:

============================  =============================================================
``data/_sharding.py``         which worker reads which data, and why (pure)
``data/_epochs.py``           steps per epoch and what each replica receives (pure)
``_dataset_info.py``             ``DatasetInfo``: the exact counts attached to a dataset (pure)
``data/_diagnostics.py``      what the builder warns about, as data (pure)
``data/_sources.py``          what a source is: kind, files, size, reads files, batched
``data/_pipeline.py``         the per-worker tf.data pipeline, one stage per function
``data/_elements.py``         what an element is: an example, or a batch of examples
``data/_self_batched.py``     self-batching ``fn(input_context)`` sources
``data/_attach.py``           ``tfdp_info`` and the epoch's step count for Keras
``data/_single_device.py``    the same data as one ``tf.data.Dataset``, for one device
``data/_splits.py``           ``split_for_validation``: Keras' ``validation_split``
``data/_arguments.py``        the builder's arguments, checked where they enter
``data/_builder.py``          ``build_distributed_dataset`` and ``plan_sharding``
``data/_input_figures.py``    what ``diagnose_input`` measures: stages, rates, the slow stage (pure)
``data/_input_advice.py``     what to change: the slow stage's rows, CPU share, overlap (pure)
``data/_input_report.py``     ``InputDiagnosis``: input-bound or not, the slow stage, advice (pure)
``data/_diagnose_input.py``   ``diagnose_input``: times the input, the model, the two together
``data/_diagnose_phases.py``  its four timed phases; the model's state read and written back
``data/_diagnose_checks.py``  what ``diagnose_input`` refuses before it times anything
``data/_diagnose_misfit.py``  the first step's error when the elements do not fit the model
``data/_step_timing.py``      the clock: warm-up, a window of at least 0.5 s, a deadline
``data/_stage_timing.py``     the pipeline's stages, each timed alone
``data/service/``             the tf.data service: modes, the request watch, the servers
============================  =============================================================

Why the builder shards by itself instead of relying on tf.data's autoshard rewrite: AUTO
silently falls back to DATA (every worker reads everything), FILE on a non-file source
raises NotFoundError with a graph dump, one file with two workers errors on one worker while
the other blocks in a collective (tensorflow#35878, #36153, #37112, #26222). Sharding the
unbatched stream explicitly makes the split a partition by construction, and TensorFlow's
distributed iterator (which all-reduces "has data" across workers every step when batches
may be partial) keeps the step count equal: a worker that runs out first feeds empty
batches until every worker is done.

Importing this package imports no TensorFlow; each name loads its module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfdp_utils._lazy import surface

if TYPE_CHECKING:
    from tfdp_utils._dataset_info import DatasetInfo as DatasetInfo
    from tfdp_utils.data._builder import build_distributed_dataset as build_distributed_dataset
    from tfdp_utils.data._builder import plan_sharding as plan_sharding
    from tfdp_utils.data._diagnose_input import diagnose_input as diagnose_input
    from tfdp_utils.data._input_report import InputDiagnosis as InputDiagnosis
    from tfdp_utils.data._sharding import ShardingPlan as ShardingPlan
    from tfdp_utils.data._single_device import single_device_dataset as single_device_dataset
    from tfdp_utils.data._splits import split_for_validation as split_for_validation

# __all__ and dir() are the names imported above as `name as name` (see tfdp_utils._lazy).
__all__, __getattr__, __dir__ = surface(globals())
