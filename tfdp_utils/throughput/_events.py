"""The event files a ThroughputLogger wrote, read back: every record, checksums checked.

Pure (no TensorFlow): the records are read with the standard library, so ``tfdp-utils report``
runs where TensorFlow is not installed. :func:`read_runs` gives each run's series;
:func:`event_file_problems` says which files are damaged or cut short.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Collection

from tfdp_utils.throughput._restarts import FitSpan
from tfdp_utils.throughput._tags import (
    COUNTS,
    EXAMPLES,
    EXAMPLES_PER_SEC,
    GOODPUT_LEDGER,
    INPUT_WAIT_NOTE,
    INPUT_WAIT_SHARE,
    MEMORY_PEAK_BYTES,
    STEPS_PER_SEC,
    WORKER_SKEW,
)

_TAGS = (
    EXAMPLES_PER_SEC,
    STEPS_PER_SEC,
    EXAMPLES,
    WORKER_SKEW,
    MEMORY_PEAK_BYTES,
    INPUT_WAIT_SHARE,
)


@dataclasses.dataclass(frozen=True)
class RunSeries:
    """The throughput series of one TensorBoard run, as ``(step, value)`` pairs per tag.

    The series are what TensorBoard shows: every point of every fit logged into the run, in
    step order. Where two fits logged the same step (a fit that resumed behind an earlier
    one), both points are kept, the earlier fit's first, unless they are equal (the count a
    resumed fit starts from, as the fit before it ended); within one fit the last write of a
    step wins.
    """

    name: str
    series: dict[str, list[tuple[int, float]]]
    notes: tuple[tuple[int, str], ...] = ()  # the logger's COUNTS texts, (step, text)
    problems: tuple[str, ...] = ()  # what is wrong with the run's event files
    wall_times: dict[int, float] = dataclasses.field(default_factory=dict)  # step -> seconds
    # The logger's INPUT_WAIT_NOTE texts, (step, text): why a fit's input-wait share is unknown.
    input_wait_notes: tuple[tuple[int, str], ...] = ()
    # The steps each fit logged (one event file each), in the order the fits started.
    fits: tuple[FitSpan, ...] = ()
    # Per fit, in the same order: its GOODPUT_LEDGER text (None for a fit that wrote none: it
    # was killed, or logged by an older version) and the wall times of its first and last
    # points.
    ledgers: tuple[str | None, ...] = ()
    fit_walls: tuple[tuple[float, float], ...] = ()

    def values(self, tag: str) -> list[float]:
        """The values of ``tag``, in step order (empty when the run has no such tag)."""
        return [value for _, value in self.series.get(tag, [])]


def read_runs(log_dir: str, *, exclude: Collection[str] = ()) -> dict[str, RunSeries]:
    """Read every run under ``log_dir`` that holds throughput or memory scalars.

    Runs are the directories that hold event files, found recursively as TensorBoard finds
    them and named by their path under ``log_dir``. Every record is read (TensorBoard's own
    reader keeps only 10 tensor events per tag by default) with its checksums checked; a
    file is read up to its first damaged record (see :func:`event_file_problems`). Pure
    Python and protobuf: no TensorFlow import.

    Args:
        log_dir: the directory given to ``ThroughputLogger``.
        exclude: paths of event files to leave unread (a logger leaves out the file it is
            writing). Defaults to none.

    Returns:
        Runs by name (``global``, ``replica_0``, ...), in name order.

    Raises:
        FileNotFoundError: when ``log_dir`` does not exist or is a file.
    """
    if not os.path.isdir(log_dir):
        raise FileNotFoundError(
            f"LOGDIR {log_dir!r} is not a directory but a file. Pass the log_dir given to "
            "ThroughputLogger: the folder that holds its runs ('global', 'replica_0', ...), not "
            "one of their event files."
            if os.path.exists(log_dir)
            else f"LOGDIR {log_dir!r} is not a directory: nothing exists at that path. Pass the "
            "log_dir given to ThroughputLogger (check the path, and that the job has started "
            "writing)."
        )
    runs: dict[str, RunSeries] = {}
    for folder, files in _event_files(log_dir, exclude=exclude):
        points: dict[str, list[tuple[int, float]]] = {}
        notes: dict[int, str] = {}
        walls: dict[int, float] = {}
        wait_notes: dict[int, str] = {}
        problems = []
        fits: list[FitSpan] = []
        ledgers: list[str | None] = []
        fit_walls: list[tuple[float, float]] = []
        read = []
        for order, path in enumerate(files):
            records, problem = _read_records(path)
            if problem:
                problems.append(f"{os.path.basename(path)} {problem}")
            read.append((_started(records), order, records))
        for _, _, records in sorted(read, key=lambda r: r[:2]):  # the order the fits started
            own: dict[str, dict[int, float]] = {}
            own_walls: dict[int, float] = {}
            ledger: dict[int, str] = {}
            steps = [
                step
                for record in records
                if (step := _add_points(record, own, notes, own_walls, wait_notes, ledger))
                is not None
            ]
            _merge(points, own)
            walls.update(own_walls)
            if steps:
                fits.append(FitSpan(steps[0], max(steps)))
                ledgers.append(ledger[max(ledger)] if ledger else None)
                fit_walls.append((own_walls[steps[0]], max(own_walls.values())))
        if not points:
            continue
        name = os.path.relpath(folder, log_dir)
        display = "." if name == os.curdir else name.replace(os.sep, "/")
        series = {tag: sorted(points[tag], key=lambda p: p[0]) for tag in _TAGS if tag in points}
        runs[display] = RunSeries(
            display,
            series,
            tuple(sorted(notes.items())),
            tuple(problems),
            dict(sorted(walls.items())),
            tuple(sorted(wait_notes.items())),
            tuple(fits),
            tuple(ledgers),
            tuple(fit_walls),
        )
    return dict(sorted(runs.items()))


def _merge(points: dict[str, list[tuple[int, float]]], own: dict[str, dict[int, float]]) -> None:
    """Add one fit's points to a run's: a step already logged keeps both points (TensorBoard
    shows both), unless the values are equal."""
    for tag, found in own.items():
        series = points.setdefault(tag, [])
        logged = set(series)
        series.extend(point for point in found.items() if point not in logged)


def _started(records: list[bytes]) -> float:
    """When an event file was opened: the wall time of its first record (the file version
    event). Orders the fits: the file names count seconds only."""
    from tensorboard.compat.proto import event_pb2

    return float(event_pb2.Event.FromString(records[0]).wall_time) if records else 0.0


def _event_files(log_dir: str, *, exclude: Collection[str] = ()) -> list[tuple[str, list[str]]]:
    found = []
    skip = {os.path.abspath(path) for path in exclude}
    for folder, _, files in sorted(os.walk(log_dir)):
        events = sorted(
            path
            for path in (os.path.join(folder, n) for n in files if ".tfevents." in n)
            if os.path.abspath(path) not in skip
        )
        if events:
            found.append((folder, events))
    return found


def _add_points(
    record: bytes,
    points: dict[str, dict[int, float]],
    notes: dict[int, str],
    walls: dict[int, float] | None = None,
    wait_notes: dict[int, str] | None = None,
    ledgers: dict[int, str] | None = None,
) -> int | None:
    """Add the throughput scalars of one event record; returns its step when it held one."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.util import tensor_util

    event = event_pb2.Event.FromString(record)
    texts = {COUNTS: notes, INPUT_WAIT_NOTE: wait_notes, GOODPUT_LEDGER: ledgers}
    added = None
    for value in event.summary.value:
        if value.tag in texts and value.HasField("tensor") and value.tensor.string_val:
            found = texts[value.tag]
            if found is not None:
                found[int(event.step)] = value.tensor.string_val[0].decode("utf-8", "replace")
            continue
        if value.tag not in _TAGS:
            continue
        if value.HasField("tensor"):
            number = float(tensor_util.make_ndarray(value.tensor))
        elif value.HasField("simple_value"):
            number = float(value.simple_value)
        else:
            continue
        points.setdefault(value.tag, {})[int(event.step)] = number  # within a fit, the last wins
        if walls is not None:
            walls[int(event.step)] = float(event.wall_time)
        added = int(event.step)
    return added


