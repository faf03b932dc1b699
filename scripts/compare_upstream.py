"""tdu.auto_strategy() against TensorFlow's own tf.distribute.experimental.auto_strategy().

Run it with a TensorFlow that has the upstream function (tf-nightly 2.23 and later) and
tfdp-utils installed in the same environment:

    python scripts/compare_upstream.py              # every scenario, about 10 minutes
    python scripts/compare_upstream.py --only cpu2 tpu_silent_metadata   # rows replaced

Each scenario runs each function in fresh processes (logical devices must be configured
before TensorFlow initialises; a multi-worker strategy is set up once per process), one
process per task of the scenario (two for the 2-worker clusters), all on this machine.
Every process imports TensorFlow first, then times one call of the function under a hard
bound (``--call-bound``, 60 s: a hang is a result, "did not return in 60 s"), records what
it returned (type, replicas in sync), what it said while it ran (tfdp-utils' reason line;
TensorFlow's log records at WARNING and above, the level its logger shows by default; any
Python warning; the exception), and then whether a short Keras 3 ``fit`` trains on the
result, under the same bound. A process that outlives its bounds is killed; the whole run
stops starting scenarios after ``--budget`` seconds. Servers started here (a socket that
accepts and never answers, for the silent metadata server and TPU worker) bind 127.0.0.1,
Ray gets 127.0.0.1 as its node address, and every cluster address is on 127.0.0.1
(``localhost``, the fake srun's node, for SLURM).

Writes ``scripts/compare_upstream.out.json`` (everything recorded) and the table between
the markers of ``docs/upstream-auto-strategy.md``. Exits 0 when every scenario ran.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
JSON_OUT = ROOT / "scripts" / "compare_upstream.out.json"
CHILD = ROOT / "scripts" / "compare_upstream_child.py"
DOC = ROOT / "docs" / "upstream-auto-strategy.md"
TABLE_START = "<!-- compare_upstream table: start -->"
TABLE_END = "<!-- compare_upstream table: end -->"
SIDES = ("tfdp-utils", "upstream")
STRATEGY_NAMES = tuple(
    f"tfdp_utils: {name}Strategy over"
    for name in ("OneDevice", "Mirrored", "MultiWorkerMirrored", "TPU", "ParameterServer")
)
CALLS = {
    "tfdp-utils": "tdu.auto_strategy()",
    "upstream": "tf.distribute.experimental.auto_strategy()",
}

# Variables that decide either function's choice: removed from the inherited environment so
# each scenario sets exactly its own.
CLEARED_PREFIXES = ("TF_CONFIG", "TPU_", "SLURM_", "TFDP_", "GCE_METADATA", "KUBE_GOOGLE")
CLEARED = (
    "COLAB_TPU_ADDR",
    "JOB_COMPLETION_INDEX",
    "JOBSET_NAME",
    "REPLICATED_JOB_NAME",
    "REPLICATED_JOB_REPLICAS",
    "JOB_INDEX",
    "TF_USE_LEGACY_KERAS",
)


# ------------------------------------------------------------------------------ scenarios


@dataclasses.dataclass(frozen=True)
class Ports:
    """Ports on 127.0.0.1 a scenario may use: free ones, one nobody listens on, a silent one."""

    free: tuple[int, ...]
    closed: int
    silent: int


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One situation both functions are put in.

    Attributes:
        name: short key (``--only``). title: what the table calls it.
        tasks: processes started together (each gets ``env(ports, index)``).
        logical_cpus: logical CPU devices each process configures before TensorFlow starts.
        env: the variables of task ``index``, given the ports.
    """

    name: str
    title: str
    env: Callable[[Ports, int], dict[str, str]]
    tasks: int = 1
    logical_cpus: int = 1
    ray: bool = False


def _tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def _workers(ports: Ports, count: int = 2) -> list[str]:
    return [f"127.0.0.1:{port}" for port in ports.free[:count]]


def _kubernetes(ports: Ports, index: int) -> dict[str, str]:
    override = ",".join(
        f"train-{i}.train-svc={address}" for i, address in enumerate(_workers(ports))
    )
    return {
        "HOSTNAME": f"train-{index}",
        "JOB_COMPLETION_INDEX": str(index),
        "TFDP_NUM_WORKERS": "2",
        "TFDP_PORT": str(ports.free[0]),
        "TFDP_SUBDOMAIN": "train-svc",
        "TFDP_HOSTS_OVERRIDE": override,
    }


