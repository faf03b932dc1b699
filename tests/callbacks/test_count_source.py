"""ThroughputLogger's count source as a table: facts at train begin -> the layout or the error.

Pure. Each row is a case the Keras tests reach through ``fit`` (tests/callbacks/,
tests/compat/test_fit_binding.py) or a branch of the decision they cannot reach cheaply
(``compat.undo()``, a resumed ``dataset=``); here each takes microseconds.
"""

from __future__ import annotations

import dataclasses

import pytest

from tfdp_utils._dataset_info import DatasetInfo, DatasetRecord, carry
from tfdp_utils.throughput._count_source import (
    GIVEN_SOURCE,
    TRAINED_SOURCE,
    CountFacts,
    choose_count_source,
    given_info,
)

pytestmark = pytest.mark.pure

# 96 examples in steps of 16 over 2 replicas; the same layout with 80 examples; a layout the
# builder cannot see the end of (the tf.data service's distributed_epoch mode).
INFO_96 = DatasetInfo(16, 8, 2, examples_per_epoch=96, steps_per_epoch=6, full_steps=6)
INFO_80 = DatasetInfo(
    16, 8, 2, examples_per_epoch=80, steps_per_epoch=5, full_steps=5, tail=((8, 8),)
)
ALIGNED_96 = dataclasses.replace(INFO_96, repeat=True)  # as a resumed stream aligns it
INEXACT = DatasetInfo(
    16, 8, 2, exact=False, inexact_reason="the service hands out its batches dynamically"
)
FOUR_REPLICAS = DatasetInfo(global_batch_size=8, per_replica_batch_size=2, num_replicas_in_sync=4)

MIRRORED_2 = {"num_replicas": 2, "strategy": "MirroredStrategy"}
PLAIN = "a _BatchDataset"
EVEN_16 = (
    "global_batch_size=16, split evenly over the replicas (the first taking any remainder, "
    "as tf.distribute splits a batch)"
)

# (id, facts, the layout counted with, source, exact, words in the derived reason)
CHOSEN = [
    (
        "dataset=-agrees-with-fit",
        CountFacts(
            **MIRRORED_2, given=INFO_96, trained="a DistributedDataset", trained_info=INFO_96
        ),
        INFO_96,
        GIVEN_SOURCE,
        True,
        None,
    ),
    (
        "dataset=-outside-fit",
        CountFacts(**MIRRORED_2, given=INFO_96, unbound="outside_fit"),
        INFO_96,
        GIVEN_SOURCE,
        True,
        None,
    ),
    (
        "dataset=-resumed-counts-the-stream",
        CountFacts(
            **MIRRORED_2,
            given=INFO_96,
            trained="a DistributedDataset",
            trained_info=ALIGNED_96,
            resumed_from=INFO_96,
        ),
        ALIGNED_96,
        TRAINED_SOURCE,
        True,
        None,
    ),
    (
        "builder-dataset",
        CountFacts(**MIRRORED_2, trained="a DistributedDataset", trained_info=INFO_80),
        INFO_80,
        TRAINED_SOURCE,
        True,
        None,
    ),
    (
        "builder-dataset-and-agreeing-global-batch",
        CountFacts(
            **MIRRORED_2, global_batch_size=16, trained="a DistributedDataset", trained_info=INFO_96
        ),
        INFO_96,
        TRAINED_SOURCE,
        True,
        None,
    ),
    (
        "inexact-builder-layout-is-derived",
        CountFacts(**MIRRORED_2, trained="a DistributedDataset", trained_info=INEXACT),
        INEXACT,
        TRAINED_SOURCE,
        False,
        "the service hands out its batches dynamically",
    ),
    (
        "global-batch-fixed-by-the-spec-is-exact",
        CountFacts(**MIRRORED_2, global_batch_size=16, trained=PLAIN, static_batch=16),
        None,
        EVEN_16,
        True,
        None,
    ),
    (
        "global-batch-unchecked-batches-are-derived",
        CountFacts(**MIRRORED_2, global_batch_size=16, trained=PLAIN),
        None,
        EVEN_16,
        False,
        f"every step is counted as {EVEN_16}; the logger cannot check the batches of {PLAIN}",
    ),
    (
        "global-batch-outside-fit-is-derived",
        CountFacts(**MIRRORED_2, global_batch_size=16, unbound="outside_fit"),
        None,
        EVEN_16,
        False,
        "cannot check the batches of the data fit trains on, so a partial last batch is "
        "counted as full",
    ),
]


@pytest.mark.parametrize(
    ("facts", "info", "source", "exact", "reason"),
    [pytest.param(*row[1:], id=row[0]) for row in CHOSEN],
)
def test_the_count_source_chosen(
    facts: CountFacts, info: DatasetInfo | None, source: str, exact: bool, reason: str | None
) -> None:
    chosen = choose_count_source(facts)
    assert chosen.info == info
    assert chosen.source == source
    assert chosen.exact is exact
    if reason is None:
        assert chosen.derived_reason is None
    else:
        assert chosen.derived_reason is not None and reason in chosen.derived_reason


