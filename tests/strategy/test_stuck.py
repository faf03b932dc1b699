"""Who holds up a stuck step, without TensorFlow: phases read from real frames, the wording,
the board over an in-memory store, and the watchdog naming a stuck peer in its message.

The training thread is a real thread parked in functions shaped like Keras' (a callback's
``on_train_batch_end``, a ``save``, a TensorFlow call), so the frames are real; the step counter
and the input clock are fakes with the input clock's ``progress()`` shape.
"""

from __future__ import annotations

import dataclasses
import multiprocessing.pool
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest

from tfdp_utils._dataset_info import DatasetInfo, DatasetRecord
from tfdp_utils.strategy._faults import CollectiveWatchdog
from tfdp_utils.strategy._phase_board import GaveUp, PeerNews, PhaseBoard
from tfdp_utils.strategy._phase_tracker import PhaseTracker, fit_facts
from tfdp_utils.strategy._stuck import (
    Phase,
    StepFacts,
    calls_into,
    diagnose,
    frame_phase,
    resolve,
)

pytestmark = pytest.mark.pure


ENDED: list[str] = []


def unexpected_end(message: str) -> None:
    """The watchdog's end where a test expects none: recorded (the test process must not end)."""
    ENDED.append(message)


@pytest.fixture(autouse=True)
def _no_unexpected_end() -> Iterator[None]:
    ENDED.clear()
    yield
    assert ENDED == [], ENDED


def in_tf(frame: FrameType) -> bool:
    """The fake's 'inside a TensorFlow call': the innermost function is ``quick_execute``."""
    return frame.f_code.co_name == "quick_execute"


def quick_execute(release: threading.Event) -> None:
    release.wait()


class Script:  # shaped like a keras.callbacks.Callback subclass
    def on_train_batch_end(self, release: threading.Event) -> None:
        helper(release)


def helper(release: threading.Event) -> None:
    release.wait()


class CallbackList:  # Keras' dispatcher: never named as the callback
    def on_train_batch_end(self, release: threading.Event) -> None:
        Script().on_train_batch_end(release)


def save(release: threading.Event) -> None:
    release.wait()


class Saver:
    def on_epoch_end(self, release: threading.Event) -> None:
        save(release)


@dataclasses.dataclass
class Progress:  # the input clock's progress() shape
    requested: int
    received: int
    waited_seconds: float = 0.0


class Clock:
    def __init__(self, requested: int, received: int) -> None:
        self.value = Progress(requested, received)

    def progress(self) -> Progress:
        return self.value


class Counter:
    def __init__(self, value: int) -> None:
        self.value = value

    def numpy(self) -> int:
        return self.value


class Model:
    def __init__(self, iterations: int) -> None:
        self.optimizer = type("Optimizer", (), {"iterations": Counter(iterations)})()

    def fit(self, x: Any, release: threading.Event, inner: Callable[..., None]) -> None:
        inner(release)


@pytest.fixture
def parked() -> Iterator[Callable[..., FrameType]]:
    """Run ``target(release)`` in a thread and return its innermost frame once parked."""
    threads: list[tuple[threading.Thread, threading.Event]] = []

    def park(target: Callable[..., None], *args: Any) -> FrameType:
        release = threading.Event()
        thread = threading.Thread(target=target, args=(*args, release), daemon=True)
        thread.start()
        threads.append((thread, release))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            frame = sys._current_frames().get(thread.ident or 0)
            names = []
            current = frame
            while current is not None:
                names.append(current.f_code.co_name)
                current = current.f_back
            if frame is not None and names[0] == "wait" and "wait" in names[1:]:
                return frame  # Event.wait -> Condition.wait: parked
            time.sleep(0.01)
        raise AssertionError("the thread did not park")

    yield park
    for thread, release in threads:
        release.set()
        thread.join(5)


def _innermost_user_frame(frame: FrameType, name: str) -> FrameType:
    current: FrameType | None = frame
    while current is not None and current.f_code.co_name != name:
        current = current.f_back
    assert current is not None
    return current