def _jobset(ports: Ports, index: int) -> dict[str, str]:
    names = [f"js-workers-0-{i}.js" for i in range(2)]
    override = ",".join(f"{n}={a}" for n, a in zip(names, _workers(ports), strict=True))
    return {
        "HOSTNAME": f"js-workers-0-{index}",
        "JOB_COMPLETION_INDEX": str(index),
        "JOBSET_NAME": "js",
        "REPLICATED_JOB_NAME": "workers",
        "REPLICATED_JOB_REPLICAS": "1",
        "JOB_INDEX": "0",
        "TFDP_NUM_WORKERS": "2",
        "TFDP_PORT": str(ports.free[0]),
        "TFDP_HOSTS_OVERRIDE": override,
    }


def _slurm(ports: Ports, index: int) -> dict[str, str]:
    # What srun sets for task `index` of `srun -N1 -n2` on node "localhost".
    return {
        "SLURM_PROCID": str(index),
        "SLURM_LOCALID": str(index),
        "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_JOB_ID": "4242",
        "TFDP_SLURM_PORT_BASE": str(ports.free[0]),
    }


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("cpu1", "No accelerator, 1 CPU", lambda p, i: {}),
    Scenario("cpu2", "No accelerator, 2 logical CPUs", lambda p, i: {}, logical_cpus=2),
    Scenario(
        "tf_config_2workers",
        "TF_CONFIG, 2 workers on 127.0.0.1 (both started; fit over 2 workers)",
        lambda p, i: {"TF_CONFIG": _tf_config({"worker": _workers(p)}, "worker", i)},
        tasks=2,
    ),
    Scenario(
        "tf_config_ps",
        "TF_CONFIG with a ps task (the chief's process)",
        lambda p, i: {
            "TF_CONFIG": _tf_config(
                {"chief": _workers(p, 1), "worker": _workers(p, 2)[1:], "ps": ["127.0.0.1:1"]},
                "chief",
                0,
            )
        },
    ),
    Scenario(
        "tf_config_malformed",
        "Malformed TF_CONFIG (a truncated JSON object)",
        lambda p, i: {"TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '},
    ),
    Scenario(
        "tpu_unreachable",
        "TPU_NAME=grpc://127.0.0.1:PORT, nothing listening",
        lambda p, i: {"TPU_NAME": f"grpc://127.0.0.1:{p.closed}"},
    ),
    Scenario(
        "tpu_silent_worker",
        "TPU_NAME=grpc://127.0.0.1:PORT, a socket that accepts and never answers",
        lambda p, i: {"TPU_NAME": f"grpc://127.0.0.1:{p.silent}"},
    ),
    Scenario(
        "tpu_no_metadata",
        "TPU_NAME=my-tpu, no metadata server (GCE_METADATA_HOST refuses)",
        lambda p, i: {"TPU_NAME": "my-tpu", "GCE_METADATA_HOST": f"127.0.0.1:{p.closed}"},
    ),
    Scenario(
        "tpu_silent_metadata",
        "TPU_NAME=my-tpu, silent metadata server (GCE_METADATA_HOST accepts, never answers)",
        lambda p, i: {"TPU_NAME": "my-tpu", "GCE_METADATA_HOST": f"127.0.0.1:{p.silent}"},
    ),
    Scenario("slurm", "SLURM srun, 1 node x 2 tasks (both started)", _slurm, tasks=2),
    Scenario(
        "k8s_indexed_job", "Kubernetes Indexed Job, 2 pods (both started)", _kubernetes, tasks=2
    ),
    Scenario("k8s_jobset", "Kubernetes JobSet, 2 pods (both started)", _jobset, tasks=2),
    Scenario("ray_train", "Ray Train TensorflowTrainer, 2 workers", lambda p, i: {}, ray=True),
    Scenario(
        "tfdp_strategy",
        "TFDP_STRATEGY=one_device, 2 logical CPUs",
        lambda p, i: {"TFDP_STRATEGY": "one_device"},
        logical_cpus=2,
    ),
)


# ---------------------------------------------------------------------------- the parent


def _free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A socket on 127.0.0.1 that accepts connections and never answers; yields its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        server.close()


