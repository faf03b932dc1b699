"""What the builder tells the user about a plan: ``diagnose(facts)`` as a table of findings.

Pure. Each branch (seed, source, policy, files, drop_remainder, repeat) is driven by facts
written out by hand, so a finding is tested without building a dataset; numbers the messages
quote are worked out here from the facts, not taken from the code.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from tfdp_utils.data._diagnostics import IMBALANCE_LIMIT, BuildFacts, Finding, diagnose
from tfdp_utils.data._epochs import EpochLayout, EpochPlan, StepShape, epoch_layout
from tfdp_utils.data._sharding import DEFAULT_SHUFFLE_SEED, ShardingPlan, SourceFacts

pytestmark = pytest.mark.pure

INFO, WARNING = logging.INFO, logging.WARNING


def facts(
    *,
    policy: Any = "data",
    workers: int = 2,
    kind: Any = "arrays",
    files_per_worker: tuple[tuple[str, ...], ...] = (),
    source: SourceFacts | None = None,
    layout: EpochLayout | None = None,
    epoch_batches: tuple[int, ...] | None = None,
    shape: StepShape | None = None,
    **given: Any,
) -> BuildFacts:
    """Facts that trigger nothing but the plan's summary, with the fields given changed."""
    plan = ShardingPlan(
        policy=policy,
        reason="chosen by the test",
        num_workers=workers,
        source_kind=kind,
        files_per_worker=files_per_worker,
    )
    return BuildFacts(
        plan=plan,
        source=source or SourceFacts(kind=kind, num_examples=100),
        epochs=EpochPlan(layout=layout, epoch_batches=epoch_batches),
        shape=shape or StepShape(4, 2 * workers, workers),
        **given,
    )


def messages(found: tuple[Finding, ...]) -> list[tuple[int, str]]:
    """Each finding but the plan's summary (always last), as (level, message)."""
    return [(f.level, f.message) for f in found[:-1]]


def test_quiet_facts_give_only_the_plan_summary_last() -> None:
    given = facts()
    assert diagnose(given) == (Finding(INFO, given.plan.describe()),)


def test_the_summary_comes_last_after_every_other_finding() -> None:
    given = facts(
        source=SourceFacts(kind="arrays", num_examples=0), shuffling=True, drop_remainder=True
    )
    found = diagnose(given)
    assert len(found) == 4
    assert found[-1] == Finding(INFO, given.plan.describe())
    # The builder's order: seed, source, ..., drop.
    assert "seed=" in found[0].message
    assert "no examples" in found[1].message
    assert found[2].message.startswith("drop_remainder=True")


# ------------------------------------------------------------------------------- seed


@pytest.mark.parametrize(
    ("policy", "workers", "shuffling", "seed", "says"),
    [
        ("data", 2, True, None, True),  # every worker must shuffle alike: a seed is chosen
        ("data", 4, True, None, True),
        ("data", 2, True, 7, False),  # the caller's seed is kept
        ("data", 2, False, None, False),  # nothing shuffled
        ("data", 1, True, None, False),  # one worker: nothing to keep disjoint
        ("file", 2, True, None, False),  # each worker reads its own files
        ("off", 2, True, None, False),
    ],
)
def test_seed_finding(
    policy: str, workers: int, shuffling: bool, seed: int | None, says: bool
) -> None:
    found = messages(
        diagnose(facts(policy=policy, workers=workers, shuffling=shuffling, seed=seed))
    )
    expected = (
        [
            (
                INFO,
                f"shuffling with DATA sharding over {workers} workers needs the same seed on "
                f"every worker; using seed={DEFAULT_SHUFFLE_SEED}. Pass seed= to shuffle "
                "differently between runs.",
            )
        ]
        if says
        else []
    )
    # shard_policy='off' on several workers has its own finding; only the seed one is checked.
    assert [m for m in found if "seed" in m[1]] == expected


# ----------------------------------------------------------------------------- source


@pytest.mark.parametrize(
    ("num_examples", "repeat", "warns"),
    [
        (100, False, []),
        (None, False, []),  # unknown size: nothing to say
        (0, False, ["the source holds no examples"]),
        (0, True, ["the source holds no examples"]),
        (-1, False, ["the source is infinite, so an epoch never ends"]),
        (-1, True, []),  # a repeated dataset never ends anyway
        (-1, "epochs", []),
    ],
)
def test_source_findings(num_examples: int | None, repeat: Any, warns: list[str]) -> None:
    given = facts(source=SourceFacts(kind="arrays", num_examples=num_examples), repeat=repeat)
    # Only the warnings: repeat='epochs' over an unknown size has its own INFO finding.
    found = [text for level, text in messages(diagnose(given)) if level == WARNING]
    assert len(found) == len(warns)
    for text, start in zip(found, warns, strict=True):
        assert text.startswith(start)