def test_frames_tell_a_callback_by_its_class_and_method(parked):
    frame = parked(CallbackList().on_train_batch_end)
    seen = frame_phase(frame, in_tf)
    assert seen.kind == "callback"
    assert seen.where == "Script.on_train_batch_end"
    # The callback's own frame anchors it: the same call at two samples is one phase.
    assert seen.anchor.f_code.co_name == "on_train_batch_end"
    assert seen.anchor.f_locals["self"].__class__ is Script


def test_frames_tell_saving_and_name_the_callback_that_saves(parked):
    seen = frame_phase(parked(Saver().on_epoch_end), in_tf)
    assert seen.kind == "saving" and seen.where == "Saver.on_epoch_end"
    seen = frame_phase(parked(save), in_tf)
    assert seen.kind == "saving" and seen.where == "save"


def test_frames_tell_validation_inside_fit(parked):
    def evaluate(release: threading.Event) -> None:
        quick_execute(release)

    frame = _innermost_user_frame(parked(evaluate), "quick_execute")
    seen = frame_phase(frame, in_tf)
    assert (seen.kind, seen.where) == ("step", "validation")
    assert resolve(seen, StepFacts(8, input_waits_for=9), since=1.0) == Phase(
        "step", 8, "validation", 1.0
    )
    assert Phase("step", 8, "validation").describe() == "validating after step 8"


def test_frames_tell_a_tensorflow_call_from_python(parked):
    frame = _innermost_user_frame(parked(quick_execute), "quick_execute")
    assert frame_phase(frame, in_tf).kind == "step"
    seen = frame_phase(parked(helper), in_tf)
    # Parked in Python's own library: the first caller outside it says what waits.
    assert seen.kind == "python"
    assert seen.where.startswith("Condition.wait in threading.py, from ")
    assert seen.where.endswith(", from helper in test_stuck.py")


