"""The suite's passes, balanced by each test file's recorded seconds (used by scripts/test).

    python scripts/lanes.py split N        print the passes for N lanes, one line each:
                                           "<id> <pure|keras3|tf_keras> <test files...>";
                                           id 0: the files with `timing` tests (lane 0's);
                                           ids q1, q2...: the queue, longest first, which the
                                           N lanes take from as each becomes free
    python scripts/lanes.py merge OUT IN.. merge the per-pass times IN (pure-*.json,
                                           keras3-*.json, tf_keras-*.json) into OUT

The seconds come from the last run on this machine (.pytest_cache/test-times.json, written by
scripts/test after every full run) or, on a fresh clone, from the committed tests/test-times.json
(`TFDP_TEST_RECORD=1 bash scripts/test` refreshes it). The pure test modules run once, with
TensorFlow refused (the plugin support.no_tensorflow, which is what
tests/test_runs_without_tensorflow.py checks for a plain `pytest`; it is left out here). Every
other test file runs on Keras 3, and again on tf_keras when it marks tests `keras`. The files
that share the session's 2-worker cluster (the `two_worker_phases` fixture) stay in one pass,
which starts that cluster once. Each flavour's files are cut into passes of about a third of a
lane's share (longest file first into the lightest pass), so that a pass's TensorFlow import is
shared by several files and the queue still ends evenly: a plan fixed in advance leaves one lane
long, because the seconds recorded swing with the suite's own load. A file with no recorded time
counts as the median of the recorded ones.

The tests marked `timing` (their truth is a figure measured in time) run apart, in lane 0 at
normal priority, while scripts/test runs the other lanes niced: they measure on the cores as a
quiet machine would give them, not against the suite's own load.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "test-times.json"
LAST_RUN = ROOT / ".pytest_cache" / "test-times.json"
FLAVOURS = ("pure", "keras3", "tf_keras")
PURE_MARK = "pytestmark = pytest.mark.pure"
REPLACED = "tests/test_runs_without_tensorflow.py"  # the pure pass does what it checks
TIMING_MARK = "pytest.mark.timing"
SHARED_CLUSTER = "two_worker_phases"


def _test_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py"))


def _times() -> dict[str, dict[str, float]]:
    for source in (LAST_RUN, RECORDED):
        if source.exists():
            loaded: dict[str, dict[str, float]] = json.loads(source.read_text())
            return {flavour: loaded.get(flavour, {}) for flavour in FLAVOURS}
    return {flavour: {} for flavour in FLAVOURS}


def _units(flavour: str, times: dict[str, float]) -> list[tuple[float, list[str]]]:
    """(seconds, files) of each unit of work of one flavour; the shared-cluster files together."""
    known = [s for s in times.values() if s > 0]
    default = statistics.median(known) if known else 5.0
    shared: list[str] = []
    units: list[tuple[float, list[str]]] = []
    for path in _test_files():
        text = (ROOT / path).read_text()
        if path == REPLACED or (PURE_MARK in text) != (flavour == "pure"):
            continue
        if flavour == "tf_keras" and "mark.keras" not in text:
            continue
        if SHARED_CLUSTER in text:
            shared.append(path)
        else:
            units.append((times.get(path, default), [path]))
    if shared:
        units.append((sum(times.get(path, default) for path in shared), shared))
    return units


PASSES_PER_LANE = 3
"""Passes per lane's share of the seconds: more passes end the lanes closer together, each
costs one more TensorFlow import (about 5 s)."""


def _passes(units: list[tuple[float, list[str]]], count: int) -> list[tuple[float, list[str]]]:
    """``units`` placed longest first on the lightest of ``count`` passes (empty ones dropped)."""
    passes: list[tuple[float, list[str]]] = [(0.0, []) for _ in range(count)]
    for seconds, files in sorted(units, key=lambda unit: (-unit[0], unit[1])):
        lightest = min(range(count), key=lambda index: passes[index][0])
        total, placed = passes[lightest]
        passes[lightest] = (total + seconds, [*placed, *files])
    return [entry for entry in passes if entry[1]]


def split(lanes: int) -> list[tuple[str, str, list[str]]]:
    """Lane 0's timing passes, then the queue of passes, longest first."""
    times = _times()
    units = {flavour: _units(flavour, times[flavour]) for flavour in FLAVOURS}
    total = sum(seconds for found in units.values() for seconds, _ in found)
    share = max(total / (lanes * PASSES_PER_LANE), 1.0)
    queue = [
        (seconds, flavour, sorted(files))
        for flavour in FLAVOURS
        for seconds, files in _passes(
            units[flavour], max(1, round(sum(s for s, _ in units[flavour]) / share))
        )
    ]
    queue.sort(key=lambda entry: (-entry[0], entry[1], entry[2]))
    timing = [path for path in _test_files() if TIMING_MARK in (ROOT / path).read_text()]
    keras_timing = [path for path in timing if "mark.keras" in (ROOT / path).read_text()]
    apart = [("0", "keras3", timing), ("0", "tf_keras", keras_timing)]
    return [entry for entry in apart if entry[2]] + [
        (f"q{index}", flavour, files) for index, (_, flavour, files) in enumerate(queue, 1)
    ]


def merge(out: Path, inputs: list[Path]) -> None:
    merged: dict[str, dict[str, float]] = {flavour: {} for flavour in FLAVOURS}
    for source in inputs:
        flavour = source.name.split("-", 1)[0]
        if flavour in merged and source.exists():
            merged[flavour].update(json.loads(source.read_text()))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "split" and argv[1].isdigit() and int(argv[1]) > 0:
        for name, flavour, files in split(int(argv[1])):
            print(name, flavour, *files)
        return 0
    if len(argv) >= 2 and argv[0] == "merge":
        merge(Path(argv[1]), [Path(p) for p in argv[2:]])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
