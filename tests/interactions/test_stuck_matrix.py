"""The stuck-worker diagnosis crossed with the settings users combine it with.

The collective watchdog names what a stuck worker does from its training thread's frames and the
``fit`` on its stack (:mod:`tfdp_utils.strategy._stuck`): the phase, and the step as users count
it (the batches trained, as Keras' batch indices, the progress bar and ThroughputLogger's step
axis count them). Each cell runs the job of :mod:`support.interactions` in a thread and parks it
for good at a known batch — in a callback after batch k, in validation, or in the input
pipeline at batch k — then reads the phase as the watchdog does and compares it with the batch
the test itself counted. Real fits, both Kerases; the two-worker path (the diagnosis read
through the coordination service, the stuck worker ending) is in tests/strategy.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Any

import pytest
from support import interactions as job
from support.pairwise import all_pairs

from tfdp_utils._tf import IS_KERAS3, keras, tf
from tfdp_utils.strategy._build import step_facts
from tfdp_utils.strategy._faults import _tensorflow_dir
from tfdp_utils.strategy._stuck import Phase, frame_phase, resolve

pytestmark = [pytest.mark.keras, pytest.mark.slow]

_FACTORS = {
    k: v
    for k, v in job.FACTORS.items()
    if k in ("spe", "accumulation", "mixed", "validation", "unknown_size", "replicas")
}
_WHERE = ("callback", "input", "validation")
ROWS = [(job.Settings(**row), _WHERE[i % len(_WHERE)]) for i, row in enumerate(all_pairs(_FACTORS))]
AT = 9  # the batch (from the job's start) after which the cell parks: 3 of epoch 2
# An input cell fits longer than the job's 3 epochs: the pipeline runs ahead of the loop (a
# shuffle buffer of 64 examples, prefetching, one iterator across epochs for data of unknown
# size), and with 3 epochs all it still had to read after batch AT fits in that lead, so under
# load it could read to the end before the loop reached AT and never block.
INPUT_EPOCHS = 8


def _in_call(frame: Any) -> bool:
    return bool(frame.f_code.co_filename.startswith(_tensorflow_dir()))


class _Park(keras.callbacks.Callback):  # type: ignore[misc]
    """Parks the training thread in ``on_train_batch_end`` once ``at`` batches are done."""

    def __init__(self, at: int, parked: threading.Event | None, release: threading.Event) -> None:
        super().__init__()
        self.at, self.parked, self.release = at, parked, release  # parked None: count only
        self.epoch, self.done = 0, 0

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.done = self.epoch * job.STEPS_PER_EPOCH + batch + 1
        if self.parked is not None and self.done >= self.at and not self.parked.is_set():
            self.parked.set()
            self.release.wait(60)


class _ParkInValidation(keras.callbacks.Callback):  # type: ignore[misc]
    def __init__(self, parked: threading.Event, release: threading.Event) -> None:
        super().__init__()
        self.parked, self.release = parked, release

    def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
        if not self.parked.is_set():
            self.parked.set()
            self.release.wait(60)


def _phase_when_parked(
    settings: job.Settings, where: str
) -> tuple[Phase, int, threading.Thread, threading.Event, int]:
    """Start the cell's fit in a thread, wait until it is parked, and read its phase."""
    strategy = job.strategy_for(settings)
    cell = job.Job(settings, strategy)
    parked, release = threading.Event(), threading.Event()
    counter = _Park(AT, parked if where == "callback" else None, release)
    callbacks: list[Any] = [counter]
    validation = job.validation_data(strategy) if settings.validation else None
    kwargs: dict[str, Any] = {}
    if where == "input":
        # The pipeline blocks from the first example of batch AT + 1 on (a from_generator
        # source or arrays alike): the input clock says the loop waits for that batch.
        def block(x: Any, y: Any) -> tuple[Any, Any]:
            def wait(ids: Any) -> Any:
                if counter.done >= AT:
                    parked.set()
                    release.wait(60)
                return ids

            x = tf.numpy_function(wait, [x], tf.float32, stateful=True)
            x.set_shape([3])
            return x, y

        kwargs["map_fn"] = block
    if where == "validation":
        callbacks.append(_ParkInValidation(parked, release))
    data = job.dataset(settings, strategy, **kwargs)
    errors: list[BaseException] = []

    def train() -> None:
        try:
            epochs = INPUT_EPOCHS if where == "input" else job.EPOCHS
            job.fit(cell, data, callbacks, validation=validation, epochs=epochs)
        except BaseException as error:  # reported by the test
            errors.append(error)

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    if not parked.wait(120):
        state = "still running" if thread.is_alive() else "ended"
        raise AssertionError(f"the cell never parked ({state}, {counter.done} batches, {errors})")
    # As the watchdog does: a phase counts once it lasted (the same anchor over 1.2 s: four
    # samples 0.3 s apart); the loop may still train on batches fetched before the pipeline
    # blocked, and under load a passing phase (a garbage collection destroying an iterator
    # inside Keras' frames) can last over one interval.
    last: Any = None
    steady = 0
    deadline = time.monotonic() + 60
    while True:
        time.sleep(0.3)
        frame = sys._current_frames()[thread.ident or 0]
        seen = frame_phase(frame, _in_call)
        steady = steady + 1 if last is not None and seen.anchor is last.anchor else 0
        if steady == 4:
            break
        assert time.monotonic() < deadline, "the training thread never stayed in one phase"
        last = seen
    phase = resolve(seen, step_facts(frame), since=0.0)
    del frame, seen, last
    return phase, counter.done, thread, release, _skipped(cell.model)


