"""The TensorFlow side of ``tfdp-utils doctor``: build facts, known issues, live self-tests.

``tfdp-utils doctor`` runs this module in a child process (``python -m
tfdp_utils.doctor._checks``) that splits the CPU into 2 logical devices before TensorFlow
initialises, so that the parent never imports TensorFlow and a hung check can be killed.
Each check is also a plain function of a strategy, so tests call them in-process with a
planted bug. Results go to a JSON-lines file, one line per check as it finishes, so a check
that runs past the time bound still leaves the earlier results behind.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tfdp_utils.doctor._check import Check, Status

NUM_EXAMPLES = 45  # not a multiple of the global batch: a partial last step
GLOBAL_BATCH = 8
FEATURES = 8
CLASSES = 4
EQUIVALENCE_STEPS = 5  # with steps_per_execution=2: executions of 2, 2 and 1 steps


# ------------------------------------------------------------------------ pieces tests swap


def doctor_model(steps_per_execution: int = 1) -> Any:
    """The self-tests' model: a small MLP trained with plain SGD (which shows a gradient
    scaled wrongly, where Adam would hide it), compiled with ``steps_per_execution``."""
    from tfdp_utils._tf import keras

    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    return model


def doctor_data(examples: int = NUM_EXAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of ``examples`` examples (fixed seed; the first ones always the
    same). Defaults to :data:`NUM_EXAMPLES`."""
    rng = np.random.default_rng(0)
    count = max(examples, NUM_EXAMPLES)
    x = rng.normal(size=(count, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=count).astype("int64")
    return x[:examples], y[:examples]


def error_summary(exc: BaseException, limit: int = 300) -> str:
    """One line for an exception; for TensorFlow's graph errors, the root error's line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    roots = [m.group(1) for m in map(_ROOT_ERROR.match, lines) if m]
    text = roots[0] if roots else (lines[0] if lines else "")
    return f"{type(exc).__name__}: {text}"[:limit]


_ROOT_ERROR = re.compile(r"^\(\d+\) (\w+:\s.*)$")


def _timed(section: str, name: str, body: Callable[[], tuple[Status, str]]) -> Check:
    start = time.perf_counter()
    status: Status
    try:
        status, detail = body()
    except Exception as exc:  # a check reports what broke; it never takes the doctor down
        status, detail = "FAIL", error_summary(exc)
    return Check(section, name, status, detail, round(time.perf_counter() - start, 2))


# ------------------------------------------------------------------------------- facts


def build_facts() -> list[Check]:
    """TensorFlow's build (CUDA/cuDNN), the active Keras and the devices TensorFlow sees."""
    from tfdp_utils._tf import KERAS_FLAVOUR, KERAS_VERSION, tf
    from tfdp_utils.strategy._upstream import UPSTREAM_NAME, upstream_note

    info = dict(tf.sysconfig.get_build_info())
    cuda = info.get("cuda_version") or "none (CPU build)"
    cudnn = info.get("cudnn_version") or "none"
    devices = collections.Counter(d.device_type for d in tf.config.list_logical_devices())
    seen = ", ".join(f"{n} {kind}" for kind, n in sorted(devices.items()))
    facts = [
        Check("versions", "Keras in use", "INFO", f"{KERAS_VERSION} ({KERAS_FLAVOUR})"),
        Check("versions", "CUDA / cuDNN (TensorFlow build)", "INFO", f"{cuda} / {cudnn}"),
        Check("versions", "logical devices", "INFO", seen),
    ]
    note = upstream_note(tf)
    if note is not None:
        facts.append(Check("versions", f"{UPSTREAM_NAME}()", "INFO", note))
    return facts


def known_issue_checks(*, gpus: int, tpus: int) -> list[Check]:
    """:data:`tfdp_utils._known_issues.KNOWN_ISSUES` marked for this installation."""
    from tfdp_utils import _known_issues as known_issues
    from tfdp_utils import compat
    from tfdp_utils._tf import IS_KERAS3, KERAS_VERSION, tf

    # The upstream bugs compat works around (status() lists the other runtime changes too).
    workarounds = [s for s in compat.status() if s.kind == "workaround"]
    installed = known_issues.Installed(
        keras=KERAS_VERSION if IS_KERAS3 else None,
        tensorflow=tf.__version__,
        bug_present={s.issue: s.bug_present for s in workarounds},
        workarounds_disabled=compat.disabled(),
        gpus=gpus,
        tpus=tpus,
    )
    checks = []
    for entry in known_issues.KNOWN_ISSUES:
        found = known_issues.assess(entry, installed)
        status: Status = "WARN" if found.verdict == "affected" and found.here else "INFO"
        detail = f"{found.verdict} ({found.reason}) - {entry.title}"
        if found.verdict == "affected" and not found.here:
            detail += f"; needs a {entry.hardware.upper() if entry.hardware else ''}, none here"
        checks.append(Check("known issues", entry.issue, status, detail, url=entry.url))
    return checks


# ---------------------------------------------------------------------------- self-tests


def check_equivalence(
    strategy: Any,
    *,
    steps_per_execution: int = 1,
    model_fn: Callable[[], Any] | None = None,
    label: str = "",
) -> Check:
    """Replicas vs one device: the same loss, metrics and weights after every step."""
    from tfdp_utils import compat
    from tfdp_utils.doctor._equivalence import check_replica_equivalence

    name = f"{strategy.num_replicas_in_sync} replicas = 1 device{label}"
    if steps_per_execution > 1:
        name += f", steps_per_execution={steps_per_execution}"

    def body() -> tuple[Status, str]:
        compat.apply_for_strategy(strategy)  # what auto_strategy does for this strategy
        report = check_replica_equivalence(
            model_fn or (lambda: doctor_model(steps_per_execution)),
            whole_batches(strategy.num_replicas_in_sync),
            strategy=strategy,
            steps=EQUIVALENCE_STEPS,
            on_divergence="ignore",
        )
        detail = (
            f"{report.steps} steps: max loss diff {report.max_loss_difference:.2g}, "
            f"max weight diff {report.max_weight_difference:.2g}"
        )
        if not report.ok:
            detail += f"; first divergent step {report.first_divergent_step}: " + ", ".join(
                report.divergent[:3]
            )
        return ("PASS" if report.ok else "FAIL"), detail

    return _timed("self-tests", name, body)


def _ids_per_replica(strategy: Any, distributed: Any) -> list[collections.Counter[int]]:
    """Labels (example ids) each replica received in one pass over ``distributed``, counted."""
    counts = [collections.Counter[int]() for _ in range(strategy.num_replicas_in_sync)]
    for batch in distributed:
        ids = batch[1] if isinstance(batch, tuple) else batch
        for replica, values in enumerate(strategy.experimental_local_results(ids)):
            counts[replica].update(int(v) for v in np.ravel(values.numpy()))
    return counts


def _builder_dataset(strategy: Any, builder: Callable[..., Any] | None, *, ids: bool) -> Any:
    """The builder's dataset of the doctor's examples, labelled with example ids or classes."""
    import tfdp_utils as tdu

    x, y = doctor_data()
    labels = np.arange(NUM_EXAMPLES, dtype="int64") if ids else y
    build = builder or tdu.build_distributed_dataset
    return build((x, labels), strategy=strategy, global_batch_size=GLOBAL_BATCH)


def check_builder(strategy: Any, *, builder: Callable[..., Any] | None = None) -> Check:
    """``build_distributed_dataset``: every example id exactly once per epoch, counted."""

    def body() -> tuple[Status, str]:
        counts = _ids_per_replica(strategy, _builder_dataset(strategy, builder, ids=True))
        total = sum(counts, collections.Counter[int]())
        missing = NUM_EXAMPLES - len(total)
        repeated = sum(1 for n in total.values() if n > 1)
        per_replica = "+".join(str(sum(c.values())) for c in counts)
        detail = f"{NUM_EXAMPLES} ids -> {per_replica} per replica"
        if missing or repeated or set(total) - set(range(NUM_EXAMPLES)):
            return "FAIL", f"{detail}; {missing} missing, {repeated} repeated"
        return "PASS", detail + ", each exactly once"

    return _timed("self-tests", "builder: each example once", body)


def _logged_examples(log_dir: str) -> dict[str, float]:
    """The last ``throughput/examples`` of every run under ``log_dir``, read back."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tfdp_utils._tf import tf
    from tfdp_utils.throughput import _tags as tags

    found = {}
    for run in sorted(p for p in Path(log_dir).iterdir() if p.is_dir()):
        events = EventAccumulator(str(run), size_guidance={"tensors": 0})
        events.Reload()
        if tags.EXAMPLES in events.Tags()["tensors"]:
            last = events.Tensors(tags.EXAMPLES)[-1]
            found[run.name] = float(tf.make_ndarray(last.tensor_proto))
    return found


def check_logger(strategy: Any, *, logger_factory: Callable[[str], Any] | None = None) -> Check:
    """``ThroughputLogger``: the examples it logged, read back from the event files, equal
    the examples each replica received, counted by iterating the same dataset."""
    from tfdp_utils.callbacks import ThroughputLogger
    from tfdp_utils.throughput import _tags as tags

    def body() -> tuple[Status, str]:
        dataset = _builder_dataset(strategy, None, ids=False)
        counted = [sum(c.values()) for c in _ids_per_replica(strategy, dataset)]
        with tempfile.TemporaryDirectory(prefix="tfdp-doctor-") as log_dir:
            factory = logger_factory or (
                # dataset=: counts exactly with or without TFDP_NO_KERAS_PATCHES.
                lambda d: ThroughputLogger(d, log_every_n_steps=1, warmup_steps=0, dataset=dataset)
            )
            with strategy.scope():
                model = doctor_model()
            model.fit(dataset, epochs=1, verbose=0, callbacks=[factory(log_dir)])
            logged = _logged_examples(log_dir)
        expected = {tags.replica_run(i): float(n) for i, n in enumerate(counted)}
        expected[tags.GLOBAL_RUN] = float(sum(counted))
        wrong = {run: logged.get(run) for run, n in expected.items() if logged.get(run) != n}
        detail = f"counted {'+'.join(map(str, counted))}, logged {logged.get(tags.GLOBAL_RUN)}"
        return ("FAIL", f"{detail}; wrong runs {wrong}") if wrong else ("PASS", detail)

    return _timed("self-tests", "ThroughputLogger counts", body)


def self_tests(strategy: Any, *, label: str = "") -> Iterator[Check]:
    """The self-tests on ``strategy``, one at a time (so each can be written as it ends)."""
    yield check_equivalence(strategy, label=label)
    yield check_equivalence(strategy, steps_per_execution=2, label=label)
    yield check_builder(strategy)
    yield check_logger(strategy)


# ------------------------------------------------------------------- accelerators, cluster


def accelerator_checks(kind: str) -> list[Check]:
    """The replica-equivalence self-test on the GPUs or TPU cores present, or a SKIP."""
    from tfdp_utils._tf import tf

    if kind == "gpu":
        gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
        if len(gpus) < 2:
            why = "none present" if not gpus else "1 GPU that could not be split in two"
            return [Check("self-tests", "GPU replicas", "SKIP", f"skipped: {why}")]
        strategy = tf.distribute.MirroredStrategy(gpus)
    else:
        import tfdp_utils as tdu

        if not tdu.detect_environment().tpus and not os.environ.get("TPU_NAME"):
            return [Check("self-tests", "TPU replicas", "SKIP", "skipped: none present")]
        strategy = tdu.auto_strategy("tpu", verbose=False)
    return [check_equivalence(strategy, label=f" ({kind.upper()})")]


def fixed_weights(model: Any) -> list[np.ndarray]:
    """Initial weights from a fixed seed, the same in every process."""
    rng = np.random.default_rng(1)
    return [(0.3 * rng.normal(size=w.shape)).astype(w.dtype) for w in model.get_weights()]


def whole_batches(replicas: int = 1) -> Any:
    """The doctor's examples in :data:`EQUIVALENCE_STEPS` whole global batches.

    Whole, because Keras averages a partial batch per replica (5 examples split 3 + 2 give
    ``(mean_3 + mean_2) / 2``, not ``mean_5``), which one device cannot reproduce; and each
    batch splits evenly over ``replicas`` (:data:`GLOBAL_BATCH` rounded up to a multiple of
    them: 9 on 3 GPUs), which ``check_replica_equivalence`` requires.
    """
    from tfdp_utils._tf import tf

    batch = -(-GLOBAL_BATCH // replicas) * replicas
    x, y = doctor_data(EQUIVALENCE_STEPS * batch)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def _train_fixed(strategy: Any) -> dict[str, Any]:
    dataset = whole_batches()
    with strategy.scope():
        model = doctor_model()
        model.set_weights(fixed_weights(model))
    history = model.fit(dataset, epochs=1, verbose=0)
    return {
        "loss": float(history.history["loss"][-1]),
        "weights": [w.tolist() for w in model.get_weights()],
    }


def cluster_worker(out: str) -> int:
    """One worker of the 2-worker localhost job (TF_CONFIG set by the doctor)."""
    import tfdp_utils as tdu
    from tfdp_utils.cluster._topology import position_from_environment

    strategy = tdu.auto_strategy(verbose=False)  # MultiWorkerMirroredStrategy, compat applied
    result = _train_fixed(strategy)
    if position_from_environment(os.environ).is_chief:
        Path(out).write_text(json.dumps(result))
    return 0


def check_cluster_result(path: str, *, rtol: float = 1e-4, atol: float = 1e-5) -> Check:
    """The 2-worker job's loss and weights against one device trained here the same way."""
    from tfdp_utils._tf import tf

    def body() -> tuple[Status, str]:
        cluster = json.loads(Path(path).read_text())
        reference = _train_fixed(tf.distribute.OneDeviceStrategy("/cpu:0"))
        pairs = [(reference["loss"], cluster["loss"])]
        pairs += list(zip(reference["weights"], cluster["weights"], strict=True))
        diffs = [float(np.max(np.abs(np.subtract(b, a)))) for a, b in pairs]
        close = all(np.allclose(b, a, rtol=rtol, atol=atol) for a, b in pairs)
        detail = f"loss diff {diffs[0]:.2g}, max weight diff {max(diffs[1:]):.2g}"
        return ("PASS" if close else "FAIL"), detail

    return _timed("self-tests", "2 workers (MultiWorkerMirrored) = 1 device", body)


# ---------------------------------------------------------------------------------- main


def configure_devices(*, cpus: int = 2, split_gpu: bool = False) -> None:
    """Split the CPU (and a single GPU, with ``split_gpu``) in two before TensorFlow starts."""
    from tfdp_utils._tf import tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(cpus)]
    )
    gpus = tf.config.list_physical_devices("GPU")
    if split_gpu and len(gpus) == 1:
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=2048)] * 2
        )


