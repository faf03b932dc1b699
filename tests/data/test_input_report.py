"""What ``diagnose_input`` concludes from its figures: the verdict, the slow stage, the advice.

Pure. Figures are written out by hand (examples, steps, seconds, CPU seconds), so every rule is
tested without TensorFlow; the factors and shares quoted are worked out here from those figures.
"""

from __future__ import annotations

import dataclasses

import pytest

from tfdp_utils.data._input_advice import advise
from tfdp_utils.data._input_figures import Figures, Rate, Stage, bottleneck
from tfdp_utils.data._input_report import DISTRIBUTED_ITERATOR, diagnose

pytestmark = pytest.mark.pure


def rate(per_sec: float, *, cpu_share_of_two: float | None = None) -> Rate:
    """A 2-second stretch at ``per_sec`` examples/s; CPU as a share of 2 cores."""
    cpu = None if cpu_share_of_two is None else cpu_share_of_two * 2 * 2.0
    return Rate(int(per_sec * 2), 20, 2.0, cpu)


SERIAL_READ = Stage("FlatMap", "read", None, False, 8)
PARALLEL_READ_ONE_FILE = Stage("TFRecordV2", "read", -1, False, 1)
PARALLEL_READ = Stage("TFRecordV2", "read", -1, False, 8)
SERIAL_MAP = Stage("Map", "map", None, True)
SERIAL_PLAIN_MAP = Stage("Map", "map", None, False)
PARALLEL_MAP = Stage("ParallelMap", "map", -1)
BATCH = Stage("Batch", "batch")
PREFETCH = Stage("Prefetch", "other")
SOURCE = Stage("TensorSlice", "source")


def timed(stage: Stage, per_sec: float | None) -> Stage:
    return dataclasses.replace(stage, examples_per_sec=per_sec)


def figures(
    stages: tuple[Stage, ...],
    *,
    input_rate: float = 1_000,
    model_rate: float = 5_000,
    together: float | None = None,
    cpu: float | None = 0.6,
    **kwargs: object,
) -> Figures:
    """Training on cached batches runs at ``model_rate`` (as on the held batch), fed from the
    pipeline at ``together`` (by default the slower of the input and the model)."""
    kwargs.setdefault("replicas", 2)
    return Figures(
        input=rate(input_rate, cpu_share_of_two=cpu),
        model=rate(model_rate),
        cached=rate(model_rate),
        together=rate(together if together is not None else min(input_rate, model_rate)),
        stages=stages,
        cores=2,
        **kwargs,  # type: ignore[arg-type]
    )


def kinds(advice: tuple[object, ...]) -> list[str]:
    return [a.kind for a in advice]  # type: ignore[attr-defined]


# ------------------------------------------------------------------------ the slow stage


@pytest.mark.parametrize(
    ("rates", "input_rate", "expected"),
    [
        ((90_000, 1_200, 1_100), 1_000, 1),  # the map takes the rate down; batch keeps it
        ((1_050, 1_000, 990), 1_000, 0),  # the reads already are the limit
        ((None, 20_000, None), 1_000, 3),  # every stage faster than the iterator delivers
        ((None, None, None), 1_000, None),  # nothing timed
    ],
)
def test_the_slow_stage_is_the_first_near_the_slowest(
    rates: tuple[float | None, ...], input_rate: float, expected: int | None
) -> None:
    stages = tuple(timed(s, r) for s, r in zip((SOURCE, SERIAL_MAP, BATCH), rates, strict=True))
    assert bottleneck(stages, input_rate) == expected


# ---------------------------------------------------------------------------- verdicts


def test_factor_is_cached_over_together_and_sets_the_verdict() -> None:
    report = diagnose(
        figures((timed(SOURCE, 1_000),), input_rate=1_000, model_rate=5_000),
        seconds=4.0,
        global_batch_size=64,
        num_replicas_in_sync=2,
    )
    assert report.factor == pytest.approx(5.0)
    assert report.input_bound
    assert report.bottleneck == "TensorSlice"
    assert report.input_cpu_share == pytest.approx(0.6)
    assert report.steps == (20, 20, 20, 20)
    balanced = diagnose(
        figures((), input_rate=1_000, model_rate=1_050),
        seconds=4.0,
        global_batch_size=64,
        num_replicas_in_sync=2,
    )
    assert not balanced.input_bound  # within 1.1x: a faster input would gain under 10 %
    assert balanced.bottleneck is None


