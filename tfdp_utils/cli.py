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
from tfdp_utils._versions import installed_version, tensorflow_flavour

ENV_VARIABLES: tuple[str, ...] = _variables.REPORTED


def environment_report() -> dict[str, Any]:
    """Everything ``tfdp-utils env`` prints, as a JSON-ready dictionary.

    The strategy is the one :func:`tfdp_utils.auto_strategy` would choose here; nothing is
    built and no network is touched (a TPU hint is reported, not probed).
    """
    from tfdp_utils import __version__

    try:
        from tfdp_utils._tf import IS_KERAS3, KERAS_VERSION, tf
    except ImportError as exc:
        return _report_without_tensorflow(__version__, exc)
    from tfdp_utils.strategy._choice import choose_strategy
    from tfdp_utils.strategy._detect import detect_environment
    from tfdp_utils.strategy._xla import keras_xla

    report: dict[str, Any] = {
        "tfdp_utils": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "tensorflow": tf.__version__,
        "tensorflow_distribution": tensorflow_flavour(),
        "keras": KERAS_VERSION,
        "keras_flavour": "keras3" if IS_KERAS3 else "tf_keras",
        "tf_keras_active": not IS_KERAS3,
        "tensorboard": installed_version("tensorboard"),
        "variables": {name: os.environ[name] for name in ENV_VARIABLES if name in os.environ},
    }
    try:
        env = detect_environment()
        choice = choose_strategy(env)
    except ValueError as exc:
        report.update(strategy=None, reason=f"error: {exc}", devices=None, cluster=None)
        return report
    report.update(
        devices={"gpu": list(env.gpus), "cpu": list(env.cpus), "tpu": list(env.tpus)},
        tpu_hint=env.tpu_hint,
        cluster=env.cluster.as_tf_config() if env.cluster else None,
        cluster_source=env.cluster.source if env.cluster else None,
        strategy=choice.class_name,
        strategy_kind=choice.kind,
        strategy_devices=list(choice.devices),
        reason=choice.reason,
        keras_xla=keras_xla(
            choice.kind, keras3=IS_KERAS3, accelerators=len(env.gpus) + len(env.tpus)
        ),
    )
    return report


def _report_without_tensorflow(version: str, error: ImportError) -> dict[str, Any]:
    """The report when TensorFlow cannot be imported: what is installed, and how to fix it."""
    reason = str(error).strip().splitlines()
    return {
        "tfdp_utils": version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "tensorflow": "not installed",
        "tensorflow_error": reason[-1] if reason else repr(error),
        "tensorflow_distribution": None,
        "keras": installed_version("keras"),
        "keras_flavour": None,
        "tf_keras": installed_version("tf-keras"),
        "tensorboard": installed_version("tensorboard"),
        "variables": {name: os.environ[name] for name in ENV_VARIABLES if name in os.environ},
        "devices": None,
        "cluster": None,
        "strategy": None,
        "reason": "TensorFlow is not installed (or fails to import), so no strategy can be "
        "built. Install it: pip install 'tfdp-utils[cpu]' (tensorflow-cpu) or "
        "'tfdp-utils[tensorflow]', or tensorflow / tensorflow[and-cuda] / tensorflow-tpu "
        "yourself.",
    }


def _format_report(report: dict[str, Any]) -> str:
    lines = ["tfdp-utils environment (paste this into bug reports)", ""]
    order = [
        ("tfdp-utils", "tfdp_utils"),
        ("Python", "python"),
        ("Platform", "platform"),
        ("TensorFlow", "tensorflow"),
        ("TensorFlow distribution", "tensorflow_distribution"),
        ("Keras", "keras"),
        ("Keras flavour", "keras_flavour"),
        ("TensorBoard", "tensorboard"),
    ]
    for label, key in order:
        lines.append(f"- {label}: {report.get(key)}")
    if report.get("tensorflow_error"):
        lines.append(f"- TensorFlow import error: {report['tensorflow_error']}")
    devices = report.get("devices") or {}
    for kind in ("gpu", "cpu", "tpu"):
        names = devices.get(kind) or []
        lines.append(f"- {kind.upper()} devices ({len(names)}): {', '.join(names) or '-'}")
    if report.get("tpu_hint"):
        lines.append(f"- TPU hint: {report['tpu_hint']} (not probed)")
    cluster = report.get("cluster")
    lines.append(
        f"- Cluster: {report.get('cluster_source')} {json.dumps(cluster)}"
        if cluster
        else "- Cluster: none"
    )
    for name, value in report.get("variables", {}).items():
        lines.append(f"- ${name}: {value}")
    lines.append(f"- Strategy auto_strategy() would build: {report.get('strategy')}")
    lines.append(f"- Why: {report.get('reason')}")
    if report.get("keras_xla"):
        lines.append(f"- {report['keras_xla']}")
    return "\n".join(lines)


def _cmd_env(args: argparse.Namespace) -> int:
    report = environment_report()
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(_format_report(report))
    return 0 if report.get("strategy") else 2


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
    """Entry point of the ``tfdp-utils`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError) as exc:
        # Our own argument checks word these for the user: one line, not a traceback.
        # TensorFlow's own errors (tf.errors.*) are not ValueErrors and keep their trace.
        from tfdp_utils._validate import env_flag

        if env_flag(_variables.TRACEBACK):
            raise
        command = getattr(args, "command", None) or "tfdp-utils"
        print(f"tfdp-utils {command}: error: {exc}", file=sys.stderr)
        print("(set TFDP_TRACEBACK=1 for the full traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
