"""The ``tfdp-utils`` command: ``env``, ``doctor``, ``demo``, ``report`` and ``data-service``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Sequence
from typing import Any

from tfdp_utils import _variables
from tfdp_utils._versions import (
    KERAS_DISTRIBUTIONS,
    TF_KERAS_DISTRIBUTIONS,
    installed_keras,
    installed_of,
    installed_version,
    tensorflow_flavour,
)

ENV_VARIABLES: tuple[str, ...] = _variables.REPORTED

EXIT_OK = 0
"""``env``: auto_strategy() would build the strategy named; other commands: success."""
EXIT_PROBLEM = 1
"""``env``: auto_strategy() would raise here (the report says why); ``doctor``: a FAIL line;
``report``: a corrupt event file; ``data-service worker``: the dispatcher never answered."""
EXIT_USAGE = 2
"""An argument is wrong (one line on stderr naming it and the fix)."""
EXIT_INTERRUPTED = 130
"""Interrupted (Ctrl-C): 128 + SIGINT."""
EXIT_CLOSED_PIPE = 141
"""The reader of the output went away (``tfdp-utils env | head -1``): 128 + SIGPIPE, quietly."""


def environment_facts() -> dict[str, Any]:
    """What ``tfdp-utils env`` knows without importing TensorFlow, as a JSON-ready dictionary.

    Versions from package metadata, the variables, the cluster spec, and the environment
    check ``auto_strategy()`` runs first (the same problems, in the same words).
    """
    from tfdp_utils import __version__
    from tfdp_utils.cluster._environments import cluster_from_environment
    from tfdp_utils.strategy._environment_check import check_environment

    problems = check_environment()
    facts: dict[str, Any] = {
        "tfdp_utils": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "tensorflow_distribution": tensorflow_flavour(),
        "keras_distributions": installed_of(KERAS_DISTRIBUTIONS + TF_KERAS_DISTRIBUTIONS),
        "tensorboard": installed_version("tensorboard"),
        "variables": {name: os.environ[name] for name in ENV_VARIABLES if name in os.environ},
        "environment_problems": [
            {"variable": problem.variable, "message": problem.message} for problem in problems
        ],
        "cluster": None,
        "cluster_source": None,
    }
    try:
        cluster = cluster_from_environment()
    except ValueError:
        cluster = None  # named by the environment check
    if cluster is not None:
        facts.update(cluster=cluster.as_tf_config(), cluster_source=cluster.source)
    return facts


def environment_report() -> dict[str, Any]:
    """Everything ``tfdp-utils env`` prints, as a JSON-ready dictionary.

    :func:`environment_facts`, then what TensorFlow adds: its version, the active Keras, the
    devices and the strategy :func:`tfdp_utils.auto_strategy` would build here (``strategy``
    is None when it would raise, and ``reason`` says why). Nothing is built and no network is
    touched (a TPU hint is reported, not probed).
    """
    facts = environment_facts()
    return {**facts, **_tensorflow_report(facts)}


def _tensorflow_report(facts: dict[str, Any]) -> dict[str, Any]:
    """The part of the report that imports TensorFlow, given :func:`environment_facts`."""
    problems = facts["environment_problems"]
    refusal = None
    if problems:
        refusal = f"auto_strategy() raises ValueError here: {problems[0]['message']}"
    try:
        from tfdp_utils._tf import IS_KERAS3, KERAS_VERSION, tf
    except ImportError as exc:
        return _report_without_tensorflow(exc, refusal)
    from tfdp_utils.strategy._build import parameter_server_refusal
    from tfdp_utils.strategy._choice import choose_strategy
    from tfdp_utils.strategy._detect import detect_environment, local_devices
    from tfdp_utils.strategy._upstream import upstream_note
    from tfdp_utils.strategy._xla import keras_xla

    report: dict[str, Any] = {
        "tensorflow": tf.__version__,
        "keras": KERAS_VERSION,
        "keras_flavour": "keras3" if IS_KERAS3 else "tf_keras",
        "tf_keras_active": not IS_KERAS3,
        "upstream_auto_strategy": upstream_note(tf),
    }
    if refusal is not None:
        gpus, cpus, tpus = local_devices()
        report.update(
            devices={"gpu": list(gpus), "cpu": list(cpus), "tpu": list(tpus)},
            strategy=None,
            reason=refusal,
        )
        return report
    env = detect_environment()  # the environment check passed, so this parses cleanly
    report.update(
        devices={"gpu": list(env.gpus), "cpu": list(env.cpus), "tpu": list(env.tpus)},
        tpu_hint=env.tpu_hint,
        strategy=None,
    )
    try:
        choice = choose_strategy(env)
    except ValueError as exc:
        report.update(reason=f"auto_strategy() raises ValueError here: {exc}")
        return report
    refused = parameter_server_refusal(choice.kind, keras3=IS_KERAS3, keras_version=KERAS_VERSION)
    if refused is not None:
        report.update(reason=f"auto_strategy() raises ValueError here: {refused}")
        return report
    report.update(
        strategy=choice.class_name,
        strategy_kind=choice.kind,
        strategy_devices=list(choice.devices),
        reason=choice.reason,
        keras_xla=keras_xla(
            choice.kind, keras3=IS_KERAS3, accelerators=len(env.gpus) + len(env.tpus)
        ),
    )
    return report


def _version_of(found: tuple[str, str] | None) -> str | None:
    return found[1] if found else None


def _report_without_tensorflow(error: ImportError, refusal: str | None) -> dict[str, Any]:
    """The TensorFlow part when TensorFlow cannot be imported: what is installed, how to fix."""
    reason = str(error).strip().splitlines()
    return {
        "tensorflow": "not installed",
        "tensorflow_error": reason[-1] if reason else repr(error),
        "keras": _version_of(installed_keras()),
        "keras_flavour": None,
        "tf_keras": _version_of(installed_keras(legacy=True)),
        "devices": None,
        "strategy": None,
        "reason": refusal
        or "TensorFlow is not installed (or fails to import), so no strategy can be "
        "built. Install it: pip install 'tfdp-utils[cpu]' (tensorflow-cpu) or "
        "'tfdp-utils[tensorflow]', or tensorflow / tensorflow[and-cuda] / tensorflow-tpu "
        "yourself.",
    }


def _format_facts(facts: dict[str, Any]) -> str:
    lines = ["tfdp-utils environment (paste this into bug reports)", ""]
    for label, key in (
        ("tfdp-utils", "tfdp_utils"),
        ("Python", "python"),
        ("Platform", "platform"),
        ("TensorFlow distribution", "tensorflow_distribution"),
        ("TensorBoard", "tensorboard"),
    ):
        lines.append(f"- {label}: {facts.get(key)}")
    kerases = facts.get("keras_distributions") or {}
    listed = ", ".join(f"{name} {version}" for name, version in kerases.items())
    lines.append(f"- Keras distributions: {listed or 'none'}")
    cluster = facts.get("cluster")
    lines.append(
        f"- Cluster: {facts.get('cluster_source')} {json.dumps(cluster)}"
        if cluster
        else "- Cluster: none"
    )
    for name, value in facts.get("variables", {}).items():
        lines.append(f"- ${name}: {value}")
    problems = facts.get("environment_problems") or []
    if not problems:
        lines.append("- Environment check: OK (the variables auto_strategy() reads are valid)")
    else:
        lines.append(
            f"- Environment check: {len(problems)} problem(s); auto_strategy() raises the first:"
        )
        for problem in problems:
            first, *more = problem["message"].splitlines()
            lines.append(f"  - {problem['variable']}: {first}")
            lines += [f"    {line}" for line in more]
    return "\n".join(lines)


def _format_tensorflow(report: dict[str, Any]) -> str:
    lines = []
    for label, key in (
        ("TensorFlow", "tensorflow"),
        ("Keras", "keras"),
        ("Keras flavour", "keras_flavour"),
    ):
        lines.append(f"- {label}: {report.get(key)}")
    if report.get("tensorflow_error"):
        lines.append(f"- TensorFlow import error: {report['tensorflow_error']}")
    devices = report.get("devices") or {}
    for kind in ("gpu", "cpu", "tpu"):
        names = devices.get(kind) or []
        lines.append(f"- {kind.upper()} devices ({len(names)}): {', '.join(names) or '-'}")
    if report.get("tpu_hint"):
        lines.append(f"- TPU hint: {report['tpu_hint']} (not probed)")
    strategy = report.get("strategy")
    lines.append(
        f"- Strategy auto_strategy() would build: {strategy}"
        if strategy
        else "- Strategy auto_strategy() would build: none, it raises here"
    )
    lines.append(f"- Why: {report.get('reason')}")
    if report.get("keras_xla"):
        lines.append(f"- {report['keras_xla']}")
    if report.get("upstream_auto_strategy"):
        lines.append(f"- Upstream: {report['upstream_auto_strategy']}")
    return "\n".join(lines)


def _cmd_env(args: argparse.Namespace) -> int:
    facts = environment_facts()
    if not args.json:
        # What is known now, before TensorFlow's import (which takes seconds to a minute).
        print(_format_facts(facts), flush=True)
    print(
        "tfdp-utils env: importing TensorFlow to list the devices and choose the strategy "
        "(as long as `python -c 'import tensorflow'` takes)...",
        file=sys.stderr,
        flush=True,
    )
    report = {**facts, **_tensorflow_report(facts)}
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(_format_tensorflow(report))
    return EXIT_OK if report.get("strategy") else EXIT_PROBLEM


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfdp-utils",
        description="Data-parallel TensorFlow/Keras training helpers.",
    )
    from tfdp_utils import __version__  # the package's own module: no TensorFlow

    parser.add_argument("--version", action="version", version=f"tfdp-utils {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    env = sub.add_parser("env", help="print versions, devices, cluster and the strategy choice")
    env.add_argument("--json", action="store_true", help="print one JSON object")
    env.set_defaults(func=_cmd_env)

    from tfdp_utils import demo
    from tfdp_utils.doctor import _command as doctor

    doctor_parser = sub.add_parser(
        "doctor",
        help="check versions, known upstream bugs, and train on 2 replicas vs 1 device",
    )
    doctor.add_arguments(doctor_parser)
    doctor_parser.set_defaults(func=doctor.run_from_args)

    demo_parser = sub.add_parser("demo", help="train the tutorial's model data-parallel")
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(func=demo.run_from_args)

    from tfdp_utils.data.service import (
        _servers as service_servers,  # imports TensorFlow only when a server starts
    )

    service_parser = sub.add_parser(
        "data-service",
        help="start a tf.data service dispatcher or worker (reads and map_fn off the trainer)",
    )
    service_servers.add_arguments(service_parser)

    from tfdp_utils.throughput import _report

    report_parser = sub.add_parser(
        "report", help="summarise throughput logs written by ThroughputLogger"
    )
    _report.add_arguments(report_parser)
    report_parser.set_defaults(func=_report.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tfdp-utils`` console script; returns the exit status.

    0 success; 1 a problem the command reports (see each command); 2 a wrong argument, in one
    line; 130 interrupted; 141 the output's reader went away (``| head``), quietly.
    """
    args: argparse.Namespace | None = None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        return _closed_pipe()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ValueError, TypeError) as exc:
        # Our own argument checks word these for the user: one line, not a traceback.
        # TensorFlow's own errors (tf.errors.*) are not ValueErrors and keep their trace.
        from tfdp_utils._validate import env_flag

        if env_flag(_variables.TRACEBACK):
            raise
        command = getattr(args, "command", None) or "tfdp-utils"
        print(f"tfdp-utils {command}: error: {exc}", file=sys.stderr)
        print("(set TFDP_TRACEBACK=1 for the full traceback)", file=sys.stderr)
        return EXIT_USAGE


def _closed_pipe() -> int:
    """End quietly when the reader of stdout has gone: no traceback, no flush error at exit."""
    # Python's recipe (docs: "Note on SIGPIPE"): point stdout at devnull, so the interpreter's
    # final flush of what is still buffered does not raise again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
        pass
    finally:
        os.close(devnull)
    return EXIT_CLOSED_PIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
