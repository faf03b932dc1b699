"""``tfdp-utils demo``: the whole toolkit on data that ships with an installed package.

Trains the tutorial's MLP (or CNN) with :func:`~tfdp_utils.auto_strategy`,
:func:`~tfdp_utils.build_distributed_dataset` and
:class:`~tfdp_utils.callbacks.ThroughputLogger` on the handwritten digits that ship inside the
package (1,797 8x8 images, upsampled to 28x28 so the tutorial's shapes hold), or on MNIST when
``~/.keras/datasets/mnist.npz`` is already on disk. Nothing is downloaded, and nothing beyond
TensorFlow is needed.

The digits (``_demo_digits.npz``, 45 KB) are the test set of the UCI "Optical Recognition of
Handwritten Digits" data set (E. Alpaydin, C. Kaynak, 1998; CC BY 4.0,
https://archive.ics.uci.edu/dataset/80), the copy scikit-learn's ``load_digits`` returns: pixel
counts 0..16 of 8x8 blocks, and their labels.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from tfdp_utils._validate import directory_path

DEFAULT_LOG_DIR = "tfdp-demo-logs"
MNIST_PATH = Path("~/.keras/datasets/mnist.npz").expanduser()
DIGITS_PATH = Path(__file__).with_name("_demo_digits.npz")
"""The handwritten digits the demo trains on when no MNIST is on disk (see the module's text)."""


@dataclasses.dataclass(frozen=True)
class DemoResult:
    """What a demo run measured.

    Attributes:
        accuracy: test-set accuracy after training.
        loss: test-set loss after training.
        dataset: ``"digits"`` or ``"mnist"``.
        strategy: the strategy class ``auto_strategy()`` built.
        replicas: replicas in sync.
        log_dir: where the TensorBoard logs are.
        seconds: wall-clock time of ``fit``.
        throughput: ``ThroughputLogger.summary()``.
    """

    accuracy: float
    loss: float
    dataset: str
    strategy: str
    replicas: int
    log_dir: str
    seconds: float
    throughput: dict[str, Any]


def load_data(*, prefer_mnist: bool = True) -> tuple[str, tuple[Any, Any], tuple[Any, Any]]:
    """Return ``(name, (x_train, y_train), (x_test, y_test))`` with 28x28 float32 images in [0, 1].

    MNIST when ``~/.keras/datasets/mnist.npz`` exists (a 10,000-example slice keeps the
    default run short), else the package's digits upsampled from 8x8.
    """
    import numpy as np

    if prefer_mnist and MNIST_PATH.exists():
        with np.load(MNIST_PATH) as data:
            x_train, y_train = data["x_train"][:10000], data["y_train"][:10000]
            x_test, y_test = data["x_test"][:2000], data["y_test"][:2000]
        return (
            "mnist",
            ((x_train / 255.0).astype("float32"), y_train.astype("int64")),
            ((x_test / 255.0).astype("float32"), y_test.astype("int64")),
        )
    with np.load(DIGITS_PATH) as digits:
        images, labels = digits["images"] / 16.0, digits["target"].astype("int64")
    images = images.astype("float32")  # (1797, 8, 8)
    # Upsample 8x8 -> 28x28 (bilinear, exact shapes of the tutorial's MNIST input).
    from tfdp_utils._tf import tf

    upsampled = tf.image.resize(images[..., None], (28, 28)).numpy()[..., 0]
    order = np.random.default_rng(0).permutation(len(labels))
    upsampled, labels = upsampled[order], labels[order]
    split = 1500
    return (
        "digits",
        (upsampled[:split], labels[:split]),
        (upsampled[split:], labels[split:]),
    )


def build_model(kind: str = "mlp") -> Any:
    """The tutorial's models, fixed: the MLP flattens its 28x28 input first.

    Raises:
        ValueError: for an unknown ``kind``.
    """
    from tfdp_utils._tf import keras

    layers = keras.layers
    if kind == "mlp":
        body = [
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(10),
        ]
    elif kind == "cnn":
        body = [
            layers.Reshape((28, 28, 1)),
            layers.Conv2D(16, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(32, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(64, activation="relu"),
            layers.Dense(10),
        ]
    else:
        raise ValueError(f"model={kind!r} is not a demo model; expected 'mlp' or 'cnn'.")
    return keras.Sequential([keras.Input(shape=(28, 28)), *body])


def configure_replicas(replicas: int) -> bool:
    """Split the CPU into ``replicas`` logical devices when no GPU or TPU is visible.

    Must run before TensorFlow initialises its devices. Returns whether it configured them.

    Raises:
        ValueError: for ``replicas < 1``.
        RuntimeError: when TensorFlow's devices are already initialised with another layout.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas={replicas!r} must be a positive integer, such as 2.")
    from tfdp_utils._tf import tf

    if tf.config.list_physical_devices("GPU") or tf.config.list_physical_devices("TPU"):
        return False
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current and len(current) == replicas:
        return False
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)]
        )
    except RuntimeError as exc:
        raise RuntimeError(
            f"cannot split the CPU into {replicas} logical devices: TensorFlow's devices are "
            "already initialised in this process. Run the demo in a fresh process."
        ) from exc
    return True


def run(
    *,
    log_dir: str | os.PathLike[str] = DEFAULT_LOG_DIR,
    model: str = "mlp",
    epochs: int = 5,
    replicas: int = 2,
    global_batch_size: int = 64,
    verbose: int = 1,
    prefer_mnist: bool = True,
) -> DemoResult:
    """Train the demo model data-parallel and return what it measured.

    Args:
        log_dir: TensorBoard log directory. Defaults to `"tfdp-demo-logs"`.
        model: ``"mlp"`` or ``"cnn"``. Defaults to `"mlp"`.
        epochs: training epochs. Defaults to `5`.
        replicas: logical CPU devices to train on when there is no accelerator. Defaults to `2`.
        global_batch_size: examples per step over all replicas. Defaults to `64`.
        verbose: Keras progress output (0, 1 or 2). Defaults to `1`.
        prefer_mnist: use ``~/.keras/datasets/mnist.npz`` when it exists. Defaults to `True`.

    Returns:
        A :class:`DemoResult`.
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs={epochs!r} must be a positive integer, such as 5.")
    directory_path(log_dir, "log_dir", example=DEFAULT_LOG_DIR)  # before any training
    configure_replicas(replicas)
    if model not in ("mlp", "cnn"):
        raise ValueError(f"model={model!r} is not a demo model; expected 'mlp' or 'cnn'.")

    import tfdp_utils as tdu
    from tfdp_utils._tf import keras
    from tfdp_utils.callbacks import ThroughputLogger

    name, (x_train, y_train), (x_test, y_test) = load_data(prefer_mnist=prefer_mnist)
    strategy = tdu.auto_strategy()
    train = tdu.build_distributed_dataset(
        (x_train, y_train),
        strategy=strategy,
        global_batch_size=global_batch_size,
        shuffle_buffer_size=len(x_train),
        seed=0,
    )
    test = tdu.build_distributed_dataset(
        (x_test, y_test), strategy=strategy, global_batch_size=global_batch_size
    )
    learning_rate = tdu.scale_learning_rate(
        1e-3, base_batch_size=32, global_batch_size=global_batch_size, rule="sqrt"
    )
    with strategy.scope():
        net = build_model(model)
        net.compile(
            optimizer=keras.optimizers.Adam(learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    logger = ThroughputLogger(str(log_dir), log_every_n_steps=10, warmup_steps=5)
    start = time.perf_counter()
    net.fit(train, epochs=epochs, callbacks=[logger], verbose=verbose)
    seconds = time.perf_counter() - start
    loss, accuracy = net.evaluate(test, verbose=0)
    return DemoResult(
        accuracy=float(accuracy),
        loss=float(loss),
        dataset=name,
        strategy=type(strategy).__name__,
        replicas=int(strategy.num_replicas_in_sync),
        log_dir=str(Path(log_dir).resolve()),
        seconds=seconds,
        throughput=logger.summary(),
    )


def _positive(text: str) -> int:
    """An argparse type: a whole number >= 1, else one clear line from argparse."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to an argument parser (each help line shows its default)."""
    parser.add_argument(
        "--log-dir",
        default=DEFAULT_LOG_DIR,
        help="TensorBoard log directory (default: %(default)s)",
    )
    parser.add_argument(
        "--model",
        choices=("mlp", "cnn"),
        default="mlp",
        help="the tutorial's model to train (default: %(default)s)",
    )
    parser.add_argument(
        "--epochs", type=_positive, default=5, help="training epochs (default: %(default)s)"
    )
    parser.add_argument(
        "--replicas",
        type=_positive,
        default=2,
        help="logical CPU devices to train on when no GPU/TPU is visible (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-size",
        type=_positive,
        default=64,
        help="global batch size: examples per step over all replicas (default: %(default)s)",
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Run the demo from parsed command-line arguments and print where to look next."""
    directory_path(args.log_dir, "--log-dir", example=DEFAULT_LOG_DIR)  # before TensorFlow
    result = run(
        log_dir=args.log_dir,
        model=args.model,
        epochs=args.epochs,
        replicas=args.replicas,
        global_batch_size=args.batch_size,
    )
    rate = result.throughput.get("examples_per_sec")
    print()
    print(f"Data set:        {result.dataset}")
    print(f"Strategy:        {result.strategy} with {result.replicas} replica(s)")
    print(f"Test accuracy:   {result.accuracy:.4f} (loss {result.loss:.4f})")
    if rate:
        print(f"Throughput:      {rate:,.0f} examples/s (all logged windows together)")
    print(f"Training time:   {result.seconds:.1f} s")
    print(f"Logs:            {result.log_dir}")
    print(f"View them with:  tensorboard --logdir {result.log_dir} --host 127.0.0.1")
    return 0
