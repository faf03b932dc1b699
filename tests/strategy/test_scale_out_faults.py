"""The collective bound's pieces in-process: its resolution and the watchdog's decisions."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import pytest
from support.processes import run_python

import tfdp_utils as tdu
from tfdp_utils.strategy._collective_bound import (
    COLLECTIVE_TIMEOUT_VARIABLE,
    DEFAULT_COLLECTIVE_TIMEOUT,
    resolve_collective_timeout,
)
from tfdp_utils.strategy._faults import CollectiveWatchdog, end_grace, peer_gone

ENDED: list[str] = []


def unexpected_end(message: str) -> None:
    """The watchdog's end where a test expects none: recorded (the test process must not end)."""
    ENDED.append(message)


@pytest.fixture(autouse=True)
def _no_unexpected_end() -> Iterator[None]:
    ENDED.clear()
    yield
    assert ENDED == [], ENDED


def test_default_bound_and_its_overrides():
    assert resolve_collective_timeout(DEFAULT_COLLECTIVE_TIMEOUT, {}) == 600.0
    env = {COLLECTIVE_TIMEOUT_VARIABLE: "45"}
    assert resolve_collective_timeout(DEFAULT_COLLECTIVE_TIMEOUT, env) == 45.0
    # An explicit argument wins over the variable.
    assert resolve_collective_timeout(30, env) == 30.0
    for off in ("0", "off", "none", "inf"):
        assert (
            resolve_collective_timeout(DEFAULT_COLLECTIVE_TIMEOUT, {"TFDP_COLLECTIVE_TIMEOUT": off})
            is None
        )
    assert resolve_collective_timeout(None, {}) is None
    assert resolve_collective_timeout(0, {}) is None
    assert resolve_collective_timeout(float("inf"), {}) is None  # not a timer of inf seconds


def test_bad_bounds_are_explained():
    with pytest.raises(ValueError, match=r"TFDP_COLLECTIVE_TIMEOUT='soon'.*0 to wait without"):
        resolve_collective_timeout(
            DEFAULT_COLLECTIVE_TIMEOUT, {COLLECTIVE_TIMEOUT_VARIABLE: "soon"}
        )
    with pytest.raises(ValueError, match=r"collective_timeout=-5 must be a positive number"):
        resolve_collective_timeout(-5, {})
    with pytest.raises(ValueError, match=r"collective_timeout=-1"):
        tdu.auto_strategy(collective_timeout=-1)


def _blocked_thread() -> tuple[threading.Thread, threading.Event]:
    release = threading.Event()
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    return thread, release


def test_watchdog_aborts_a_thread_stuck_in_one_call_after_the_bound():
    thread, release = _blocked_thread()
    aborted: list[tuple[float, str]] = []
    start = time.monotonic()
    watchdog = CollectiveWatchdog(
        1.5,
        thread_id=thread.ident,
        interval=0.1,
        abort=lambda message: aborted.append((time.monotonic(), message)),
        end=unexpected_end,
        in_call=lambda frame: True,
    ).start()
    try:
        deadline = time.monotonic() + 10
        while not aborted and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        release.set()
        watchdog.stop()
    assert len(aborted) == 1
    fired_at, message = aborted[0]
    # Measured with this test's own clock: not before the bound, and soon after it.
    assert 1.5 <= fired_at - start < 1.5 + 1.0
    assert "collective_timeout=1.5 s" in message
    assert "auto_strategy(collective_timeout=SECONDS)" in message
    assert "TFDP_COLLECTIVE_TIMEOUT" in message
    assert watchdog.fired == message


def test_watchdog_ends_the_process_when_the_call_outlives_the_abort():
    """A call the abort cannot end (here: an abort that does nothing) ends the worker
    :func:`end_grace` seconds after the abort, with the call and the bound named."""
    thread, release = _blocked_thread()
    aborted: list[float] = []
    ended: list[tuple[float, str]] = []
    watchdog = CollectiveWatchdog(
        1.0,
        thread_id=thread.ident,
        interval=0.05,
        abort=lambda message: aborted.append(time.monotonic()),
        in_call=lambda frame: True,
        end=lambda message: ended.append((time.monotonic(), message)),
    ).start()
    try:
        deadline = time.monotonic() + 15
        while not ended and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        release.set()
        watchdog.stop()
    assert len(aborted) == 1 and len(ended) == 1
    at, message = ended[0]
    # This test's own clock: the grace after the abort, and soon after it.
    assert end_grace(1.0) <= at - aborted[0] < end_grace(1.0) + 1.0
    assert message.startswith("tfdp-utils: this worker ends with status 1: it has been ")
    assert "inside one TensorFlow call (wait in threading.py)" in message
    assert re.search(r"its collectives were aborted \d+ s ago \(collective_timeout=1 s\)", message)
    assert "Restart every task" in message
    assert watchdog.ended == message