def test_a_wait_in_pythons_library_is_a_call_of_its_first_caller_outside_it(parked):
    """The watchdog's default test of "inside a TensorFlow call", with this file's folder as
    the package: TensorFlow's eager cross-worker reduce runs on a thread pool while the
    training thread waits in ``pool.map`` (threading and multiprocessing are Python's)."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    inside, elsewhere = calls_into(here), calls_into(os.path.join(here, "elsewhere") + os.sep)
    frame = parked(helper)  # helper -> Event.wait -> Condition.wait
    assert frame.f_code.co_filename == threading.__file__
    assert inside(frame) and not elsewhere(frame)

    def reduce_on_a_pool(release: threading.Event) -> None:
        with multiprocessing.pool.ThreadPool(1) as pool:
            pool.map(lambda _: release.wait(), [0])

    frame = parked(reduce_on_a_pool)
    assert inside(frame) and not elsewhere(frame)
    assert frame_phase(frame, inside).kind == "step"
    assert frame_phase(frame, elsewhere).kind == "python"


EVEN = DatasetInfo(global_batch_size=4, per_replica_batch_size=2, num_replicas_in_sync=2)


def test_fit_facts_on_real_frames(parked):
    data = type("Data", (), {"tfdp": DatasetRecord(EVEN, plan=None, input_clock=Clock(12, 11))})()

    def run(release: threading.Event) -> None:
        Model(11).fit(data, release, quick_execute)

    frame = _innermost_user_frame(parked(run), "quick_execute")
    assert fit_facts(frame) == StepFacts(finished=11, input_waits_for=12)
    data.tfdp.input_clock.value = Progress(12, 12, 3.0)
    assert fit_facts(frame) == StepFacts(finished=11)
    # No fit on the stack: nothing known.
    assert fit_facts(_innermost_user_frame(parked(quick_execute), "quick_execute")) == StepFacts()


@pytest.mark.parametrize(
    ("kind", "facts", "expected"),
    [
        ("step", StepFacts(11), Phase("step", 12, "", 5.0)),
        ("step", StepFacts(11, input_waits_for=12), Phase("input", 12, "", 5.0)),
        ("step", StepFacts(None, input_waits_for=7), Phase("input", 7, "", 5.0)),
        ("step", StepFacts(), Phase("step", None, "", 5.0)),
        # tf_keras' optimizer has counted the running step already.
        ("step", StepFacts(12, counted_early=True), Phase("step", 12, "", 5.0)),
        ("step", StepFacts(12, True, 13), Phase("input", 12, "", 5.0)),
        ("callback", StepFacts(12, counted_early=True), Phase("callback", 12, "S.on_x", 5.0)),
        ("callback", StepFacts(11, input_waits_for=12), Phase("callback", 11, "S.on_x", 5.0)),
    ],
)
def test_resolve_fills_in_the_step(kind, facts, expected, parked):
    from tfdp_utils.strategy._stuck import FramePhase

    anchor = sys._getframe()
    where = "S.on_x" if kind == "callback" else ""
    assert resolve(FramePhase(kind, where, anchor), facts, since=5.0) == expected


def test_phases_in_words():
    assert Phase("input", 12).describe() == "reading input for step 12"
    assert Phase("step", 12).describe() == "inside step 12"
    assert Phase("step").describe() == "inside a TensorFlow call"
    assert (
        Phase("callback", 3, "Script.on_train_batch_end").describe()
        == "in a callback (Script.on_train_batch_end) after step 3"
    )
    assert (
        Phase("saving", 8, "ModelCheckpoint.on_epoch_end").describe()
        == "saving a checkpoint (ModelCheckpoint.on_epoch_end) after step 8"
    )
    assert (
        Phase("saving", 0, "loading Checkpoint.restore").describe()
        == "loading a checkpoint (Checkpoint.restore) after step 0"
    )
    assert Phase("python", None, "f in x.py").describe() == "in Python (f in x.py)"
    assert Phase.decode(Phase("input", 3, "", 1.5).encode()) == Phase("input", 3, "", 1.5)


def test_diagnosis_names_the_worker_that_did_not_reach_the_step():
    now = 1000.0
    text = diagnose(0, Phase("step", 12, "", 990.0), {1: Phase("input", 12, "", 969.0)}, now=now)
    assert text == (
        "tfdp-utils: step 12 stuck: worker 1 is reading input for step 12 (for 31 s); "
        "worker 0 (this one) waits in the step's collective"
    )
    text = diagnose(
        2,
        Phase("step", 4, "", 990.0),
        {
            0: Phase("step", 4, "", 991.0),
            1: Phase("callback", 3, "Script.on_train_batch_end", 992.0),
            3: None,
        },
        now=now,
    )
    assert text == (
        "tfdp-utils: step 4 stuck: worker 1 is in a callback (Script.on_train_batch_end) after "
        "step 3 (for 8 s); worker 0 and worker 2 (this one) wait in the step's collective; "
        "worker 3: no phase known (its watchdog publishes none: not started by auto_strategy, "
        "or no collective_timeout)"
    )
    # The stuck worker's own view names itself.
    text = diagnose(1, Phase("input", 12, "", 969.0), {0: Phase("step", 12, "", 990.0)}, now=now)
    assert text.startswith("tfdp-utils: step 12 stuck: worker 1 (this one) is reading input")
    # Everyone inside the step: nobody is named.
    text = diagnose(0, Phase("step", 5), {1: Phase("step", 5)}, now=now)
    assert text == (
        "tfdp-utils: step 5 stuck: worker 0 (this one) and worker 1 wait in the step (none is "
        "named: every worker reached it; the wait is inside it, a collective or an op)"
    )


class MemoryStore:
    """The coordination service's store: ``set`` refuses a key that exists."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.operations = 0
        self.lock = threading.Lock()

    def set(self, key: str, value: str) -> None:
        with self.lock:
            self.operations += 1
            if key in self.values:
                raise KeyError(key)
            self.values[key] = value

    def get(self, key: str, timeout_ms: int) -> str | None:
        with self.lock:
            self.operations += 1
            return self.values.get(key)

    def delete(self, key: str) -> None:
        with self.lock:
            self.operations += 1
            self.values.pop(key, None)


