"""Where a fit's example counts come from, decided from plain facts. Pure Python, no TensorFlow.

:class:`~tfdp_utils.callbacks.ThroughputLogger` gathers :class:`CountFacts` at train begin (its
arguments, the data ``fit`` hands it, the replicas it trains on) and :func:`choose_count_source`
picks the layout to count with, in this order: ``dataset=``, the builder dataset ``fit`` trains
on, ``global_batch_size=``. It checks each given figure against what ``fit`` trains on, and
raises before the first step when one disagrees or when nothing says how many examples a step
holds, in words that say why and what to pass instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from tfdp_utils import _dataset_info as dataset_info
from tfdp_utils._dataset_info import DatasetInfo
from tfdp_utils.throughput._counts import even_split

Unbound = Literal["patches_off", "undone", "late", "outside_fit"]
"""Why ``fit`` handed the logger no data: ``TFDP_NO_KERAS_PATCHES`` keeps ``Model.fit``
unwrapped, ``tfdp_utils.compat.undo()`` removed the wrapper, the ``fit`` call started before
the wrapper was installed, or the hooks run outside ``Model.fit``."""

GIVEN_SOURCE = "the DatasetInfo passed as dataset="
TRAINED_SOURCE = "the dataset built by build_distributed_dataset that fit trains on"


@dataclasses.dataclass(frozen=True)
class CountFacts:
    """What the logger knows at train begin about the examples in a step.

    Attributes:
        num_replicas: replicas in sync of the strategy the model trains on.
        strategy: that strategy's class name, for messages.
        global_batch_size: ``ThroughputLogger(global_batch_size=)``, or None.
        given: the :class:`DatasetInfo` of ``ThroughputLogger(dataset=)``, or None.
        trained: what ``fit`` trains on, in words (``"a _BatchDataset"``); None when ``fit``
            handed the logger no data.
        trained_info: the builder's info of the data ``fit`` trains on, or None.
        static_batch: the examples in every element of that data when its spec fixes them.
        resumed_from: for a builder dataset resumed mid-epoch, the info of the dataset it was
            rebuilt from; else None.
        unbound: why ``fit`` handed no data; None when it handed its data.
    """

    num_replicas: int
    strategy: str
    global_batch_size: int | None = None
    given: DatasetInfo | None = None
    trained: str | None = None
    trained_info: DatasetInfo | None = None
    static_batch: int | None = None
    resumed_from: DatasetInfo | None = None
    unbound: Unbound | None = None


@dataclasses.dataclass(frozen=True)
class CountSource:
    """The layout one fit counts with, where it comes from, and whether its counts are exact.

    Attributes:
        info: the dataset layout to count with; None to split ``global_batch_size`` evenly.
        source: where the counts come from, in words (``summary()["count_source"]``).
        exact: whether the counts are exact.
        derived_reason: why they are not, in words; None when exact.
    """

    info: DatasetInfo | None
    source: str
    exact: bool
    derived_reason: str | None


def given_info(dataset: Any, *, global_batch_size: int | None) -> DatasetInfo | None:
    """The :class:`DatasetInfo` of ``ThroughputLogger(dataset=)``, checked when it is created.

    Raises:
        TypeError: ``dataset`` carries no ``DatasetInfo``.
        ValueError: ``global_batch_size`` disagrees with it.
    """
    if dataset is None:
        return None
    info = dataset if isinstance(dataset, DatasetInfo) else dataset_info.info_of(dataset)
    if info is None:
        raise TypeError(
            f"dataset={type(dataset).__name__} carries no DatasetInfo; expected a dataset "
            "from tfdp_utils.build_distributed_dataset or a DatasetInfo. For other "
            "datasets pass global_batch_size= instead."
        )
    if global_batch_size is not None and info.global_batch_size != global_batch_size:
        raise ValueError(
            f"global_batch_size={global_batch_size} disagrees with the dataset's "
            f"global batch size {info.global_batch_size}; pass only dataset=."
        )
    return info


def choose_count_source(facts: CountFacts) -> CountSource:
    """The layout to count with: ``dataset=``, the builder dataset, or ``global_batch_size=``.

    Raises:
        ValueError: a given figure disagrees with the data ``fit`` trains on, the dataset was
            built for other replicas, or nothing says how many examples a step holds.
    """
    info = facts.given
    if info is not None and facts.resumed_from == info:
        info = None  # the dataset passed, resumed by PreemptionCheckpoint: count its stream
    if info is not None:
        if facts.trained_info is not None and facts.trained_info != info:
            raise ValueError(_other_dataset_message(info, facts.trained_info))
        source = GIVEN_SOURCE
    elif facts.trained_info is not None:
        _check_builder_batch(facts.global_batch_size, facts.trained_info)
        info, source = facts.trained_info, TRAINED_SOURCE
    elif facts.global_batch_size is not None:
        return _even_split_source(facts, facts.global_batch_size)
    else:
        raise ValueError(
            f"ThroughputLogger cannot count examples: {_why_no_data(facts)}, and no "
            "global_batch_size= or dataset= was given. Pass ThroughputLogger(..., "
            "global_batch_size=<examples per step over all replicas>), or dataset=<a "
            "dataset from build_distributed_dataset>, or train on a dataset from "
            "build_distributed_dataset (fit hands it to the logger: exact counts)."
        )
    if info.num_replicas_in_sync != facts.num_replicas:
        raise ValueError(
            f"The dataset was built for {info.num_replicas_in_sync} replicas but the "
            f"model trains on {facts.num_replicas} ({facts.strategy}). "
            "Build the dataset under the strategy the model was created in."
        )
    reason = info.derived_reason()
    return CountSource(info, source, reason is None, reason)


def _check_builder_batch(global_batch: int | None, trained: DatasetInfo) -> None:
    """``global_batch_size=`` against the builder dataset ``fit`` trains on."""
    if global_batch is None or global_batch == trained.global_batch_size:
        return
    raise ValueError(
        f"ThroughputLogger(global_batch_size={global_batch}) disagrees "
        "with the dataset fit trains on: build_distributed_dataset built it with "
        f"{trained.global_batch_size} examples per step "
        f"({trained.per_replica_batch_size} per replica on "
        f"{trained.num_replicas_in_sync}), so every count would be off. Pass no "
        "global_batch_size= (the logger counts from that dataset, partial steps "
        f"included), or global_batch_size={trained.global_batch_size}."
    )


def _even_split_source(facts: CountFacts, global_batch: int) -> CountSource:
    """Every step counted as ``global_batch_size=``, checked against what the data fixes."""
    _check_global_batch(facts, global_batch)
    source = (
        f"global_batch_size={global_batch}, split evenly over the replicas "
        "(the first taking any remainder, as tf.distribute splits a batch)"
    )
    if facts.trained is not None and facts.static_batch == global_batch:
        return CountSource(None, source, True, None)
    what = "the data fit trains on" if facts.trained is None else facts.trained
    return CountSource(
        None,
        source,
        False,
        f"every step is counted as {source}; the logger cannot check the batches of "
        f"{what}, so a partial last batch is counted as full (a dataset from "
        "build_distributed_dataset gives exact counts)",
    )


def _check_global_batch(facts: CountFacts, global_batch: int) -> None:
    """``global_batch_size=`` against the replicas and a batch size the data fixes."""
    if (
        facts.trained is not None
        and facts.static_batch is not None
        and facts.static_batch != global_batch
    ):
        raise ValueError(
            f"ThroughputLogger(global_batch_size={global_batch}) disagrees with the "
            f"dataset fit trains on: {facts.trained} whose every element holds "
            f"{facts.static_batch} examples (its element_spec), so every count would be "
            f"off. Pass global_batch_size={facts.static_batch}."
        )
    replicas = facts.num_replicas
    if global_batch % replicas:
        low = global_batch - global_batch % replicas
        shares = sorted(set(even_split(global_batch, replicas)), reverse=True)
        raise ValueError(
            f"ThroughputLogger(global_batch_size={global_batch}) is not divisible by the "
            f"{replicas} replicas in sync of {facts.strategy}: "
            f"tf.distribute would give them {' and '.join(map(str, shares))} examples per "
            "step, which Keras' step cannot sum (Keras 3 fails inside it). Use a multiple of "
            f"{replicas} (e.g. {max(low, replicas)} or {low + replicas}) as the batch size "
            "of the dataset and here, or build the dataset with "
            "tdu.build_distributed_dataset, which checks it."
        )


def _why_no_data(facts: CountFacts) -> str:
    """Why no data says how many examples a step holds, true for every way in."""
    if facts.trained is not None:
        return (
            f"fit trains on {facts.trained}, which is not a dataset from "
            "tfdp_utils.build_distributed_dataset"
        )
    if facts.unbound == "patches_off":
        return (
            "TFDP_NO_KERAS_PATCHES=1 keeps Keras' Model.fit unwrapped, so fit does not "
            "hand ThroughputLogger the data it trains on"
        )
    if facts.unbound == "undone":
        return (
            "Keras' Model.fit is not wrapped (tfdp_utils.compat.undo() removed the "
            "wrapper), so fit does not hand ThroughputLogger the data it trains on"
        )
    if facts.unbound == "late":
        return (
            "this fit call started before Keras' Model.fit was wrapped to hand its data "
            "to callbacks (ThroughputLogger wraps it when it is created, too late for a "
            "fit call that creates the logger in its own arguments; create the logger "
            "before calling fit), so it did not see the data"
        )
    return (
        "its hooks run outside Model.fit (e.g. a custom training loop calls them), so no "
        "fit call hands it the data"
    )


def _other_dataset_message(given: DatasetInfo, trained: DatasetInfo) -> str:
    differ = [
        f"{field.name} {getattr(given, field.name)!r} vs {getattr(trained, field.name)!r}"
        for field in dataclasses.fields(DatasetInfo)
        if getattr(given, field.name) != getattr(trained, field.name)
    ]
    return (
        "ThroughputLogger(dataset=...) describes another dataset than the one fit trains "
        f"on ({'; '.join(differ)}: given vs trained on), so its counts would be those of "
        "the other dataset. Pass no dataset= (fit hands the logger the builder dataset it "
        "trains on), or the dataset you pass to fit."
    )
