"""Ctrl-C heard at once, even while the main thread waits inside one C++ call. Pure stdlib.

CPython runs a signal's Python handler in the main thread, between two bytecodes. While that
thread waits inside one long TensorFlow call (a multi-worker collective whose peer has left
the step: Ctrl-C reached the peer between two steps, or the peer is stuck), SIGINT is only
noted, and ``KeyboardInterrupt`` comes when the call returns: after the collective bound, or
after the peer's heartbeats stop, seconds to minutes later.

:func:`listen` hears it at once: ``signal.set_wakeup_fd`` makes CPython's C-level handler
write each caught signal's number to a socket, the moment it arrives, whatever the main
thread does; a daemon thread (``tfdp-interrupts``) reads it and calls the listeners with
SIGINT. A listener runs in that thread: it must return soon (start its own thread for waits).

The wakeup socket is installed once, from the main thread, only when no other is in place
(asyncio's loop sets its own while it handles signals); a program that replaces it later
keeps its own and the listeners are no longer called. Only signals that have a Python
handler are written (SIGINT has one unless the program ignores it).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Callable

logger = logging.getLogger("tfdp_utils")

Listener = Callable[[], None]

_lock = threading.Lock()
_listeners: list[Listener] = []
_sockets: tuple[socket.socket, socket.socket] | None = None


def listen(listener: Listener) -> Callable[[], None] | None:
    """Call ``listener()`` (from the reader thread) each time SIGINT reaches the process.

    Returns:
        A function that removes the listener, or None when SIGINT cannot be heard this way:
        not called from the main thread, another wakeup descriptor is in place, or the
        platform has no socket pair.
    """
    with _lock:
        if _sockets is None and not _install():
            return None
        _listeners.append(listener)

    def remove() -> None:
        with _lock, contextlib.suppress(ValueError):
            _listeners.remove(listener)

    return remove


def installed() -> bool:
    """Whether the wakeup socket is installed (and, asked from the main thread, still the
    process's wakeup descriptor)."""
    with _lock:
        if _sockets is None:
            return False
        if threading.current_thread() is not threading.main_thread():
            return True
        return _current_wakeup_fd() == _sockets[1].fileno()


def _current_wakeup_fd() -> int:
    # set_wakeup_fd returns the previous descriptor; putting it straight back reads it.
    previous = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(previous)
    return previous


def _install() -> bool:
    global _sockets
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        reader, writer = socket.socketpair()
    except OSError as error:
        logger.debug("tfdp_utils: no socket pair to hear Ctrl-C with: %s", error)
        return False
    writer.setblocking(False)  # CPython requires a non-blocking wakeup descriptor
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    if previous != -1:  # another's (asyncio's): put it back and stay out of its way
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()
        return False
    _sockets = (reader, writer)
    thread = threading.Thread(target=_read, args=(reader,), name="tfdp-interrupts", daemon=True)
    thread.start()
    return True


def _read(reader: socket.socket) -> None:
    while True:
        try:
            data = reader.recv(64)
        except OSError:
            return  # closed by uninstall()
        if not data:
            return
        if signal.SIGINT in data:
            with _lock:
                listeners = list(_listeners)
            for listener in listeners:
                try:
                    listener()
                except Exception as error:  # one listener must not silence the others
                    logger.debug("tfdp_utils: a Ctrl-C listener failed: %s", error)


def uninstall() -> None:
    """Remove every listener and the wakeup socket (if it is still the process's); main thread."""
    global _sockets
    with _lock:
        _listeners.clear()
        if _sockets is None:
            return
        reader, writer = _sockets
        _sockets = None
        if _current_wakeup_fd() == writer.fileno():
            signal.set_wakeup_fd(-1)
        with contextlib.suppress(OSError):
            reader.shutdown(socket.SHUT_RDWR)
        reader.close()
        writer.close()