def run_checks(
    emit: Callable[[Check], None], *, gpu: bool, tpu: bool, cluster_result: str | None
) -> None:
    """Every TensorFlow-side check, in order, each passed to ``emit`` as it ends."""
    from tfdp_utils._tf import tf

    for check in build_facts():
        emit(check)
    gpus = len(tf.config.list_physical_devices("GPU"))
    tpus = len(tf.config.list_logical_devices("TPU"))
    for check in known_issue_checks(gpus=gpus, tpus=tpus):
        emit(check)
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    if len(cpus) < 2:
        emit(Check("self-tests", "CPU replicas", "FAIL", "needs 2 logical CPU devices"))
        return
    for check in self_tests(tf.distribute.MirroredStrategy(cpus)):
        emit(check)
    if cluster_result is not None:
        emit(check_cluster_result(cluster_result))
    for kind, wanted in (("gpu", gpu), ("tpu", tpu)):
        if wanted:
            for check in accelerator_checks(kind):
                emit(check)


def main(argv: list[str] | None = None) -> int:
    """Child-process entry point: ``python -m tfdp_utils.doctor._checks --out FILE``."""
    parser = argparse.ArgumentParser(prog="python -m tfdp_utils.doctor._checks")
    parser.add_argument("--out", required=True, help="JSON-lines file for the results")
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--tpu", action="store_true")
    parser.add_argument("--cluster-result", default=None)
    parser.add_argument("--cluster-worker", action="store_true")
    args = parser.parse_args(argv)
    if args.cluster_worker:
        return cluster_worker(args.out)
    configure_devices(split_gpu=args.gpu)
    with open(args.out, "a", encoding="utf-8") as out:

        def emit(check: Check) -> None:
            out.write(json.dumps(check.as_dict()) + "\n")
            out.flush()

        run_checks(emit, gpu=args.gpu, tpu=args.tpu, cluster_result=args.cluster_result)
    return 0


if __name__ == "__main__":  # pragma: no cover - run by tfdp-utils doctor
    sys.exit(main())
