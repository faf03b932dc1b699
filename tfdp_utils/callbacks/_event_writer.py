"""TensorBoard event files for the throughput runs: one writer per run, scalars and a layout.

Writes the same tensor events ``tf.summary.scalar`` writes (a float32 scalar with the scalars
plugin's metadata) into event files named as TensorBoard's ``EventFileWriter`` names them, in
the calling thread through TensorFlow's record writer (a buffered append: a few microseconds,
no TensorFlow ops built, no writer thread to start, wake or join). Each file is flushed at
:meth:`RunWriters.flush` (the logger's epoch ends), at close, and when a write finds the last
flush ``FLUSH_SECONDS`` old, as ``EventFileWriter`` flushes. Names and descriptions come from
:mod:`tfdp_utils.throughput._tags`; this module only encodes them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from tensorboard.compat.proto import (
    event_pb2,
    summary_pb2,
    tensor_pb2,
    tensor_shape_pb2,
    types_pb2,
)
from tensorboard.plugins.scalar import summary_v2 as scalar_summary

from tfdp_utils._tf import tf
from tfdp_utils.throughput._tags import Category

# Summaries built once per process and copied into each event (a new logger per fit reuses
# them too): scalar values without their number by (tag, description), dashboards by their
# categories, texts by content. Never changed once built.
_TEMPLATES: dict[tuple[str, str], Any] = {}
_LAYOUTS: dict[tuple[Category, ...], Any] = {}
_TEXTS: dict[tuple[str, str, str], Any] = {}
_KEPT = 256  # summaries kept per kind (each fit's notes repeat; a goodput ledger never does)
FLUSH_SECONDS = 120.0
"""A write flushes its file when the last flush is this old (``EventFileWriter``'s default)."""
_file_ids = itertools.count()


class EventFile:
    """One event file in ``run_dir``, written in the calling thread.

    Its name is the one TensorBoard's ``EventFileWriter`` gives (``events.out.tfevents.<time>.
    <host>.<pid>.<n>``), and it starts with the same file-version event.

    Raises:
        OSError: the file cannot be created (its message is TensorFlow's).
    """

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(
            run_dir,
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{next(_file_ids)}",
        )
        self._records = tf.io.TFRecordWriter(self.path)
        self._flushed = time.monotonic()
        self.add_event(
            event_pb2.Event(
                wall_time=time.time(),
                file_version="brain.Event:2",
                source_metadata=event_pb2.SourceMetadata(writer="tfdp_utils"),
            )
        )
        self.flush()

    def add_event(self, event: Any) -> None:
        """Append ``event``; flush when the last flush is ``FLUSH_SECONDS`` old."""
        self._records.write(event.SerializeToString())
        if time.monotonic() - self._flushed >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Hand what was written to the file system."""
        self._records.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        """Flush and close the file."""
        self._records.close()


class RunWriters:
    """The open event writers of the runs under ``log_dir``, by run name.

    Args:
        log_dir: directory holding one subdirectory per run (local path or any
            ``tf.io.gfile`` URL).
        owner: the callback that writes, as errors name it. Defaults to `"ThroughputLogger"`.
    """

    def __init__(self, log_dir: str, *, owner: str = "ThroughputLogger") -> None:
        self.log_dir = log_dir
        self.owner = owner
        self._writers: dict[str, EventFile] = {}
        self._pending: dict[tuple[str, int], Any] | None = None  # inside batch()
        self._files: dict[str, tuple[str, ...]] = {}  # by run: the files of its open writer

    def open(self, runs: Iterable[str]) -> None:
        """Create each run's directory, check it is writable, and open its event file.

        Raises:
            OSError: a run directory cannot be created or written.
        """
        for run in runs:
            path = os.path.join(self.log_dir, run)
            try:
                tf.io.gfile.makedirs(path)
                writer = EventFile(path)
            except (OSError, tf.errors.OpError) as exc:
                raise OSError(
                    f"{self.owner} cannot write its TensorBoard run to {path!r} "
                    f"(log_dir={self.log_dir!r}): {getattr(exc, 'message', exc)}. Pass a "
                    "log_dir this process can create and write."
                ) from exc
            self._writers[run] = writer
            if _local(path):
                self._files[run] = (writer.path,)

    def files(self, run: str) -> tuple[str, ...]:
        """The event files the open writer of ``run`` created (local directories only)."""
        return self._files.get(run, ())

    def scalar(self, run: str, tag: str, value: float, step: int, description: str) -> None:
        """Write ``value`` under ``tag`` at ``step`` into ``run`` (nothing when it is not open).

        Inside :meth:`batch` the scalar joins the one event of its run and step.
        """
        writer = self._writers.get(run)
        if writer is None:
            return
        template = _TEMPLATES.get((tag, description))
        if template is None:
            template = self._template(tag, description)
        pending = self._pending
        event = None if pending is None else pending.get((run, step))
        if event is None:
            event = event_pb2.Event(wall_time=time.time(), step=int(step))
            if pending is not None:
                pending[(run, step)] = event
        value_pb = event.summary.value.add()
        value_pb.CopyFrom(template)
        value_pb.tensor.float_val.append(float(value))
        if pending is None:
            writer.add_event(event)

    @staticmethod
    def _template(tag: str, description: str) -> Any:
        """The summary value of ``tag`` without its number: the scalars plugin's metadata and
        an empty float32 scalar, built once and copied into every event."""
        metadata = scalar_summary.scalar_pb(tag, 0.0, description=description).value[0].metadata
        template = summary_pb2.Summary.Value(
            tag=tag,
            metadata=metadata,
            tensor=tensor_pb2.TensorProto(
                dtype=types_pb2.DT_FLOAT, tensor_shape=tensor_shape_pb2.TensorShapeProto()
            ),
        )
        if len(_TEMPLATES) < _KEPT:
            _TEMPLATES[(tag, description)] = template
        return template

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Gather the scalars written inside into one event per run and step, each handed to
        its writer once at the end (a log point's scalars: one queued write per run, not one
        per scalar). Nested batches join the outer one."""
        if self._pending is not None:
            yield
            return
        self._pending = {}
        try:
            yield
        finally:
            pending, self._pending = self._pending, None
            for (run, _), event in pending.items():
                writer = self._writers.get(run)
                if writer is not None:
                    writer.add_event(event)

    def text(self, run: str, tag: str, text: str, step: int, description: str) -> None:
        """Write ``text`` under ``tag`` at ``step`` into ``run`` as the text plugin's summary."""
        writer = self._writers.get(run)
        if writer is None:
            return
        key = (tag, text, description)
        summary = _TEXTS.get(key)
        if summary is None:
            from tensorboard.plugins.text import summary_v2 as text_summary

            summary = text_summary.text_pb(tag, text, description=description)
            if len(_TEXTS) < _KEPT:
                _TEXTS[key] = summary
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def layout(self, run: str, categories: Sequence[Category]) -> None:
        """Write the custom-scalars dashboard ``categories`` into ``run`` (which must be open)."""
        key = tuple(categories)
        summary = _LAYOUTS.get(key)
        if summary is None:
            summary = _layout_summary(key)
            if len(_LAYOUTS) < _KEPT:
                _LAYOUTS[key] = summary
        self._writers[run].add_event(
            event_pb2.Event(wall_time=time.time(), step=0, summary=summary)
        )

    def flush(self) -> None:
        """Flush every open writer."""
        for writer in self._writers.values():
            writer.flush()

    def close(self) -> None:
        """Flush and close every open writer (the summaries built stay for the next fit)."""
        for writer in self._writers.values():
            writer.close()
        self._writers = {}
        self._files = {}


def _local(path: str) -> bool:
    return "://" not in path


def _layout_summary(categories: Sequence[Category]) -> Any:
    """The custom-scalars plugin's summary of the dashboard ``categories``."""
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.custom_scalar import summary as custom_scalar_summary

    layout = layout_pb2.Layout(
        category=[
            layout_pb2.Category(
                title=category.title,
                chart=[
                    layout_pb2.Chart(
                        title=chart.title,
                        multiline=layout_pb2.MultilineChartContent(tag=list(chart.tag_patterns)),
                    )
                    for chart in category.charts
                ],
                closed=category.closed,
            )
            for category in categories
        ]
    )
    # The plugin builds TensorFlow's Summary proto; the event writer takes TensorBoard's.
    return summary_pb2.Summary.FromString(custom_scalar_summary.pb(layout).SerializeToString())
