"""``tfdp-utils report LOGDIR``: throughput figures from the event files a ThroughputLogger wrote.

Reads the runs under ``LOGDIR`` through TensorBoard's own event reader and prints a table
(median / min / max examples/s per run, replica skew, workers), or JSON with ``--json``;
``--plot PATH`` also draws examples/s per run over steps into a PNG (needs matplotlib:
``pip install 'tfdp-utils[report]'``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from tfdp_utils.throughput_tags import (
    EXAMPLES,
    EXAMPLES_PER_SEC,
    GLOBAL_RUN,
    MEMORY_PEAK_BYTES,
    STEPS_PER_SEC,
    WORKER_SKEW,
    RunKind,
    parse_run,
    replica_run,
)

_TAGS = (EXAMPLES_PER_SEC, STEPS_PER_SEC, EXAMPLES, WORKER_SKEW, MEMORY_PEAK_BYTES)


@dataclasses.dataclass(frozen=True)
class RunSeries:
    """The throughput series of one TensorBoard run, as ``(step, value)`` pairs per tag."""

    name: str
    series: dict[str, list[tuple[int, float]]]

    def values(self, tag: str) -> list[float]:
        """The values of ``tag``, in step order (empty when the run has no such tag)."""
        return [value for _, value in self.series.get(tag, [])]


def read_runs(log_dir: str) -> dict[str, RunSeries]:
    """Read every run under ``log_dir`` that holds throughput or memory scalars.

    Args:
        log_dir: the directory given to ``ThroughputLogger`` (runs are its subdirectories,
            found recursively as TensorBoard finds them).

    Returns:
        Runs by name (``global``, ``replica_0``, ...), in name order.

    Raises:
        FileNotFoundError: when ``log_dir`` does not exist.
    """
    from tensorboard.backend.event_processing import event_multiplexer
    from tensorboard.util import tensor_util

    if not os.path.isdir(log_dir):
        raise FileNotFoundError(
            f"LOGDIR {log_dir!r} is not a directory; pass the log_dir given to ThroughputLogger."
        )
    # The default size guidance keeps only 10 tensor events per tag: keep them all.
    multiplexer = event_multiplexer.EventMultiplexer(size_guidance={"tensors": 0})
    multiplexer.AddRunsFromDirectory(log_dir)
    multiplexer.Reload()
    runs: dict[str, RunSeries] = {}
    for name, tags in sorted(multiplexer.Runs().items()):
        present = [t for t in _TAGS if t in tags.get("tensors", [])]
        if not present:
            continue
        series: dict[str, list[tuple[int, float]]] = {}
        for tag in present:
            events = multiplexer.Tensors(name, tag)
            points = {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in events}
            series[tag] = sorted(points.items())
        display = name.replace(os.sep, "/")
        runs[display] = RunSeries(display, series)
    return runs


def _stats(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def summarize(runs: dict[str, RunSeries]) -> dict[str, Any]:
    """Figures per run and across replicas and workers, as a JSON-ready dict.

    Args:
        runs: from :func:`read_runs`.

    Returns:
        ``{"runs": {name: {...}}, "replica_skew": ..., "workers": {...}}``. Per run:
        ``windows``, ``examples_per_sec`` and ``steps_per_sec`` (median / min / max over
        windows), ``examples`` (the last cumulative count), ``last_step``. ``replica_skew``
        is ``(max - min) / max`` of the replicas' median examples/s (None with fewer than
        two replicas). ``workers`` gives each worker's median steps/s and the median of the
        chief's logged worker skew.
    """
    per_run: dict[str, Any] = {}
    for name, run in runs.items():
        examples = run.series.get(EXAMPLES, [])
        rates = run.series.get(EXAMPLES_PER_SEC, [])
        entry: dict[str, Any] = {
            "windows": len(rates),
            "examples_per_sec": _stats(run.values(EXAMPLES_PER_SEC)),
            "steps_per_sec": _stats(run.values(STEPS_PER_SEC)),
            "examples": int(examples[-1][1]) if examples else None,
            "last_step": max((s for s, _ in examples + rates), default=None),
        }
        peak = run.values(MEMORY_PEAK_BYTES)
        if peak:
            entry["peak_memory_bytes"] = int(max(peak))
        per_run[name] = entry

    def kind(name: str) -> RunKind | None:
        parsed = parse_run(name)
        return None if parsed is None else parsed[0]

    replica_medians = [
        e["examples_per_sec"]["median"]
        for n, e in per_run.items()
        if kind(n) == "replica" and e["examples_per_sec"]
    ]
    replica_skew = None
    if len(replica_medians) >= 2 and max(replica_medians) > 0:
        replica_skew = (max(replica_medians) - min(replica_medians)) / max(replica_medians)
    workers = {
        n: e["steps_per_sec"]["median"]
        for n, e in per_run.items()
        if kind(n) == "worker" and e["steps_per_sec"]
    }
    skews = [v for run in runs.values() for v in run.values(WORKER_SKEW)]
    return {
        "runs": per_run,
        "replica_skew": replica_skew,
        "workers": {
            "count": len(workers),
            "median_steps_per_sec": workers,
            "median_skew": statistics.median(skews) if skews else None,
        },
    }


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if value >= 100 else f"{value:.3g}"


def format_table(summary: dict[str, Any]) -> str:
    """The plain-text table ``tfdp-utils report`` prints."""
    header = ("run", "windows", "median ex/s", "min ex/s", "max ex/s", "steps/s", "examples")
    rows = [header]
    for name, entry in summary["runs"].items():
        rates = entry["examples_per_sec"] or {}
        steps = entry["steps_per_sec"] or {}
        rows.append(
            (
                name,
                str(entry["windows"]),
                _fmt(rates.get("median")),
                _fmt(rates.get("min")),
                _fmt(rates.get("max")),
                _fmt(steps.get("median")),
                "-" if entry["examples"] is None else f"{entry['examples']:,}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    skew = summary["replica_skew"]
    lines.append("")
    lines.append(
        "replica skew (max-min)/max of median examples/s: "
        + ("-" if skew is None else f"{skew:.1%}")
    )
    workers = summary["workers"]
    if workers["count"]:
        rates = ", ".join(f"{n} {_fmt(v)}" for n, v in workers["median_steps_per_sec"].items())
        skew_text = "-" if workers["median_skew"] is None else f"{workers['median_skew']:.1%}"
        lines.append(f"workers: {workers['count']} ({rates} steps/s); median skew {skew_text}")
    else:
        lines.append("workers: 1")
    return "\n".join(lines)


def plot(runs: dict[str, RunSeries], path: str) -> None:
    """Draw examples/s per run over steps into the PNG file ``path``.

    Raises:
        ImportError: when matplotlib is not installed (``pip install 'tfdp-utils[report]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(
            "tfdp-utils report --plot needs matplotlib; install it with "
            "pip install 'tfdp-utils[report]'."
        ) from exc
    figure, axes = plt.subplots(figsize=(9, 5))
    try:
        for name, run in runs.items():
            points = run.series.get(EXAMPLES_PER_SEC, [])
            if points:
                steps, values = zip(*points, strict=True)
                axes.plot(steps, values, label=name, marker="." if len(points) < 50 else None)
        axes.set_xlabel("optimizer step")
        axes.set_ylabel("examples / second")
        axes.set_title("Throughput per run")
        axes.grid(True, alpha=0.3)
        axes.legend(loc="best", fontsize="small")
        figure.tight_layout()
        figure.savefig(path, dpi=100)
    finally:
        plt.close(figure)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``LOGDIR``, ``--plot`` and ``--json`` to ``parser`` (for ``tfdp-utils report``)."""
    parser.add_argument("logdir", metavar="LOGDIR", help="the log_dir given to ThroughputLogger")
    parser.add_argument("--plot", metavar="PATH", help="also write examples/s per run as a PNG")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    """Carry out ``tfdp-utils report`` for parsed ``args``; returns the exit status."""
    try:
        runs = read_runs(args.logdir)
    except FileNotFoundError as exc:
        print(f"tfdp-utils report: {exc}", file=sys.stderr)
        return 2
    if not runs:
        print(
            f"tfdp-utils report: no throughput runs under {args.logdir!r}; expected the "
            f"log_dir of a ThroughputLogger (runs such as {GLOBAL_RUN!r} and "
            f"{replica_run(0)!r}).",
            file=sys.stderr,
        )
        return 1
    summary = summarize(runs)
    if args.plot:
        try:
            plot(runs, args.plot)
        except ImportError as exc:
            print(f"tfdp-utils report: {exc}", file=sys.stderr)
            return 2
        summary["plot"] = args.plot
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print(format_table(summary))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``tfdp-utils report LOGDIR [--plot PATH] [--json]`` as a function.

    Args:
        argv: the arguments after ``report``. Defaults to `None` (``sys.argv[1:]``).

    Returns:
        0 on success, 1 when no throughput runs were found, 2 for a missing ``LOGDIR`` or a
        missing plotting extra.

    Examples:
    >>> main(["logs", "--json"])  # doctest: +SKIP
    """
    parser = argparse.ArgumentParser(
        prog="tfdp-utils report",
        description="Throughput figures from the event files a ThroughputLogger wrote.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


__all__ = [
    "RunSeries",
    "add_arguments",
    "format_table",
    "main",
    "plot",
    "read_runs",
    "run",
    "summarize",
]