def test_an_empty_source_says_training_does_nothing_and_what_to_check() -> None:
    (finding, _) = diagnose(facts(source=SourceFacts(kind="arrays", num_examples=0)))
    assert finding.message == (
        "the source holds no examples, so every epoch is empty and training does nothing. "
        "Check the source (a filter that drops everything, an empty file)."
    )


def test_an_infinite_source_says_to_pass_steps_per_epoch() -> None:
    (finding, _) = diagnose(facts(source=SourceFacts(kind="dataset", num_examples=-1)))
    assert finding.level == WARNING
    assert "pass steps_per_epoch to fit" in finding.message
    assert "Per-epoch exact coverage does not apply." in finding.message


# ----------------------------------------------------------------------------- policy


@pytest.mark.parametrize(
    ("policy", "kind", "workers", "warning"),
    [
        (
            "file",
            "dataset",
            3,
            "shard_policy='file' on a tf.data.Dataset uses tf.data's FILE autoshard, which "
            "needs at least 3 files in the dataset",
        ),
        (
            "off",
            "arrays",
            2,
            "shard_policy='off' on 2 workers: every worker trains on every example, so each "
            "epoch sees each example 2 times.",
        ),
        (
            "off",
            "dataset",
            4,
            "shard_policy='off' on 4 workers: every worker trains on every example, so each "
            "epoch sees each example 4 times.",
        ),
        ("off", "function", 2, None),  # fn(input_context) shards itself
        ("off", "arrays", 1, None),  # one worker: 'off' is the only sensible policy
        ("file", "dataset", 1, None),
        ("hint", "dataset", 2, None),
        ("data", "dataset", 2, None),
    ],
)
def test_policy_findings(policy: str, kind: str, workers: int, warning: str | None) -> None:
    given = facts(policy=policy, kind=kind, workers=workers, source=SourceFacts(kind=kind))
    found = messages(diagnose(given))
    if warning is None:
        assert found == []
    else:
        ((level, text),) = found
        assert level == WARNING and text.startswith(warning)


def test_file_on_a_dataset_says_how_to_let_the_builder_check_the_files() -> None:
    given = facts(policy="file", kind="dataset", source=SourceFacts(kind="dataset"))
    (finding, _) = diagnose(given)
    assert "a worker fails at its first batch while the others wait for it" in finding.message
    assert finding.message.endswith(
        "Pass the file paths as source instead so the builder can check and balance them."
    )


# ------------------------------------------------------------------------------ files


FILES = ("a", "b", "c", "d")


def file_facts(
    files_per_worker: tuple[tuple[str, ...], ...],
    *,
    sizes: tuple[int, ...] | None = None,
    counts: tuple[int, ...] | None = None,
    policy: str = "file",
) -> BuildFacts:
    source = SourceFacts(kind="files", files=FILES, sizes=sizes, file_counts=counts)
    return facts(
        policy=policy,
        kind="files",
        workers=len(files_per_worker),
        files_per_worker=files_per_worker,
        source=source,
    )


@pytest.mark.parametrize(
    ("files_per_worker", "sizes", "counts", "warning"),
    [
        # Loads 90 and 30, mean 60: 1.5x, not above the limit.
        ((("a",), ("b", "c", "d")), (90, 10, 10, 10), None, None),
        # Loads 100 and 30, mean 65: 1.54x.
        ((("a",), ("b", "c", "d")), (100, 10, 10, 10), None, "1.5x the mean bytes"),
        # Loads 50, 5 and 5, mean 20: 2.5x.
        ((("a",), ("b",), ("c", "d")), (50, 5, 3, 2), None, "2.5x the mean bytes"),
        # Counted examples decide, not bytes. Examples 600 and 2, mean 301: 1.99x.
        ((("a", "b"), ("c", "d")), (10, 10, 10, 10), (300, 300, 1, 1), "2.0x the mean examples"),
        # 20 and 20 examples: even, however uneven the bytes.
        ((("a", "b"), ("c", "d")), (300, 300, 1, 1), (10, 10, 10, 10), None),
    ],
)
def test_uneven_files_warn_above_the_limit_naming_the_ratio(
    files_per_worker: tuple[tuple[str, ...], ...],
    sizes: tuple[int, ...],
    counts: tuple[int, ...] | None,
    warning: str | None,
) -> None:
    assert IMBALANCE_LIMIT == 1.5
    found = messages(diagnose(file_facts(files_per_worker, sizes=sizes, counts=counts)))
    if warning is None:
        assert found == []
    else:
        ((level, text),) = found
        assert level == WARNING
        assert text.startswith(f"the busiest worker reads {warning} per worker")
        assert "Split the large files, or use shard_policy='data'" in text