# (id, facts, the error's words as a regular expression)
REFUSED = [
    (
        "dataset=-describes-another-dataset",
        CountFacts(
            **MIRRORED_2, given=INFO_80, trained="a DistributedDataset", trained_info=INFO_96
        ),
        r"describes another dataset .*examples_per_epoch 80 vs 96.*: given vs trained on",
    ),
    (
        "dataset=-built-for-other-replicas",
        CountFacts(**MIRRORED_2, given=FOUR_REPLICAS, trained=PLAIN),
        r"built for 4 replicas but the model trains on 2 \(MirroredStrategy\)",
    ),
    (
        "builder-dataset-built-for-other-replicas",
        CountFacts(
            num_replicas=1,
            strategy="OneDeviceStrategy",
            trained="a DistributedDataset",
            trained_info=INFO_96,
        ),
        r"built for 2 replicas but the model trains on 1 \(OneDeviceStrategy\)",
    ),
    (
        "global-batch-disagrees-with-the-builder-dataset",
        CountFacts(
            **MIRRORED_2, global_batch_size=15, trained="a DistributedDataset", trained_info=INFO_96
        ),
        r"global_batch_size=15\) disagrees with the dataset fit trains on: .* 16 examples "
        r"per step \(8 per replica on 2\).*global_batch_size=16",
    ),
    (
        "global-batch-disagrees-with-the-spec",
        CountFacts(**MIRRORED_2, global_batch_size=8, trained=PLAIN, static_batch=16),
        r"global_batch_size=8\) disagrees .*a _BatchDataset whose every element holds 16 "
        r"examples .*global_batch_size=16",
    ),
    (
        "global-batch-not-divisible-by-the-replicas",
        CountFacts(**MIRRORED_2, global_batch_size=15, trained=PLAIN),
        r"global_batch_size=15\) is not divisible by the 2 replicas in sync of "
        r"MirroredStrategy: tf.distribute would give them 8 and 7 .*e\.g\. 14 or 16",
    ),
    (
        "global-batch-not-divisible-outside-fit",
        CountFacts(
            num_replicas=4, strategy="MirroredStrategy", global_batch_size=6, unbound="outside_fit"
        ),
        r"global_batch_size=6\) is not divisible by the 4 replicas .*give them 2 and 1 "
        r".*e\.g\. 4 or 8",
    ),
    (
        "nothing-plain-dataset",
        CountFacts(**MIRRORED_2, trained=PLAIN),
        r"cannot count examples: fit trains on a _BatchDataset, which is not a dataset from "
        r"tfdp_utils.build_distributed_dataset, and no global_batch_size= or dataset=",
    ),
    (
        "nothing-patches-off",
        CountFacts(**MIRRORED_2, unbound="patches_off"),
        r"cannot count examples: TFDP_NO_KERAS_PATCHES=1 keeps Keras' Model.fit unwrapped",
    ),
    (
        "nothing-wrapper-undone",
        CountFacts(**MIRRORED_2, unbound="undone"),
        r"cannot count examples: Keras' Model.fit is not wrapped \(tfdp_utils.compat.undo\(\)",
    ),
    (
        "nothing-logger-created-in-the-fit-call",
        CountFacts(**MIRRORED_2, unbound="late"),
        r"cannot count examples: this fit call started before Keras' Model.fit was wrapped",
    ),
    (
        "nothing-outside-fit",
        CountFacts(**MIRRORED_2, unbound="outside_fit"),
        r"cannot count examples: its hooks run outside Model\.fit.*global_batch_size=.*dataset=",
    ),
]


@pytest.mark.parametrize(("facts", "says"), [pytest.param(*row[1:], id=row[0]) for row in REFUSED])
def test_the_count_source_refused(facts: CountFacts, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        choose_count_source(facts)


class _Carrier:
    """Stands in for a builder dataset: it carries the builder's record."""


@pytest.mark.parametrize(
    ("dataset", "global_batch_size", "expected"),
    [
        pytest.param(None, 16, None, id="none"),
        pytest.param(INFO_96, None, INFO_96, id="info"),
        pytest.param(
            carry(_Carrier(), DatasetRecord(INFO_96, plan=None)), 16, INFO_96, id="builder-dataset"
        ),
    ],
)
def test_the_dataset_argument_read(
    dataset: object, global_batch_size: int | None, expected: DatasetInfo | None
) -> None:
    assert given_info(dataset, global_batch_size=global_batch_size) == expected


@pytest.mark.parametrize(
    ("dataset", "global_batch_size", "error", "says"),
    [
        pytest.param(
            "train.tfrecord", None, TypeError, "dataset=str carries no DatasetInfo", id="str"
        ),
        pytest.param(
            INFO_96,
            32,
            ValueError,
            "global_batch_size=32 disagrees with the dataset's global batch size 16",
            id="disagrees",
        ),
    ],
)
def test_the_dataset_argument_refused(
    dataset: object, global_batch_size: int | None, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        given_info(dataset, global_batch_size=global_batch_size)