def test_not_input_bound_says_so_and_nothing_about_the_pipeline() -> None:
    advice = advise(figures((timed(SERIAL_READ, 900),), input_rate=5_000, model_rate=1_000))
    assert kinds(advice) == ["compute"]
    assert "at 100% of the speed on the same batches held in memory" in advice[0].message


# ------------------------------------------------------------------------------ advice


def test_serial_reads_get_parallel_reads() -> None:
    stages = (timed(SERIAL_READ, 1_000), timed(PARALLEL_MAP, 990), timed(BATCH, 990))
    advice = advise(figures(stages))
    assert kinds(advice) == ["parallel_reads"]
    assert "num_parallel_reads=tf.data.AUTOTUNE" in advice[0].message
    assert "interleave" in advice[0].message


def test_one_file_gets_more_files() -> None:
    advice = advise(figures((timed(PARALLEL_READ_ONE_FILE, 1_000), timed(BATCH, 1_000))))
    assert kinds(advice) == ["more_files"]
    assert "Only 1 file(s)" in advice[0].message
    assert "at least 4" in advice[0].message  # 2 per core, 2 cores


def test_a_serial_python_map_gets_parallel_calls_and_cache_but_not_the_service() -> None:
    # A py_function cannot run on the tf.data service's workers.
    stages = (timed(SOURCE, 500_000), timed(SERIAL_MAP, 1_000), timed(BATCH, 1_000))
    advice = advise(figures(stages))
    assert kinds(advice) == ["parallel_map", "cache"]
    assert "num_parallel_calls=tf.data.AUTOTUNE" in advice[0].message
    assert "GIL" in advice[0].message
    assert ".cache()" in advice[1].message


def test_builder_advice_names_the_builder_arguments() -> None:
    stages = (timed(SOURCE, 500_000), timed(PARALLEL_MAP, 1_000))
    advice = {a.kind: a.message for a in advise(figures(stages, builder=True))}
    assert set(advice) == {"cache", "service"}
    assert "cache=True" in advice["cache"]
    assert "service='grpc://dispatcher:port'" in advice["service"]


def test_no_cache_advice_when_a_cache_follows_and_no_service_when_in_use() -> None:
    stages = (timed(SOURCE, 500_000), timed(PARALLEL_MAP, 1_000))
    advice = advise(figures(stages, cached_after=(0, 1), service=True))
    assert kinds(advice) == []


@pytest.mark.parametrize(
    ("stage", "flags", "expected"),
    [
        (SERIAL_READ, {}, ["parallel_reads"]),  # 8 files: enough for 2 cores
        (dataclasses.replace(SERIAL_READ, files=1), {}, ["parallel_reads", "more_files"]),
        (PARALLEL_READ_ONE_FILE, {}, ["more_files"]),
        (dataclasses.replace(PARALLEL_READ, files=3), {}, ["more_files"]),  # under 2 per core
        (dataclasses.replace(PARALLEL_READ, files=4), {}, []),  # 2 per core: enough
        (dataclasses.replace(PARALLEL_READ, files=None), {}, []),  # files unknown
        (Stage("Generator", "generator", None, True), {}, ["python"]),
        (SERIAL_MAP, {}, ["parallel_map", "cache"]),  # Python: no service
        (SERIAL_PLAIN_MAP, {}, ["parallel_map", "cache", "service"]),
        (PARALLEL_MAP, {"first_epoch": True}, ["cache"]),  # the cache being filled: no service
        (PARALLEL_MAP, {}, ["cache", "service"]),
        (PARALLEL_MAP, {"cached_after": (0,)}, ["service"]),
        (PARALLEL_MAP, {"service": True}, ["cache"]),
        (SERIAL_MAP, {"cached_after": (0,), "service": True}, ["parallel_map"]),
        (Stage("Interleave", "interleave"), {}, []),
        (BATCH, {}, []),
        (SOURCE, {}, []),
        (PREFETCH, {}, []),
    ],
)
def test_the_slow_stage_gets_the_rows_that_apply_to_it(
    stage: Stage, flags: dict[str, object], expected: list[str]
) -> None:
    # The stage alone is the slow one; CPU 60 % of 2 cores and full overlap add nothing.
    advice = advise(figures((timed(stage, 900),), **flags))
    assert kinds(advice) == expected


