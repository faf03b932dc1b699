"""One process of scripts/compare_upstream.py: call one auto_strategy, then fit on its result.

    python scripts/compare_upstream_child.py {tfdp-utils,upstream} --out FILE [--ray]

Imports TensorFlow (configuring ``--logical-cpus`` first), times the call under a hard bound
(``--call-bound``: past it the process records "hung" and ends itself), records what it
returned and said, then a short Keras 3 ``fit`` on the result under the same bound. Each
record is one JSON line in ``--out``. ``--ray`` runs the same steps in the 2 workers of a
Ray Train ``TensorflowTrainer`` (its files are ``--out`` + ``.0`` / ``.1``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

STRATEGY_LOGGERS = ("tensorflow", "tfdp_utils", "absl")


class _Records:
    """Log records and Python warnings emitted while a call runs."""

    def __init__(self) -> None:
        import logging

        self.lines: list[dict[str, str]] = []
        outer = self

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                outer.lines.append(
                    {"logger": record.name, "level": record.levelname, "text": record.getMessage()}
                )

        self.handler = Handler(level=logging.INFO)
        for name in STRATEGY_LOGGERS:
            logging.getLogger(name).addHandler(self.handler)
        # tfdp-utils prints its line to stderr when no logging set-up shows INFO; with a level
        # set it logs the same line here instead.
        logging.getLogger("tfdp_utils").setLevel(logging.INFO)

    def warning(self, message: object, category: type, *_: Any, **__: Any) -> None:
        self.lines.append({"logger": "warnings", "level": category.__name__, "text": str(message)})


def _emit(out: Path, record: dict[str, Any]) -> None:
    with open(out, "a", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")


def _bounded(out: Path, phase: str, bound: float) -> threading.Timer:
    """A timer that records "did not return" and ends the process when ``bound`` passes."""

    def expire() -> None:
        _emit(out, {"event": phase, "hung": True, "seconds": bound})
        os._exit(3)

    timer = threading.Timer(bound, expire)
    timer.daemon = True
    timer.start()
    return timer


def _call(side: str, records: _Records) -> Any:
    import warnings

    from tensorflow.python.platform import tf_logging

    tf_logging.get_logger().setLevel("INFO")  # recorded; the table shows WARNING and above
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = records.warning
        if side == "tfdp-utils":
            import tfdp_utils as tdu

            return tdu.auto_strategy()
        import tensorflow as tf

        return tf.distribute.experimental.auto_strategy()


def _describe(side: str, strategy: Any) -> dict[str, Any]:
    described = {
        "strategy": type(strategy).__name__,
        "replicas": int(strategy.num_replicas_in_sync),
    }
    if side == "tfdp-utils":
        import tfdp_utils as tdu

        choice = tdu.strategy.explain(strategy)
        described["reason"] = choice.reason if choice else None
    return described


def _fit(strategy: Any) -> dict[str, Any]:
    import keras
    import numpy as np
    import tensorflow as tf

    x = np.random.default_rng(0).random((64, 4), dtype=np.float32)
    y = x.sum(axis=1, keepdims=True)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    history = model.fit(data, epochs=3, verbose=0)
    losses = [round(float(loss), 4) for loss in history.history["loss"]]
    return {"trains": losses[-1] < losses[0], "losses": losses}


def _error(exc: BaseException) -> dict[str, str]:
    text = str(exc).strip().splitlines()
    return {"type": type(exc).__name__, "message": (text[0] if text else "")[:400]}


def child(side: str, out: Path, *, logical_cpus: int, bound: float) -> int:
    """One process of one scenario: import TensorFlow, time the call, then fit on its result."""
    import tensorflow as tf

    if logical_cpus > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * logical_cpus
        )
    import keras

    _emit(out, {"event": "versions", "tensorflow": tf.__version__, "keras": keras.__version__})
    records = _Records()
    timer = _bounded(out, "call", bound)
    start = time.perf_counter()
    try:
        strategy = _call(side, records)
    except BaseException as exc:
        strategy, failure = None, _error(exc)
    else:
        failure = None
    seconds = round(time.perf_counter() - start, 2)
    timer.cancel()
    result: dict[str, Any] = {"event": "call", "seconds": seconds, "said": records.lines}
    result.update(error=failure) if strategy is None else result.update(_describe(side, strategy))
    _emit(out, result)
    if strategy is not None:
        timer = _bounded(out, "fit", bound)
        try:
            _emit(out, {"event": "fit", **_fit(strategy)})
        except BaseException as exc:
            _emit(out, {"event": "fit", "trains": False, "error": _error(exc)})
        timer.cancel()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # a multi-worker runtime's teardown is not what is measured


def ray_child(side: str, out: Path, *, bound: float) -> int:
    """Ray Train: a TensorflowTrainer whose 2 workers each run :func:`child`'s steps."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    def train_loop(config: dict[str, Any]) -> None:
        import ray.train

        rank = ray.train.get_context().get_world_rank()
        os.environ.pop("TF_USE_LEGACY_KERAS", None)  # set by Ray; no tf_keras installed here
        worker_out = Path(f"{config['out']}.{rank}")
        _emit(worker_out, {"event": "tf_config", "TF_CONFIG": os.environ.get("TF_CONFIG")})
        child(config["side"], worker_out, logical_cpus=1, bound=config["bound"])

    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    trainer = TensorflowTrainer(
        train_loop,
        train_loop_config={"side": side, "out": str(out), "bound": bound},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=str(out.parent / "ray_results")),
    )
    try:
        trainer.fit()
    except BaseException as exc:  # a worker ended by os._exit: Ray reports it; the files tell
        _emit(out, {"event": "ray", "error": _error(exc)})
    ray.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("side", choices=("tfdp-utils", "upstream"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--logical-cpus", type=int, default=1)
    parser.add_argument("--call-bound", type=float, default=60.0)
    parser.add_argument("--ray", action="store_true")
    args = parser.parse_args(argv)
    if args.ray:
        return ray_child(args.side, args.out, bound=args.call_bound)
    return child(args.side, args.out, logical_cpus=args.logical_cpus, bound=args.call_bound)


if __name__ == "__main__":
    sys.exit(main())
