"""``tfdp-utils report LOGDIR``: throughput figures from the event files a ThroughputLogger wrote.

Reads the runs under ``LOGDIR`` (every record, checksums checked) and prints a table
(median / min / max examples/s per run, replica skew, workers), or JSON with ``--json``;
``--plot PATH`` also draws examples/s per run over steps into a PNG (needs matplotlib:
``pip install 'tfdp-utils[report]'``). Event files whose records fail their checksums are
reported as corrupt (exit status 1). Runs cut short (an event file that ends inside a record,
or runs of one job that end at different steps or disagree on the examples trained), derived
counts and steps that go back (a fit that resumed behind a step an earlier fit logged: a job
killed without notice and resumed from an older checkpoint) are marked in the table, the JSON
and the plot. ``--csv PATH`` and
``--windows-json PATH`` write every logged point (:mod:`tfdp_utils.throughput._export`). Reading
needs no TensorFlow import.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from tfdp_utils.throughput import _export
from tfdp_utils.throughput._events import RunSeries, event_file_problems, read_runs
from tfdp_utils.throughput._input_wait import straggler, verdict
from tfdp_utils.throughput._restarts import steps_back
from tfdp_utils.throughput._tags import (
    EXAMPLES,
    EXAMPLES_PER_SEC,
    GLOBAL_RUN,
    INPUT_WAIT_SHARE,
    MEMORY_PEAK_BYTES,
    STEPS_PER_SEC,
    WORKER_SKEW,
    RunKind,
    parse_counts_note,
    parse_run,
    replica_run,
)


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
        ``{"runs": {name: {...}}, "replica_skew": ..., "workers": {...}, "complete": ...,
        "cut_short": {...}, "exact": ..., "derived": {...}, "input": {...}}``. Per run:
        ``windows``,
        ``examples_per_sec`` and ``steps_per_sec`` (median / min / max over windows),
        ``examples`` (the last cumulative count), ``last_step``, ``counts`` ("exact",
        "derived", or None for logs without the note) and ``counts_note``, and ``cut_short``
        (why the run looks cut short: its event file ends inside a record, it ends before the
        other runs of its job, or its count disagrees with its replicas'; empty when not).
        ``complete`` is False when any run is cut short; ``exact`` False when any run's counts
        are derived (None when no run says). ``replica_skew``
        is ``(max - min) / max`` of the replicas' median examples/s (None with fewer than
        two replicas). ``workers`` gives the number of workers (1 when the job wrote no
        ``worker_<w>`` runs), each worker's median steps/s and the median of the chief's
        logged worker skew. ``steps_back`` (per run, and for the job by run name: said once,
        in the global run) lists each fit that resumed behind a step an earlier fit of the run
        logged (``fit``, ``resumed_at``, ``reached``, ``reached_by`` and the ``text``: the
        steps between were trained twice), e.g. a job killed without notice and resumed from
        an older checkpoint; the series keep both fits' points, as TensorBoard shows them.
        ``input`` gives the ``verdict`` line, the ``straggler``,
        ``measured`` (whether any input-wait share was logged) and ``note`` (when none was,
        why: the logger's ``input/wait_note``, e.g. op determinism; else None).
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
            "input_wait_share": _stats(run.values(INPUT_WAIT_SHARE)),
        }
        peak = run.values(MEMORY_PEAK_BYTES)
        if peak:
            entry["peak_memory_bytes"] = int(max(peak))
        entry.update(_counts_entry(run))
        entry["cut_short"] = [f"event file {p}" for p in run.problems]
        entry["steps_back"] = _steps_back_entries(run)
        per_run[name] = entry
    for name, reasons in _inconsistencies(runs).items():
        per_run[name]["cut_short"].extend(reasons)

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
    waits = _input_waits(per_run)
    named = straggler(waits)
    wait_note = None if waits else _input_wait_note(runs)
    cut_short = {n: e["cut_short"] for n, e in per_run.items() if e["cut_short"]}
    derived = {n: e["counts_note"] for n, e in per_run.items() if e["counts"] == "derived"}
    went_back = _steps_back_by_job(per_run)
    return {
        "runs": per_run,
        "replica_skew": replica_skew,
        # A job without worker_<w> runs is one worker (the logger writes them only for more).
        "workers": {
            "count": max(1, len(workers)),
            "median_steps_per_sec": workers,
            "median_skew": statistics.median(skews) if skews else None,
            "median_input_wait_share": {f"worker_{w}": s for w, s in waits.items()},
        },
        "input": {
            "verdict": verdict(waits) if waits else _unknown_verdict(wait_note),
            "straggler": None if named is None else dataclasses.asdict(named),
            "measured": bool(waits),
            "note": wait_note,
        },
        "complete": not cut_short,
        "cut_short": cut_short,
        "exact": None if not derived and not _any_note(per_run) else not derived,
        "derived": derived,
        "steps_back": went_back,
    }


def _input_waits(per_run: dict[str, Any]) -> dict[int, float]:
    """Each worker's median input-wait share: from its ``worker_<w>`` run, or the global run's
    for a job of one worker (keyed by worker index)."""
    found: dict[int, float] = {}
    for name, entry in per_run.items():
        parsed, share = parse_run(name), entry["input_wait_share"]
        if parsed is not None and parsed[0] == "worker" and share and parsed[1] is not None:
            found[parsed[1]] = share["median"]
    if not found:
        for name, entry in per_run.items():
            if parse_run(name) == ("global", None) and entry["input_wait_share"]:
                found[0] = entry["input_wait_share"]["median"]
    return found


def _steps_back_entries(run: RunSeries) -> list[dict[str, Any]]:
    """The fits of a run that resumed behind an earlier fit's steps, as JSON-ready dicts.

    Only for runs that log the count (global and replica runs): each fit's first point there is
    the count at the step it starts from. A worker run's first point is its first window.
    """
    if not run.series.get(EXAMPLES):
        return []
    return [{**dataclasses.asdict(back), "text": back.describe()} for back in steps_back(run.fits)]


def _steps_back_by_job(per_run: dict[str, Any]) -> dict[str, list[str]]:
    """Each job's steps that went back, said once: in its global run, or, for a job without
    one, in each run that shows them."""
    jobs: dict[str, dict[str, list[str]]] = {}
    for name, entry in per_run.items():
        if entry["steps_back"]:
            folder = name.rsplit("/", 1)[0] if "/" in name else ""
            jobs.setdefault(folder, {})[name] = [back["text"] for back in entry["steps_back"]]
    found: dict[str, list[str]] = {}
    for members in jobs.values():
        totals = [n for n in members if parse_run(n) == ("global", None)]
        for name in totals or list(members):
            found[name] = members[name]
    return found


def _input_wait_note(runs: dict[str, RunSeries]) -> str | None:
    """Why the job's input-wait share is unknown, as its logger noted it (the global run's
    latest note first), or None when no run says."""
    ordered = sorted(runs.values(), key=lambda r: parse_run(r.name) != ("global", None))
    for run in ordered:
        if run.input_wait_notes:
            return run.input_wait_notes[-1][1]
    return None


def _unknown_verdict(note: str | None) -> str | None:
    return None if note is None else verdict({}, unknown=note)


def _counts_entry(run: RunSeries) -> dict[str, Any]:
    """``counts`` ("exact", "derived" or None when the run says nothing) and its note."""
    for _, note in reversed(run.notes):
        parsed = parse_counts_note(note)
        if parsed is not None:
            exact, text = parsed
            return {"counts": "exact" if exact else "derived", "counts_note": text}
    return {"counts": None, "counts_note": None}


def _any_note(per_run: dict[str, Any]) -> bool:
    return any(entry["counts"] is not None for entry in per_run.values())


def _inconsistencies(runs: dict[str, RunSeries]) -> dict[str, list[str]]:
    """Runs of one job (one folder) that end early or disagree on the examples trained.

    The logger ends every fit with a count at its final step in the global run and in every
    replica run, and the replicas' counts add up to the global one, so a run that ends at an
    earlier step than its siblings, or a global count that is not the sum of the replicas'
    at the same step, was cut short (or the folder mixes two jobs).
    """
    jobs: dict[str, dict[str, RunSeries]] = {}
    for name, run in runs.items():
        parsed = parse_run(name)
        if parsed is None or parsed[0] == "worker" or not run.series.get(EXAMPLES):
            continue
        folder = name.rsplit("/", 1)[0] if "/" in name else ""
        jobs.setdefault(folder, {})[name] = run
    found: dict[str, list[str]] = {}
    for members in jobs.values():
        if len(members) < 2:
            continue
        last = {n: r.series[EXAMPLES][-1][0] for n, r in members.items()}
        end = max(last.values())
        reach = ", ".join(f"{n} {s}" for n, s in last.items() if s == end)
        for name, step in last.items():
            if step < end:
                found.setdefault(name, []).append(
                    f"ends at step {step} while other runs of the job reach step {end} ({reach})"
                )
        totals = [n for n in members if parse_run(n) == ("global", None)]
        replicas = [n for n in members if (parse_run(n) or ("", None))[0] == "replica"]
        if not totals or not replicas:
            continue
        counts = {n: dict(r.series[EXAMPLES]) for n, r in members.items()}
        common = set.intersection(*(set(c) for c in counts.values()))
        if not common:
            continue
        step = max(common)
        total = counts[totals[0]][step]
        replica_sum = sum(counts[n][step] for n in replicas)
        if total != replica_sum:
            found.setdefault(totals[0], []).append(
                f"counts {total:,.0f} examples at step {step} but its replica runs add up to "
                f"{replica_sum:,.0f} (runs of different jobs mixed, or files cut short)"
            )
    return found


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if value >= 100 else f"{value:.3g}"


def format_table(summary: dict[str, Any]) -> str:
    """The plain-text table ``tfdp-utils report`` prints."""
    header = (
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
    rows = [header]
    for name, entry in summary["runs"].items():
        rates = entry["examples_per_sec"] or {}
        steps = entry["steps_per_sec"] or {}
        marks = (
            (["CUT SHORT"] if entry.get("cut_short") else [])
            + (["derived"] if entry.get("counts") == "derived" else [])
            + (["STEPS BACK"] if entry.get("steps_back") else [])
        )
        rows.append(
            (
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
    if workers["median_steps_per_sec"]:
        rates = ", ".join(f"{n} {_fmt(v)}" for n, v in workers["median_steps_per_sec"].items())
        skew_text = "-" if workers["median_skew"] is None else f"{workers['median_skew']:.1%}"
        lines.append(f"workers: {workers['count']} ({rates} steps/s); median skew {skew_text}")
    else:
        lines.append("workers: 1")
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
    return "\n".join(lines)


def legend_label(name: str, entry: dict[str, Any], last_step: int) -> str:
    """The plot's legend entry for run ``name``: marked when cut short or counts are derived."""
    label = name
    if entry.get("cut_short"):
        label += f" (CUT SHORT at step {last_step})"
    if entry.get("counts") == "derived":
        label += " (derived counts)"
    return label


