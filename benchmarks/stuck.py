"""Cost of naming a stuck worker: what the collective watchdog adds per interval.

One process trains a small Keras model with ``fit`` on the main thread; a side thread samples
the training thread's stack every 10 ms, as the watchdog does once an interval, and times:

- ``sample``: what the watchdog did before (``sys._current_frames()`` and its in-call test);
- ``classify``: the phase from the frames (:func:`frame_phase`), done at every sample;
- ``resolve``: the step number and input clock (:func:`fit_facts`: ``fit``'s locals, a variable
  read, the clock's three reads), done only for a phase that lasted an interval (at most once
  an interval, only while a step, callback or save lasts that long).

Publishing (delete + set in the coordination service) runs on a helper thread, once per change.

Run:  python benchmarks/stuck.py [--samples 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import numpy as np

import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf
from tfdp_utils.strategy._faults import _tensorflow_dir
from tfdp_utils.strategy._phase_tracker import fit_facts
from tfdp_utils.strategy._stuck import frame_phase


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()

    strategy = tf.distribute.get_strategy()
    x = np.random.RandomState(0).rand(4096, 32).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    dist = tdu.build_distributed_dataset(
        (x, y), strategy=strategy, global_batch_size=64, repeat=True
    )
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    prefix = _tensorflow_dir()

    def in_call(frame: object) -> bool:
        return frame.f_code.co_filename.startswith(prefix)  # type: ignore[attr-defined]

    main_id = threading.get_ident()
    times: dict[str, list[float]] = {"sample": [], "classify": [], "resolve": []}
    depth: list[int] = []
    done = threading.Event()

    def sampler() -> None:
        time.sleep(3.0)  # past the first trace
        while len(times["resolve"]) < args.samples and not done.is_set():
            start = time.perf_counter()
            frame = sys._current_frames().get(main_id)
            if frame is None:
                return
            in_call(frame)
            middle = time.perf_counter()
            frame_phase(frame, in_call)
            classified = time.perf_counter()
            fit_facts(frame)
            end = time.perf_counter()
            times["sample"].append(middle - start)
            times["classify"].append(classified - middle)
            times["resolve"].append(end - classified)
            n, current = 0, frame
            while current is not None:
                n, current = n + 1, current.f_back
            depth.append(n)
            del frame, current
            time.sleep(0.01)
        done.set()

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()

    class Stop(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            if done.is_set():
                self.model.stop_training = True

    model.fit(dist, epochs=1000, steps_per_epoch=200, callbacks=[Stop()], verbose=0)
    thread.join()
    flavour = "tf_keras" if keras.__name__.startswith("tf_keras") else f"Keras {keras.__version__}"
    print(
        f"{flavour}, {len(times['sample'])} samples, stack depth median {statistics.median(depth)}"
    )
    for name, values in times.items():
        micro = sorted(v * 1e6 for v in values)
        print(
            f"{name:9s} median {statistics.median(micro):7.1f} us   p90 "
            f"{micro[int(0.9 * len(micro))]:7.1f} us"
        )


if __name__ == "__main__":
    main()
