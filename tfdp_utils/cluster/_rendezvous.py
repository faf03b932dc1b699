"""The bounded peer rendezvous: wait for a cluster's other tasks, never forever.

Pure Python (sockets, no TensorFlow). :func:`wait_for_peers` is the bound that
MultiWorkerMirroredStrategy's own constructor lacks (it waits forever for a worker that never
starts); :func:`wait_for_servers` waits for parameter servers; :func:`reachable` is one probe.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Collection

from tfdp_utils._waiting import Deadline, WaitProgress, wait_until
from tfdp_utils.cluster._config import ClusterConfig
from tfdp_utils.errors import ClusterTimeoutError

logger = logging.getLogger("tfdp_utils")


def _bind_host(host: str) -> str:
    """Where to listen for our own address: that interface when it is local, else all."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return ""
    for info in infos:
        candidate = str(info[4][0])
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((candidate, 0))
            return candidate
        except OSError:
            continue
    return ""


UNRESOLVED = "unresolved"
"""What the probes return when the peer's host name does not resolve here."""


def reachable(address: str, timeout: float) -> bool:
    """Whether ``address`` accepts a TCP connection within ``timeout`` seconds."""
    return _connect(address, timeout) == "up"


def _connect(address: str, timeout: float) -> str:
    """``"up"`` when ``address`` accepts a TCP connection within ``timeout`` seconds,
    :data:`UNRESOLVED` when its host name does not resolve, else ``"down"``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=max(timeout, 0.05)):
            return "up"
    except socket.gaierror:
        return UNRESOLVED
    except OSError:
        return "down"


_BANNER = b"tfdp-rendezvous\n"
_HELLO = b"tfdp-hello "


def _probe(address: str, me: str, timeout: float) -> str | None:
    """Contact a peer: ``"rendezvous"`` (it waits for us, and now knows we are here),
    ``"running"`` (its port answers without our banner: TensorFlow's server is up),
    :data:`UNRESOLVED` (its host name does not resolve), or None (nothing answers yet)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection(
            (host.strip("[]"), int(port)), timeout=max(timeout, 0.05)
        ) as s:
            s.settimeout(0.5)
            try:
                banner = s.recv(len(_BANNER))
            except OSError:
                banner = b""
            if banner != _BANNER:
                return "running"
            s.sendall(_HELLO + me.encode() + b"\n")
            return "rendezvous"
    except socket.gaierror:
        return UNRESOLVED
    except OSError:
        return None


class _Listener:
    """Listens on this task's port and records which peers said hello."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.greeted: set[str] = set()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="tfdp-rendezvous", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(1.0)
                    conn.sendall(_BANNER)
                    line = conn.recv(256)
                except OSError:
                    continue
                # Let the peer close first, so TIME_WAIT stays on its side and this port is
                # free for TensorFlow's server straight away.
                with contextlib.suppress(OSError):
                    conn.recv(1)
            if line.startswith(_HELLO):
                with self.lock:
                    self.greeted.add(line[len(_HELLO) :].decode(errors="replace").strip())

    def has_greeted(self, name: str) -> bool:
        with self.lock:
            return name in self.greeted

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2.0)
        self.sock.close()


def _names(
    tasks: list[tuple[str, int, str]], unresolved: Collection[tuple[str, int, str]] = ()
) -> str:
    return ", ".join(
        f"{task_type}:{index} at {address}"
        + (
            " (its host name does not resolve here)"
            if (task_type, index, address) in unresolved
            else ""
        )
        for task_type, index, address in tasks
    )


def _host(address: str) -> str:
    return address.rpartition(":")[0].strip("[]")


def _resolution_note(unresolved: Collection[tuple[str, int, str]]) -> str:
    """A sentence for the timeout error when some peers' host names never resolved."""
    if not unresolved:
        return ""
    hosts = ", ".join(sorted({repr(_host(task[2])) for task in unresolved}))
    return (
        f" The host name(s) {hosts} did not resolve here at all (socket.getaddrinfo "
        "failed): check them for typos in the cluster spec (TF_CONFIG, the SLURM host list) "
        "and that this machine's DNS or /etc/hosts knows them."
    )


def _within(timeout: float, deadline: Deadline, called_at: float | None, caller: str) -> str:
    """ "within 8 s", and, given when the user's call began, where the wait sat in it."""
    if called_at is None:
        return f"within {timeout:g} s"
    began = deadline.start - called_at
    total = deadline.elapsed() + began
    return (
        f"within {timeout:g} s of waiting (the wait began {began:.0f} s after {caller} was "
        f"called, once TensorFlow was imported and set up; {total:.0f} s in all)"
    )


def _warn_unresolved(
    tasks: Collection[tuple[str, int, str]], source: str, timeout: float, warned: set[str]
) -> None:
    """Say once per host, at once, that a peer's host name does not resolve."""
    for task_type, index, address in tasks:
        host = _host(address)
        if host in warned:
            continue
        warned.add(host)
        logger.warning(
            "tfdp_utils: the host name %r of %s:%d (%s cluster) does not resolve here "
            "(socket.getaddrinfo failed). Waiting for it anyway, up to %g s, since a task's "
            "name can appear only once the task starts (Kubernetes); if it is misspelled, "
            "fix the cluster spec.",
            host,
            task_type,
            index,
            source,
            timeout,
        )


def _listen(own: str, me: str) -> _Listener:
    """Listen on this task's own address, where peers say hello until TensorFlow takes it.

    Raises:
        OSError: when another program holds the port.
    """
    host, _, port = own.rpartition(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((_bind_host(host.strip("[]")), int(port)))
    except OSError as exc:
        sock.close()
        raise OSError(
            f"cannot listen on this task's address {own} ({me}): {exc}. Another program holds "
            "the port; free it or give this task another port in the cluster spec."
        ) from exc
    sock.listen(64)
    return _Listener(sock)


class _PeerProbes:
    """Rounds of probes to the peers: what each answered, whose host name does not resolve,
    and who is still pending (not found, or waiting for our hello)."""

    def __init__(
        self,
        peers: list[tuple[str, int, str]],
        *,
        me: str,
        listener: _Listener,
        deadline: Deadline,
        source: str,
        timeout: float,
    ) -> None:
        self.peers = peers
        self.me = me
        self.listener = listener
        self.deadline = deadline
        self.source = source
        self.timeout = timeout
        self.state: dict[tuple[str, int, str], str | None] = {task: None for task in peers}
        self.unresolved: set[tuple[str, int, str]] = set()
        self.warned: set[str] = set()
        self.pending = list(peers)

    def all_joined(self) -> bool:
        """One round: probe each peer not found yet; True once no peer is pending."""
        for task in self.peers:
            if self.state[task] is None:
                found = _probe(task[2], self.me, self.deadline.slice(1.0, 0.05))
                if found == UNRESOLVED:
                    self.unresolved.add(task)
                else:
                    self.unresolved.discard(task)
                    self.state[task] = found
        _warn_unresolved(self.unresolved, self.source, self.timeout, self.warned)
        self.pending = [
            task
            for task in self.peers
            if self.state[task] is None
            or (
                self.state[task] == "rendezvous"
                and not self.listener.has_greeted(f"{task[0]}:{task[1]}")
            )
        ]
        return not self.pending


def wait_for_peers(
    config: ClusterConfig,
    *,
    timeout: float,
    poll_interval: float = 0.2,
    timeout_variable: str = "cluster_timeout",
    called_at: float | None = None,
    caller: str = "auto_strategy()",
) -> float:
    """Block until every other training task has started, at most ``timeout`` seconds.

    A small rendezvous on each task's own port: every task listens there, contacts every peer,
    and returns once it has reached each peer and each peer still waiting has reached it. The
    listener is closed before returning, so TensorFlow's server can bind the port next; a peer
    whose TensorFlow server already answers counts as started. Returns the seconds waited.

    A peer whose host name does not resolve is named at once (a WARNING), in each progress line
    and in the timeout error, but still waited for: on Kubernetes a task's name can appear only
    once the task runs.

    Args:
        config: the cluster and this task's place in it.
        timeout: seconds to wait, counted from this call.
        poll_interval: seconds between rounds of probes. Defaults to `0.2`.
        timeout_variable: the argument the messages say changes the bound. Defaults to
            `"cluster_timeout"`.
        called_at: when the user's call began (``time.monotonic()``), so the timeout error can
            say how long that call had run before this wait. Defaults to `None`.
        caller: the user's call, for that sentence. Defaults to `"auto_strategy()"`.

    Raises:
        ClusterTimeoutError: naming each task that never answered and how to wait longer.
        OSError: when this task's own port is taken by another program.
    """
    deadline = Deadline(timeout)
    own = config.address
    me = f"{config.task_type}:{config.task_index}"
    peers = [task for task in config.training_tasks if task[2] != own]
    listener = _listen(own, me)
    probes = _PeerProbes(
        peers, me=me, listener=listener, deadline=deadline, source=config.source, timeout=timeout
    )
    progress = WaitProgress(
        lambda: (
            f"{len(probes.pending)} peer task(s) to join the {config.source} cluster: "
            + _names(probes.pending, probes.unresolved)
        ),
        bound=timeout,
        change=f"auto_strategy({timeout_variable}=SECONDS) or TFDP_CLUSTER_TIMEOUT",
    )

    def timeout_error() -> ClusterTimeoutError:
        pending, unresolved = probes.pending, probes.unresolved
        return ClusterTimeoutError(
            f"{len(pending)} of {len(peers)} peer task(s) did not join the "
            f"{config.source} cluster {_within(timeout, deadline, called_at, caller)}: "
            f"{_names(pending, unresolved)}. "
            f"This task is {me} at {own}.{_resolution_note(unresolved)} Check that every task "
            "was started and that the addresses are reachable from here, or wait longer with "
            f"auto_strategy({timeout_variable}=SECONDS) or the TFDP_CLUSTER_TIMEOUT "
            "environment variable.",
            missing=pending,
            timeout=timeout,
        )

    try:
        waited = wait_until(
            probes.all_joined,
            deadline=deadline,
            progress=progress,
            timeout_error=timeout_error,
            poll_interval=poll_interval,
        )
    finally:
        listener.close()
    logger.debug("all %d peer(s) started after %.2f s", len(peers), waited)
    return waited


def wait_for_servers(
    config: ClusterConfig,
    *,
    timeout: float,
    poll_interval: float = 0.2,
    called_at: float | None = None,
    caller: str = "auto_strategy()",
) -> float:
    """Block until every ``worker`` and ``ps`` server of a parameter-server cluster accepts
    connections, at most ``timeout`` seconds. Returns the seconds waited.

    ``called_at`` and ``caller`` are as for :func:`wait_for_peers`; a server whose host name
    does not resolve is named the same way.

    Raises:
        ClusterTimeoutError: naming each server that never answered and how to wait longer.
    """
    deadline = Deadline(timeout)
    servers = [
        (task_type, index, address)
        for task_type in ("worker", "ps")
        for index, address in enumerate(config.cluster.get(task_type, ()))
    ]
    pending = list(servers)
    unresolved: set[tuple[str, int, str]] = set()
    warned: set[str] = set()
    progress = WaitProgress(
        lambda: (
            f"{len(pending)} parameter-server cluster task(s) to serve: "
            + _names(pending, unresolved)
        ),
        bound=timeout,
        change="auto_strategy(cluster_timeout=SECONDS) or TFDP_CLUSTER_TIMEOUT",
    )

    def serves(task: tuple[str, int, str]) -> bool:
        found = _connect(task[2], deadline.slice(1.0, 0.05))
        if found == UNRESOLVED:
            unresolved.add(task)
        else:
            unresolved.discard(task)
        return found == "up"

    def all_serve() -> bool:
        nonlocal pending
        pending = [task for task in pending if not serves(task)]
        _warn_unresolved(unresolved, config.source, timeout, warned)
        return not pending

    def timeout_error() -> ClusterTimeoutError:
        within = _within(timeout, deadline, called_at, caller)
        return ClusterTimeoutError(
            f"{len(pending)} of {len(servers)} server task(s) of the {config.source} "
            f"parameter-server cluster did not answer {within}: "
            f"{_names(pending, unresolved)}.{_resolution_note(unresolved)} Check "
            "that those tasks run tfdp_utils.run_server() and are reachable from here, or "
            "wait longer with auto_strategy(cluster_timeout=SECONDS) or the "
            "TFDP_CLUSTER_TIMEOUT environment variable.",
            missing=pending,
            timeout=timeout,
        )

    return wait_until(
        all_serve,
        deadline=deadline,
        progress=progress,
        timeout_error=timeout_error,
        poll_interval=poll_interval,
    )
