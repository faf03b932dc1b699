"""Multi-worker training on one machine: N local worker processes joined by TF_CONFIG.

This is a way to try MultiWorkerMirroredStrategy on a laptop, not a launcher: on real clusters
start one process per worker with your scheduler (SLURM's srun, a Kubeflow TFJob, Ray Train),
which sets TF_CONFIG or SLURM variables for you; the training code below runs there unchanged.
See docs/scale-out.md.

Run: python examples/multi_worker_localhost.py [--workers N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile

GLOBAL_BATCH_SIZE = 64


def train(log_dir: str) -> None:
    """What each worker runs: the same script as on one machine."""
    import tensorflow as tf

    import tfdp_utils as tdu
    from tfdp_utils.demo import build_model, load_data

    keras = tf.keras  # Keras 3, or tf_keras when TF_USE_LEGACY_KERAS=1

    strategy = tdu.auto_strategy(cluster_timeout=120)  # MultiWorkerMirroredStrategy from TF_CONFIG
    _, (x_train, y_train), _ = load_data()
    train_data = tdu.build_distributed_dataset(
        (x_train, y_train),
        strategy=strategy,
        global_batch_size=GLOBAL_BATCH_SIZE,
        shuffle_buffer_size=2048,
        seed=0,
    )
    with strategy.scope():
        model = build_model("mlp")
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    logger = tdu.callbacks.ThroughputLogger(log_dir, log_every_n_steps=10, warmup_steps=5)
    history = model.fit(train_data, epochs=3, verbose=0, callbacks=[logger])
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    checksum = float(sum(float(w.numpy().sum()) for w in model.trainable_weights))
    print(
        "WORKER",
        json.dumps(
            {
                "index": task["index"],
                "replicas": strategy.num_replicas_in_sync,
                "loss": history.history["loss"],
                "weights_checksum": checksum,
            }
        ),
        flush=True,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300, help="seconds before giving up")
    args = parser.parse_args()
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(args.workers)]
    log_dir = tempfile.mkdtemp(prefix="tfdp-multi-worker-")
    processes = []
    reports = []
    with contextlib.ExitStack() as stack:
        # Each worker's stderr goes to a file (a pipe nobody reads could fill and stall it).
        errors = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in addresses]
        for index in range(args.workers):
            task = {"type": "worker", "index": index}
            env = {
                **os.environ,
                "TF_CONFIG": json.dumps({"cluster": {"worker": addresses}, "task": task}),
                "TFDP_EXAMPLE_WORKER": log_dir,
            }
            processes.append(
                subprocess.Popen(
                    [sys.executable, __file__],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=errors[index],
                    text=True,
                )
            )
        try:
            for index, process in enumerate(processes):
                out, _ = process.communicate(timeout=args.timeout)
                if process.returncode != 0:
                    errors[index].seek(0)
                    raise SystemExit(
                        f"worker {index} (pid {process.pid}) failed with exit code "
                        f"{process.returncode}; the end of its stderr:\n"
                        + errors[index].read()[-4000:]
                    )
                reports.append(json.loads(out.split("WORKER ", 1)[1]))
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
    for report in reports:
        losses = ", ".join(f"{x:.4f}" for x in report["loss"])
        print(
            f"worker {report['index']}: {report['replicas']} replicas in sync, "
            f"losses per epoch [{losses}], weights checksum {report['weights_checksum']:.6f}"
        )
    checksums = {round(r["weights_checksum"], 5) for r in reports}
    assert len(checksums) == 1, "workers must end with identical weights"
    print(f"all {args.workers} workers agree; throughput logs in {log_dir}")


if __name__ == "__main__":
    if "TFDP_EXAMPLE_WORKER" in os.environ:
        train(os.environ["TFDP_EXAMPLE_WORKER"])
    else:
        main()