def _wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_board_overwrites_this_workers_key_and_reads_the_others():
    store = MemoryStore()
    boards = [PhaseBoard(store, worker=w, num_workers=3) for w in range(3)]
    try:
        boards[1].publish(Phase("step", 4, "", 1.0))
        _wait_for(lambda: boards[1].published == 1)
        boards[1].publish(Phase("callback", 4, "S.on_x", 2.0))
        _wait_for(lambda: boards[1].published == 2)
        assert boards[0].read() == {1: Phase("callback", 4, "S.on_x", 2.0), 2: None}
        store.values["tfdp/phase/2"] = '{"kind": "step", "future_field": 1}'  # another version
        assert boards[0].read() == {1: Phase("callback", 4, "S.on_x", 2.0), 2: None}
    finally:
        for board in boards:
            board.close()


def test_board_read_is_bounded_when_the_store_does_not_answer():
    class Hanging(MemoryStore):
        def get(self, key: str, timeout_ms: int) -> str | None:
            time.sleep(30)
            return None

    board = PhaseBoard(Hanging(), worker=0, num_workers=2)
    start = time.monotonic()
    assert board.read(timeout=0.3) == {1: None}
    assert time.monotonic() - start < 2


def test_tracker_publishes_a_phase_once_it_lasted_an_interval_and_once_per_change(parked):
    store = MemoryStore()
    board = PhaseBoard(store, worker=1, num_workers=2)
    times = iter(range(100, 200))
    tracker = PhaseTracker(
        board, in_call=in_tf, facts=lambda frame: StepFacts(3), clock=lambda: next(times)
    )
    frame = parked(CallbackList().on_train_batch_end)
    try:
        assert tracker.sample(frame) is None  # first seen: not yet an interval
        phase = tracker.sample(frame)
        assert phase == Phase("callback", 3, "Script.on_train_batch_end", 100.0)
        for _ in range(5):  # unchanged: published once
            tracker.sample(frame)
        _wait_for(lambda: board.published == 1)
        time.sleep(0.1)
        assert board.published == 1
        assert PhaseBoard(store, worker=0, num_workers=2).read() == {1: phase}
    finally:
        tracker.release()
        board.close()


def test_tracker_publishes_nothing_for_steps_shorter_than_the_interval():
    store = MemoryStore()
    board = PhaseBoard(store, worker=0, num_workers=2)
    tracker = PhaseTracker(board, in_call=lambda frame: True, facts=lambda frame: StepFacts(1))

    def one_step() -> FrameType:
        return sys._getframe()  # a new frame per call, as a new TensorFlow call per step

    for _ in range(50):
        tracker.sample(one_step())
    assert tracker.published is None and store.operations == 0
    board.close()


def test_tracker_rereads_the_input_clock_while_one_call_lasts(parked):
    store = MemoryStore()
    board = PhaseBoard(store, worker=0, num_workers=2)
    facts = [StepFacts(11, input_waits_for=12)]
    tracker = PhaseTracker(board, in_call=in_tf, facts=lambda frame: facts[0])
    frame = _innermost_user_frame(parked(quick_execute), "quick_execute")
    try:
        tracker.sample(frame)
        assert tracker.sample(frame) == Phase("input", 12, "", tracker.published.since)
        facts[0] = StepFacts(11)  # the batch arrived; the step computes
        assert tracker.sample(frame).kind == "step"
        # The newest phase is the one written (an unwritten older one is replaced).
        _wait_for(lambda: '"kind": "step"' in store.values.get("tfdp/phase/0", ""))
    finally:
        tracker.release()
        board.close()


def waits_in_quick_execute(frame: FrameType) -> bool:
    """'Inside a TensorFlow call': the first caller outside Python's library is quick_execute."""
    library = os.path.dirname(threading.__file__)
    current: FrameType | None = frame
    while current is not None and current.f_code.co_filename.startswith(library):
        current = current.f_back
    return current is not None and current.f_code.co_name == "quick_execute"


class Iterators:
    """Stands for fit's dataset iterators: records the thread that destroys it."""

    destroyed_on: list[str] = []

    def __del__(self) -> None:
        Iterators.destroyed_on.append(threading.current_thread().name)


