"""The clock of :func:`~tfdp_utils.diagnose_input`: a step run after a warm-up, timed for at
least a window and at most to a deadline, the examples each distributed element holds, and
``next()`` of an iterator waited for on a thread up to a deadline (:class:`Fetcher`).

TensorFlow glue: the steps are the caller's (the distributed iterator drained, the compiled
train function called); this times them into a :class:`~tfdp_utils.data._input_figures.Rate`.
A step cannot be interrupted, so a phase never starts one that the last one's duration says
would end past the deadline; a ``next()`` that is late is left to finish on its thread. That
thread is no daemon (a daemon stopped inside TensorFlow at exit aborts the process), so the
interpreter's exit waits for it: bounded, and said (:func:`_wait_at_exit`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from tfdp_utils import _exit_guard
from tfdp_utils._tf import tf
from tfdp_utils.data._input_figures import Rate

WARMUP_STEPS = 2
"""Steps run before each phase's clock starts: the first one traces or fills the pipeline."""

MIN_TIMED_STEPS = 1
"""Steps each phase times even past its share of the budget (unless its step is late)."""

MIN_WINDOW_SECONDS = 0.5
"""Each phase is timed for at least this long (within its budget), past ``steps`` if need be:
a pipeline's buffers (prefetch, parallel calls in flight) hand out what they made during the
warm-up at once, and a window of a few fast steps is at the mercy of one hiccup of a shared
machine."""


class Exhausted(Exception):
    """The dataset ended twice in a row: it holds no batch."""


def cpu_seconds() -> float:
    """CPU time of this process so far, all threads, user and system."""
    times = os.times()
    return times.user + times.system


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def leading_size(value: Any) -> int:
    """The first dimension of a tensor (rows of a ragged or sparse one); 0 for a scalar."""
    if isinstance(value, tf.RaggedTensor):
        return int(value.nrows())
    if isinstance(value, tf.SparseTensor):
        return int(value.dense_shape[0])
    shape = getattr(value, "shape", None)
    return int(shape[0]) if shape is not None and shape.rank else 0


def examples_in(strategy: Any, element: Any) -> int:
    """Examples in one distributed element, summed over this worker's replicas."""
    first = tf.nest.flatten(element)[0]
    return sum(leading_size(v) for v in strategy.experimental_local_results(first))


