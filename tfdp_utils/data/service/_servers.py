"""``tfdp-utils data-service dispatcher|worker``: start tf.data service servers.

Importing this module imports no TensorFlow (``tfdp-utils --help`` stays fast); the commands
import it when they run. The servers are TensorFlow's own
(``tf.data.experimental.service.DispatchServer`` / ``WorkerServer``); this module adds
arguments checked at the boundary, a bounded wait for the dispatcher, the address to pass
to ``build_distributed_dataset(service=...)`` and the security warning.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import time
from typing import Any

from tfdp_utils._validate import directory_path, positive_float, positive_int
from tfdp_utils._waiting import Deadline, WaitProgress, wait_until

logger = logging.getLogger("tfdp_utils")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_DISPATCHER_PORT = 5050
DEFAULT_DISPATCHER_TIMEOUT = 300.0

SECURITY_WARNING = (
    "WARNING: the tf.data service is unauthenticated and unencrypted (like TensorFlow's "
    "cluster gRPC): anyone who can reach its ports can register workers, read the datasets "
    "and run their graphs. TensorFlow's servers listen on every network interface (they have "
    "no bind-address option); --host only sets the address this server gives to others. "
    "Keep the ports on a private network or behind a firewall."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``data-service`` subcommands and their options."""
    sub = parser.add_subparsers(dest="role", required=True)
    dispatcher = sub.add_parser(
        "dispatcher", help="start a dispatcher (trainers pass its address as service=)"
    )
    dispatcher.add_argument(
        "--port", type=int, default=DEFAULT_DISPATCHER_PORT, help="port (default: %(default)s)"
    )
    dispatcher.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help="the address trainers and workers reach this machine at (default: %(default)s)",
    )
    dispatcher.add_argument(
        "--work-dir",
        default=None,
        help="journal the dispatcher's state here, so a restarted dispatcher resumes its jobs "
        "(fault tolerance; default: none)",
    )
    dispatcher.add_argument(
        "--worker-timeout",
        type=float,
        default=None,
        help="seconds without a heartbeat before a worker counts as gone (default: TensorFlow's)",
    )
    worker = sub.add_parser("worker", help="start a worker that reads and maps for trainers")
    worker.add_argument(
        "--dispatcher", required=True, help="the dispatcher's host:port (or grpc://host:port)"
    )
    worker.add_argument("--port", type=int, default=0, help="port (default: any free port)")
    worker.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help="the address trainers reach this worker at (default: %(default)s)",
    )
    worker.add_argument(
        "--dispatcher-timeout",
        type=float,
        default=DEFAULT_DISPATCHER_TIMEOUT,
        help="seconds to wait for the dispatcher to answer (default: %(default)s)",
    )
    parser.set_defaults(func=run_from_args)


def _port(value: Any, name: str, *, allow_any: bool) -> int:
    port = positive_int(value, name, minimum=0 if allow_any else 1, hint="Pass e.g. --port 5050.")
    if port > 65535:
        raise ValueError(f"{name} must be at most 65535, but received {name}={port}.")
    return port


def _host(value: Any) -> str:
    host = str(value).strip()
    if not host or any(c in host for c in "/ ") or (":" in host and not host.startswith("[")):
        raise ValueError(
            f"--host must be a host name or IP address, but received {value!r}. Pass e.g. "
            "--host 10.0.0.5 (the address others reach this machine at)."
        )
    return host


def dispatcher_address(value: Any) -> tuple[str, int]:
    """``(host, port)`` from ``host:port`` or ``grpc://host:port``, or a clear error."""
    raw = str(value).strip()
    rest = raw.split("://", 1)[1] if "://" in raw else raw
    host, colon, port = rest.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"--dispatcher must be host:port, but received {value!r}. Pass the address "
            "`tfdp-utils data-service dispatcher` printed, e.g. --dispatcher 10.0.0.5:5050."
        )
    return host, int(port)


def wait_for_port(host: str, port: int, timeout: float, what: str, change: str) -> None:
    """Return once ``host:port`` accepts a TCP connection; ``TimeoutError`` after ``timeout``."""

    def accepts() -> bool:
        try:
            with socket.create_connection((host, port), timeout=2.0):
                return True
        except OSError:
            return False

    wait_until(
        accepts,
        deadline=Deadline(timeout),
        progress=WaitProgress(f"{what} at {host}:{port}", bound=timeout, change=change),
        timeout_error=lambda: TimeoutError(
            f"{what} at {host}:{port} did not answer within {timeout:g} s (change it with "
            f"{change}). Start it first, or check the address."
        ),
        poll_interval=0.5,
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Start the server the arguments describe and serve until interrupted."""
    if args.role == "dispatcher":
        return _run_dispatcher(args)
    return _run_worker(args)


def _serve(server: Any) -> int:
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        server.stop()
        print("stopped", file=sys.stderr)
        return 0


def _run_dispatcher(args: argparse.Namespace) -> int:
    port = _port(args.port, "--port", allow_any=True)
    host = _host(args.host)
    if args.work_dir is not None:
        # TensorFlow would find out only after ~25 s of retries, with a raw error.
        directory_path(args.work_dir, "--work-dir", example="dispatcher-journal")
    timeout_ms = None
    if args.worker_timeout is not None:
        seconds = positive_float(args.worker_timeout, "--worker-timeout", unit="number of seconds")
        timeout_ms = int(seconds * 1000)
    from tfdp_utils._tf import tf

    service = tf.data.experimental.service
    config = service.DispatcherConfig(
        port=port,
        work_dir=args.work_dir,
        fault_tolerant_mode=args.work_dir is not None,
        worker_timeout_ms=timeout_ms,
    )
    server = service.DispatchServer(config)
    bound = int(server.target.rsplit(":", 1)[1])
    print(SECURITY_WARNING, file=sys.stderr, flush=True)
    print(
        f"tf.data service dispatcher on port {bound}: pass service='grpc://{host}:{bound}' to "
        f"build_distributed_dataset, and start workers with `tfdp-utils data-service worker "
        f"--dispatcher {host}:{bound}`",
        flush=True,
    )
    return _serve(server)


def _run_worker(args: argparse.Namespace) -> int:
    port = _port(args.port, "--port", allow_any=True)
    host = _host(args.host)
    dispatcher_host, dispatcher_port = dispatcher_address(args.dispatcher)
    timeout = positive_float(
        args.dispatcher_timeout, "--dispatcher-timeout", unit="number of seconds"
    )
    try:
        wait_for_port(
            dispatcher_host,
            dispatcher_port,
            timeout,
            "the tf.data service dispatcher",
            "--dispatcher-timeout SECONDS",
        )
    except TimeoutError as exc:
        print(f"tfdp-utils data-service worker: error: {exc}", file=sys.stderr)
        return 1
    from tfdp_utils._tf import tf

    service = tf.data.experimental.service
    config = service.WorkerConfig(
        dispatcher_address=f"{dispatcher_host}:{dispatcher_port}",
        worker_address=f"{host}:%port%",
        port=port,
        dispatcher_timeout_ms=int(timeout * 1000),
    )
    server = service.WorkerServer(config)
    bound = int(server._address.rsplit(":", 1)[1])
    print(SECURITY_WARNING, file=sys.stderr, flush=True)
    print(
        f"tf.data service worker on port {bound} (reached at {host}:{bound}), registered with "
        f"the dispatcher at {dispatcher_host}:{dispatcher_port}",
        flush=True,
    )
    return _serve(server)
