"""Where the suite's CPU goes: the per-test records of a run with TFDP_TEST_CPU=FOLDER, added up.

    TFDP_TEST_CPU=/tmp/cpu bash scripts/test    (the folder must exist)
    python scripts/suite_cpu.py /tmp/cpu [--top N]

Prints the CPU seconds (the test process's own, its ended children's, the preloaded jobs') by
flavour, then the files and the tests that took the most. On a 2-core machine the suite's wall
time cannot go below half its CPU seconds, whatever the lanes do.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=30)
    options = parser.parse_args()
    records = [
        json.loads(line)
        for path in sorted(options.folder.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    by_flavour: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    by_file: dict[tuple[str, str], float] = defaultdict(float)
    by_test: list[tuple[float, str, str]] = []
    for record in records:
        flavour = record["flavour"]
        cpu = record["own"] + record["children"] + record["jobs"]
        totals = by_flavour[flavour]
        for i, key in enumerate(("own", "children", "jobs")):
            totals[i] += record[key]
        totals[3] += record["wall"]
        by_file[(flavour, record["test"].split("::", 1)[0])] += cpu
        by_test.append((cpu, flavour, record["test"]))
    print(f"{len(records)} tests")
    for flavour, (own, children, jobs, wall) in sorted(by_flavour.items()):
        print(
            f"{flavour:9} CPU {own + children + jobs:7.0f} s (own {own:.0f}, children "
            f"{children:.0f}, preloaded jobs {jobs:.0f}); wall in tests {wall:.0f} s"
        )
    print(f"\nfiles by CPU (top {options.top}):")
    for (flavour, path), cpu in sorted(by_file.items(), key=lambda kv: -kv[1])[: options.top]:
        print(f"{cpu:7.1f}  {flavour:9} {path}")
    print(f"\ntests by CPU (top {options.top}):")
    for cpu, flavour, test in sorted(by_test, reverse=True)[: options.top]:
        print(f"{cpu:7.1f}  {flavour:9} {test[:150]}")


if __name__ == "__main__":
    main()
