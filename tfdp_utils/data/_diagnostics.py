"""What the builder tells the user about a plan: its findings as data, computed from facts.

Pure Python (no TensorFlow). :func:`diagnose` looks at the sharding plan, the source facts
and the epoch plan and returns :class:`Finding` records (a logging level and a message) in
the order the builder logs them; the builder only logs them. Each check is a small function
here, so a finding can be tested without building a dataset.
"""

from __future__ import annotations

import dataclasses
import logging

from tfdp_utils.data._epochs import EpochPlan, Repeat, StepShape
from tfdp_utils.data._sharding import ShardingPlan, SourceFacts, file_imbalance, shuffle_seed

INFO = logging.INFO
WARNING = logging.WARNING
IMBALANCE_LIMIT = 1.5
"""Busiest worker's bytes (or examples) over the mean above which the builder warns."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing the builder logs about a dataset it builds.

    Attributes:
        level: ``logging.INFO`` or ``logging.WARNING``.
        message: the text, without the ``"tfdp_utils: "`` prefix the builder logs it with.
    """

    level: int
    message: str


@dataclasses.dataclass(frozen=True)
class BuildFacts:
    """Everything :func:`diagnose` looks at.

    Attributes:
        plan: the sharding plan.
        source: what the planner knew about the source.
        epochs: how each worker batches and repeats.
        shape: batch size and replicas.
        shuffling: whether the builder shuffles.
        seed: the ``seed`` the caller gave (None: none).
        repeat: ``False``, ``True`` or ``"epochs"``.
        drop_remainder: as given to the builder.
    """

    plan: ShardingPlan
    source: SourceFacts
    epochs: EpochPlan
    shape: StepShape
    shuffling: bool = False
    seed: int | None = None
    repeat: Repeat = False
    drop_remainder: bool = False


def _seed_findings(facts: BuildFacts) -> list[Finding]:
    seed = shuffle_seed(facts.plan, facts.seed, shuffling=facts.shuffling)
    if seed == facts.seed:
        return []
    return [
        Finding(
            INFO,
            f"shuffling with DATA sharding over {facts.plan.num_workers} workers needs the "
            f"same seed on every worker; using seed={seed}. Pass seed= to shuffle differently "
            "between runs.",
        )
    ]


def _source_findings(facts: BuildFacts) -> list[Finding]:
    findings = []
    if facts.source.num_examples == 0:
        findings.append(
            Finding(
                WARNING,
                "the source holds no examples, so every epoch is empty and training does "
                "nothing. Check the source (a filter that drops everything, an empty file).",
            )
        )
    if facts.source.infinite and not facts.repeat:
        findings.append(
            Finding(
                WARNING,
                "the source is infinite, so an epoch never ends; pass steps_per_epoch to fit "
                "(or stop your loop yourself). Per-epoch exact coverage does not apply.",
            )
        )
    return findings


def _policy_findings(facts: BuildFacts) -> list[Finding]:
    plan, kind, workers = facts.plan, facts.source.kind, facts.plan.num_workers
    if workers <= 1:
        return []
    if plan.policy == "file" and kind == "dataset":
        return [
            Finding(
                WARNING,
                "shard_policy='file' on a tf.data.Dataset uses tf.data's FILE autoshard, which "
                f"needs at least {workers} files in the dataset: with fewer, a worker fails at "
                "its first batch while the others wait for it. Pass the file paths as source "
                "instead so the builder can check and balance them.",
            )
        ]
    if plan.policy == "off" and kind != "function":
        return [
            Finding(
                WARNING,
                f"shard_policy='off' on {workers} workers: every worker trains on every "
                f"example, so each epoch sees each example {workers} times.",
            )
        ]
    return []


def _file_findings(facts: BuildFacts) -> list[Finding]:
    plan, source = facts.plan, facts.source
    if plan.policy != "file" or source.kind != "files":
        return []
    findings = []
    idle = [i for i, files in enumerate(plan.files_per_worker) if not files]
    counted = source.file_counts is not None
    weights = source.file_counts if counted else source.sizes
    imbalance = file_imbalance(plan.files_per_worker, source.files, weights)
    if imbalance is not None and imbalance > IMBALANCE_LIMIT and not idle:
        findings.append(
            Finding(
                WARNING,
                f"the busiest worker reads {imbalance:.1f}x the mean "
                f"{'examples' if counted else 'bytes'} per worker (files of very different "
                "sizes): the others feed empty batches for the last part of each epoch. Split "
                "the large files, or use shard_policy='data' (every worker reads everything) "
                "to balance the steps.",
            )
        )
    if idle:
        findings.append(
            Finding(
                WARNING,
                f"{len(source.files)} file(s) for {plan.num_workers} workers: workers {idle} "
                "read no file and feed only empty batches. Use shard_policy='auto' or 'data' "
                "to use every worker.",
            )
        )
    return findings


def _drop_findings(facts: BuildFacts) -> list[Finding]:
    if not facts.drop_remainder:
        return []
    layout = facts.epochs.layout
    if layout is None:
        return [
            Finding(
                WARNING,
                "drop_remainder=True with an unknown number of examples per worker: each epoch "
                f"drops up to {facts.shape.per_replica_batch_size - 1} examples per replica, "
                "and a worker that runs out of full batches first feeds empty batches until "
                "the others finish.",
            )
        ]
    return [
        Finding(
            INFO,
            f"drop_remainder=True drops {layout.dropped} of {layout.dropped + layout.examples} "
            f"examples each epoch ({layout.steps} full steps of "
            f"{facts.shape.global_batch_size}).",
        )
    ]


def _repeat_findings(facts: BuildFacts) -> list[Finding]:
    if facts.repeat != "epochs":
        return []
    if facts.epochs.layout is None:
        return [
            Finding(
                INFO,
                "repeat='epochs' needs the number of examples, which is unknown for this "
                "source; repeating example by example instead (every step full).",
            )
        ]
    if facts.epochs.epoch_batches is None:
        return [
            Finding(
                INFO,
                "repeat='epochs' over sparse or ragged elements repeats example by example "
                "instead: epochs are not aligned to steps.",
            )
        ]
    return []


def diagnose(facts: BuildFacts) -> tuple[Finding, ...]:
    """What the builder logs about ``facts``, in order; the plan's summary comes last. Pure."""
    return (
        *_seed_findings(facts),
        *_source_findings(facts),
        *_policy_findings(facts),
        *_file_findings(facts),
        *_drop_findings(facts),
        *_repeat_findings(facts),
        Finding(INFO, facts.plan.describe()),
    )