@pytest.mark.parametrize(
    ("stage", "builder", "kind", "phrase", "shown"),
    [
        (SERIAL_READ, False, "parallel_reads", "(a file source given to", True),
        (SERIAL_READ, True, "parallel_reads", "(a file source given to", False),
        (SERIAL_MAP, False, "parallel_map", "holds the GIL", True),
        (SERIAL_PLAIN_MAP, False, "parallel_map", "holds the GIL", False),
        (SERIAL_PLAIN_MAP, False, "cache", "add .cache() (memory) or .cache(path)", True),
        (SERIAL_PLAIN_MAP, True, "cache", "pass cache=True (or a file prefix)", True),
        (SERIAL_PLAIN_MAP, False, "service", "tf.data.experimental.service.distribute", True),
        (SERIAL_PLAIN_MAP, True, "service", "tfdp-utils data-service dispatcher", True),
    ],
)
def test_the_slow_stage_advice_names_the_call_for_its_dataset(
    stage: Stage, builder: bool, kind: str, phrase: str, shown: bool
) -> None:
    advice = {a.kind: a.message for a in advise(figures((timed(stage, 900),), builder=builder))}
    assert (phrase in advice[kind]) is shown, advice[kind]
    if kind != "service":  # the service's advice is about the machine, not the stage
        assert f"(the slow stage is {stage.describe()})" in advice[kind]


def test_cpu_saturated_gets_the_service_and_intra_op_threads() -> None:
    stages = (timed(SOURCE, 500_000), timed(BATCH, 1_000))
    advice = advise(figures(stages, cpu=0.95))
    assert kinds(advice) == ["service", "threading"]
    assert "keeps 95% of 2 core(s) busy" in advice[0].message
    assert "max_intra_op_parallelism = 1" in advice[1].message


def test_latency_bound_gets_a_larger_private_thread_pool() -> None:
    advice = advise(figures((timed(SERIAL_READ, 1_000),), cpu=0.05))
    assert kinds(advice) == ["parallel_reads", "threading"]
    assert "private_threadpool_size = 8" in advice[1].message  # 4 per core
    assert "5% of 2 core(s)" in advice[1].message


def test_the_distributed_iterator_as_the_slow_part() -> None:
    report = diagnose(
        figures((timed(SOURCE, 50_000), timed(BATCH, 40_000))),
        seconds=1.0,
        global_batch_size=64,
        num_replicas_in_sync=2,
    )
    assert report.bottleneck == DISTRIBUTED_ITERATOR
    assert kinds(report.advice) == ["distribution"]


@pytest.mark.parametrize(
    ("prefetches", "phrase"),
    [(False, "add .prefetch(tf.data.AUTOTUNE)"), (True, "compete for the same cores")],
)
def test_no_overlap_gets_prefetch_or_contention(prefetches: bool, phrase: str) -> None:
    # cached 1,000/s, input 5,000/s: training should reach 1,000/s, gets 500/s
    advice = advise(
        figures((), input_rate=5_000, model_rate=1_000, together=500, prefetches=prefetches)
    )
    assert kinds(advice) == ["overlap"]
    assert phrase in advice[0].message
    assert "500 examples/s, below the slower of the pipeline alone and training on cached" in (
        advice[0].message
    )


def test_summary_is_a_bug_report() -> None:
    stages = (timed(SOURCE, 500_000), timed(SERIAL_MAP, 1_000), PREFETCH)
    report = diagnose(
        figures(stages, input_rate=1_000, model_rate=4_000, together=990),
        seconds=6.5,
        global_batch_size=64,
        num_replicas_in_sync=2,
        strategy="MirroredStrategy",
        keras="keras3 3.15.1; TensorFlow 2.21.0",
        dataset="tf.data.Dataset",
        notes=("a note",),
    )
    text = report.summary()
    assert text.startswith(
        "tfdp-utils diagnose_input: INPUT-BOUND: training fed from the pipeline runs 4.0x slower"
    )
    for part in (
        "MirroredStrategy, 2 replica(s); keras3 3.15.1",
        "global batch 64",
        "1,000 examples/s",
        "4,000 examples/s",
        "990 examples/s",
        "CPU 60% of 2 core(s)",
        "Map(serial, Python)",
        "<- slow stage",
        "1. [parallel_map]",
        "note: a note",
        "(diagnosis took 6.5 s)",
    ):
        assert part in text, part


