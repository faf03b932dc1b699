"""The throughput logs' TensorBoard schema: pinned literally, parsed, described, charted."""

from __future__ import annotations

import re

import pytest

from tfdp_utils.throughput import _tags as tags

pytestmark = pytest.mark.pure


def test_the_schema_is_pinned() -> None:
    # Users' dashboards, scripts and `tfdp-utils report` on old logs rely on these exact
    # strings: changing one is a breaking change, made here on purpose or not at all.
    assert (tags.GLOBAL_RUN, tags.replica_run(3), tags.worker_run(1)) == (
        "global",
        "replica_3",
        "worker_1",
    )
    assert {kind: tags.tags_of(kind) for kind in ("global", "worker", "replica")} == {
        "global": (
            "throughput/examples",
            "throughput/examples_per_sec",
            "throughput/steps_per_sec",
            "throughput/flops_per_sec",
            "throughput/mfu",
            "throughput/worker_steps_per_sec_min",
            "throughput/worker_steps_per_sec_max",
            "throughput/worker_skew",
            "throughput/epoch_start_seconds",
            "input/wait_share",
            "goodput/goodput",
            "goodput/loss_seconds/startup",
            "goodput/loss_seconds/restarts",
            "goodput/loss_seconds/epoch_starts",
            "goodput/loss_seconds/validation",
            "goodput/loss_seconds/input_wait",
            "goodput/loss_seconds/checkpoint_saves",
            "goodput/loss_seconds/steps_trained_twice",
            "goodput/loss_seconds/after_last_step",
            "goodput/loss_seconds/other",
        ),
        "worker": ("input/wait_share", "throughput/steps_per_sec", "throughput/examples_per_sec"),
        "replica": (
            "throughput/examples",
            "throughput/examples_per_sec",
            "memory/current_bytes",
            "memory/peak_bytes",
        ),
    }
    assert tags.LAYOUT_TAG == "custom_scalars__config__"
    assert (tags.COUNTS, tags.INPUT_WAIT_NOTE, tags.GOODPUT_LEDGER) == (
        "throughput/counts",
        "input/wait_note",
        "goodput/ledger",
    )


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("global", ("global", None)),
        ("replica_0", ("replica", 0)),
        ("replica_12", ("replica", 12)),
        ("worker_3", ("worker", 3)),
        ("exp1/replica_1", ("replica", 1)),
        ("train", None),
        ("validation", None),
        ("replica_", None),
        ("replica_x", None),
        ("replica_01", None),
        ("replica_-1", None),
        ("replica_\u00b2", None),
        ("worker", None),
        ("global_0", None),
    ],
)
def test_parse_run(name: str, parsed: object) -> None:
    assert tags.parse_run(name) == parsed


@pytest.mark.parametrize("index", [0, 1, 7, 128])
def test_run_names_round_trip(index: int) -> None:
    assert tags.parse_run(tags.replica_run(index)) == ("replica", index)
    assert tags.parse_run(tags.worker_run(index)) == ("worker", index)


def test_every_description_fills_and_says_how_it_was_obtained() -> None:
    fields = {
        "timing": tags.window_timing(100),
        "counted": tags.count_origin(exact=True, source="a DatasetInfo"),
        "exactness": tags.replica_split(exact=True),
        "device": "GPU:0",
        "steps": tags.step_unit(1),
    }
    runs = {"global": tags.GLOBAL_RUN, "worker": tags.worker_run(0), "replica": tags.replica_run(0)}
    for spec in tags.SCHEMA:
        text = tags.describe(runs[spec.run], spec.tag, **fields)
        assert "{" not in text and text.endswith("."), (spec, text)
        assert text.startswith(("Measured", "Derived", "Exact count")), (spec, text)


def test_describe_rejects_tags_outside_the_schema() -> None:
    with pytest.raises(KeyError):
        tags.describe(tags.worker_run(0), tags.MFU)
    with pytest.raises(KeyError):
        tags.describe("train", tags.EXAMPLES)


def test_count_descriptions() -> None:
    assert tags.count_origin(exact=False, source="").startswith("Derived count")
    assert tags.count_origin(exact=False, source="").endswith("from the dataset.")
    assert "split evenly" in tags.replica_split(exact=False)


def test_the_layout_charts_every_tag_and_only_schema_tags() -> None:
    patterns = [
        p for category in tags.LAYOUT for chart in category.charts for p in chart.tag_patterns
    ]
    charted = {t for t in tags.TAGS if any(re.fullmatch(p, t) for p in patterns)}
    # FLOPs/s is a figure to read off, not a chart of its own (MFU is its normalised form).
    assert charted == tags.TAGS - {tags.FLOPS_PER_SEC}
    for pattern in patterns:
        assert any(re.fullmatch(pattern, t) for t in tags.TAGS), pattern


def test_a_job_layout_charts_only_what_it_writes() -> None:
    def charted(layout: tuple[tags.Category, ...]) -> set[str]:
        patterns = [p for c in layout for chart in c.charts for p in chart.tag_patterns]
        return {t for t in tags.TAGS if any(re.fullmatch(p, t) for p in patterns)}

    single = charted(tags.layout(multi_worker=False, flops=False, memory=False))
    goodput = {t for t in tags.TAGS if t.startswith("goodput/")}  # every job's chief writes
    assert len(goodput) == 1 + len(tags.GOODPUT_LOSSES)
    assert single == {
        tags.EXAMPLES_PER_SEC,
        tags.STEPS_PER_SEC,
        tags.EXAMPLES,
        tags.EPOCH_START_SECONDS,
        *goodput,
    }
    everything = charted(tags.layout(multi_worker=True, flops=True, memory=True, input_wait=True))
    assert everything == charted(tags.LAYOUT) == tags.TAGS - {tags.FLOPS_PER_SEC}
    waits = charted(tags.layout(multi_worker=False, flops=False, memory=False, input_wait=True))
    assert waits - single == {tags.INPUT_WAIT_SHARE}
    workers = charted(tags.layout(multi_worker=True, flops=False, memory=False)) - single
    assert workers == {
        tags.WORKER_STEPS_PER_SEC_MIN,
        tags.WORKER_STEPS_PER_SEC_MAX,
        tags.WORKER_SKEW,
    }


def test_step_unit_says_what_a_step_is() -> None:
    assert tags.step_unit(1) == "optimizer steps"
    assert tags.step_unit(4).startswith("micro-batches (gradient accumulation: 4 per optimizer")


def test_the_counts_note_reads_back() -> None:
    from tfdp_utils.throughput import _tags as schema

    exact = schema.counts_note(exact=True, source="the builder dataset")
    derived = schema.counts_note(exact=False, source="x", reason="partial steps unseen")
    assert schema.parse_counts_note(exact) == (True, "the builder dataset")
    assert schema.parse_counts_note(derived) == (False, "partial steps unseen")
    assert schema.parse_counts_note("something else") is None
    text = schema.count_origin(exact=False, source="global_batch_size=8", reason="unseen")
    assert text.startswith("Derived count") and text.endswith("Not exact: unseen.")