def plot(runs: dict[str, RunSeries], path: str, summary: dict[str, Any] | None = None) -> None:
    """Draw examples/s per run over steps into the PNG file ``path``.

    Runs cut short and derived counts (from ``summary``, :func:`summarize`'s) are marked in
    the legend and the title.

    Raises:
        ImportError: when matplotlib is not installed (``pip install 'tfdp-utils[report]'``).
    """
    entries = (summary or {}).get("runs", {})
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(
            "tfdp-utils report --plot needs matplotlib; install it with "
            "pip install 'tfdp-utils[report]'."
        ) from exc
    waits = {
        n: r.series[INPUT_WAIT_SHARE] for n, r in runs.items() if r.series.get(INPUT_WAIT_SHARE)
    }
    if waits:
        figure, (axes, wait_axes) = plt.subplots(
            2, 1, figsize=(9, 7.5), sharex=True, height_ratios=(2, 1)
        )
    else:
        figure, axes = plt.subplots(figsize=(9, 5))
    colors: dict[str, str] = {}
    try:
        for name, run in runs.items():
            points = run.series.get(EXAMPLES_PER_SEC, [])
            if points:
                steps, values = zip(*points, strict=True)
                entry = entries.get(name, {})
                style = "--" if entry.get("cut_short") else "-"
                (line,) = axes.plot(
                    steps,
                    values,
                    style,
                    label=legend_label(name, entry, points[-1][0]),
                    marker="." if len(points) < 50 else None,
                )
                colors[name] = line.get_color()
        axes.set_ylabel("examples / second")
        if not waits:
            axes.set_xlabel("optimizer step")
        else:
            verdict_line = (summary or {}).get("input", {}).get("verdict")
            _plot_waits(wait_axes, waits, verdict_line, colors)
        title = "Throughput per run (epoch boundaries left out of every window)"
        if summary and summary.get("cut_short"):
            title += "\nruns cut short: " + ", ".join(summary["cut_short"])
        if summary and summary.get("derived"):
            title += "\nderived counts: " + ", ".join(summary["derived"])
        if summary and summary.get("steps_back"):
            texts = [t for found in summary["steps_back"].values() for t in found]
            title += "\nsteps back: " + "; ".join(texts)
        axes.set_title(title, fontsize="medium")
        axes.grid(True, alpha=0.3)
        axes.legend(loc="best", fontsize="small")
        figure.tight_layout()
        figure.savefig(path, dpi=100, format="png")
    finally:
        plt.close(figure)


