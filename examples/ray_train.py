"""Train with Ray Train's TensorflowTrainer: 2 workers on a local Ray instance.

The train loop is the same user code as on SLURM or Kubernetes: Ray writes TF_CONFIG for each
worker, and ``auto_strategy()`` builds MultiWorkerMirroredStrategy from it. Ray 2.60 sets
``TF_USE_LEGACY_KERAS=1`` in the workers, but they have already imported Keras 3, so
``tf.keras`` there is Keras 3; the loop works with whichever Keras the workers end up with.

Run:  python examples/ray_train.py --steps 6 --logdir /tmp/ray_logs
Needs: pip install 'tfdp-utils[ray]'
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any]:
    """What each Ray worker runs: auto_strategy + dataset builder + ThroughputLogger + fit."""
    import numpy as np
    import ray.train
    import tensorflow as tf

    import tfdp_utils as tdu

    keras = tf.keras  # Keras 3, or tf_keras when TF_USE_LEGACY_KERAS=1

    strategy = tdu.auto_strategy(cluster_timeout=120)
    rng = np.random.RandomState(0)
    x = rng.rand(256, 8).astype("float32")
    y = (x @ np.arange(1, 9, dtype="float32"))[:, None]
    dist = tdu.build_distributed_dataset(
        (x, y), strategy=strategy, global_batch_size=config["global_batch_size"], repeat=True
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
    logger = tdu.callbacks.ThroughputLogger(config["logdir"], log_every_n_steps=2, warmup_steps=1)
    history = model.fit(
        dist, epochs=1, steps_per_epoch=config["steps"], callbacks=[logger], verbose=0
    )
    metrics = {
        "loss": float(history.history["loss"][-1]),
        "replicas": int(strategy.num_replicas_in_sync),
        "strategy": type(strategy).__name__,
        "keras": tdu.KERAS_FLAVOUR,
        "iterations": int(model.optimizer.iterations.numpy()),
        "weights_sum": float(sum(float(w.sum()) for w in model.get_weights())),
        "examples_per_sec": float(logger.summary().get("examples_per_sec") or 0.0),
        "rank": int(ray.train.get_context().get_world_rank()),
        "hosts": sorted(
            {
                address.rsplit(":", 1)[0]
                for address in strategy.cluster_resolver.cluster_spec().as_dict().get("worker", [])
            }
        ),
    }
    ray.train.report(metrics)
    return metrics


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--logdir", default=os.path.join(tempfile.gettempdir(), "tfdp_ray"))
    args = parser.parse_args(argv)

    # Ray's workers put their node's address in TF_CONFIG. Read by Ray at import, this makes
    # that address 127.0.0.1, so TensorFlow's unauthenticated cluster servers stay on this
    # machine. Leave it out on a real multi-node Ray cluster.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    # A private local instance on the loopback interface, without the dashboard.
    ray.init(
        num_cpus=args.workers,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    try:
        trainer = TensorflowTrainer(
            train_loop_per_worker,
            train_loop_config={
                "steps": args.steps,
                "global_batch_size": args.global_batch_size,
                "logdir": args.logdir,
            },
            scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
            run_config=RunConfig(storage_path=os.path.join(args.logdir, "ray_results")),
        )
        result = trainer.fit()
    finally:
        ray.shutdown()
    # Ray Train 2.x keeps reported metrics only alongside a checkpoint; the loop's return
    # value (rank 0's) carries them either way.
    metrics = dict(result.metrics or getattr(result, "return_value", None) or {})
    print("RESULT " + json.dumps(metrics))
    return metrics


if __name__ == "__main__":
    main()
