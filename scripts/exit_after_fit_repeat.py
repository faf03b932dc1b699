"""Repeat the elastic-resume reference job and count the workers that did not exit 0.

The job (``tests/support/elastic_job.py``): 2 localhost workers x 1 replica, a builder dataset
over arrays, ``PreemptionCheckpoint`` and ``ThroughputLogger`` beside a recording callback, 3
epochs of ``fit``, then a clean exit. A finished worker used to die by SIGABRT after its last
line (``FATAL: exception not rethrown``, -6) in about 1 in 100 such jobs under load: the
collective watchdog's thread destroyed the returned ``fit``'s iterators while the interpreter
finalized. Run several at once to load the machine as the test suite's lanes do (five did,
each job being 2 processes); ``--fork`` forks the workers after TensorFlow's import, as the
suite does. Set ``PYTHONFAULTHANDLER=1`` and ``ulimit -c unlimited`` to keep a dump and a core
of a failure (the core is written in the working folder).

    for i in 1 2 3 4 5; do
      TF_USE_LEGACY_KERAS=1 PYTHONPATH=. python scripts/exit_after_fit_repeat.py --runs 80 --fork &
    done; wait

Prints one line per run and a total; exits 1 when any worker did not exit 0.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import elastic_job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of the job")
    parser.add_argument("--fork", action="store_true", help="fork after TensorFlow's import")
    args = parser.parse_args()
    start = elastic_job.start_python

    def start_python(code: str, **kwargs: object) -> object:
        kwargs["preloaded"] = args.fork
        return start(code, **kwargs)

    elastic_job.start_python = start_python
    failed = 0
    for run in range(args.runs):
        tmp = Path(tempfile.mkdtemp(prefix="exit-after-fit-"))
        began = time.monotonic()
        logs = elastic_job.run_job(
            tmp, "reference", tmp / "job", (2, 1), JOB_SOURCE="arrays", JOB_TB=str(tmp / "tb")
        )
        statuses = [log["status"] for log in logs]
        print(f"run {run}: statuses {statuses}, {time.monotonic() - began:.1f} s", flush=True)
        for index, log in enumerate(logs):
            if log["status"] != 0:
                failed += 1
                print(f"--- worker {index}:\n{log['stderr'][-4000:]}", flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{failed} workers of {args.runs} jobs did not exit 0")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
