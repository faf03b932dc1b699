"""The rendezvous' pieces on real sockets on 127.0.0.1: a probe, the greeting, the server wait.

Pure (sockets, no TensorFlow). Every wait here has a bound of a second or less; the full
peer rendezvous between tasks is in test_cluster_config.py.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from support.processes import free_port

from tfdp_utils.cluster._config import validate_cluster
from tfdp_utils.cluster._rendezvous import (
    _Listener,
    _names,
    _probe,
    reachable,
    wait_for_servers,
)
from tfdp_utils.errors import ClusterTimeoutError

pytestmark = pytest.mark.pure


@contextlib.contextmanager
def listening() -> Iterator[tuple[socket.socket, str]]:
    """A socket that accepts connections (the kernel's backlog) and never says anything."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock, f"127.0.0.1:{sock.getsockname()[1]}"


@contextlib.contextmanager
def rendezvous_peer() -> Iterator[tuple[str, _Listener]]:
    """A peer waiting in its rendezvous: its address and its (real) listener."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    listener = _Listener(sock)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}", listener
    finally:
        listener.close()


def eventually(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize(
    ("tasks", "expected"),
    [
        ([], ""),
        ([("worker", 1, "10.0.0.2:2222")], "worker:1 at 10.0.0.2:2222"),
        (
            [("chief", 0, "c:1"), ("ps", 2, "[::1]:9")],
            "chief:0 at c:1, ps:2 at [::1]:9",
        ),
    ],
)
def test_names_of_tasks(tasks: list[tuple[str, int, str]], expected: str) -> None:
    assert _names(tasks) == expected


# ---------------------------------------------------------------------------- reachable


def test_a_listening_address_is_reachable() -> None:
    with listening() as (_, address):
        assert reachable(address, 0.5) is True


def test_a_closed_port_is_not_reachable() -> None:
    assert reachable(f"127.0.0.1:{free_port()}", 0.2) is False


# --------------------------------------------------------------------- probe and greeting


def test_a_port_that_answers_without_the_banner_is_a_running_server() -> None:
    # TensorFlow's gRPC server is up there: the peer started before us and is past its wait.
    with listening() as (_, address):
        assert _probe(address, "worker:0", 0.5) == "running"


def test_nobody_listening_is_no_answer() -> None:
    assert _probe(f"127.0.0.1:{free_port()}", "worker:0", 0.2) is None


def test_a_waiting_peer_is_greeted_and_remembers_who_said_hello() -> None:
    with rendezvous_peer() as (address, listener):
        assert not listener.has_greeted("worker:1")
        assert _probe(address, "worker:1", 0.5) == "rendezvous"
        assert eventually(lambda: listener.has_greeted("worker:1"))
        assert not listener.has_greeted("worker:2")


def test_a_closed_listener_frees_its_port() -> None:
    with rendezvous_peer() as (address, _):
        port = int(address.rpartition(":")[2])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# ------------------------------------------------------------------- wait_for_servers


def test_servers_that_listen_end_the_wait_at_once() -> None:
    with listening() as (_, worker), listening() as (_, ps):
        config = validate_cluster({"worker": [worker], "ps": [ps]}, "worker", 0)
        waited = wait_for_servers(config, timeout=5, poll_interval=0.05)
    assert 0 <= waited < 5


def test_a_server_that_starts_late_is_waited_for() -> None:
    port = free_port()
    with listening() as (_, ps):
        late = socket.socket()

        def start() -> None:
            time.sleep(0.3)
            late.bind(("127.0.0.1", port))
            late.listen(8)

        thread = threading.Thread(target=start)
        thread.start()
        try:
            config = validate_cluster({"worker": [f"127.0.0.1:{port}"], "ps": [ps]}, "worker", 0)
            waited = wait_for_servers(config, timeout=10, poll_interval=0.05)
        finally:
            thread.join(5)
            late.close()
    assert waited >= 0.2  # the second timer: it did wait for the late server


def test_a_missing_server_ends_the_wait_at_the_bound_naming_it_and_the_fix() -> None:
    missing = f"127.0.0.1:{free_port()}"
    with listening() as (_, worker):
        config = validate_cluster({"worker": [worker], "ps": [missing]}, "worker", 0)
        with pytest.raises(ClusterTimeoutError) as info:
            wait_for_servers(config, timeout=0.5, poll_interval=0.05)
    error = info.value
    assert isinstance(error, TimeoutError)
    assert error.missing == (("ps", 0, missing),)
    assert error.timeout == 0.5
    message = str(error)
    assert message.startswith(
        "1 of 2 server task(s) of the TF_CONFIG parameter-server cluster did not answer "
        f"within 0.5 s: ps:0 at {missing}."
    )
    assert "run tfdp_utils.run_server()" in message
    assert "auto_strategy(cluster_timeout=SECONDS)" in message
    assert "TFDP_CLUSTER_TIMEOUT" in message


UNRESOLVABLE = "nodex.invalid"  # RFC 2606: a .invalid name never resolves


def test_a_peer_whose_host_name_does_not_resolve_is_named_at_once_and_in_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before: such a peer was waited on for the whole bound, and the error did not say why.
    from tfdp_utils.cluster._rendezvous import wait_for_peers

    spec = {"worker": [f"127.0.0.1:{free_port()}", f"{UNRESOLVABLE}:2222"]}
    config = validate_cluster(spec, "worker", 0)
    with (
        caplog.at_level("WARNING", logger="tfdp_utils"),
        pytest.raises(ClusterTimeoutError) as info,
    ):
        wait_for_peers(config, timeout=0.5, poll_interval=0.05)
    # A WARNING of its own, not the progress line (which comes every 30 s).
    warnings = [r.getMessage() for r in caplog.records if UNRESOLVABLE in r.getMessage()]
    assert warnings and "still waiting" not in warnings[0], warnings
    assert "does not resolve here" in warnings[0] and "worker:1" in warnings[0]
    message = str(info.value)
    assert f"worker:1 at {UNRESOLVABLE}:2222 (its host name does not resolve here)" in message
    assert f"The host name(s) '{UNRESOLVABLE}' did not resolve here at all" in message


def test_a_server_whose_host_name_does_not_resolve_is_named_in_the_error() -> None:
    spec = {
        "chief": [f"127.0.0.1:{free_port()}"],
        "worker": [f"{UNRESOLVABLE}:2222"],
        "ps": [f"127.0.0.1:{free_port()}"],
    }
    with pytest.raises(ClusterTimeoutError) as info:
        wait_for_servers(validate_cluster(spec, "chief", 0), timeout=0.3, poll_interval=0.05)
    message = str(info.value)
    assert f"worker:0 at {UNRESOLVABLE}:2222 (its host name does not resolve here)" in message
    assert "ps:0 at 127.0.0.1:" in message and message.count("does not resolve here") == 1


def test_the_timeout_error_says_how_long_the_users_call_had_run_before_the_wait() -> None:
    # Before: "within 8 s" for an error that came 50 s after auto_strategy() was called.
    from tfdp_utils.cluster._rendezvous import wait_for_peers

    spec = {"worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]}
    called_at = time.monotonic() - 40.0  # as if TensorFlow's import had taken 40 s
    with pytest.raises(ClusterTimeoutError) as info:
        wait_for_peers(validate_cluster(spec, "worker", 0), timeout=0.5, called_at=called_at)
    in_all = time.monotonic() - called_at  # a second timer, around the whole "call"
    message = str(info.value)
    assert "within 0.5 s of waiting (the wait began 40 s after auto_strategy() was called" in (
        message
    )
    reported = float(message.split("; ")[1].split(" s in all")[0])
    assert abs(reported - in_all) <= 1.0, (reported, in_all)
