"""auto_strategy() overhead against building the same strategy by hand, and TPU fall-back time.

Run: python benchmarks/strategy.py [--rounds N]

Both constructions run alternately in one process (2 logical CPUs), so machine noise hits both
alike; the figure is the ratio of medians. The fall-back time is measured against a metadata
server on 127.0.0.1 that accepts connections and never answers.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import statistics
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import tfdp_utils as tdu  # noqa: E402

logging.getLogger("tfdp_utils").setLevel(logging.WARNING)


def time_once(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def construction_ratio(rounds: int) -> dict[str, float]:
    devices = ["/device:CPU:0", "/device:CPU:1"]
    auto, direct = [], []
    # Warm both paths once (first construction initialises the runtime).
    tdu.auto_strategy()
    tf.distribute.MirroredStrategy(devices)
    for i in range(rounds):
        pair = [
            ("auto", lambda: tdu.auto_strategy()),
            ("direct", lambda: tf.distribute.MirroredStrategy(devices)),
        ]
        if i % 2:
            pair.reverse()
        for name, fn in pair:
            (auto if name == "auto" else direct).append(time_once(fn))
    auto_median, direct_median = statistics.median(auto), statistics.median(direct)
    return {
        "auto_ms": auto_median * 1e3,
        "direct_ms": direct_median * 1e3,
        "ratio": auto_median / direct_median,
    }


def tpu_fallback_seconds(probe_timeout: float) -> float:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    os.environ["TPU_NAME"] = "bench-tpu"
    os.environ["GCE_METADATA_IP"] = f"127.0.0.1:{server.getsockname()[1]}"
    try:
        start = time.perf_counter()
        strategy = tdu.auto_strategy(probe_timeout=probe_timeout)
        elapsed = time.perf_counter() - start
        assert not isinstance(strategy, tf.distribute.TPUStrategy)
    finally:
        del os.environ["TPU_NAME"], os.environ["GCE_METADATA_IP"]
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        server.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--probe-timeout", type=float, default=2.0)
    args = parser.parse_args()
    ratio = construction_ratio(args.rounds)
    print(
        f"auto_strategy(): {ratio['auto_ms']:.2f} ms, MirroredStrategy(devices): "
        f"{ratio['direct_ms']:.2f} ms, ratio {ratio['ratio']:.3f} (goal <= 1.1), "
        f"median of {args.rounds} alternating rounds"
    )
    fallback = tpu_fallback_seconds(args.probe_timeout)
    print(
        f"silent TPU metadata server: fell back in {fallback:.2f} s with "
        f"probe_timeout={args.probe_timeout:g} s (bound: probe_timeout + 1 s)"
    )


if __name__ == "__main__":
    main()