def test_the_thread_that_stops_the_watchdog_destroys_what_its_held_frames_kept(parked):
    """After fit returned, the frame the watchdog held (inside a TensorFlow call, its caller
    fit's) keeps fit's locals alive. At exit, stop() runs on the main thread: their
    destruction (TensorFlow's C++ destructors, for real iterators) must run there, not on the
    watchdog's thread, which a slow destruction kept alive past the interpreter's
    finalization, where TensorFlow aborts the process."""
    Iterators.destroyed_on.clear()
    go, returned, release = threading.Event(), threading.Event(), threading.Event()

    def fit() -> None:
        iterators = Iterators()  # noqa: F841 - kept alive by this frame
        quick_execute(go)

    def training() -> None:
        fit()
        returned.set()
        release.wait(10)  # the training thread goes on outside fit

    sampled = threading.Event()

    def in_call(frame: FrameType) -> bool:
        inside = waits_in_quick_execute(frame)
        if inside:
            sampled.set()
        return inside

    thread = threading.Thread(target=training, daemon=True)
    thread.start()
    watchdog = CollectiveWatchdog(
        60.0, thread_id=thread.ident, interval=2.0, in_call=in_call, end=unexpected_end
    ).start()
    try:
        assert sampled.wait(10)  # the watchdog holds the frame inside the call
        go.set()  # fit returns; the next sample is ~2 s away
        assert returned.wait(5)
        assert Iterators.destroyed_on == []  # the held frame keeps them
        watchdog.stop()
        assert Iterators.destroyed_on == [threading.current_thread().name]
    finally:
        go.set()
        release.set()
        watchdog.stop()
        thread.join(5)


def test_watchdog_message_names_the_stuck_peer(parked):
    """Worker 0 waits in a TensorFlow call; worker 1 published 'in a callback'."""
    store = MemoryStore()
    peer = PhaseBoard(store, worker=1, num_workers=2)
    peer.publish(Phase("callback", 3, "Script.on_train_batch_end", time.time()))
    _wait_for(lambda: peer.published == 1)
    peer.close()
    frame = parked(quick_execute)
    thread_id = next(i for i, f in sys._current_frames().items() if f is frame)
    aborted: list[str] = []
    board = PhaseBoard(store, worker=0, num_workers=2)
    watchdog = CollectiveWatchdog(
        1.0,
        thread_id=thread_id,
        interval=0.1,
        abort=aborted.append,
        end=unexpected_end,
        in_call=lambda f: f.f_code.co_name in ("wait", "quick_execute"),
        phases=lambda in_call: PhaseTracker(
            board, in_call=in_call, facts=lambda frame: StepFacts(3)
        ),
    ).start()
    del frame
    try:
        _wait_for(lambda: bool(aborted), timeout=10)
    finally:
        watchdog.stop()
    first, _, rest = aborted[0].partition("\n")
    assert re.fullmatch(
        r"tfdp-utils: step 4 stuck: worker 1 is in a callback \(Script.on_train_batch_end\) "
        r"after step 3 \(for 1 s\); worker 0 \(this one\) waits in the step's collective\.",
        first,
    )
    assert "collective_timeout=1 s" in rest
    # This worker published its own phase while it waited.
    assert Phase.decode(store.values["tfdp/phase/0"]).kind == "step"


def test_a_worker_stuck_outside_tensorflow_says_it_holds_the_others_up(parked, caplog):
    store = MemoryStore()
    peer = PhaseBoard(store, worker=0, num_workers=2)
    peer.publish(Phase("step", 4, "", time.time()))
    _wait_for(lambda: peer.published == 1)
    peer.close()
    frame = parked(CallbackList().on_train_batch_end)
    thread_id = next(i for i, f in sys._current_frames().items() if f is frame)
    del frame
    board = PhaseBoard(store, worker=1, num_workers=2)
    aborted: list[str] = []
    with caplog.at_level("WARNING", logger="tfdp_utils"):
        watchdog = CollectiveWatchdog(
            0.6,
            thread_id=thread_id,
            interval=0.05,
            abort=aborted.append,
            end=unexpected_end,
            in_call=in_tf,
            phases=lambda in_call: PhaseTracker(
                board, in_call=in_call, facts=lambda frame: StepFacts(3)
            ),
        ).start()
        try:
            _wait_for(lambda: "stuck" in caplog.text, timeout=10)
            time.sleep(0.5)
        finally:
            watchdog.stop()
    assert aborted == []  # not inside a TensorFlow call: it never aborts
    told = [r.getMessage() for r in caplog.records if "stuck" in r.getMessage()]
    assert len(told) == 1
    assert re.fullmatch(
        r"tfdp-utils: step 4 stuck: worker 1 \(this one\) is in a callback "
        r"\(Script.on_train_batch_end\) after step 3 \(for [01] s\); worker 0 waits in the "
        r"step's collective",
        told[0],
    )


