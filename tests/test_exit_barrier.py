"""The exit barrier's parts, without TensorFlow: the wait on a fake store, its bound, the handler.

The 2-worker job whose workers end 6 s apart is in tests/test_crash_exits.py.
"""

from __future__ import annotations

import socket

import pytest

from tfdp_utils import _exit_barrier as barrier
from tfdp_utils import _exit_guard

pytestmark = pytest.mark.pure

ADDRESSES = ("127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeStore:
    """A key-value store whose blocking get advances a fake clock by its timeout."""

    def __init__(self, clock: Clock, *, marks: dict[str, float] | None = None) -> None:
        self.clock = clock
        self.marks = dict(marks or {})  # key -> time it is set
        self.fail_set = self.fail_get = False
        self.calls: list[str] = []

    def set(self, key: str, value: str) -> None:
        self.calls.append(f"set {key}")
        if self.fail_set:
            raise ConnectionError("UNAVAILABLE: failed to connect to all addresses")
        self.marks[key] = self.clock.now

    def get(self, key: str, timeout_ms: int) -> str | None:
        self.calls.append(f"get {key}")
        if self.fail_get:
            raise ConnectionError("UNAVAILABLE: failed to connect to all addresses")
        at = self.marks.get(key)
        if at is not None and at <= self.clock.now + timeout_ms / 1000:
            self.clock.now = max(self.clock.now, at)
            return "1"
        self.clock.now += timeout_ms / 1000
        return None


def _wait(store: FakeStore, clock: Clock, probe=lambda address: True, **kwargs):
    return barrier.wait_for_peers(
        store,
        rank=kwargs.pop("rank", 0),
        addresses=kwargs.pop("addresses", ADDRESSES),
        seconds=kwargs.pop("seconds", 10.0),
        probe=probe,
        clock=clock,
    )


def test_every_worker_marks_then_all_leave() -> None:
    clock = Clock()
    store = FakeStore(clock, marks={"tfdp/exit/1": 0.0, "tfdp/exit/2": 6.0})
    assert _wait(store, clock) == ("all", [])
    assert store.marks["tfdp/exit/0"] == 0.0  # marked first, before waiting
    assert 6.0 <= clock.now < 6.3  # left within one read's slice of the last mark


def test_a_peer_whose_port_is_closed_is_not_waited_for() -> None:
    clock = Clock()
    store = FakeStore(clock, marks={"tfdp/exit/2": 1.0})
    closed = {ADDRESSES[1]}
    outcome = _wait(store, clock, probe=lambda address: address not in closed)
    assert outcome == ("gone", [1])
    assert clock.now < 1.3


def test_a_peer_that_closes_its_port_while_waited_for_is_seen_within_a_probe() -> None:
    clock = Clock()
    store = FakeStore(clock)
    outcome = _wait(
        store, clock, rank=1, addresses=ADDRESSES[:2], probe=lambda address: clock.now < 3.0
    )
    assert outcome == ("gone", [0])
    assert 3.0 <= clock.now <= 3.0 + barrier.PROBE_EVERY + 0.3


def test_a_live_peer_that_never_marks_is_waited_for_until_the_bound() -> None:
    clock = Clock()
    store = FakeStore(clock, marks={"tfdp/exit/2": 0.0})
    assert _wait(store, clock, probe=lambda address: None, seconds=4.0) == ("bound", [1])
    assert clock.now == pytest.approx(4.0, abs=0.01)


@pytest.mark.parametrize("failing", ["set", "get"])
def test_when_the_service_is_gone_the_wait_ends_at_once(failing: str) -> None:
    clock = Clock()
    store = FakeStore(clock)
    setattr(store, f"fail_{failing}", True)
    how, missing = _wait(store, clock, rank=1)
    assert how == "service" and missing == [0, 2]
    assert clock.now == 0.0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("", barrier.DEFAULT_BOUND), ("12.5", 12.5), ("0", None), ("off", None)],
)
def test_the_bound_comes_from_its_variable(value: str, seconds: float | None) -> None:
    assert barrier.bound({"TFDP_EXIT_BARRIER": value}) == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", "TFDP_EXIT_BARRIER must be a number of seconds, but received"),
        ("-1", "TFDP_EXIT_BARRIER must be a finite number of seconds >= 0, but received"),
        ("nan", "TFDP_EXIT_BARRIER must be a finite number of seconds >= 0"),
        ("inf", "TFDP_EXIT_BARRIER must be a finite number of seconds >= 0"),
    ],
)
def test_a_bad_bound_is_refused_with_its_name(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        barrier.bound({"TFDP_EXIT_BARRIER": value})


def test_a_closed_port_is_told_from_an_open_one() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        address = f"127.0.0.1:{server.getsockname()[1]}"
        assert barrier.port_open(address) is True
    assert barrier.port_open(address) is False


def test_the_handler_waits_only_on_a_clean_exit(monkeypatch) -> None:
    clock = Clock()
    store = FakeStore(clock, marks={"tfdp/exit/0": 0.0})
    ran: list[str] = []
    handler = barrier.ExitBarrier(
        store, rank=1, addresses=ADDRESSES[:2], seconds=5.0, before=lambda: ran.append("before")
    )
    monkeypatch.setattr(_exit_guard, "_status", 1)  # an uncaught error was reported
    handler()
    assert store.calls == [] and ran == [] and handler.outcome is None
    clean = barrier.ExitBarrier(
        store,
        rank=1,
        addresses=ADDRESSES[:2],
        seconds=5.0,
        before=lambda: ran.append("before"),
        probe=lambda address: True,
    )
    monkeypatch.setattr(_exit_guard, "_status", None)
    monkeypatch.setattr(_exit_guard, "INTERRUPTED", False)
    clean()
    assert ran == ["before"]
    assert clean.outcome == ("all", [])
    clean()  # once per process
    assert ran == ["before"]


def test_the_handler_is_undone_by_the_registry_protocol() -> None:
    store = FakeStore(Clock())
    handler = barrier.install(store, rank=0, addresses=ADDRESSES[:2], seconds=1.0)
    assert handler.installed()
    handler.undo()
    assert not handler.installed()
    handler()
    assert store.calls == []
