"""How workers agree on the step to act at, without TensorFlow: channels over an in-memory store.

Each worker's :class:`CoordinationChannel` runs here on its own watcher thread over one shared
:class:`MemoryStore` (the coordination service's key-value store: ``set`` refuses a key that
exists, ``get`` waits up to its timeout). A request for "after call ``k + 1``" made at the end
of call ``k`` reaches every worker before ``propose`` returns; two requests at once agree on
one; a missing worker costs a WARNING and a bounded wait, never a hang.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tfdp_utils.preemption._agreement import (
    CLOSED,
    CoordinationChannel,
    Request,
    barrier,
    gather,
)

pytestmark = pytest.mark.pure

WATCHER = "tfdp-preemption-watcher"
SLICE = 1.0  # seconds a blocking get of the channel waits at most (its _SLICE_MS)


class AlreadyExistsError(Exception):
    """What this store's ``set`` raises for a key that exists (TensorFlow's AlreadyExistsError)."""


class MemoryStore:
    """An in-memory key-value store with the coordination service's semantics."""

    def __init__(self, exists_error: type[Exception] = KeyError) -> None:
        self.values: dict[str, str] = {}
        self.exists_error = exists_error
        self.changed = threading.Condition()
        self.broken = False
        self._generation = 0  # gets begun before release_waiters() return None at once

    def set(self, key: str, value: str) -> None:
        self.before_set(key)
        with self.changed:
            if key in self.values:
                raise self.exists_error(key)
            self.values[key] = value
            self.changed.notify_all()

    def before_set(self, key: str) -> None:
        """A hook for tests that need two writers to meet before either writes."""

    def get(self, key: str, timeout_ms: int) -> str | None:
        deadline = time.monotonic() + timeout_ms / 1000
        with self.changed:
            generation = self._generation
            while key not in self.values:
                if self.broken:
                    raise ConnectionError("the coordination service is gone")
                left = deadline - time.monotonic()
                if left <= 0 or generation != self._generation:
                    return None
                self.changed.wait(left)
            return self.values[key]

    def release_waiters(self) -> None:
        """Make the gets waiting right now return None (an early timeout)."""
        with self.changed:
            self._generation += 1
            self.changed.notify_all()

    def go_away(self) -> None:
        """Every get from now on raises, as when the coordination service stops."""
        with self.changed:
            self.broken = True
            self.changed.notify_all()


class EndlessStore(MemoryStore):
    """A store whose ``get`` ignores its timeout: it returns when the key is set (or after
    ``HOLD`` s), so that a watcher that ends did so because a key was written, not by a slice."""

    HOLD = 60.0

    def get(self, key: str, timeout_ms: int) -> str | None:
        return super().get(key, int(self.HOLD * 1000))


class CountingStore(MemoryStore):
    """Counts the keys written and the reads that returned a value."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []
        self.reads: list[str] = []
        self.count = threading.Lock()

    def set(self, key: str, value: str) -> None:
        super().set(key, value)
        with self.count:
            self.writes.append(key)

    def get(self, key: str, timeout_ms: int) -> str | None:
        value = super().get(key, timeout_ms)
        if value is not None:
            with self.count:
                self.reads.append(key)
        return value


class MeetingStore(MemoryStore):
    """Two proposers both write request 0 only once both are about to: a true collision."""

    def __init__(self, exists_error: type[Exception] = KeyError) -> None:
        super().__init__(exists_error)
        self.meeting = threading.Barrier(2, timeout=5)

    def before_set(self, key: str) -> None:
        if key.endswith("/request/0"):
            self.meeting.wait()


def close_all(store: MemoryStore, channels: list[CoordinationChannel]) -> None:
    """Close every channel at once, waking the watchers' pending gets so that it is quick."""
    closers = [threading.Thread(target=channel.close) for channel in channels]
    for closer in closers:
        closer.start()
    while any(closer.is_alive() for closer in closers):
        store.release_waiters()
        time.sleep(0.01)