# ---------------------------------------------------- what applies to the strategy at hand


def test_one_replica_never_blames_the_distributed_iterator() -> None:
    # Every stage faster than the iterator delivers: on 2 replicas the split is the slow part;
    # on 1 nothing is split, so no stage and no iterator is named.
    stages = (timed(SOURCE, 50_000), timed(BATCH, 40_000))
    for replicas, named in ((2, True), (1, False)):
        report = diagnose(
            figures(stages, replicas=replicas),
            seconds=1.0,
            global_batch_size=64,
            num_replicas_in_sync=replicas,
        )
        assert report.input_bound
        assert (report.bottleneck == DISTRIBUTED_ITERATOR) is named
        assert ("distribution" in kinds(report.advice)) is named
        assert (DISTRIBUTED_ITERATOR in report.summary()) is named
    assert bottleneck(stages, 1_000, replicas=1) is None


def test_first_epoch_figures_say_so_and_get_no_service_advice() -> None:
    # An expensive map before a cache() being filled, CPU saturated: the service would be
    # advised twice (the map, the CPU) were the figures not first-epoch ones.
    stages = (timed(SOURCE, 500_000), timed(PARALLEL_MAP, 1_000), PREFETCH)
    for first_epoch in (False, True):
        report = diagnose(
            figures(stages, cpu=0.95, cached_after=(0, 1), first_epoch=first_epoch),
            seconds=1.0,
            global_batch_size=64,
            num_replicas_in_sync=2,
        )
        assert report.first_epoch is first_epoch
        assert ("service" in kinds(report.advice)) is not first_epoch
        assert ("first epoch" in report.summary()) is first_epoch
        assert any("first-epoch figures" in note for note in report.notes) is first_epoch


def test_no_batch_within_the_budget_is_undetermined_with_the_phases_cut() -> None:
    generator = Stage("FlatMap", "generator", None, True)
    report = diagnose(
        Figures(input=None, model=None, together=None, stages=(SOURCE, generator, BATCH)),
        seconds=1.8,
        global_batch_size=0,
        num_replicas_in_sync=1,
        cut_short=("input",),
    )
    assert report.input_bound is None and report.factor is None
    assert report.steps == (0, 0, 0, 0)
    assert kinds(report.advice) == ["budget", "python"]  # the generator, slow by its kind
    assert "not timed" in report.advice[1].message
    text = report.summary()
    assert text.startswith("tfdp-utils diagnose_input: UNDETERMINED")
    assert "max_seconds cut short: input" in text


def test_the_pipeline_alone_stands_in_when_training_on_it_was_not_timed() -> None:
    # Too slow to train on within the budget: the pipeline alone against the cached batches.
    report = diagnose(
        dataclasses.replace(figures((), input_rate=10, model_rate=1_000), together=None),
        seconds=4.0,
        global_batch_size=2,
        num_replicas_in_sync=2,
        cut_short=("together",),
    )
    assert report.factor == pytest.approx(100.0)
    assert report.input_bound and report.training_examples_per_sec is None
    assert "not timed" in report.summary()


def test_a_difference_within_the_windows_spread_is_not_input_bound() -> None:
    # Fed from the pipeline 1,000/s; cached batches 1,500/s at best but 900/s in their slowest
    # window: load moved the figures as much as the input did.
    base = figures((), input_rate=5_000, model_rate=1_500, together=1_000)
    for slowest, bound in ((900, False), (1_100, True)):
        report = diagnose(
            dataclasses.replace(base, cached_slowest=rate(slowest)),
            seconds=4.0,
            global_batch_size=64,
            num_replicas_in_sync=2,
        )
        assert report.factor == pytest.approx(1.5)
        assert report.input_bound is bound
        assert ("within the spread of its windows" in report.summary()) is not bound
