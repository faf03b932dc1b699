"""grpc_answer: one bounded HTTP/2 handshake tells a TPU worker that answers from one that never
will. Servers here are sockets on 127.0.0.1, each playing one kind of peer."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tfdp_utils.cluster._grpc_probe import EMPTY_SETTINGS, HTTP2_PREFACE, describe, grpc_answer

pytestmark = pytest.mark.pure


@contextlib.contextmanager
def peer(serve: Callable[[socket.socket], None]) -> Iterator[str]:
    """A listener on 127.0.0.1 whose accepted connections are handed to ``serve``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            held.append(conn)
            serve(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        thread.join(2)
        for conn in held:
            conn.close()


def _grpc(conn: socket.socket) -> None:
    preface = conn.recv(len(HTTP2_PREFACE))
    assert preface == HTTP2_PREFACE
    conn.sendall(EMPTY_SETTINGS)


def _silent(conn: socket.socket) -> None:
    return None  # accepted, kept open, never answered


def _closes(conn: socket.socket) -> None:
    conn.close()


def _http1(conn: socket.socket) -> None:
    conn.recv(64)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")


@pytest.mark.parametrize(
    ("serve", "expected"),
    [(_grpc, "grpc"), (_silent, "silent"), (_closes, "closed"), (_http1, "other")],
)
def test_each_kind_of_peer(serve: Callable[[socket.socket], None], expected: str) -> None:
    with peer(serve) as address:
        assert grpc_answer(address, timeout=1.0) == expected


def test_a_silent_peer_is_given_up_on_at_the_timeout() -> None:
    with peer(_silent) as address:
        started = time.monotonic()
        assert grpc_answer(address, timeout=0.3) == "silent"
        assert 0.25 <= time.monotonic() - started < 2.0
    message = describe("silent", address, 0.3)
    assert f"TPU worker {address} accepted a connection but did not answer" in message
    assert "probe_timeout=0.3 s" in message


def test_nothing_listening_is_down() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening: refused
        assert grpc_answer(address, timeout=1.0) == "down"
    assert "did not accept a connection (refused, or no answer within probe_timeout=1 s)" in (
        describe("down", address, 1)
    )
