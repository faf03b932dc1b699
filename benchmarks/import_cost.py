"""What ``import tensorflow`` costs a fresh process, with and without extra packages importable.

Keras 3 imports some packages at its own import whenever they are installed (scikit-learn for
its wrappers, matplotlib for its image gallery, pandas for its array slicing), and
``import tensorflow`` imports Keras. Every fresh Python process pays that: a user's script, and
each test process and child job of the suite. This benchmark starts fresh processes that run
``import tensorflow`` (and import nothing else), alternating two arms, and reports each arm's CPU
seconds (user + system, from the kernel's accounting of the ended child: an independent clock)
and wall seconds:

* ``as installed``: this environment;
* ``with EXTRA``: the same, with the folder ``--extra`` first on ``PYTHONPATH`` (e.g. a
  ``pip install --target`` of scikit-learn).

    pip install -q --no-deps --target /tmp/sklearn-only scikit-learn scipy joblib threadpoolctl
    .venv/bin/python benchmarks/import_cost.py --extra /tmp/sklearn-only --runs 8

(``--no-deps``: the environment's own numpy stays the one imported.) ``--flavour tf_keras``
sets ``TF_USE_LEGACY_KERAS=1`` in both arms. The lines after the table name the top-level
modules that one arm's import brought in and the other's did not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, sys
before = set(sys.modules)
import tensorflow  # noqa: F401
brought = sorted({name.partition(".")[0] for name in set(sys.modules) - before})
print(json.dumps(brought))
"""


def _run(env: dict[str, str]) -> tuple[float, float, list[str]]:
    """One fresh process: its CPU seconds, its wall seconds and the packages it imported."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", required=True, help="a folder put first on PYTHONPATH")
    parser.add_argument("--runs", type=int, default=6, help="processes per arm (alternating)")
    parser.add_argument("--flavour", choices=("keras3", "tf_keras"), default="keras3")
    options = parser.parse_args()
    if not os.path.isdir(options.extra):
        parser.error(f"--extra {options.extra!r} is not a folder")
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    base["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if options.flavour == "tf_keras":
        base["TF_USE_LEGACY_KERAS"] = "1"
    arms = {
        "as installed": dict(base),
        f"with {options.extra}": {**base, "PYTHONPATH": options.extra},
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    brought: dict[str, list[str]] = {}
    _run(arms["as installed"])  # one untimed start: the file cache warm for both arms
    for i in range(options.runs):
        order = list(arms) if i % 2 == 0 else list(reversed(arms))  # ABBA
        for name in order:
            cpu, wall, packages = _run(arms[name])
            samples[name].append((cpu, wall))
            brought[name] = packages
    print(
        f"import tensorflow ({options.flavour}), {options.runs} fresh processes per arm, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'arm':40} {'CPU s (median)':>15} {'wall s (median)':>16}")
    for name, values in samples.items():
        cpu = statistics.median(v[0] for v in values)
        wall = statistics.median(v[1] for v in values)
        print(f"{name:40} {cpu:15.2f} {wall:16.2f}")
    first, second = (set(brought[name]) for name in arms)
    print(f"imported only {list(arms)[1]}: {sorted(second - first)}")
    print(f"imported only as installed: {sorted(first - second)}")


if __name__ == "__main__":
    main()
