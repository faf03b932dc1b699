"""The clock of :func:`~tfdp_utils.diagnose_input`: a step run after a warm-up, timed for at
least a window and at most to a deadline, and the examples each distributed element holds.

TensorFlow glue: the steps are the caller's (the distributed iterator drained, the compiled
train function called); this times them into a :class:`~tfdp_utils.data._input_figures.Rate`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from tfdp_utils._tf import tf
from tfdp_utils.data._input_figures import Rate

WARMUP_STEPS = 2
"""Steps run before each phase's clock starts: the first one traces or fills the pipeline."""

MIN_TIMED_STEPS = 2
"""Steps each phase times even past its share of the budget."""

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
        """Let the iterator go (its prefetch threads stop competing for the cores)."""
        self.iterator = None

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


def timed(
    step: Callable[[], int],
    *,
    steps: int,
    deadline: float | None,
    warmup: int = WARMUP_STEPS,
    min_seconds: float = 0.0,
) -> Rate:
    """Run ``step`` (it returns the examples it handled) ``warmup`` times, then time ``steps``
    calls (more while under ``min_seconds``), stopping at ``deadline`` (None: never, and then
    exactly ``steps``) after :data:`MIN_TIMED_STEPS`."""
    for _ in range(warmup):
        step()
    cpu, start = cpu_seconds(), time.perf_counter()
    # Without a deadline (several workers) every worker times exactly ``steps``.
    window = 0.0 if deadline is None else min(min_seconds, max(0.0, deadline - start))
    examples = done = 0
    while done < steps or time.perf_counter() - start < window:
        examples += step()
        done += 1
        if deadline is not None and done >= MIN_TIMED_STEPS and time.perf_counter() > deadline:
            break
    return Rate(examples, done, time.perf_counter() - start, cpu_seconds() - cpu)


def per_call_steps(rate: Rate, per_call: int) -> Rate:
    """``rate`` with its calls of the train function counted as steps."""
    return Rate(rate.examples, rate.steps * per_call, rate.seconds, rate.cpu_seconds)