def test_unknown_sizes_give_no_imbalance_finding() -> None:
    assert messages(diagnose(file_facts((("a", "b"), ("c", "d"))))) == []


@pytest.mark.parametrize(
    ("files_per_worker", "idle"),
    [
        ((("a", "b", "c", "d"), ()), [1]),
        ((("a", "b"), (), ("c", "d"), ()), [1, 3]),
        ((("a",), ("b",), ("c",), ("d",)), []),
    ],
)
def test_workers_without_a_file_are_named(
    files_per_worker: tuple[tuple[str, ...], ...], idle: list[int]
) -> None:
    # Sizes as uneven as can be: an idle worker is the finding, not the imbalance.
    found = messages(diagnose(file_facts(files_per_worker, sizes=(100, 1, 1, 1))))
    idle_warning = (
        WARNING,
        f"4 file(s) for {len(files_per_worker)} workers: workers {idle} read no file and feed "
        "only empty batches. Use shard_policy='auto' or 'data' to use every worker.",
    )
    if idle:
        assert found == [idle_warning]
    else:
        assert len(found) == 1 and "the busiest worker reads" in found[0][1]


def test_file_findings_only_for_file_sharding_of_file_paths() -> None:
    every_file = (FILES, FILES)  # DATA: every worker reads every file
    assert messages(diagnose(file_facts(every_file, sizes=(100, 1, 1, 1), policy="data"))) == []


# ------------------------------------------------------------------------ drop_remainder


def test_drop_remainder_with_a_known_layout_says_what_it_drops() -> None:
    # 2 workers of 2 replicas of 4: a step takes 8 from each worker. With 13 and 12 examples
    # each worker fills one step (8 + 8 = 16 trained) and 5 + 4 = 9 are dropped.
    shape = StepShape(4, 4, 2)
    layout = epoch_layout([13, 12], 4, 2, drop_remainder=True)
    found = messages(diagnose(facts(layout=layout, shape=shape, drop_remainder=True)))
    assert found == [
        (
            INFO,
            "drop_remainder=True drops 9 of 25 examples each epoch (1 full steps of 16).",
        )
    ]


def test_drop_remainder_with_an_unknown_size_warns_of_the_most_it_can_drop() -> None:
    found = messages(diagnose(facts(shape=StepShape(32, 4, 2), drop_remainder=True)))
    ((level, text),) = found
    assert level == WARNING
    assert text.startswith(
        "drop_remainder=True with an unknown number of examples per worker: each epoch "
        "drops up to 31 examples per replica"
    )


def test_no_drop_finding_without_drop_remainder() -> None:
    layout = EpochLayout(steps=2, full_steps=1, tail=((3, 3, 3, 3),), examples=28, dropped=0)
    assert messages(diagnose(facts(layout=layout))) == []


# -------------------------------------------------------------------------------- repeat


LAYOUT = EpochLayout(steps=2, full_steps=1, tail=((3, 3, 3, 3),), examples=28, dropped=0)


@pytest.mark.parametrize(
    ("repeat", "layout", "epoch_batches", "says"),
    [
        ("epochs", LAYOUT, (4, 4), None),  # aligned epochs: nothing to say
        ("epochs", None, None, "repeat='epochs' needs the number of examples"),
        ("epochs", LAYOUT, None, "repeat='epochs' over sparse or ragged elements"),
        (True, None, None, None),
        (True, LAYOUT, None, None),
        (False, LAYOUT, None, None),
    ],
)
def test_repeat_findings(
    repeat: Any,
    layout: EpochLayout | None,
    epoch_batches: tuple[int, ...] | None,
    says: str | None,
) -> None:
    given = facts(layout=layout, epoch_batches=epoch_batches, repeat=repeat)
    found = messages(diagnose(given))
    if says is None:
        assert found == []
    else:
        ((level, text),) = found
        assert level == INFO and text.startswith(says)
        assert "repeating example by example" in text or "repeats example by example" in text


def test_facts_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts().seed = 3  # type: ignore[misc]
