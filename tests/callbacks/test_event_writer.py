"""RunWriters: a log point's scalars as one event per run, and the files a fit writes.

Read back with TensorBoard's own event reader and with ``tfdp-utils report``'s
(:func:`tfdp_utils.throughput._events.read_runs`), never from the writer's own state.
"""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.util import tensor_util

from tfdp_utils.callbacks._event_writer import RunWriters
from tfdp_utils.throughput import _tags as tags
from tfdp_utils.throughput._events import read_runs


def _events(run: Path) -> list[tuple[int, dict[str, float]]]:
    """(step, {tag: value}) of every summary event in the run's files, in file order."""
    found = []
    for path in sorted(run.glob("*.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            if event.HasField("summary"):
                values = {
                    v.tag: float(tensor_util.make_ndarray(v.tensor)) for v in event.summary.value
                }
                found.append((event.step, values))
    return found


def test_scalars_written_in_a_batch_arrive_as_one_event_per_run_and_step(tmp_path: Path) -> None:
    writers = RunWriters(str(tmp_path))
    writers.open([tags.GLOBAL_RUN, "replica_0"])
    with writers.batch():
        writers.scalar(tags.GLOBAL_RUN, tags.EXAMPLES, 80.0, 10, "d")
        with writers.batch():  # nested: joins the outer one
            writers.scalar(tags.GLOBAL_RUN, tags.EXAMPLES_PER_SEC, 123.5, 10, "d")
        writers.scalar("replica_0", tags.EXAMPLES, 40.0, 10, "d")
        writers.scalar(tags.GLOBAL_RUN, tags.EXAMPLES, 160.0, 20, "d")
    writers.scalar(tags.GLOBAL_RUN, tags.EXAMPLES, 240.0, 30, "d")  # outside: its own event
    writers.close()
    assert _events(tmp_path / tags.GLOBAL_RUN) == [
        (10, {tags.EXAMPLES: 80.0, tags.EXAMPLES_PER_SEC: 123.5}),
        (20, {tags.EXAMPLES: 160.0}),
        (30, {tags.EXAMPLES: 240.0}),
    ]
    assert _events(tmp_path / "replica_0") == [(10, {tags.EXAMPLES: 40.0})]
    run = read_runs(str(tmp_path))[tags.GLOBAL_RUN]
    assert run.series[tags.EXAMPLES] == [(10, 80.0), (20, 160.0), (30, 240.0)]
    assert run.series[tags.EXAMPLES_PER_SEC] == [(10, 123.5)]


def test_the_files_of_the_open_writers_can_be_left_unread(tmp_path: Path) -> None:
    earlier = RunWriters(str(tmp_path))
    earlier.open([tags.GLOBAL_RUN])
    earlier.scalar(tags.GLOBAL_RUN, tags.EXAMPLES, 8.0, 1, "d")
    earlier.close()
    writers = RunWriters(str(tmp_path))
    writers.open([tags.GLOBAL_RUN])
    writers.scalar(tags.GLOBAL_RUN, tags.EXAMPLES, 16.0, 2, "d")
    writers.flush()
    own = writers.files(tags.GLOBAL_RUN)
    on_disk = sorted(str(p) for p in (tmp_path / tags.GLOBAL_RUN).glob("*.tfevents.*"))
    assert len(own) == 1 and own[0] in on_disk and len(on_disk) == 2
    assert read_runs(str(tmp_path))[tags.GLOBAL_RUN].series[tags.EXAMPLES] == [(1, 8.0), (2, 16.0)]
    unread = read_runs(str(tmp_path), exclude=own)[tags.GLOBAL_RUN]
    assert unread.series[tags.EXAMPLES] == [(1, 8.0)]
    writers.close()
    assert writers.files(tags.GLOBAL_RUN) == ()