def _base_env() -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(CLEARED_PREFIXES) and name not in CLEARED
    }
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    return env


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _tail(path: Path, limit: int = 500) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-4:])[-limit:]


def _task_result(out: Path, err: Path, code: int | None, *, bound: float) -> dict[str, Any]:
    """What one process recorded, as a dictionary: call, fit, exit status, stderr's tail."""
    events = {record["event"]: record for record in _read(out)}
    call = events.get("call") or {"hung": True, "seconds": bound, "note": "no call record"}
    result: dict[str, Any] = {"call": call, "fit": events.get("fit"), "exit_code": code}
    if "versions" in events:
        result["versions"] = {k: v for k, v in events["versions"].items() if k != "event"}
    if "tf_config" in events:
        result["tf_config"] = events["tf_config"]["TF_CONFIG"]
    if code not in (0, None) or call.get("error") or call.get("hung"):
        result["stderr_tail"] = _tail(err)
    return result


def run_side(scenario: Scenario, side: str, folder: Path, *, bound: float) -> list[dict[str, Any]]:
    """Start every task of ``scenario`` for one function; wait (bounded); their results."""
    ports = Ports(tuple(_free_ports(2)), _free_ports(1)[0], 0)
    with silent_server() as silent:
        ports = dataclasses.replace(ports, silent=silent)
        processes, files = [], []
        for index in range(scenario.tasks):
            out = folder / f"{scenario.name}-{side}-{index}.jsonl"
            err = folder / f"{scenario.name}-{side}-{index}.err"
            argv = [sys.executable, str(CHILD), side, "--out", str(out)] + ["--ray"] * scenario.ray
            argv += ["--logical-cpus", str(scenario.logical_cpus), "--call-bound", str(bound)]
            env = {**_base_env(), **scenario.env(ports, index)}
            with open(err, "w") as stderr:
                processes.append(
                    subprocess.Popen(
                        argv,
                        stdout=stderr,
                        stderr=stderr,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        cwd=folder,
                    )
                )
            files.append((out, err))
        limit = time.monotonic() + 2 * bound + (90 if scenario.ray else 45)
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, limit - time.monotonic()))
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    if scenario.ray:
        out, err = files[0]
        worker_files = [Path(f"{out}.{rank}") for rank in range(2)]
        return [_task_result(w, err, processes[0].returncode, bound=bound) for w in worker_files]
    return [
        _task_result(out, err, process.returncode, bound=bound)
        for (out, err), process in zip(files, processes, strict=True)
    ]


# ---------------------------------------------------------------------------- the table


def _returns(task: dict[str, Any], bound: float) -> str:
    call = task["call"]
    if call.get("hung"):
        return f"nothing: did not return in {bound:g} s"
    if call.get("error"):
        return f"raises {call['error']['type']}"
    return f"{call['strategy']} ({call['replicas']} in sync)"


def _seconds(task: dict[str, Any], bound: float) -> str:
    call = task["call"]
    return f"> {bound:g} (killed)" if call.get("hung") else f"{call['seconds']:.2f}"


def _cell(text: str, limit: int = 260) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _said(side: str, task: dict[str, Any]) -> str:
    call = task["call"]
    shown = [
        line["text"]
        for line in call.get("said", [])
        if line["logger"] == "warnings"
        or line["level"] in ("WARNING", "ERROR", "CRITICAL")
        or (line["logger"] == "tfdp_utils" and line["text"].startswith("tfdp_utils: "))
    ]
    # tfdp-utils' own line (what it built and why) first, then the warnings before it.
    shown.sort(key=lambda text: not text.startswith(STRATEGY_NAMES))
    if call.get("error"):
        shown.append(f"{call['error']['type']}: {call['error']['message']}")
    if call.get("hung"):
        shown.append("(hung; nothing more)" if shown else "nothing (hung)")
    if side == "upstream" and not shown:
        return "nothing (its INFO lines are hidden by default)"
    return _cell(" / ".join(shown) or "nothing")


