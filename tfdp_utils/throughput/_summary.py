"""The figures of ``tfdp-utils report``: each run's median / min / max examples/s, replica skew,
workers, input-wait verdicts, and what is inconsistent or cut short, from the runs read back.
Pure (no TensorFlow)."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from tfdp_utils.throughput._events import RunSeries
from tfdp_utils.throughput._goodput import goodput_of
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
    per_run = {name: _run_entry(run) for name, run in runs.items()}
    for name, reasons in _inconsistencies(runs).items():
        per_run[name]["cut_short"].extend(reasons)
    waits = _input_waits(per_run)
    cut_short = {n: e["cut_short"] for n, e in per_run.items() if e["cut_short"]}
    derived = {n: e["counts_note"] for n, e in per_run.items() if e["counts"] == "derived"}
    chief = runs.get(GLOBAL_RUN)
    goodput = None if chief is None else goodput_of(chief.fits, chief.ledgers, chief.fit_walls)
    return {
        "goodput": None if goodput is None else goodput.as_dict(),
        "runs": per_run,
        "replica_skew": _replica_skew(per_run),
        "workers": _workers_entry(per_run, runs, waits),
        "input": _input_entry(runs, waits),
        "complete": not cut_short,
        "cut_short": cut_short,
        "exact": None if not derived and not _any_note(per_run) else not derived,
        "derived": derived,
        "steps_back": _steps_back_by_job(per_run),
    }


def _run_entry(run: RunSeries) -> dict[str, Any]:
    """One run's figures; its ``cut_short`` holds its event file's problems (the job's
    inconsistencies are added by :func:`summarize`)."""
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
    return entry


def _kind(name: str) -> RunKind | None:
    parsed = parse_run(name)
    return None if parsed is None else parsed[0]


def _replica_skew(per_run: dict[str, Any]) -> float | None:
    """``(max - min) / max`` of the replicas' median examples/s; None under two replicas."""
    replica_medians = [
        e["examples_per_sec"]["median"]
        for n, e in per_run.items()
        if _kind(n) == "replica" and e["examples_per_sec"]
    ]
    skew: float | None = None
    if len(replica_medians) >= 2 and max(replica_medians) > 0:
        skew = (max(replica_medians) - min(replica_medians)) / max(replica_medians)
    return skew


def _workers_entry(
    per_run: dict[str, Any], runs: dict[str, RunSeries], waits: dict[int, float]
) -> dict[str, Any]:
    """The workers: how many, each one's median steps/s and input-wait share, and the median
    of the chief's logged worker skew."""
    workers = {
        n: e["steps_per_sec"]["median"]
        for n, e in per_run.items()
        if _kind(n) == "worker" and e["steps_per_sec"]
    }
    skews = [v for run in runs.values() for v in run.values(WORKER_SKEW)]
    return {
        # A job without worker_<w> runs is one worker (the logger writes them only for more).
        "count": max(1, len(workers)),
        "median_steps_per_sec": workers,
        "median_skew": statistics.median(skews) if skews else None,
        "median_input_wait_share": {f"worker_{w}": s for w, s in waits.items()},
    }


def _input_entry(runs: dict[str, RunSeries], waits: dict[int, float]) -> dict[str, Any]:
    """The input-wait verdict, the straggler, and why the share is unknown when it is."""
    named = straggler(waits)
    wait_note = None if waits else _input_wait_note(runs)
    return {
        "verdict": verdict(waits) if waits else _unknown_verdict(wait_note),
        "straggler": None if named is None else dataclasses.asdict(named),
        "measured": bool(waits),
        "note": wait_note,
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