def _stuck_in_a_callback(
    parked: Callable[..., FrameType], store: Any, timeout: float
) -> tuple[CollectiveWatchdog, list[tuple[float, str]], float]:
    """Worker 1 of 2, parked in a callback after step 3, watched with bound ``timeout``."""
    frame = parked(CallbackList().on_train_batch_end)
    stuck_at = time.monotonic()
    thread_id = next(i for i, f in sys._current_frames().items() if f is frame)
    del frame
    board = PhaseBoard(store, worker=1, num_workers=2)
    ended: list[tuple[float, str]] = []
    watchdog = CollectiveWatchdog(
        timeout,
        thread_id=thread_id,
        interval=0.05,
        abort=lambda message: ended.append((time.monotonic(), "ABORTED " + message)),
        end=lambda message: ended.append((time.monotonic(), message)),
        in_call=in_tf,
        phases=lambda in_call: PhaseTracker(
            board, in_call=in_call, facts=lambda frame: StepFacts(3)
        ),
    ).start()
    return watchdog, ended, stuck_at


def test_a_worker_stuck_outside_tensorflow_ends_once_a_peer_gave_up(parked, caplog):
    """Worker 0's watchdog aborted step 4 and marked it; worker 1, stuck in a callback (no
    TensorFlow call of its own to abort), reads the mark and ends instead of waiting forever."""
    store = MemoryStore()
    watchdog, ended, _ = _stuck_in_a_callback(parked, store, 0.6)
    try:
        time.sleep(0.2)
        assert ended == []  # nobody gave up yet
        PhaseBoard(store, worker=0, num_workers=2).mark_aborted(4, 0.6)
        with caplog.at_level("ERROR", logger="tfdp_utils"):
            _wait_for(lambda: bool(ended), timeout=10)
    finally:
        watchdog.stop()
    [(_, message)] = ended
    assert re.fullmatch(
        r"tfdp-utils: worker 1 \(this one\) ends with status 1: it has been in a callback "
        r"\(Script.on_train_batch_end\) after step 3 for \d+ s, and worker 0 gave up on step 4 "
        r"after waiting 1 s \(collective_timeout\); it cannot rejoin the job, so it exits "
        r"instead of holding its allocation \(every thread's stack follows\)\. Restart every "
        r"task: with PreemptionCheckpoint or BackupAndRestore, training resumes\.",
        message,
    )
    assert message in caplog.text  # logged before the process ends
    assert watchdog.ended == message


def test_a_worker_stuck_outside_tensorflow_ends_when_the_service_is_gone_after_the_bound(
    parked,
):
    """The store no longer answers (the leader exited): the worker ends, but only once it has
    been stuck for the whole bound (its peers' watchdogs have fired by then)."""

    class Gone(MemoryStore):
        def get(self, key: str, timeout_ms: int) -> str | None:
            raise ConnectionError("coordination service unavailable")

    watchdog, ended, stuck_at = _stuck_in_a_callback(parked, Gone(), 1.0)
    try:
        _wait_for(lambda: bool(ended), timeout=10)
    finally:
        watchdog.stop()
    [(at, message)] = ended
    assert at - stuck_at >= 1.0  # this test's own clock
    assert "the job's coordination service no longer answers" in message
    assert message.startswith("tfdp-utils: worker 1 (this one) ends with status 1")


