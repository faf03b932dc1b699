"""Free ports on 127.0.0.1 for the repeat scripts' localhost clusters (shared by crash_repeat.py
and exit_repeat.py, which run as scripts and import it from their own folder)."""

from __future__ import annotations

import socket
import threading

_GIVEN_PORTS: set[int] = set()
_PORTS_LOCK = threading.Lock()


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1, none given before by this process (runs go
    on in threads at once; the kernel may hand a port just released out again, and a
    TF_CONFIG holding one address twice is refused)."""
    with _PORTS_LOCK:
        ports: list[int] = []
        while len(ports) < count:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            if port not in _GIVEN_PORTS:
                _GIVEN_PORTS.add(port)
                ports.append(port)
        return ports