def test_watchdog_does_not_end_a_worker_whose_call_the_abort_ended():
    thread, release = _blocked_thread()
    ended: list[str] = []
    watchdog = CollectiveWatchdog(
        0.5,
        thread_id=thread.ident,
        interval=0.05,
        abort=lambda message: release.set(),  # the call returns, as an aborted collective does
        in_call=lambda frame: True,
        end=ended.append,
    ).start()
    thread.join(10)
    time.sleep(end_grace(0.5) + 0.5)
    watchdog.stop()
    assert watchdog.fired and ended == [] and watchdog.ended is None


def test_end_grace_is_short_and_bounded():
    assert end_grace(1.0) == 2.0
    assert end_grace(6.0) == 3.0
    assert end_grace(600.0) == 10.0


def test_watchdog_leaves_a_progressing_thread_alone():
    stop = threading.Event()

    def step() -> None:
        time.sleep(0.02)

    def loop() -> None:
        while not stop.is_set():
            step()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    aborted: list[str] = []
    watchdog = CollectiveWatchdog(
        0.5,
        thread_id=thread.ident,
        interval=0.05,
        abort=aborted.append,
        end=unexpected_end,
        in_call=lambda frame: frame.f_code.co_name == "step",
    ).start()
    time.sleep(2.0)  # four bounds' worth of many short calls
    stop.set()
    thread.join(5)
    watchdog.stop()
    assert aborted == []


def test_watchdog_ignores_waits_outside_tensorflow_and_ends_with_its_thread():
    thread, release = _blocked_thread()
    aborted: list[str] = []
    # The default test: the innermost frame must lie in the tensorflow package; this thread
    # waits in threading.py.
    watchdog = CollectiveWatchdog(
        0.3, thread_id=thread.ident, interval=0.05, abort=aborted.append, end=unexpected_end
    ).start()
    time.sleep(1.0)
    assert aborted == []
    release.set()
    thread.join(5)
    time.sleep(0.3)
    assert not watchdog.running
    watchdog.stop()


def test_watchdog_lets_go_of_the_training_frame_before_the_interpreter_finalizes():
    """A frame the watchdog still holds at exit is freed while the interpreter is intact.

    That frame's locals (dataset iterators in a real job) freed by a daemon thread during
    finalization abort the process in TensorFlow's C++ destructors after training finished.
    Here the watchdog samples ``train_step`` once (at 2 s) and would next wake at 4 s, long
    after the script ends at 2.5 s: only the stop at exit can free the frame in time.
    """
    result = run_python(
        """
        import sys, time
        from tfdp_utils.strategy._faults import CollectiveWatchdog

        class Iterator:
            def __del__(self):
                print(f"freed finalizing={sys.is_finalizing()}", flush=True)

        def train_step():
            iterator = Iterator()
            time.sleep(2.5)

        watchdog = CollectiveWatchdog(
            60.0, interval=2.0, in_call=lambda frame: frame.f_code.co_name == "train_step"
        ).start()
        train_step()
        print("script ends", flush=True)
        """,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["script ends", "freed finalizing=False"], result.stdout


KILLED_PEER = """Graph execution error:

Detected at node sgd/CollectiveReduceV2 defined at (most recent call last):
  File "<string>", line 48, in <module>

Collective ops is aborted by: recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling \
/tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}
The error could be from a previous operation. Restart your program to reset.
\t [[{{node sgd/CollectiveReduceV2}}]] [Op:__inference_multi_step_on_iterator_531]"""


def test_a_killed_peer_is_named_from_tensorflows_message():
    # The message TensorFlow 2.21 gave worker 0 when worker 1 was SIGKILLed mid-fit.
    line = peer_gone(KILLED_PEER)
    assert line == (
        "tfdp-utils: the peer task /job:worker/replica:0/task:1 is gone: its connection failed "
        "during a multi-worker call (its process ended: killed, out of memory, preempted or "
        "crashed; its own log says which). Restart every task: with PreemptionCheckpoint or "
        "BackupAndRestore, training resumes."
    )
    heartbeats = (
        "The following tasks are unhealthy (stopped sending heartbeats):\n"
        "/job:worker/replica:0/task:2\nThe tasks have crashed."
    )
    assert "/job:worker/replica:0/task:2 is gone" in (peer_gone(heartbeats) or "")
    # Other failures are not a gone peer.
    assert peer_gone("Graph execution error: Incompatible shapes: [8,3] vs. [8,1]") is None
    assert peer_gone("Connection reset by peer (no task named)") is None
