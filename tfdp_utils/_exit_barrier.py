"""The workers of a multi-worker job leave together: a bounded barrier at interpreter exit.

Pure standard library; TensorFlow is reached only through the injected store. What it is for
(TF 2.21): finished two-worker jobs were reported to die by SIGABRT after their last output
line (``terminate called after throwing an instance of ...`` / ``FATAL: exception not
rethrown``) in about 1 of 15 jobs, each time with the workers ending more than ~4 s apart. A
worker that exits after its peers tears down with TensorFlow's coordination-service agent still
running (nothing shuts it down: the server that owns it is never destroyed) and already failed
over their absence: its heartbeat to the leader fails, or the leader's service declares the
early worker unhealthy, and either error aborts the collective executor before or while the
late worker tears down. Workers that end together (CI's unskewed repeat) have not shown the
abort. So they end together: on a clean exit every worker marks ``tfdp/exit/<rank>`` in the
coordination service's key-value store and waits for every other worker's mark, and all of
them then tear down while their peers are alive (``benchmarks/README.md``, "Exit skew").

The wait is bounded so an exit never hangs on a peer:

* a peer whose server no longer accepts TCP connections (it crashed, was killed, or exited
  without the barrier) is not waited for; each unmarked peer is probed about once a second;
* when the service itself is gone (the leader, rank 0, has exited), the wait ends at once;
* after :data:`DEFAULT_BOUND` seconds (``TFDP_EXIT_BARRIER`` changes it, ``0`` turns the
  barrier off) the worker leaves with a warning that names the workers it did not see.

Only clean exits wait: after an uncaught error or Ctrl-C (the exit guard's status) a worker
leaves at once, and its peers see its port close. An exit made on purpose through
:func:`tfdp_utils._exit_guard.exit_within` (a preemption) ends the process before this runs.
Installed by :func:`tfdp_utils.auto_strategy` as the ``exit-barrier`` change of
:mod:`tfdp_utils.compat` when it builds MultiWorkerMirroredStrategy over two or more workers.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

from tfdp_utils import _variables
from tfdp_utils._validate import env_seconds, is_off_word

logger = logging.getLogger("tfdp_utils")

DEFAULT_BOUND = 60.0
"""Seconds a worker waits at exit for peers that are alive but have not reached their exit."""

KEY_PREFIX = "tfdp/exit"
"""Coordination-service keys ``tfdp/exit/<rank>`` mark the workers that reached their exit."""

SLICE_MS = 200
"""Milliseconds of one blocking read of a peer's mark (the peers' probes run between reads)."""

PROBE_EVERY = 1.0
"""Seconds between two probes of the same unmarked peer's port."""

PROBE_TIMEOUT = 0.5
"""Seconds one probe waits for a TCP connection."""

Outcome = Literal["all", "gone", "service", "bound"]
"""How a wait ended: every peer marked (``"all"``); every peer marked or gone, at least one
gone (``"gone"``); the coordination service stopped answering (``"service"``); the bound."""


class Store(Protocol):
    """The two operations of TensorFlow's coordination-service key-value store used here."""

    def set(self, key: str, value: str) -> None:
        """Set ``key``; raise if it is set already or the service does not answer."""

    def get(self, key: str, timeout_ms: int) -> str | None:
        """``key``'s value, None when it is not set within ``timeout_ms``; raise when the
        service does not answer."""


def bound(environ: Mapping[str, str] | None = None) -> float | None:
    """The barrier's bound: ``TFDP_EXIT_BARRIER`` or :data:`DEFAULT_BOUND`; None when off.

    Raises:
        ValueError: a value that is not a number of seconds, or a negative one.
    """
    source = os.environ if environ is None else environ
    name = _variables.EXIT_BARRIER
    text = source.get(name, "").strip()
    if not text:
        return DEFAULT_BOUND
    if is_off_word(text):
        return None
    seconds = env_seconds(name, text, example=DEFAULT_BOUND)
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(
            f"{name} must be a finite number of seconds >= 0, but received {name}={text!r}. "
            f"Set it to e.g. {DEFAULT_BOUND:g}, or 0 to let each worker exit on its own."
        )
    return seconds or None