class Feed:
    """An iterator over a distributed dataset that starts again when the dataset ends."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.iterator: Iterator[Any] | None = iter(dataset)
        self.restarts = 0

    def close(self) -> None:
        """Let the iterator go (its prefetch threads stop competing for the cores), on a
        thread of its own: destroying a distributed iterator can stall for seconds. Not a
        daemon: the interpreter's exit waits for it (a daemon stopped inside TensorFlow at
        exit aborts the process)."""
        held = [self.iterator]
        self.iterator = None
        thread = threading.Thread(target=held.clear, name="tfdp-diagnose-close")
        thread.start()

    def run(self, step: Callable[[Iterator[Any]], Any]) -> Any:
        """``step(iterator)``; once more on a fresh iterator if the dataset ended."""
        for attempt in range(2):
            try:
                return step(self.iterator)  # type: ignore[arg-type]
            except (StopIteration, tf.errors.OutOfRangeError):
                if attempt:
                    break
                self.iterator = iter(self.dataset)
                self.restarts += 1
        raise Exhausted


LATE = object()
"""What a step returns instead of its examples when its input did not come in time."""


logger = logging.getLogger("tfdp_utils")

_late: list[threading.Thread] = []
"""The ``next()`` calls left running past their deadline, for the wait at exit."""


def _wait_at_exit(grace: float | None = None) -> None:
    """Before the interpreter joins its threads at exit: wait for the late ``next()`` calls,
    saying so, at most ``grace`` seconds (``TFDP_EXIT_GRACE``, the exit guard's bound; None
    when it is off: as long as they take); then end the process with status 1 and a line
    that says why, rather than hang (a tf.data iterator cannot be interrupted)."""
    running = [thread for thread in _late if thread.is_alive()]
    if not running:
        return
    bound = _exit_guard.grace() if grace is None else grace
    logger.warning(
        "tfdp_utils: diagnose_input left %d next() of its dataset running past its deadline "
        "(a tf.data iterator cannot be interrupted); the exit waits for %s.",
        len(running),
        "it to return" if bound is None else f"it at most {bound:g} s (TFDP_EXIT_GRACE)",
    )
    deadline = math.inf if bound is None else time.monotonic() + bound
    for thread in running:
        thread.join(None if bound is None else max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in running):
        logger.error(
            "tfdp_utils: diagnose_input's next() of its dataset is still running after %g s "
            "at exit: ending the process with status 1 (its input never returned an element; "
            "set TFDP_EXIT_GRACE to wait longer).",
            bound,
        )
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(1)


def _leave_late(thread: threading.Thread) -> None:
    """Keep ``thread`` (a late ``next()``) for the bounded wait at exit."""
    if not _late:
        register = getattr(threading, "_register_atexit", None)  # before threads are joined
        if register is not None:
            register(_wait_at_exit)
    _late.append(thread)


class Fetcher:
    """``next()`` of a :class:`Feed` run on a thread and waited for up to a deadline.

    A ``next()`` still running at its deadline is left to finish on its thread (a tf.data
    iterator cannot be interrupted; not a daemon, so the interpreter's exit waits for it,
    bounded, rather than abort inside TensorFlow); the feed is then :attr:`busy` and gives
    nothing more.
    """

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self._pending: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """Whether a late ``next()`` still runs (the feed must not be used meanwhile)."""
        return self._pending is not None and self._pending.is_alive()

    def next(self, deadline: float) -> Any:
        """The feed's next element, or :data:`LATE` when it did not come by ``deadline``
        (``math.inf``: waited for as long as it takes, on several workers)."""
        if self.busy:
            return LATE
        box: list[tuple[bool, Any]] = []

        def pull() -> None:
            try:
                box.append((True, self.feed.run(next)))
            except BaseException as error:  # handed to the caller's thread
                box.append((False, error))

        thread = threading.Thread(target=pull, name="tfdp-diagnose-next")
        thread.start()
        thread.join(None if math.isinf(deadline) else max(0.0, deadline - time.perf_counter()))
        if thread.is_alive():
            self._pending = thread
            _leave_late(thread)
            return LATE
        ok, value = box[0]
        if not ok:
            raise value
        return value


@dataclasses.dataclass(frozen=True)
class Timed:
    """A phase's clock: its rate (None: no step timed), whether its budget cut it short, and
    the slowest of its windows when it was timed in several (else None)."""

    rate: Rate | None
    cut: bool
    slowest: Rate | None = None


def _no_time_for(deadline: float | None, last: float) -> bool:
    """Whether a step as long as the last one would end past ``deadline``."""
    return deadline is not None and time.perf_counter() + last > deadline


def timed(
    step: Callable[[], Any],
    *,
    steps: int,
    deadline: float | None,
    warmup: int = WARMUP_STEPS,
    min_seconds: float = 0.0,
    expected: float = 0.0,
) -> Timed:
    """Run ``step`` (it returns the examples it handled, or :data:`LATE`) ``warmup`` times,
    then time ``steps`` calls (more while under ``min_seconds``). With a ``deadline`` (None:
    exactly ``steps``, on several workers) no step starts that would end past it, judged by
    the last step's duration (``expected`` before the first; a warm-up that does not fit
    leaves the phase untimed); once warm, at least :data:`MIN_TIMED_STEPS` are timed unless a
    step is late."""
    last = expected
    for _ in range(warmup):
        if _no_time_for(deadline, last):
            return Timed(None, cut=True)
        began = time.perf_counter()
        if step() is LATE:
            return Timed(None, cut=True)
        last = time.perf_counter() - began
    cpu, start = cpu_seconds(), time.perf_counter()
    window = 0.0 if deadline is None else min(min_seconds, max(0.0, deadline - start))
    examples = done = 0
    cut = False
    while done < steps or time.perf_counter() - start < window:
        if done >= MIN_TIMED_STEPS and _no_time_for(deadline, last):
            cut = done < steps
            break
        began = time.perf_counter()
        got = step()
        if got is LATE:
            cut = True
            break
        examples += int(got)
        done += 1
        last = time.perf_counter() - began
    if not done:
        return Timed(None, cut=True)
    rate = Rate(examples, done, time.perf_counter() - start, cpu_seconds() - cpu)
    return Timed(rate, cut)


def per_call_steps(rate: Rate | None, per_call: int) -> Rate | None:
    """``rate`` with its calls of the train function counted as steps."""
    if rate is None:
        return None
    return Rate(rate.examples, rate.steps * per_call, rate.seconds, rate.cpu_seconds)
