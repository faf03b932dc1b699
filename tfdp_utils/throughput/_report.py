"""``tfdp-utils report LOGDIR``: throughput figures from the event files a ThroughputLogger wrote.

Reads the runs under ``LOGDIR`` (every record, checksums checked) and prints a table (median /
min / max examples/s per run, replica skew, workers), or JSON with ``--json``; ``--plot PATH``
also draws examples/s per run over steps (and the job's goodput) into a PNG (needs matplotlib:
``pip install 'tfdp-utils[report]'``). Event files whose records fail their checksums are
reported as corrupt (exit status 1). Runs cut short (an event file that ends inside a record, or
runs of one job that end at different steps or disagree on the examples trained), derived counts
and steps that go back (a fit that resumed behind a step an earlier fit logged: a job killed
without notice and resumed from an older checkpoint) are marked in the table, the JSON and the
plot. ``--csv PATH`` and ``--windows-json PATH`` write every logged point
(:mod:`tfdp_utils.throughput._export`). Reading needs no TensorFlow import.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tfdp_utils.throughput import _export
from tfdp_utils.throughput._events import RunSeries, event_file_problems, read_runs
from tfdp_utils.throughput._plot import plot, plot_path_problem
from tfdp_utils.throughput._summary import summarize
from tfdp_utils.throughput._tags import (
    GLOBAL_RUN,
    replica_run,
)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if value >= 100 else f"{value:.3g}"


_HEADER = (
    "run",
    "windows",
    "median ex/s",
    "min ex/s",
    "max ex/s",
    "steps/s",
    "examples",
    "input wait",
    "note",
)


def _run_row(name: str, entry: dict[str, Any]) -> tuple[str, ...]:
    """One run's cells, in the order of the header."""
    rates = entry["examples_per_sec"] or {}
    steps = entry["steps_per_sec"] or {}
    marks = (
        (["CUT SHORT"] if entry.get("cut_short") else [])
        + (["derived"] if entry.get("counts") == "derived" else [])
        + (["STEPS BACK"] if entry.get("steps_back") else [])
    )
    return (
        name,
        str(entry["windows"]),
        _fmt(rates.get("median")),
        _fmt(rates.get("min")),
        _fmt(rates.get("max")),
        _fmt(steps.get("median")),
        "-" if entry["examples"] is None else f"{entry['examples']:,}",
        "-"
        if not entry.get("input_wait_share")
        else (f"{entry['input_wait_share']['median']:.0%}"),
        ", ".join(marks) or "-",
    )


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """The rows as lines of columns (the first left-aligned, the rest right), a rule under
    the first."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _workers_line(workers: dict[str, Any]) -> str:
    if not workers["median_steps_per_sec"]:
        return "workers: 1"
    rates = ", ".join(f"{n} {_fmt(v)}" for n, v in workers["median_steps_per_sec"].items())
    skew_text = "-" if workers["median_skew"] is None else f"{workers['median_skew']:.1%}"
    return f"workers: {workers['count']} ({rates} steps/s); median skew {skew_text}"


def _notes(summary: dict[str, Any]) -> list[str]:
    """The lines under the table: replica skew, workers, the input verdict, and the runs cut
    short, gone back or counted by derivation."""
    skew = summary["replica_skew"]
    lines = [
        "",
        "replica skew (max-min)/max of median examples/s: "
        + ("-" if skew is None else f"{skew:.1%}"),
        _workers_line(summary["workers"]),
    ]
    input_summary = summary.get("input", {})
    input_verdict = input_summary.get("verdict")
    if input_verdict:
        measured = input_summary.get("measured", True)
        lines.append(f"{input_verdict} (median over windows)" if measured else input_verdict)
    for name, reasons in summary.get("cut_short", {}).items():
        lines.append(f"CUT SHORT {name}: {'; '.join(reasons)}")
    for name, texts in summary.get("steps_back", {}).items():
        lines.append(
            f"STEPS BACK {name}: {'; '.join(texts)} (a restart from an older step; both "
            "fits' points are kept, as TensorBoard shows them)"
        )
    derived = summary.get("derived", {})
    for note in sorted(set(derived.values())):
        names = ", ".join(n for n, v in derived.items() if v == note)
        lines.append(f"derived counts ({names}): {note}")
    return lines + _goodput_lines(summary.get("goodput"))


def _goodput_lines(goodput: dict[str, Any] | None) -> list[str]:
    """The job's goodput and its losses (each with its share of the wall time)."""
    if goodput is None:
        return ["goodput: unknown (no fit in this log dir wrote its ledger)"]
    wall = goodput["wall_seconds"] or 1.0
    fits = goodput["fits"]
    lines = [
        "",
        f"goodput {goodput['goodput']:.1%}: {goodput['productive_seconds']:,.1f} s of "
        f"{goodput['wall_seconds']:,.1f} s trained the model ({fits} run{'s' if fits != 1 else ''}"
        " of the job)",
    ]
    for name, loss in goodput["losses"].items():
        lines.append(
            f"  {name:<20} {loss['seconds']:>10,.1f} s {loss['seconds'] / wall:>6.1%}  "
            f"{loss['kind']}: {loss['note']}"
        )
    lines.extend(f"  note: {note}" for note in goodput["notes"])
    return lines