def _plot_waits(
    axes: Any,
    waits: dict[str, list[tuple[int, float]]],
    title: str | None,
    colors: dict[str, str],
) -> None:
    """The lower panel: each run's input-wait share per window, in its colour above."""
    for name, points in waits.items():
        steps, values = zip(*points, strict=True)
        axes.plot(
            steps,
            [100 * v for v in values],
            label=name,
            color=colors.get(name),
            marker="." if len(points) < 50 else None,
        )
    axes.set_ylim(0, 100)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("waiting for input (%)")
    axes.set_title(title or "input wait share", fontsize="medium")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="best", fontsize="small")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``LOGDIR``, ``--plot``, ``--json``, ``--csv`` and ``--windows-json`` to ``parser``."""
    parser.add_argument("logdir", metavar="LOGDIR", help="the log_dir given to ThroughputLogger")
    parser.add_argument("--plot", metavar="PATH", help="also write examples/s per run as a PNG")
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


def plot_path_problem(path: str) -> str | None:
    """What is wrong with ``--plot PATH`` before any reading starts, or None."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"--plot {path!r} is a directory; pass a file path ending in .png, e.g. out.png."
    if os.path.splitext(path)[1].lower() != ".png":
        return f"--plot {path!r} does not end in .png; the plot is a PNG: pass e.g. out.png."
    if not os.path.isdir(folder):
        return (
            f"--plot {path!r}: the directory {folder!r} does not exist; create it first or "
            "pass a path in an existing directory."
        )
    if not os.access(folder, os.W_OK):
        return f"--plot {path!r}: the directory {folder!r} is not writable; pass another path."
    if importlib.util.find_spec("matplotlib") is None:
        return (
            "--plot needs matplotlib, which is not installed; install it with "
            "pip install 'tfdp-utils[report]'."
        )
    return None


