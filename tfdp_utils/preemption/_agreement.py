"""How the workers agree on the step at which to save or stop, without a per-step collective.

A request ("stop after call N", "save after call N") is agreed once, when it is made, through
TensorFlow's coordination service (the key-value store every MultiWorkerMirroredStrategy job
already runs), never at every step:

1. The worker that wants it (the one that received the signal; the chief for timed saves), at
   the end of its call ``k`` of ``on_train_batch_end``, writes request ``n`` = "after call
   ``k + 1``". Writing a key that exists fails, so of two simultaneous requests the first
   wins; the second worker adopts it and makes its own later.
2. A watcher thread on every worker waits for request ``n`` (in slices of a second, so that it
   can stop), records it and acknowledges it.
3. The requester waits for every acknowledgement before it starts its call ``k + 1``. The others
   cannot finish that call before it does (each step's collectives need every worker), so each
   of them has the request before its own end of call ``k + 1``, where all act on it.

With one worker there is nothing to agree: the callback acts on its own notice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tfdp_utils.cluster._coordination import KeyValueStore

logger = logging.getLogger("tfdp_utils")

_SLICE_MS = 1000


@dataclasses.dataclass(frozen=True)
class Request:
    """An agreed action at a step boundary.

    Attributes:
        action: ``"stop"`` (save, then stop) or ``"save"`` (save and go on).
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
                self._requests.append(request)
                self._changed.notify_all()
            try:
                self.store.set(self._ack_key(index, self.worker), "1")
            except Exception as error:  # pragma: no cover - the service went away
                logger.debug("tfdp_utils: preemption watcher cannot acknowledge: %s", error)
                return
            index += 1

    def propose(self, action: str, *, after_call: int, reason: str) -> Request:
        """Request ``action`` after call ``after_call + 1``; return the request agreed.

        That is another worker's when one was made at the same time (the first written wins);
        the caller then acts on that one and asks again if it still needs its own.
        """
        request = Request(action, after_call + 1, self.worker, reason)
        with self._lock:
            index = len(self._requests)
        # Another worker's request may hold this index: it is then the one agreed.
        with contextlib.suppress(self.exists_error):
            self.store.set(self._request_key(index), request.encode())
        deadline = time.monotonic() + self.ack_timeout  # one bound for the whole agreement
        agreed = self._wait_for(index, deadline)
        self._wait_for_acks(index, agreed, deadline)
        return agreed

    def _wait_for(self, index: int, deadline: float) -> Request:
        with self._changed:
            while len(self._requests) <= index:
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
        self._stop.set()
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
    """Mark ``key/<worker>`` and wait up to ``timeout`` s for every worker's mark."""
    store.set(f"{key}/{worker}", "1")
    deadline = time.monotonic() + timeout
    for other in range(num_workers):
        while store.get(f"{key}/{other}", _slice_ms(deadline)) is None:
            if time.monotonic() >= deadline:
                say(
                    f"tfdp_utils: worker {other} did not finish its part of the save within "
                    f"{timeout:g} s; exiting without it."
                )
                return False
    return True