def format_table(summary: dict[str, Any]) -> str:
    """The plain-text table ``tfdp-utils report`` prints."""
    rows = [_HEADER] + [_run_row(name, entry) for name, entry in summary["runs"].items()]
    return "\n".join(_aligned(rows) + _notes(summary))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``LOGDIR``, ``--plot``, ``--json``, ``--csv`` and ``--windows-json`` to ``parser``."""
    parser.add_argument("logdir", metavar="LOGDIR", help="the log_dir given to ThroughputLogger")
    parser.add_argument(
        "--plot",
        metavar="PATH",
        help="also write examples/s per run and the job's goodput as a PNG",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--csv",
        metavar="PATH",
        help="also write every logged point of every run as CSV ('-' for stdout, instead of "
        "the table)",
    )
    parser.add_argument(
        "--windows-json",
        metavar="PATH",
        help="also write every logged point of every run as a JSON list ('-' for stdout, "
        "instead of the table)",
    )


def _emit(text: str) -> None:
    """Print ``text`` to stdout. A reader that has gone (``report ... | head -1``) raises
    BrokenPipeError here, which the ``tfdp-utils`` command ends quietly, as every command."""
    print(text)
    sys.stdout.flush()


def _refuse(message: str, status: int) -> int:
    """Say ``message`` on stderr; returns the exit status ``status``."""
    print(f"tfdp-utils report: {message}", file=sys.stderr)
    return status


def _read(logdir: str) -> tuple[dict[str, RunSeries], list[str]] | int:
    """The runs under ``logdir`` and its event files' problems (each said on stderr), or the
    exit status when there is nothing to report (2: no ``logdir``; 1: no throughput runs)."""
    try:
        runs = read_runs(logdir)
    except FileNotFoundError as exc:
        return _refuse(f"{exc}", 2)
    problems = event_file_problems(logdir)
    for problem in problems:
        print(f"tfdp-utils report: {problem}", file=sys.stderr)
    if not runs:
        return _refuse(
            f"no throughput runs under {logdir!r}; expected the "
            f"log_dir of a ThroughputLogger (runs such as {GLOBAL_RUN!r} and "
            f"{replica_run(0)!r}).",
            1,
        )
    return runs, problems


def _write_exports(args: argparse.Namespace, runs: dict[str, RunSeries]) -> int | None:
    """Write ``--csv`` and ``--windows-json``; the exit status 2 when one cannot be written."""
    exports = [(args.csv, _export.write_csv), (args.windows_json, _export.write_json)]
    rows = _export.point_rows(runs)
    for target, write in exports:
        if target is None:
            continue
        try:
            write(rows, target)
        except OSError as exc:
            return _refuse(f"cannot write {target!r}: {exc}", 2)
    return None


def _show(summary: dict[str, Any], args: argparse.Namespace) -> None:
    """Print the summary: JSON with ``--json``, else the table (and the plot's path)."""
    if args.json:
        _emit(json.dumps(summary, indent=2, sort_keys=True))
    else:
        text = format_table(summary) + (f"\nplot: {args.plot}" if args.plot else "")
        _emit(text)


def run(args: argparse.Namespace) -> int:
    """Carry out ``tfdp-utils report`` for parsed ``args``; returns the exit status."""
    if args.plot:
        problem = plot_path_problem(args.plot)
        if problem:
            return _refuse(problem, 2)
    read = _read(args.logdir)
    if isinstance(read, int):
        return read
    runs, problems = read
    corrupt = [p for p in problems if ": corrupt" in p]
    summary = summarize(runs)
    if args.plot:
        try:
            plot(runs, args.plot, summary)
        except (ImportError, OSError) as exc:
            return _refuse(f"--plot {args.plot!r}: {exc}", 2)
        summary["plot"] = args.plot
    if problems:
        summary["event_file_problems"] = problems
    status = 1 if corrupt else 0
    failed = _write_exports(args, runs)
    if failed is not None:
        return failed
    if "-" not in (args.csv, args.windows_json):  # an export to stdout replaces the table
        _show(summary, args)
    return status


def main(argv: list[str] | None = None) -> int:
    """``tfdp-utils report LOGDIR [--plot PATH] [--json] [--csv PATH] [--windows-json PATH]``.

    Args:
        argv: the arguments after ``report``. Defaults to `None` (``sys.argv[1:]``).

    Returns:
        0 on success (runs cut short are marked, not failed: a job may still be writing),
        1 when no throughput runs were found or an event file is corrupt, 2 for a missing
        ``LOGDIR``, a ``--plot PATH`` that cannot be written, or a missing plotting extra
        (checked before reading).

    Examples:
    >>> main(["logs", "--json"])  # doctest: +SKIP
    """
    parser = argparse.ArgumentParser(
        prog="tfdp-utils report",
        description="Throughput figures from the event files a ThroughputLogger wrote.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
