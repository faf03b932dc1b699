"""``tfdp-utils report --csv`` / ``--windows-json``: every logged point, for tools without a
TensorBoard reader.

One row per (run, step) at which a ThroughputLogger wrote a throughput or memory scalar:
``run`` (``global``, ``replica_<k>``, ``worker_<w>``), ``step``, ``wall_time`` (seconds since
the epoch, as written in the event file), then one column per tag of
:data:`COLUMNS`, empty (CSV) or null (JSON) where the run has no value at that step.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from typing import TYPE_CHECKING, Any

from tfdp_utils.throughput._tags import (
    EXAMPLES,
    EXAMPLES_PER_SEC,
    MEMORY_PEAK_BYTES,
    STEPS_PER_SEC,
    WORKER_SKEW,
)

if TYPE_CHECKING:
    from tfdp_utils.throughput._events import RunSeries

# Column name -> the tag it holds; the names drop the ``throughput/`` / ``memory/`` prefix.
COLUMNS = {
    "examples_per_sec": EXAMPLES_PER_SEC,
    "steps_per_sec": STEPS_PER_SEC,
    "examples": EXAMPLES,
    "worker_skew": WORKER_SKEW,
    "memory_peak_bytes": MEMORY_PEAK_BYTES,
}
FIELDS = ("run", "step", "wall_time", *COLUMNS)


def point_rows(runs: dict[str, RunSeries]) -> list[dict[str, Any]]:
    """Every logged point of ``runs``, by run name then step."""
    rows = []
    for name, run in runs.items():
        by_tag = {column: dict(run.series.get(tag, [])) for column, tag in COLUMNS.items()}
        steps = sorted({step for values in by_tag.values() for step in values})
        for step in steps:
            row: dict[str, Any] = {"run": name, "step": step, "wall_time": run.wall_times.get(step)}
            row.update({column: values.get(step) for column, values in by_tag.items()})
            rows.append(row)
    return rows


def _write(text: str, target: str) -> None:
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with open(target, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def write_csv(rows: list[dict[str, Any]], target: str) -> None:
    """Write ``rows`` as CSV with a header to the file ``target``, or stdout for ``-``."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {
                k: ("" if v is None else repr(v) if isinstance(v, float) else v)
                for k, v in row.items()
            }
        )
    _write(out.getvalue(), target)


def write_json(rows: list[dict[str, Any]], target: str) -> None:
    """Write ``rows`` as one JSON list to the file ``target``, or stdout for ``-``."""
    _write(json.dumps(rows, indent=1) + "\n", target)
