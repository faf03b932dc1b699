"""How the workers agree on the step at which to save or stop, without a per-step collective.

A request ("stop after call N", "save after call N") is agreed once, when it is made, through
TensorFlow's coordination service (the key-value store every MultiWorkerMirroredStrategy job
already runs), never at every step:

1. The worker that wants it (the one that received the signal; the chief for timed saves), at
   the end of its call ``k`` of ``on_train_batch_end``, writes request ``n`` = "after call
   ``k + 1``". Writing a key that exists fails, so of two simultaneous requests the first
   wins; the second worker adopts it and makes its own later.
2. A watcher thread on every worker waits for request ``n`` (in slices of a second), records it
   and acknowledges it. Closing the channel writes a "closed" mark where the watchers wait (the
   next request's key) so that every watcher of the fit returns at once instead of at the end of
   its slice; a proposal that meets the mark agrees on nothing (the fit ended on a worker).
3. The requester waits for every acknowledgement before it starts its call ``k + 1``. The others
   cannot finish that call before it does (each step's collectives need every worker), so each
   of them has the request before its own end of call ``k + 1``, where all act on it.

After a stop's save the workers wait for each other's part (:func:`barrier`): each marks its
part, the chief alone reads the marks and writes one "all saved" key, which the others wait on
and confirm they read (the chief's process runs the service: it leaves after them), so a stop
reads 3(N - 1) keys, not N².

With one worker there is nothing to agree: the callback acts on its own notice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tfdp_utils._waiting import WaitProgress
from tfdp_utils.cluster._coordination import KeyValueStore

logger = logging.getLogger("tfdp_utils")

_SLICE_MS = 1000

CLOSED = "closed"
"""The action of the mark :meth:`CoordinationChannel.close` writes: no request, the fit ended."""


@dataclasses.dataclass(frozen=True)
class Request:
    """An agreed action at a step boundary.

    Attributes:
        action: ``"stop"`` (save, then stop), ``"save"`` (save and go on), or :data:`CLOSED`
            (no request: the channel of the worker that wrote it was closed).
        call: the training step (counted from the job's first, as the global step) after which
            every worker acts.
        worker: the worker that asked.
        reason: why, in words (``"SIGTERM on worker 1"``, ``"every_seconds=600"``).
    """

    action: str
    call: int
    worker: int
    reason: str

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> Request:
        return cls(**json.loads(text))


class CoordinationChannel:
    """Several workers: requests through a key-value store (see the module docstring).

    Args:
        store: the key-value store.
        prefix: keys of this ``fit`` start with it (distinct per fit and per job).
        worker: this worker's index.
        num_workers: workers in the job.
        ack_timeout: seconds a requester waits for every acknowledgement.
        exists_error: the exception ``store.set`` raises for a key that exists.
    """

    def __init__(
        self,
        store: KeyValueStore,
        prefix: str,
        *,
        worker: int,
        num_workers: int,
        ack_timeout: float = 30.0,
        exists_error: type[BaseException] = KeyError,
    ) -> None:
        self.store, self.prefix = store, prefix
        self.worker, self.num_workers = worker, num_workers
        self.ack_timeout = ack_timeout
        self.exists_error = exists_error
        self._requests: list[Request] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._closed: Request | None = None  # the mark that ended the watcher, once read
        self._watcher = threading.Thread(
            target=self._watch, name="tfdp-preemption-watcher", daemon=True
        )
        self._watcher.start()

    def _request_key(self, index: int) -> str:
        return f"{self.prefix}/request/{index}"

    def _ack_key(self, index: int, worker: int) -> str:
        return f"{self.prefix}/ack/{index}/{worker}"

    def _watch(self) -> None:
        index = 0
        while not self._stop.is_set():
            try:
                value = self.store.get(self._request_key(index), _SLICE_MS)
            except Exception as error:  # the service went away: the job is ending
                if not self._stop.is_set():
                    logger.debug("tfdp_utils: preemption watcher stops: %s", error)
                return
            if value is None:
                continue
            request = Request.decode(value)
            with self._changed:
                if request.action == CLOSED:
                    self._closed = request
                else:
                    self._requests.append(request)
                self._changed.notify_all()
            if request.action == CLOSED:
                return  # a closed channel's mark: no request can be agreed after it
            try:
                self.store.set(self._ack_key(index, self.worker), "1")
            except Exception as error:  # pragma: no cover - the service went away
                logger.debug("tfdp_utils: preemption watcher cannot acknowledge: %s", error)
                return
            index += 1

    def propose(self, action: str, *, after_call: int, reason: str) -> Request:
        """Request ``action`` after call ``after_call + 1``; return the request agreed.

        That is another worker's when one was made at the same time (the first written wins);
        the caller then acts on that one and asks again if it still needs its own. It is a
        :data:`CLOSED` mark when a worker closed its channel first (its fit ended): nothing is
        agreed then.
        """
        request = Request(action, after_call + 1, self.worker, reason)
        with self._lock:
            index = len(self._requests)
            if self._closed is not None:
                return self._closed
        # Another worker's request may hold this index: it is then the one agreed.
        with contextlib.suppress(self.exists_error):
            self.store.set(self._request_key(index), request.encode())
        deadline = time.monotonic() + self.ack_timeout  # one bound for the whole agreement
        agreed = self._wait_for(index, deadline)
        if agreed.action != CLOSED:
            self._wait_for_acks(index, agreed, deadline)
        return agreed

    def _wait_for(self, index: int, deadline: float) -> Request:
        with self._changed:
            while len(self._requests) <= index:
                if self._closed is not None:
                    return self._closed
                left = deadline - time.monotonic()
                if left <= 0 or not self._watcher.is_alive():
                    raise TimeoutError(
                        f"the preemption request {index} was not received back within "
                        f"{self.ack_timeout:g} s through TensorFlow's coordination service."
                    )
                self._changed.wait(min(left, 1.0))
            return self._requests[index]

    def _wait_for_acks(self, index: int, request: Request, deadline: float) -> None:
        for worker in range(self.num_workers):
            while True:
                value = self.store.get(self._ack_key(index, worker), _slice_ms(deadline))
                if value is not None:
                    break
                if time.monotonic() >= deadline:
                    logger.warning(
                        "tfdp_utils: worker %d did not acknowledge the request to %s after "
                        "call %d within %g s; going on (it may be gone).",
                        worker,
                        request.action,
                        request.call,
                        self.ack_timeout,
                    )
                    break

    def received(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def close(self) -> None:
        """Stop the watcher and join it (bounded by two slices).

        The watcher's pending read is woken by a :data:`CLOSED` mark written where it waits;
        the same mark wakes the other workers' watchers of this fit. Where a request holds that
        key already, the watcher reads it, sees the stop and returns.
        """
        self._stop.set()
        if self._watcher.is_alive():
            with self._lock:
                index = len(self._requests)
            mark = Request(CLOSED, -1, self.worker, f"the fit ended on worker {self.worker}")
            try:
                self.store.set(self._request_key(index), mark.encode())
            except self.exists_error:
                pass  # a request or another worker's mark is there: the watcher reads it
            except Exception as error:  # the service went away: the read returns on its own
                logger.debug("tfdp_utils: cannot wake the preemption watcher: %s", error)
        self._watcher.join(timeout=2 * _SLICE_MS / 1000)


def _slice_ms(deadline: float) -> int:
    """A wait of at most one slice that ends by ``deadline`` (at least 1 ms)."""
    return max(1, min(_SLICE_MS, int((deadline - time.monotonic()) * 1000)))


def barrier(
    store: KeyValueStore,
    key: str,
    *,
    worker: int,
    num_workers: int,
    timeout: float,
    say: Callable[[str], Any] = logger.warning,
) -> bool:
    """Wait up to ``timeout`` s until every worker's part (of the save after a stop) is done.

    Each worker other than the chief marks ``key/<worker>``; the chief reads those marks in
    turn and writes ``key/all`` (the workers it did not see, as a JSON list), which the others
    wait on; each of them then marks ``key/read/<worker>``, and the chief, whose process runs
    the coordination service, leaves once the workers it saw have read its verdict: 3(N - 1)
    keys read per stop. A worker that ends its wait without every part names the workers
    missing (through ``say``; the chief when its service stopped answering) and returns False.
    """
    deadline = time.monotonic() + timeout
    if worker == 0:
        missing = _missing_marks(store, key, range(1, num_workers), deadline)
        store.set(f"{key}/all", json.dumps(missing))
        seen = [other for other in range(1, num_workers) if other not in missing]
        _missing_marks(store, f"{key}/read", seen, deadline)
    else:
        store.set(f"{key}/{worker}", "1")
        try:
            missing = _chief_verdict(store, key, num_workers, deadline)
            store.set(f"{key}/read/{worker}", "1")
        except Exception as error:  # the service is gone: the chief left without a verdict
            logger.debug("tfdp_utils: the chief's verdict cannot be read: %s", error)
            missing = [0]
    if missing:
        names = ", ".join(str(other) for other in missing)
        say(
            f"tfdp_utils: worker{'s' if len(missing) > 1 else ''} {names} did not finish "
            f"{'their' if len(missing) > 1 else 'its'} part of the save within {timeout:g} s; "
            "exiting without it."
        )
    return not missing


def _missing_marks(
    store: KeyValueStore, key: str, workers: Sequence[int], deadline: float
) -> list[int]:
    """The workers whose mark ``key/<worker>`` is not set by ``deadline`` (read in turn; past
    the deadline, each remaining mark is read once without waiting)."""
    missing = []
    for other in workers:
        while store.get(f"{key}/{other}", _slice_ms(deadline)) is None:
            if time.monotonic() >= deadline:
                missing.append(other)
                break
    return missing


def _chief_verdict(store: KeyValueStore, key: str, num_workers: int, deadline: float) -> list[int]:
    """The workers the chief did not see, as its ``key/all`` says; at the deadline without it,
    the workers whose mark is not set (the chief included when every other one is)."""
    while True:
        verdict = store.get(f"{key}/all", _slice_ms(deadline))
        if verdict is not None:
            return [int(other) for other in json.loads(verdict)]
        if time.monotonic() >= deadline:
            break
    # The chief did not answer in time: name whom it still waits for, or the chief itself.
    unmarked = [other for other in range(1, num_workers) if store.get(f"{key}/{other}", 1) is None]
    return unmarked or [0]


def gather(
    store: KeyValueStore,
    key: str,
    *,
    worker: int,
    num_workers: int,
    mine: str,
    decide: Callable[[list[str]], str],
    timeout: float,
    progress_interval: float | None = None,
) -> str:
    """Every worker's ``mine`` to the chief, which decides once for all: the verdict each
    worker returns (the chief's ``decide`` of every worker's text, in worker order). A wait
    logs what it waits for every ``progress_interval`` seconds (``None``: the default of
    :class:`~tfdp_utils._waiting.WaitProgress`).

    Each worker other than the chief writes ``key/<worker>``; the chief reads them in turn and
    writes ``key/verdict``, which the others wait on; each of them then marks
    ``key/read/<worker>``, and the chief, whose process runs the coordination service (a
    refusal ends it), returns once they read it: 2N - 1 keys.

    Raises:
        TimeoutError: a worker's text (on the chief) or the chief's verdict (on the others)
            did not come within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout

    def wait(name: str, what: str, late: str) -> str:
        progress = WaitProgress(
            what,
            bound=timeout,
            change="no setting: start every worker of the job",
            interval=progress_interval,
        )
        while (text := store.get(f"{key}/{name}", _slice_ms(deadline))) is None:
            progress.tick()
            if time.monotonic() >= deadline:
                raise TimeoutError(late)
        return text

    if worker != 0:
        store.set(f"{key}/{worker}", mine)
        verdict = wait(
            "verdict",
            "worker 0's verdict on where the resumed job starts",
            f"worker 0 did not tell worker {worker} within {timeout:g} s, through "
            "TensorFlow's coordination service, where the job resumes.",
        )
        store.set(f"{key}/read/{worker}", "1")
        return verdict
    texts = [mine]
    for other in range(1, num_workers):
        texts.append(
            wait(
                str(other),
                f"worker {other} to tell where it would resume",
                f"worker {other} did not tell worker 0 within {timeout:g} s, through "
                "TensorFlow's coordination service, where it resumes; it may not have "
                "started, or it runs another script.",
            )
        )
    verdict = decide(texts)
    store.set(f"{key}/verdict", verdict)
    _missing_marks(store, f"{key}/read", range(1, num_workers), deadline)
    return verdict
