"""Does an address answer as a gRPC server? One bounded HTTP/2 handshake. Pure (sockets).

A TCP connection that is accepted says little: a port held by a hung process, a proxy with
nothing behind it, or a listener of another protocol accepts too, and TensorFlow's own first
call to such a TPU worker (``experimental_connect_to_cluster``) then waits with no bound.
A gRPC server answers the HTTP/2 client preface with a SETTINGS frame at once, so sending the
preface and waiting ``timeout`` seconds for that frame tells a worker that will answer from
one that never will, before TensorFlow is handed the address.
"""

from __future__ import annotations

import socket
import time
from typing import Literal

HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""The client connection preface of HTTP/2 (RFC 9113, section 3.4)."""

EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""A SETTINGS frame with no settings: length 0, type 0x4, no flags, stream 0."""

SETTINGS_TYPE = 0x4

Answer = Literal["grpc", "down", "unresolved", "silent", "closed", "other"]
"""``grpc``: answered with an HTTP/2 SETTINGS frame. ``down``: no connection. ``unresolved``:
the host name does not resolve. ``silent``: accepted, then no answer in time. ``closed``:
accepted, then closed without a frame. ``other``: answered, not with HTTP/2."""


def grpc_answer(address: str, timeout: float) -> Answer:
    """How ``address`` (``host:port``) answers an HTTP/2 client preface within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    host, _, port = address.rpartition(":")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=max(timeout, 0.05))
    except socket.gaierror:
        return "unresolved"
    except (OSError, ValueError):
        return "down"
    with sock:
        header = b""
        try:
            sock.sendall(HTTP2_PREFACE + EMPTY_SETTINGS)
            while len(header) < 9:
                sock.settimeout(max(deadline - time.monotonic(), 0.01))
                chunk = sock.recv(9 - len(header))
                if not chunk:
                    return "closed"
                header += chunk
        except TimeoutError:
            return "silent"
        except OSError:
            return "closed"
    return "grpc" if header[3] == SETTINGS_TYPE else "other"


def describe(answer: Answer, address: str, timeout: float) -> str:
    """What ``answer`` means for a TPU worker at ``address``, in a sentence's words."""
    return {
        "grpc": f"TPU worker {address} answered as a gRPC server",
        "down": f"TPU worker {address} did not accept a connection (refused, or no answer "
        f"within probe_timeout={timeout:g} s)",
        "unresolved": f"TPU worker {address}: its host name does not resolve here",
        "silent": f"TPU worker {address} accepted a connection but did not answer as a gRPC "
        f"server within probe_timeout={timeout:g} s (TensorFlow would wait for it forever)",
        "closed": f"TPU worker {address} closed the connection without answering as a gRPC server",
        "other": f"TPU worker {address} answered, but not as a gRPC (HTTP/2) server",
    }[answer]