@pytest.fixture
def open_channels() -> Iterator[Callable[..., list[CoordinationChannel]]]:
    """Opens channels for given workers over a store; closes them all after the test."""
    opened: list[tuple[MemoryStore, list[CoordinationChannel]]] = []

    def open_(
        store: MemoryStore,
        workers: range | list[int],
        *,
        num_workers: int,
        ack_timeout: float = 5.0,
        prefix: str = "tfdp/preemption/1",
    ) -> list[CoordinationChannel]:
        channels = [
            CoordinationChannel(
                store,
                prefix,
                worker=worker,
                num_workers=num_workers,
                ack_timeout=ack_timeout,
                exists_error=store.exists_error,
            )
            for worker in workers
        ]
        opened.append((store, channels))
        return channels

    yield open_
    for store, channels in opened:
        close_all(store, channels)


def in_threads(*calls: Callable[[], Any], timeout: float = 10) -> list[Any]:
    """Run each call on its own thread at once; their results (an error is re-raised)."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(index: int, call: Callable[[], Any]) -> None:
        try:
            results[index] = call()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a call did not return"
    if errors:
        raise errors[0]
    return results


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "tfdp_utils" and record.levelno == logging.WARNING
    ]


# -- Request ---------------------------------------------------------------------------------


def test_a_request_survives_encoding_and_decoding() -> None:
    request = Request("stop", 42, 1, "SIGTERM on worker 1 — über")
    assert Request.decode(request.encode()) == request


def test_a_request_is_encoded_as_a_json_object_of_its_four_fields() -> None:
    text = Request("save", 7, 0, "every_seconds=600").encode()
    assert json.loads(text) == {
        "action": "save",
        "call": 7,
        "worker": 0,
        "reason": "every_seconds=600",
    }
    same = '{"reason": "every_seconds=600", "worker": 0, "call": 7, "action": "save"}'
    assert Request.decode(same) == Request("save", 7, 0, "every_seconds=600")


# -- several workers -------------------------------------------------------------------------


@pytest.mark.parametrize(("num_workers", "proposer"), [(2, 0), (2, 1), (3, 2)])
def test_every_worker_has_a_request_before_propose_returns(
    open_channels: Callable[..., list[CoordinationChannel]], num_workers: int, proposer: int
) -> None:
    channels = open_channels(MemoryStore(), range(num_workers), num_workers=num_workers)
    started = time.monotonic()
    agreed = channels[proposer].propose("stop", after_call=41, reason="SIGTERM")
    elapsed = time.monotonic() - started
    # Read at once: no waiting after propose returned.
    seen = [channel.received() for channel in channels]
    expected = Request("stop", 42, proposer, "SIGTERM")
    assert agreed == expected
    assert seen == [[expected]] * num_workers
    assert elapsed < 4.5  # every worker was there: the 5 s timeout was not waited for


def test_successive_requests_reach_every_worker_in_order(
    open_channels: Callable[..., list[CoordinationChannel]],
) -> None:
    channels = open_channels(MemoryStore(), range(3), num_workers=3)
    first = channels[0].propose("save", after_call=10, reason="every_seconds=600")
    second = channels[2].propose("stop", after_call=15, reason="SIGTERM")
    third = channels[0].propose("save", after_call=20, reason="every_seconds=600")
    assert [first.call, second.call, third.call] == [11, 16, 21]
    for channel in channels:
        assert channel.received() == [first, second, third]


def test_two_requests_at_once_agree_on_one(
    open_channels: Callable[..., list[CoordinationChannel]],
) -> None:
    store = MeetingStore(AlreadyExistsError)
    channels = open_channels(store, range(3), num_workers=3)
    mine = Request("stop", 6, 0, "SIGTERM")
    theirs = Request("stop", 9, 1, "SIGUSR1")
    got = in_threads(
        lambda: channels[0].propose("stop", after_call=5, reason="SIGTERM"),
        lambda: channels[1].propose("stop", after_call=8, reason="SIGUSR1"),
    )
    assert got[0] == got[1]
    assert got[0] in (mine, theirs)
    for channel in channels:
        assert channel.received() == [got[0]]


def test_the_worker_whose_request_lost_gets_its_own_when_it_asks_again(
    open_channels: Callable[..., list[CoordinationChannel]],
) -> None:
    store = MeetingStore(AlreadyExistsError)
    channels = open_channels(store, range(2), num_workers=2)
    first = in_threads(
        lambda: channels[0].propose("save", after_call=5, reason="every_seconds=60"),
        lambda: channels[1].propose("stop", after_call=5, reason="SIGTERM"),
    )[0]
    loser = 1 - first.worker
    action, reason = ("save", "every_seconds=60") if loser == 0 else ("stop", "SIGTERM")
    again = channels[loser].propose(action, after_call=7, reason=reason)
    assert again == Request(action, 8, loser, reason)
    for channel in channels:
        assert channel.received() == [first, again]


def test_a_worker_that_starts_listening_late_still_gets_the_request(
    open_channels: Callable[..., list[CoordinationChannel]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    (chief,) = open_channels(store, [0], num_workers=2, ack_timeout=5.0)
    late: list[CoordinationChannel] = []

    def join_late() -> None:
        time.sleep(0.3)
        late.extend(open_channels(store, [1], num_workers=2, ack_timeout=5.0))

    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        started = time.monotonic()
        agreed = in_threads(
            lambda: chief.propose("stop", after_call=3, reason="SIGTERM"), join_late
        )[0]
        elapsed = time.monotonic() - started
    assert agreed == Request("stop", 4, 0, "SIGTERM")
    assert late[0].received() == [agreed]
    assert warnings_of(caplog) == []
    assert elapsed < 4.5  # it waited for the late worker, not for the 5 s timeout


def test_a_missing_worker_costs_a_warning_and_a_bounded_wait(
    open_channels: Callable[..., list[CoordinationChannel]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    ack_timeout = 1.5
    channels = open_channels(MemoryStore(), [0, 1], num_workers=3, ack_timeout=ack_timeout)
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        started = time.monotonic()
        agreed = channels[1].propose("stop", after_call=3, reason="SIGTERM")
        elapsed = time.monotonic() - started
    assert agreed == Request("stop", 4, 1, "SIGTERM")
    assert [channel.received() for channel in channels] == [[agreed], [agreed]]
    warnings = warnings_of(caplog)
    assert len(warnings) == 1
    assert "worker 2" in warnings[0] and "did not acknowledge" in warnings[0]
    assert "after call 4" in warnings[0]
    assert ack_timeout <= elapsed < ack_timeout + 2.5  # bounded (generous for a loaded CI)


def test_missing_workers_cost_no_more_than_ack_timeout_in_all(
    open_channels: Callable[..., list[CoordinationChannel]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    ack_timeout = 1.5
    # Six missing workers: a whole slice each beyond the bound would add 5 s.
    channels = open_channels(MemoryStore(), [0, 1], num_workers=8, ack_timeout=ack_timeout)
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        started = time.monotonic()
        channels[0].propose("stop", after_call=3, reason="SIGTERM")
        elapsed = time.monotonic() - started
    warnings = warnings_of(caplog)
    assert len(warnings) == 6
    assert "worker 2" in warnings[0] and "worker 7" in warnings[5]
    assert elapsed < ack_timeout + 2.5


def test_requests_of_another_fit_are_not_received(
    open_channels: Callable[..., list[CoordinationChannel]],
) -> None:
    store = MemoryStore()
    (earlier,) = open_channels(store, [0], num_workers=1, prefix="tfdp/preemption/1")
    (later,) = open_channels(store, [0], num_workers=1, prefix="tfdp/preemption/2")
    request = earlier.propose("stop", after_call=1, reason="SIGTERM")
    time.sleep(0.1)
    assert earlier.received() == [request]
    assert later.received() == []


def test_close_stops_the_watcher_thread(open_channels: Callable[..., Any]) -> None:
    before = {t for t in threading.enumerate() if t.name == WATCHER}
    (channel,) = open_channels(MemoryStore(), [0], num_workers=2)
    watchers = [t for t in threading.enumerate() if t.name == WATCHER and t not in before]
    assert len(watchers) == 1 and watchers[0].is_alive()
    assert watchers[0].daemon  # never keeps a finished job's process alive
    started = time.monotonic()
    channel.close()
    assert time.monotonic() - started < 2 * SLICE + 0.5
    assert not watchers[0].is_alive()
    channel.close()  # twice is harmless


def watchers_of(channels: list[CoordinationChannel]) -> list[threading.Thread]:
    return [channel._watcher for channel in channels]


def test_close_wakes_the_watchers_read_instead_of_waiting_for_its_end(
    open_channels: Callable[..., list[CoordinationChannel]],
) -> None:
    # The store's reads last a minute unless their key is written: the watcher can end within
    # close's join only because close wrote where it waits.
    (channel,) = open_channels(EndlessStore(), [0], num_workers=2)
    (watcher,) = watchers_of([channel])
    channel.close()
    assert not watcher.is_alive()
    assert channel.received() == []  # the mark is no request


def test_one_closed_channel_wakes_every_watcher_of_the_fit(
    open_channels: Callable[..., list[CoordinationChannel]],
) -> None:
    store = EndlessStore()
    channels = open_channels(store, range(3), num_workers=3)
    channels[1].close()
    for watcher in watchers_of(channels):
        watcher.join(timeout=10)
        assert not watcher.is_alive()
    marks = [Request.decode(value) for key, value in store.values.items() if "/request/" in key]
    assert marks == [Request(CLOSED, -1, 1, "the fit ended on worker 1")]
    assert not [key for key in store.values if "/ack/" in key]  # a mark is not acknowledged


def test_a_request_already_in_the_closing_slot_is_acknowledged_and_the_watcher_ends(
    open_channels: Callable[..., list[CoordinationChannel]],
) -> None:
    store = EndlessStore()
    (channel,) = open_channels(store, [0], num_workers=2)
    request = Request("stop", 5, 1, "SIGTERM")

    def request_first(key: str) -> None:  # worker 1's request lands just before the mark
        if key.endswith("/request/0") and key not in store.values:
            with store.changed:
                store.values[key] = request.encode()
                store.changed.notify_all()

    store.before_set = request_first  # type: ignore[method-assign]
    channel.close()
    assert not channel._watcher.is_alive()
    assert channel.received() == [request]
    assert "tfdp/preemption/1/ack/0/0" in store.values


def test_a_proposal_after_another_worker_closed_agrees_on_nothing(
    open_channels: Callable[..., list[CoordinationChannel]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = EndlessStore()
    first, second = open_channels(store, range(2), num_workers=2, ack_timeout=30.0)
    first.close()
    second._watcher.join(timeout=10)
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        agreed = second.propose("stop", after_call=8, reason="SIGTERM")
    assert agreed == Request(CLOSED, -1, 0, "the fit ended on worker 0")
    assert second.received() == []
    assert warnings_of(caplog) == []  # no acknowledgement was waited for


def test_a_store_that_goes_away_ends_the_watcher_quietly(
    open_channels: Callable[..., Any],
) -> None:
    # An error escaping the thread would fail the test (pytest's unhandled-thread warning).
    store = MemoryStore()
    before = {t for t in threading.enumerate() if t.name == WATCHER}
    open_channels(store, [0, 1], num_workers=2)
    watchers = [t for t in threading.enumerate() if t.name == WATCHER and t not in before]
    store.go_away()
    for watcher in watchers:
        watcher.join(timeout=2 * SLICE)
        assert not watcher.is_alive()


# -- the barrier after a save ----------------------------------------------------------------


def test_the_barrier_passes_when_every_worker_marks() -> None:
    store = MemoryStore()
    said: list[str] = []
    marks = [
        lambda worker=worker: barrier(
            store, "fit/saved/7", worker=worker, num_workers=3, timeout=5.0, say=said.append
        )
        for worker in range(3)
    ]
    started = time.monotonic()
    assert in_threads(*marks) == [True, True, True]
    assert time.monotonic() - started < 2.0
    assert said == []


def test_the_barrier_waits_for_a_worker_that_marks_late() -> None:
    store = MemoryStore()
    said: list[str] = []

    def late() -> bool:
        time.sleep(0.4)
        return barrier(store, "fit/saved/7", worker=1, num_workers=2, timeout=5.0, say=said.append)

    early = lambda: barrier(  # noqa: E731
        store, "fit/saved/7", worker=0, num_workers=2, timeout=5.0, say=said.append
    )
    assert in_threads(early, late) == [True, True]
    assert said == []


def test_the_barrier_gives_up_after_its_timeout_naming_the_missing_worker() -> None:
    store = MemoryStore()
    said: list[tuple[int, str]] = []
    timeout = 0.5

    def mark(worker: int) -> Callable[[], bool]:
        return lambda: barrier(
            store,
            "fit/saved/7",
            worker=worker,
            num_workers=3,
            timeout=timeout,
            say=lambda message: said.append((worker, message)),
        )

    started = time.monotonic()
    assert in_threads(mark(0), mark(1)) == [False, False]
    elapsed = time.monotonic() - started
    assert sorted(worker for worker, _ in said) == [0, 1]
    for _, message in said:
        assert "worker 2" in message
        assert "0.5 s" in message
    assert timeout <= elapsed < timeout + 2.5  # bounded (generous for a loaded CI)


def test_the_barrier_says_it_through_the_tfdp_utils_logger_by_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="tfdp_utils"):
        passed = barrier(MemoryStore(), "fit/saved/3", worker=1, num_workers=2, timeout=0.2)
    assert passed is False
    assert any("worker 0" in message for message in warnings_of(caplog))


@pytest.mark.parametrize("num_workers", [2, 4, 8])
def test_the_barrier_reads_each_mark_once_through_the_chief(num_workers: int) -> None:
    store = CountingStore()
    marks = [
        lambda worker=worker: barrier(
            store, "fit/saved/7", worker=worker, num_workers=num_workers, timeout=30.0
        )
        for worker in range(num_workers)
    ]
    assert in_threads(*marks, timeout=60) == [True] * num_workers
    # The chief reads the N - 1 marks and their N - 1 confirmations, each other worker the
    # chief's one key.
    others = range(1, num_workers)
    expected_reads = [f"fit/saved/7/{w}" for w in others]
    expected_reads += [f"fit/saved/7/read/{w}" for w in others]
    expected_reads += ["fit/saved/7/all"] * (num_workers - 1)
    assert sorted(store.reads) == sorted(expected_reads)
    assert sorted(store.writes) == sorted(
        [f"fit/saved/7/{w}" for w in others]
        + [f"fit/saved/7/read/{w}" for w in others]
        + ["fit/saved/7/all"]
    )
    assert store.values["fit/saved/7/all"] == "[]"


def test_the_chief_leaves_only_after_the_others_read_its_verdict() -> None:
    # The chief's process runs the coordination service: leaving before a slow worker read
    # the verdict would take the key away from it.
    store = MemoryStore()
    events: list[str] = []
    read_verdict = threading.Event()

    class SlowReader(MemoryStore):
        def get(self, key: str, timeout_ms: int) -> str | None:
            value = store.get(key, timeout_ms)
            if key.endswith("/all") and value is not None:
                time.sleep(0.3)  # a worker slow to act on the verdict
                events.append("worker 1 read the verdict")
                read_verdict.set()
            return value

        def set(self, key: str, value: str) -> None:
            store.set(key, value)

    def chief() -> bool:
        passed = barrier(store, "fit/saved/7", worker=0, num_workers=2, timeout=30.0)
        events.append("chief left")
        return passed

    worker = lambda: barrier(  # noqa: E731
        SlowReader(), "fit/saved/7", worker=1, num_workers=2, timeout=30.0
    )
    assert in_threads(chief, worker, timeout=60) == [True, True]
    assert events == ["worker 1 read the verdict", "chief left"]


def test_a_worker_whose_chief_is_gone_names_it_instead_of_raising() -> None:
    store = MemoryStore()
    store.go_away()
    said: list[str] = []

    class Marks(MemoryStore):  # the mark is written; the service is gone for the reads
        def set(self, key: str, value: str) -> None:
            pass

        def get(self, key: str, timeout_ms: int) -> str | None:
            return store.get(key, timeout_ms)

    passed = barrier(Marks(), "fit/saved/7", worker=1, num_workers=2, timeout=30.0, say=said.append)
    assert passed is False
    assert said and said[0].startswith("tfdp_utils: worker 0 did not finish its part")


def test_the_workers_name_the_chief_when_it_never_confirms() -> None:
    store = MemoryStore()
    said: list[tuple[int, str]] = []

    def mark(worker: int) -> Callable[[], bool]:
        return lambda: barrier(
            store,
            "fit/saved/7",
            worker=worker,
            num_workers=3,
            timeout=0.5,
            say=lambda message: said.append((worker, message)),
        )

    assert in_threads(mark(1), mark(2)) == [False, False]
    assert sorted(worker for worker, _ in said) == [1, 2]
    for _, message in said:
        assert message.startswith("tfdp_utils: worker 0 did not finish its part")


def test_the_chief_names_every_missing_worker_to_every_worker() -> None:
    store = MemoryStore()
    said: list[tuple[int, str]] = []

    def mark(worker: int) -> Callable[[], bool]:
        return lambda: barrier(
            store,
            "fit/saved/7",
            worker=worker,
            num_workers=5,
            timeout=0.5,
            say=lambda message: said.append((worker, message)),
        )

    assert in_threads(mark(0), mark(2), mark(4)) == [False, False, False]
    assert json.loads(store.values["fit/saved/7/all"]) == [1, 3]
    assert sorted(worker for worker, _ in said) == [0, 2, 4]
    for _, message in said:
        assert "workers 1, 3 did not finish their part" in message


# -- where a resumed job starts ----------------------------------------------------------------


def test_every_worker_gets_the_chief_s_verdict_on_every_worker_s_start() -> None:
    store = CountingStore()
    seen: list[list[str]] = []

    def decide(texts: list[str]) -> str:
        seen.append(texts)
        return "verdict"

    def start(worker: int) -> Callable[[], str]:
        return lambda: gather(
            store,
            "start/0",
            worker=worker,
            num_workers=3,
            mine=f"w{worker}",
            decide=decide,
            timeout=5.0,
        )

    assert in_threads(start(2), start(0), start(1)) == ["verdict"] * 3
    assert seen == [["w0", "w1", "w2"]]  # decided once, in worker order
    assert len(store.writes) == 2 * 3 - 1


def test_a_worker_that_never_tells_its_start_is_named_after_the_timeout() -> None:
    store = MemoryStore()
    with pytest.raises(TimeoutError, match=r"worker 1 did not tell worker 0 within 0\.2 s"):
        gather(store, "start/0", worker=0, num_workers=2, mine="", decide=str, timeout=0.2)
    with pytest.raises(TimeoutError, match=r"worker 0 did not tell worker 1 within 0\.2 s"):
        gather(store, "start/1", worker=1, num_workers=2, mine="", decide=str, timeout=0.2)


def test_a_worker_waiting_for_the_start_says_what_it_waits_for(caplog) -> None:
    store = MemoryStore()
    with caplog.at_level("WARNING", logger="tfdp_utils"), pytest.raises(TimeoutError):
        gather(
            store,
            "start/2",
            worker=1,
            num_workers=2,
            mine="",
            decide=str,
            timeout=0.5,
            progress_interval=0.1,
        )
    lines = [r.getMessage() for r in caplog.records if "still waiting" in r.getMessage()]
    assert lines, caplog.text
    assert lines[0].startswith(
        "tfdp_utils: still waiting for worker 0's verdict on where the resumed job starts after"
    )
    assert "(bound 0.5 s; change it with no setting: start every worker of the job)" in lines[0]