def _emit(text: str) -> None:
    """Print ``text`` to stdout. A reader that has gone (``report ... | head -1``) raises
    BrokenPipeError here, which the ``tfdp-utils`` command ends quietly, as every command."""
    print(text)
    sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    """Carry out ``tfdp-utils report`` for parsed ``args``; returns the exit status."""
    if args.plot:
        problem = plot_path_problem(args.plot)
        if problem:
            print(f"tfdp-utils report: {problem}", file=sys.stderr)
            return 2
    try:
        runs = read_runs(args.logdir)
    except FileNotFoundError as exc:
        print(f"tfdp-utils report: {exc}", file=sys.stderr)
        return 2
    problems = event_file_problems(args.logdir)
    corrupt = [p for p in problems if ": corrupt" in p]
    for problem in problems:
        print(f"tfdp-utils report: {problem}", file=sys.stderr)
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
            plot(runs, args.plot, summary)
        except (ImportError, OSError) as exc:
            print(f"tfdp-utils report: --plot {args.plot!r}: {exc}", file=sys.stderr)
            return 2
        summary["plot"] = args.plot
    if problems:
        summary["event_file_problems"] = problems
    status = 1 if corrupt else 0
    exports = [(args.csv, _export.write_csv), (args.windows_json, _export.write_json)]
    rows = _export.point_rows(runs)
    for target, write in exports:
        if target is None:
            continue
        try:
            write(rows, target)
        except OSError as exc:
            print(f"tfdp-utils report: cannot write {target!r}: {exc}", file=sys.stderr)
            return 2
    if "-" in (args.csv, args.windows_json):
        return status
    if args.json:
        _emit(json.dumps(summary, indent=2, sort_keys=True))
    else:
        text = format_table(summary) + (f"\nplot: {args.plot}" if args.plot else "")
        _emit(text)
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
