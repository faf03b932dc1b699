"""``tfdp-utils report --plot PATH``: examples/s per run over steps, in a PNG (needs matplotlib:
``pip install 'tfdp-utils[report]'``), the input-wait share under it where measured, and the
job's goodput as one bar of its wall time (productive, then each loss) where a fit wrote its
ledger."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from tfdp_utils.throughput._events import RunSeries
from tfdp_utils.throughput._tags import (
    EXAMPLES_PER_SEC,
    GOODPUT_LOSSES,
    INPUT_WAIT_SHARE,
)


def legend_label(name: str, entry: dict[str, Any], last_step: int) -> str:
    """The plot's legend entry for run ``name``: marked when cut short or counts are derived."""
    label = name
    if entry.get("cut_short"):
        label += f" (CUT SHORT at step {last_step})"
    if entry.get("counts") == "derived":
        label += " (derived counts)"
    return label


def goodput_segments(goodput: dict[str, Any]) -> list[tuple[str, float]]:
    """The goodput bar's segments, in order: productive first, then each loss that took any
    time (in the report's order, whatever order a JSON reader kept), each labelled with its
    seconds and share of the wall time (``summary["goodput"]``)."""
    wall = goodput["wall_seconds"] or 1.0
    parts = [("productive", float(goodput["productive_seconds"]))]
    losses = goodput["losses"]
    order = [n for n in GOODPUT_LOSSES if n in losses] + sorted(set(losses) - {*GOODPUT_LOSSES})
    parts += [(name, float(losses[name]["seconds"])) for name in order]
    return [
        (f"{name} {seconds:,.1f} s ({seconds / wall:.0%})", seconds)
        for name, seconds in parts
        if seconds > 0
    ]


def _panels(plt: Any, waits: bool, goodput: bool) -> tuple[Any, Any, Any, Any]:
    """The figure and its axes: rates, input waits (or None), goodput (or None)."""
    ratios = (2.0, *((1.0,) if waits else ()), *((0.6,) if goodput else ()))
    if len(ratios) == 1:
        figure, axes = plt.subplots(figsize=(9, 5))
        return figure, axes, None, None
    height = 5.0 + 2.5 * waits + 1.8 * goodput
    figure, panels = plt.subplots(len(ratios), 1, figsize=(9, height), height_ratios=ratios)
    panels = list(panels)
    axes = panels.pop(0)
    wait_axes = panels.pop(0) if waits else None
    if wait_axes is not None:
        wait_axes.sharex(axes)
    return figure, axes, wait_axes, panels.pop(0) if goodput else None


def _plot_goodput(axes: Any, goodput: dict[str, Any]) -> None:
    """The goodput panel: the job's wall time as one bar, productive then each loss."""
    left = 0.0
    for label, seconds in goodput_segments(goodput):
        axes.barh(0, seconds, left=left, label=label, height=0.6)
        left += seconds
    axes.set_yticks([])
    axes.set_xlabel("seconds of the job's wall time")
    fits = goodput["fits"]
    axes.set_title(
        f"goodput {goodput['goodput']:.1%} ({fits} run{'s' if fits != 1 else ''} of the job)",
        fontsize="medium",
    )
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3, fontsize="small")


def plot(runs: dict[str, RunSeries], path: str, summary: dict[str, Any] | None = None) -> None:
    """Draw examples/s per run over steps into the PNG file ``path``.

    Runs cut short and derived counts (from ``summary``, :func:`summarize`'s) are marked in
    the legend and the title; the job's goodput (``summary["goodput"]``) gets a panel of its
    own.

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
    goodput = (summary or {}).get("goodput")
    figure, axes, wait_axes, goodput_axes = _panels(plt, bool(waits), goodput is not None)
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
        if wait_axes is None:
            axes.set_xlabel("optimizer step")
        else:
            verdict_line = (summary or {}).get("input", {}).get("verdict")
            _plot_waits(wait_axes, waits, verdict_line, colors)
        if goodput_axes is not None and goodput is not None:
            _plot_goodput(goodput_axes, goodput)
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