def test_board_abort_marks_are_read_back_and_a_silent_store_is_told():
    store = MemoryStore()
    board = PhaseBoard(store, worker=0, num_workers=3)
    assert board.read_aborted() == PeerNews((), True)
    PhaseBoard(store, worker=2, num_workers=3).mark_aborted(7, 31.26)
    assert board.read_aborted() == PeerNews((GaveUp(2, 7, 31.3),), True)
    assert GaveUp(2, 7, 31.3).describe() == "worker 2 gave up on step 7 after waiting 31 s"
    assert GaveUp(1, None, 5).describe() == "worker 1 gave up on its step after waiting 5 s"

    class Hanging(MemoryStore):
        def get(self, key: str, timeout_ms: int) -> str | None:
            time.sleep(30)
            return None

    start = time.monotonic()
    assert PhaseBoard(Hanging(), worker=0, num_workers=2).read_aborted(timeout=0.3) == (
        PeerNews((), False)
    )
    assert time.monotonic() - start < 2


class TensorFlowError(Exception):
    """Stands for a ``tf.errors.OpError`` (its module is TensorFlow's)."""


TensorFlowError.__module__ = "tensorflow.python.framework.errors_impl"


def test_a_call_that_fails_on_its_own_after_half_the_bound_is_explained(parked):
    """The diagnosis is read at half the bound; a TensorFlow error after the call gets it."""
    store = MemoryStore()
    peer = PhaseBoard(store, worker=1, num_workers=2)
    peer.publish(Phase("callback", 3, "Script.on_train_batch_end", time.time()))
    _wait_for(lambda: peer.published == 1)
    peer.close()
    release = threading.Event()

    def train() -> None:
        quick_execute(release)  # the collective, until a peer's failure ends it
        time.sleep(0.5)  # the error travels up to the program

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    board = PhaseBoard(store, worker=0, num_workers=2)
    aborted: list[str] = []
    watchdog = CollectiveWatchdog(
        2.0,
        thread_id=thread.ident,
        interval=0.05,
        abort=aborted.append,
        end=unexpected_end,
        in_call=lambda f: f.f_code.co_name in ("wait", "quick_execute"),
        phases=lambda in_call: PhaseTracker(
            board, in_call=in_call, facts=lambda frame: StepFacts(3)
        ),
    ).start()
    try:
        _wait_for(lambda: watchdog.prepared is not None)
        release.set()
        thread.join(5)
    finally:
        watchdog.stop()
    assert aborted == [] and watchdog.fired is None
    line = watchdog.explain(TensorFlowError("collective failed"))
    assert line is not None and line.startswith(
        "tfdp-utils: step 4 stuck: worker 1 is in a callback (Script.on_train_batch_end)"
    )
    assert watchdog.explain(ValueError("not TensorFlow's")) is None


def test_lines_registered_before_the_traceback_are_printed_first(capsys):
    from tfdp_utils import _exit_guard

    hook = _exit_guard.make_excepthook(lambda t, e, tb: print("Traceback", file=sys.stderr))

    def explain(error: BaseException) -> str | None:
        return "tfdp-utils: step 4 stuck: ..." if isinstance(error, TensorFlowError) else None

    _exit_guard.before_traceback(explain)
    try:
        hook(TensorFlowError, TensorFlowError("x"), None)
        hook(ValueError, ValueError("y"), None)
    finally:
        _exit_guard._before_traceback.remove(explain)
        _exit_guard._status = None
    assert capsys.readouterr().err == "tfdp-utils: step 4 stuck: ...\nTraceback\nTraceback\n"


def test_a_step_counter_read_that_never_returns_does_not_hold_up_the_watchdog(parked):
    """On an accelerator the counter's read queues behind the stuck step: it is bounded."""
    never = threading.Event()

    class Blocked:
        def numpy(self) -> int:
            never.wait(10)
            return 0

    model = Model(0)
    model.optimizer.iterations = Blocked()

    def run(release: threading.Event) -> None:
        model.fit(None, release, quick_execute)

    frame = _innermost_user_frame(parked(run), "quick_execute")
    try:
        start = time.monotonic()
        assert fit_facts(frame, timeout=0.2) == StepFacts()
        assert fit_facts(frame, timeout=0.2) == StepFacts()  # the first read still waits
        assert time.monotonic() - start < 1.0
    finally:
        never.set()
    _wait_for(lambda: fit_facts(frame, timeout=0.5).finished == 0)
