"""TensorBoard event files for the throughput runs: one writer per run, scalars and a layout.

Writes the same tensor events ``tf.summary.scalar`` writes (a float32 scalar with the scalars
plugin's metadata) through TensorBoard's own ``EventFileWriter``: a few microseconds each,
flushed on the writer's own thread, no TensorFlow ops built. Names and descriptions come from
:mod:`tfdp_utils.throughput._tags`; this module only encodes them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

from tensorboard.compat.proto import (
    event_pb2,
    summary_pb2,
    tensor_pb2,
    tensor_shape_pb2,
    types_pb2,
)
from tensorboard.plugins.scalar import summary_v2 as scalar_summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from tfdp_utils._tf import tf
from tfdp_utils.throughput._tags import Category


class RunWriters:
    """The open event writers of the runs under ``log_dir``, by run name.

    Args:
        log_dir: directory holding one subdirectory per run (local path or any
            ``tf.io.gfile`` URL).
    """

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self._writers: dict[str, Any] = {}
        # Scalar metadata by (tag, description), built once and reused across fits.
        self._metadata: dict[tuple[str, str], Any] = {}

    def open(self, runs: Iterable[str]) -> None:
        """Create each run's directory, check it is writable, and open its event file.

        Raises:
            OSError: a run directory cannot be created or written.
        """
        for run in runs:
            path = os.path.join(self.log_dir, run)
            probe = os.path.join(path, f".tfdp_write_check.{os.getpid()}")
            try:
                tf.io.gfile.makedirs(path)
                with tf.io.gfile.GFile(probe, "w") as handle:
                    handle.write("")
                tf.io.gfile.remove(probe)
            except (OSError, tf.errors.OpError) as exc:
                raise OSError(
                    f"ThroughputLogger cannot write its TensorBoard run to {path!r} "
                    f"(log_dir={self.log_dir!r}): {getattr(exc, 'message', exc)}. Pass a "
                    "log_dir this process can create and write."
                ) from exc
            self._writers[run] = EventFileWriter(path)

    def scalar(self, run: str, tag: str, value: float, step: int, description: str) -> None:
        """Write ``value`` under ``tag`` at ``step`` into ``run`` (nothing when it is not open)."""
        writer = self._writers.get(run)
        if writer is None:
            return
        key = (tag, description)
        metadata = self._metadata.get(key)
        if metadata is None:
            metadata = scalar_summary.scalar_pb(tag, 0.0, description=description).value[0].metadata
            self._metadata[key] = metadata
        tensor = tensor_pb2.TensorProto(
            dtype=types_pb2.DT_FLOAT,
            tensor_shape=tensor_shape_pb2.TensorShapeProto(),
            float_val=[float(value)],
        )
        value_pb = summary_pb2.Summary.Value(tag=tag, metadata=metadata, tensor=tensor)
        summary = summary_pb2.Summary(value=[value_pb])
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def text(self, run: str, tag: str, text: str, step: int, description: str) -> None:
        """Write ``text`` under ``tag`` at ``step`` into ``run`` as the text plugin's summary."""
        writer = self._writers.get(run)
        if writer is None:
            return
        from tensorboard.plugins.text import summary_v2 as text_summary

        summary = text_summary.text_pb(tag, text, description=description)
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def layout(self, run: str, categories: Sequence[Category]) -> None:
        """Write the custom-scalars dashboard ``categories`` into ``run`` (which must be open)."""
        from tensorboard.plugins.custom_scalar import layout_pb2
        from tensorboard.plugins.custom_scalar import summary as custom_scalar_summary

        layout = layout_pb2.Layout(
            category=[
                layout_pb2.Category(
                    title=category.title,
                    chart=[
                        layout_pb2.Chart(
                            title=chart.title,
                            multiline=layout_pb2.MultilineChartContent(
                                tag=list(chart.tag_patterns)
                            ),
                        )
                        for chart in category.charts
                    ],
                    closed=category.closed,
                )
                for category in categories
            ]
        )
        # The plugin builds TensorFlow's Summary proto; the event writer takes TensorBoard's.
        summary = summary_pb2.Summary.FromString(
            custom_scalar_summary.pb(layout).SerializeToString()
        )
        self._writers[run].add_event(
            event_pb2.Event(wall_time=time.time(), step=0, summary=summary)
        )

    def flush(self) -> None:
        """Flush every open writer."""
        for writer in self._writers.values():
            writer.flush()

    def close(self) -> None:
        """Flush and close every open writer; the metadata cache is kept."""
        for writer in self._writers.values():
            writer.flush()
            writer.close()
        self._writers = {}