def _read_records(path: str) -> tuple[list[bytes], str]:
    """The records of one event file up to the first damaged one, and what was wrong."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    with open(path, "rb") as file:
        data = file.read()
    records: list[bytes] = []
    offset = 0
    while offset < len(data):
        header = data[offset : offset + 12]
        partial = f"ends in a partial record after {len(records)} records (still being written?)"
        if len(header) < 12:
            return records, partial
        (length,) = struct.unpack("<Q", header[:8])
        (length_crc,) = struct.unpack("<I", header[8:])
        where = f"record {len(records) + 1} at byte {offset}"
        if masked_crc32c(header[:8]) != length_crc:
            return records, f"corrupt: {where} fails its length checksum"
        body = data[offset + 12 : offset + 16 + length]
        if len(body) < length + 4:
            return records, partial
        (data_crc,) = struct.unpack("<I", body[length:])
        if masked_crc32c(body[:length]) != data_crc:
            return records, f"corrupt: {where} fails its data checksum"
        records.append(body[:length])
        offset += 16 + length
    return records, ""


def event_file_problems(log_dir: str) -> list[str]:
    """What is wrong with the event files under ``log_dir``, one line per damaged file.

    Every record of a TensorBoard event file carries a CRC of its length and of its data;
    a file whose record fails a check is corrupt (TensorBoard's reader silently stops at
    it, so its later points are lost). A file that ends inside its last record is noted as
    such: a job may still be writing it.

    Args:
        log_dir: the directory given to ``ThroughputLogger``.

    Returns:
        ``"PATH: corrupt: ..."`` or ``"PATH: ends in a partial record ..."`` lines, empty when
        every file reads to its end.
    """
    problems = []
    for _, files in _event_files(log_dir):
        for path in files:
            _, problem = _read_records(path)
            if problem:
                problems.append(f"{path}: {problem}")
    return problems