def _skipped(model: Any) -> int:
    """Steps Keras 3's loss scale skipped, read from its scale: each skip halves it (it
    doubles only after 2,000 good steps, far more than a cell trains)."""
    optimizer = model.optimizer
    if not IS_KERAS3 or not hasattr(optimizer, "dynamic_scale"):
        return 0
    return round(math.log2(optimizer.initial_scale / float(optimizer.dynamic_scale.numpy())))


@pytest.mark.parametrize(("settings", "where"), ROWS, ids=[f"{s.label()}-{w}" for s, w in ROWS])
def test_the_stuck_phase_names_the_batch_users_count(settings: job.Settings, where: str) -> None:
    if not settings.validation and where == "validation":
        where = "callback"
    if not IS_KERAS3 and settings.unknown_size and settings.spe > 1:
        # tf_keras ends an epoch only between executions: refused before the first step.
        with job.applied(settings), pytest.raises(ValueError, match="unknown size"):
            strategy = job.strategy_for(settings)
            job.fit(job.Job(settings, strategy), job.dataset(settings, strategy), [])
        return
    with job.applied(settings):
        phase, done, thread, release, skipped = _phase_when_parked(settings, where)
        release.set()
        thread.join(120)
    # The step as users count it, where the counter is exact; two documented limits
    # (docs/scale-out.md, "Who is stuck, and where"): Keras 3's loss scale does not count the
    # steps it skipped, and Keras counts one more iteration at each end of data of unknown size.
    if where == "callback":
        # Parked in _Park.on_train_batch_end after `done` batches (the first batch-end hook
        # at or after AT: every steps_per_execution batches).
        assert (phase.kind, phase.where) == ("callback", "_Park.on_train_batch_end"), phase
        expected = done
    elif where == "input":
        # The loop waits for the first batch after the `done` ones.
        assert phase.kind == "input", (phase, done)
        expected = done + 1
    else:
        assert phase.kind == "callback" and phase.where == "_ParkInValidation.on_test_batch_end"
        expected = None
    assert phase.step is not None, phase
    if settings.unknown_size:  # ahead by the end-of-data iterations, never behind
        assert phase.step >= (expected or 0) - skipped, (phase, done, skipped)
    elif expected is None:  # validation follows the epoch's last batch
        assert (phase.step + skipped) % job.STEPS_PER_EPOCH == 0, (phase, skipped)
    else:
        assert phase.step == expected - skipped, (phase, done, skipped)
    if where == "callback" and not skipped and not settings.unknown_size:
        assert phase.describe() == f"in a callback (_Park.on_train_batch_end) after step {done}"