def port_open(address: str, timeout: float = PROBE_TIMEOUT) -> bool | None:
    """Whether ``address`` (``host:port``) accepts a TCP connection: True, False when refused
    (nothing listens: the process is gone), None when unknown (no answer, or no such host)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except ConnectionRefusedError:
        return False
    except (OSError, ValueError):
        return None


def wait_for_peers(
    store: Store,
    *,
    rank: int,
    addresses: Sequence[str],
    seconds: float,
    probe: Callable[[str], bool | None] = port_open,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Outcome, list[int]]:
    """Mark ``rank``'s exit and wait up to ``seconds`` for every other worker's mark.

    Args:
        store: the coordination service's key-value store.
        rank: this worker's rank among the training tasks (the leader is rank 0).
        addresses: every training task's ``host:port``, by rank.
        seconds: the bound.
        probe: tells whether a peer's server still listens (False: it is gone).
        clock: monotonic seconds.

    Returns:
        How the wait ended, and the ranks not seen (gone, or unmarked at the bound).
    """
    deadline = clock() + seconds
    try:
        store.set(f"{KEY_PREFIX}/{rank}", "1")
    except Exception as error:  # the leader has exited (or crashed): nobody to wait with
        logger.debug("tfdp_utils: exit barrier: cannot mark this worker's exit: %s", error)
        return "service", [r for r in range(len(addresses)) if r != rank]
    pending = [r for r in range(len(addresses)) if r != rank]
    gone: list[int] = []
    probed: dict[int, float] = {}
    turn = 0
    while pending:  # round robin: one blocking read per unmarked peer in turn
        peer = pending[turn % len(pending)]
        now = clock()
        if now >= deadline:
            return "bound", sorted(pending + gone)
        if now - probed.get(peer, -PROBE_EVERY) >= PROBE_EVERY:
            probed[peer] = now
            if probe(addresses[peer]) is False:
                gone.append(peer)
                pending.remove(peer)
                continue
        wait_ms = max(1, min(SLICE_MS, int((deadline - now) * 1000)))
        try:
            value = store.get(f"{KEY_PREFIX}/{peer}", wait_ms)
        except Exception as error:  # the service is gone: the leader has left
            logger.debug("tfdp_utils: exit barrier: the service stopped answering: %s", error)
            return "service", sorted(pending + gone)
        if value is not None:
            pending.remove(peer)
        else:
            turn += 1
    return ("gone" if gone else "all"), gone


def clean_exit() -> bool:
    """Whether the process is ending without an uncaught error or Ctrl-C (per the exit guard,
    and ``sys.last_*`` for a guard that is off or whose hook another replaced)."""
    from tfdp_utils import _exit_guard

    if _exit_guard._status is not None or _exit_guard.INTERRUPTED:
        return False
    return getattr(sys, "last_value", None) is None and getattr(sys, "last_exc", None) is None


class ExitBarrier:
    """One process's barrier: what it waits with, installed as an ``atexit`` handler.

    Args:
        store: the coordination service's key-value store.
        rank: this worker's rank among the training tasks.
        addresses: every training task's ``host:port``, by rank.
        seconds: the bound.
        before: called first at exit (stops the collective watchdog, whose helper threads
            use the same service).
        probe: tells whether a peer's server still listens. Defaults to :func:`port_open`.
    """

    def __init__(
        self,
        store: Store,
        *,
        rank: int,
        addresses: Sequence[str],
        seconds: float,
        before: Callable[[], Any] | None = None,
        probe: Callable[[str], bool | None] = port_open,
    ) -> None:
        self.store, self.rank, self.addresses = store, rank, tuple(addresses)
        self.seconds, self.before, self.probe = seconds, before, probe
        self.active = True
        self.outcome: tuple[Outcome, list[int]] | None = None
        self.times: dict[str, float] = {}
        """``time.time()`` when the handler began, marked... (for tests and the benchmark)."""

    def __call__(self) -> None:
        """The ``atexit`` handler: wait on a clean exit of the main thread, else return."""
        if not self.active or threading.current_thread() is not threading.main_thread():
            return
        self.active = False
        if not clean_exit():
            return
        self.times["began"] = time.time()
        try:
            if self.before is not None:
                self.before()
            self.times["waits"] = time.time()
            started = time.monotonic()
            self.outcome = wait_for_peers(
                self.store,
                rank=self.rank,
                addresses=self.addresses,
                seconds=self.seconds,
                probe=self.probe,
            )
        except KeyboardInterrupt:  # Ctrl-C while waiting: leave now
            return
        except Exception as error:  # the barrier must never break an exit
            logger.debug("tfdp_utils: exit barrier failed: %s", error)
            return
        self.times["left"] = time.time()
        how, missing = self.outcome
        if how == "bound":
            names = ", ".join(str(rank) for rank in missing)
            logger.warning(
                "tfdp_utils: worker(s) %s did not reach their exit within %g s of this one's "
                "(%s); exiting without them.",
                names,
                time.monotonic() - started,
                _variables.EXIT_BARRIER,
            )

    def undo(self) -> None:
        """Take the handler back out (the registry's undo)."""
        self.active = False
        atexit.unregister(self)

    def installed(self) -> bool:
        return self.active

    def describe(self) -> str:
        return "atexit handler (exit barrier)"


def install(
    store: Store,
    *,
    rank: int,
    addresses: Sequence[str],
    seconds: float,
    before: Callable[[], Any] | None = None,
) -> ExitBarrier:
    """Register a new :class:`ExitBarrier` with ``atexit`` and return it."""
    barrier = ExitBarrier(store, rank=rank, addresses=addresses, seconds=seconds, before=before)
    atexit.register(barrier)
    return barrier
