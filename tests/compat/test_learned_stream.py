"""The stream of a fit's later epochs over data of unknown size, started before its steps are known.

``fit`` starts the stream on a thread once its first epoch's first step has run
(:meth:`LearnedEpochs.start_stream`): the stream reads its first epoch while the steps are still
unknown, waits for them where they decide, and a fit that ends first gives them up, so that no
read waits on. Truth comes from the source's own passes and from the example ids the stream's
iterator yields, never from the stream's arithmetic.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf
from tfdp_utils.compat import _learned_steps

pytestmark = pytest.mark.keras

STRATEGIES = {
    "1 replica": lambda: tdu.auto_strategy(devices=["/cpu:0"], verbose=False),
    "2 replicas": lambda: tdu.auto_strategy(devices=["/cpu:0", "/cpu:1"], verbose=False),
}
N, STEPS = 23, 6  # 6 steps of 4, the last one partial


def _counted_source(passes: list[float]) -> Any:
    """Examples ``(id, id)`` for ids ``0 .. N - 1`` of unknown size; each pass noted."""

    def generate() -> Any:
        passes.append(time.monotonic())
        yield from range(N)

    source = tf.data.Dataset.from_generator(generate, output_signature=tf.TensorSpec([], tf.int64))

    def pair(i: Any) -> Any:
        value = tf.reshape(tf.cast(i, tf.float32), [1])
        return value, value

    return source.map(pair)


def _learned(name: str, passes: list[float]) -> tuple[Any, _learned_steps.LearnedEpochs]:
    strategy = STRATEGIES[name]()
    dist = tdu.build_distributed_dataset(
        _counted_source(passes),
        strategy=strategy,
        global_batch_size=4,
        shuffle_buffer_size=N,
        seed=5,
    )
    learnable = dist.tfdp.learnable()
    assert learnable is not None
    return strategy, _learned_steps.LearnedEpochs(dist, learnable, learnable.seed, 0, 3)


def _wait_for(condition: Any, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(condition())


def _stream_threads() -> list[threading.Thread]:
    names = ("tfdp-build-stream", "tfdp-release-iterator")
    return [t for t in threading.enumerate() if t.name in names]


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_the_stream_reads_before_its_steps_are_known_and_pads_to_them(name: str) -> None:
    passes: list[float] = []
    strategy, learned = _learned(name, passes)
    learned.start_stream(1)
    assert _wait_for(lambda: len(passes) == 1), "the stream read nothing before its steps"
    iterator = learned.stream_iterator(1, STEPS)
    epochs = []
    for _ in range(2):  # epochs 1 and 2 (the stream ends with the fit's last, epoch 2)
        ids: list[int] = []
        for _ in range(STEPS):
            x, _y = next(iterator)
            for part in strategy.experimental_local_results(x):
                ids.extend(int(v) for v in part.numpy().reshape(-1))
        epochs.append(ids)
    with pytest.raises((StopIteration, tf.errors.OutOfRangeError)):
        next(iterator)
    learned.end()
    _learned_steps.join_releases(timeout=30.0)
    assert [sorted(ids) for ids in epochs] == [list(range(N))] * 2  # each example once
    assert epochs[0] != epochs[1], "the order repeats across epochs"
    assert len(passes) == 2  # one pass per epoch, none past the last
    assert not _stream_threads()


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_steps_never_learnt_end_the_stream_at_the_fits_end(name: str) -> None:
    passes: list[float] = []
    _, learned = _learned(name, passes)
    learned.start_stream(1)
    assert _wait_for(lambda: len(passes) == 1)
    learned.end()  # the fit ended in its first epoch: the stream waits for steps no more
    _learned_steps.join_releases(timeout=30.0)
    assert not _stream_threads(), "a read still waits for steps that will never come"
    assert len(passes) == 1


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_a_fit_stopped_in_its_first_epoch_leaves_nothing_waiting(name: str) -> None:
    passes: list[float] = []
    strategy = STRATEGIES[name]()
    dist = tdu.build_distributed_dataset(
        _counted_source(passes), strategy=strategy, global_batch_size=4
    )

    class StopAtTheThirdStep(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.batches = 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.batches += 1
            if batch == 2:
                self.model.stop_training = True

    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
    stop = StopAtTheThirdStep()
    model.fit(dist, epochs=3, verbose=0, callbacks=[stop])
    _learned_steps.join_releases(timeout=30.0)
    assert stop.batches == 3
    assert not _stream_threads(), "a read still waits for steps that will never come"


def test_a_slow_build_is_said_while_the_second_epoch_waits_and_ends_in_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tfdp_utils import _waiting

    passes: list[float] = []
    _, learned = _learned("1 replica", passes)
    release = threading.Event()
    make = learned._make_iterator

    def held_build(*args: Any, **kwargs: Any) -> Any:  # the build, held until released
        release.wait(60)
        return make(*args, **kwargs)

    monkeypatch.setattr(learned, "_make_iterator", held_build)
    monkeypatch.setattr(_learned_steps, "_BUILD_TIMEOUT_S", 1.0)
    monkeypatch.setattr(_waiting, "PROGRESS_INTERVAL", 0.2)
    learned.start_stream(1)
    try:
        with (
            caplog.at_level("WARNING", logger="tfdp_utils"),
            pytest.raises(TimeoutError, match=r"was not built within 1 s; undo the compat change"),
        ):
            learned.stream_iterator(1, STEPS)
    finally:
        release.set()
        learned.end()
        _learned_steps.join_releases(timeout=30.0)
    said = [r.getMessage() for r in caplog.records if "still waiting for" in r.getMessage()]
    assert said, "the wait said nothing"
    assert "to be built on thread tfdp-build-stream (now in held_build < _build)" in said[0]
    assert "bound 1 s; change it with tdu.compat.undo('fit-one-iterator')" in said[0]
    assert not _stream_threads()