def _fit_cell(tasks: list[dict[str, Any]]) -> str:
    fits = [task.get("fit") for task in tasks]
    if all(fit is None for fit in fits):
        return "no strategy to fit on"
    parts = []
    for fit in fits:
        if fit is None:
            parts.append("not run")
        elif fit.get("hung"):
            parts.append("fit hung")
        elif fit.get("error"):
            parts.append(f"no: {fit['error']['type']}: {fit['error']['message'][:120]}")
        else:
            loss = f"loss {fit['losses'][0]} -> {fit['losses'][-1]}"
            parts.append(f"yes, {loss}" if fit["trains"] else f"no, {loss}")
    if len(set(parts)) == 1:
        return _cell(parts[0] + (f" (each of {len(parts)} tasks)" if len(parts) > 1 else ""))
    return _cell("; ".join(f"task {i}: {part}" for i, part in enumerate(parts)))


def table(results: list[dict[str, Any]], bound: float) -> str:
    """The Markdown table: two rows per scenario, one per function."""
    lines = [
        "| scenario | function | returns | seconds (bound "
        f"{bound:g} s) | what it says | "
        "a short Keras 3 fit then |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        for side in SIDES:
            tasks = result["sides"].get(side)
            if not tasks:
                why = result.get("skipped", "not run")
                lines.append(f"| {result['title']} | `{CALLS[side]}` | {why} | | | |")
                continue
            returns = "; ".join(dict.fromkeys(_returns(t, bound) for t in tasks))
            seconds = " / ".join(_seconds(t, bound) for t in tasks)
            said = _said(side, tasks[0])
            lines.append(
                f"| {result['title']} | `{CALLS[side]}` | {returns} | {seconds} | {said} | "
                f"{_fit_cell(tasks)} |"
            )
    return "\n".join(lines)


def write_doc(markdown: str, header: str) -> None:
    """Put the table between the markers of the docs page (left alone when they are missing)."""
    if not DOC.exists():
        return
    text = DOC.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        return
    before, rest = text.split(TABLE_START, 1)
    after = rest.split(TABLE_END, 1)[1]
    DOC.write_text(f"{before}{TABLE_START}\n{header}\n\n{markdown}\n{TABLE_END}{after}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="scenario names (default: all)")
    parser.add_argument("--call-bound", type=float, default=60.0)
    parser.add_argument("--budget", type=float, default=1800.0, help="seconds for the whole run")
    parser.add_argument("--no-write", action="store_true", help="print, write no files")
    args = parser.parse_args(argv)
    chosen = [s for s in SCENARIOS if not args.only or s.name in args.only]
    deadline = time.monotonic() + args.budget
    results = []
    with tempfile.TemporaryDirectory(prefix="tfdp-compare-") as folder:
        for scenario in chosen:
            result: dict[str, Any] = {"name": scenario.name, "title": scenario.title, "sides": {}}
            results.append(result)
            if scenario.ray and not _has_ray():
                result["skipped"] = "not run: ray is not installed"
                continue
            for side in SIDES:
                if time.monotonic() > deadline:
                    result["skipped"] = f"not run: the {args.budget:g} s budget was spent"
                    break
                started = time.monotonic()
                tasks = run_side(scenario, side, Path(folder), bound=args.call_bound)
                result["sides"][side] = tasks
                print(
                    f"{scenario.name} {side}: {[_returns(t, args.call_bound) for t in tasks]} "
                    f"({time.monotonic() - started:.0f} s)",
                    flush=True,
                )
    versions = next(
        (
            t["versions"]
            for r in results
            for ts in r["sides"].values()
            for t in ts
            if "versions" in t
        ),
        {},
    )
    header = (
        f"Measured by `scripts/compare_upstream.py` on {time.strftime('%Y-%m-%d')}: "
        f"TensorFlow {versions.get('tensorflow')}, Keras {versions.get('keras')}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPU cores, no accelerator."
    )
    if args.only and JSON_OUT.exists():
        results = _merged(results)  # the other scenarios' rows stay as last measured
    markdown = table(results, args.call_bound)
    print(markdown)
    if not args.no_write:
        JSON_OUT.write_text(
            json.dumps(
                {"header": header, "call_bound": args.call_bound, "results": results}, indent=1
            )
            + "\n"
        )
        write_doc(markdown, header)
    return 0 if all(r.get("skipped") is None for r in results) else 1


def _merged(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last full run's results with these scenarios' results in their place."""
    fresh = {result["name"]: result for result in results}
    earlier = json.loads(JSON_OUT.read_text())["results"]
    return [fresh.get(result["name"], result) for result in earlier]


def _has_ray() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


if __name__ == "__main__":
    sys.exit(main())
