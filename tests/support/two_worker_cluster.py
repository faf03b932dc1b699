"""One real 2-worker MultiWorkerMirroredStrategy cluster on localhost, once per Keras flavour.

Several test modules each needed a 2-worker cluster of the flavour under test; each process pays
the TensorFlow import and the cluster start, so one cluster now runs all of their phases in
turn, and each module's tests assert on their phase's results (the ``two_worker_phases``
fixture in conftest). The phases, in order, each a copy of what its module's workers ran:

``compat`` (test_compat_multiworker)
    ``auto_strategy()`` builds the strategy while ``TFDP_NO_KERAS_PATCHES=1`` keeps the Keras
    workarounds off, so that Keras 3 reproduces keras#20585, then (with only that one fixed)
    tensorflow#72388; then fit/evaluate/predict with everything ``auto_strategy()`` applies.
``train_step`` (test_training_multiworker)
    ``make_distributed_train_step`` over both workers, from the same initial weights and data as
    the test's one-device reference.
``fit_ids`` (test_data_multiworker)
    ``model.fit(dist, epochs=3)`` and ``evaluate`` without ``steps`` on builder datasets, with
    example ids counted inside the model's step.
``accumulation`` (test_accumulation)
    ``fit`` with 2 micro-batches per update (Keras 3: ``SGD(gradient_accumulation_steps=2)``
    with the keras#20582 workaround; tf_keras: ``tdu.enable_gradient_accumulation``) and
    ``make_distributed_train_step(accumulation_steps=2)`` on a partial last micro-batch, from
    the same initial weights and data as the test's one-device reference.

A phase that raises records ``{"phase_error": traceback}`` and the next one still runs. No side
effects at import: this module is imported by conftest's fixture only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# compat phase
EPOCHS = 2
BATCHES = 16
GLOBAL_BATCH = 16

# train_step phase
TRAIN_GLOBAL_BATCH = 8
TRAIN_EXAMPLES = 3 * TRAIN_GLOBAL_BATCH + 5  # the last global batch is partial
MODEL = """
def build_model(keras):
    return keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(6, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.05)),
        keras.layers.Dense(3),
    ])
"""

# fit_ids phase
FIT_FILE_SIZES = (21, 2, 3, 2)  # FILE: 23 examples on one worker, 5 on the other
FIT_ARRAYS = 13

# accumulation phase: 2 workers x 1 replica x 8 examples per micro-batch, 2 micro-batches
ACCUMULATION_MICRO_BATCH = 16  # global, over both workers
ACCUMULATION_STEPS = 2
ACCUMULATION_FIT_EXAMPLES = 5 * ACCUMULATION_MICRO_BATCH * ACCUMULATION_STEPS  # 5 updates
ACCUMULATION_STEP_EXAMPLES = ACCUMULATION_FIT_EXAMPLES - 10  # the last micro-batch holds 6

WORKER = (
    MODEL
    + r"""
import json, logging, os, sys, traceback
import numpy as np
import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf, IS_KERAS3

sys.path.insert(0, "tests")  # the workers run in the repository root
from support.id_metrics import id_metrics

if hasattr(keras, "config") and hasattr(keras.config, "disable_traceback_filtering"):
    keras.config.disable_traceback_filtering()  # keep Keras' own frames in the traceback
inputs = json.loads(os.environ["PHASE_INPUTS"])
results = {}


def phase(function):
    try:
        results[function.__name__] = function()
    except Exception:
        results[function.__name__] = {"phase_error": traceback.format_exc()[-6000:]}
    return function


# The one strategy of this process: built with the workarounds off, for the compat phase.
strategy = tdu.auto_strategy(cluster_timeout=60, collective_timeout=120)


@phase
def compat():
    result = {"keras3": IS_KERAS3}
    result["replicas"] = int(strategy.num_replicas_in_sync)
    result["applied_when_disabled"] = list(tdu.compat.applied())
    result["probes"] = {s.issue: s.bug_present for s in tdu.compat.status()}
    del os.environ["TFDP_NO_KERAS_PATCHES"]

    rng = np.random.RandomState(0)
    x = rng.rand(inputs["examples"], 3).astype("float32")
    y = (x @ np.array([[1.0], [2.0], [3.0]], "float32") + 0.5).astype("float32")
    init = [rng.randn(3, 1).astype("float32") * 0.1, np.zeros((1,), "float32")]
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    batch = inputs["batch"]
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).with_options(options)
    features = tf.data.Dataset.from_tensor_slices(x).batch(batch).with_options(options)

    def model_for(steps_per_execution):
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse",
                          steps_per_execution=steps_per_execution)
        model.set_weights(init)
        return model

    def attempt(name, steps_per_execution, full=False):
        result_of_phase = {}
        model = model_for(steps_per_execution)
        try:
            history = model.fit(data, epochs=inputs["epochs"], verbose=0)
            result_of_phase["loss"] = [float(v) for v in history.history["loss"]]
            result_of_phase["iterations"] = int(model.optimizer.iterations.numpy())
            result_of_phase["weights"] = [w.tolist() for w in model.get_weights()]
            if full:
                result_of_phase["evaluate"] = float(model.evaluate(data, verbose=0))
                result_of_phase["predict"] = model.predict(features, verbose=0).tolist()
        except Exception as exc:
            result_of_phase["error"] = f"{type(exc).__name__}: {exc}"[:3000]
            result_of_phase["frames"] = [
                frame.name for frame in traceback.extract_tb(exc.__traceback__)
            ]
        result[name] = result_of_phase

    attempt("off", 1)
    tdu.compat.apply(["keras#20585"])
    result["applied_20585_only"] = list(tdu.compat.applied())
    attempt("only_20585", 1)
    result["applied"] = list(tdu.compat.apply_for_strategy(strategy))
    attempt("on", 1, full=True)
    attempt("on_spe4", 4, full=True)
    return result


@phase
def train_step():
    data = np.load(inputs["train_data"])
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((data["x"], data["y"]))
    dataset = dataset.batch(inputs["train_global_batch"])
    dist = strategy.experimental_distribute_dataset(dataset.with_options(options))
    with strategy.scope():
        model = build_model(keras)
        model.set_weights([data[f"w{i}"] for i in range(len(model.get_weights()))])
        optimizer = keras.optimizers.SGD(learning_rate=0.3, momentum=0.9)
    step = tdu.make_distributed_train_step(
        model,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
        optimizer=optimizer,
        strategy=strategy,
    )
    losses = [float(step(batch)) for batch in dist]
    return {
        "replicas": strategy.num_replicas_in_sync,
        "losses": losses,
        "weights": [w.ravel().tolist() for w in model.get_weights()],
    }


@phase
def fit_ids():
    data_dir, n_arrays = inputs["fit_dir"], inputs["fit_arrays"]

    def parse(line):
        value = tf.strings.to_number(line, tf.float32)
        return tf.reshape(value, [1]), tf.reshape(value, [1])

    ids = np.arange(n_arrays, dtype="float32").reshape(-1, 1)
    files = sorted(os.path.join(data_dir, f) for f in os.listdir(data_dir))
    sources = {
        "arrays": (n_arrays, dict(source=(ids, ids), shuffle_buffer_size=n_arrays, seed=3)),
        "files_uneven": (inputs["fit_files"], dict(
            source=files, reader=tf.data.TextLineDataset, map_fn=parse, count_examples=True,
            shuffle_buffer_size=16, seed=3)),
    }
    out = {"keras3": IS_KERAS3}
    for name, (n, kwargs) in sources.items():
        dist = tdu.build_distributed_dataset(strategy=strategy, global_batch_size=4, **kwargs)
        with strategy.scope():
            model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse", metrics=id_metrics(n))
        history = model.fit(dist, epochs=3, verbose=0)
        evaluated = model.evaluate(dist, verbose=0, return_dict=True)
        out[name] = {
            "n": n,
            "policy": dist.tfdp_plan.policy,
            "steps_per_epoch": dist.tfdp_info.steps_per_epoch,
            "seen": history.history["seen"],
            "once": history.history["once"],
            "iterations": int(model.optimizer.iterations.numpy()),
            "evaluate": [evaluated["seen"], evaluated["once"]],
        }
    return out


@phase
def accumulation():
    data = np.load(inputs["accumulation_data"])
    steps, micro_batch = inputs["accumulation_steps"], inputs["accumulation_micro_batch"]
    initial = [data[f"w{i}"] for i in range(len(build_model(keras).get_weights()))]
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    tdu.compat.apply_for_strategy(strategy)  # keras#20582 on Keras 3
    out = {"replicas": strategy.num_replicas_in_sync, "applied": list(tdu.compat.applied())}

    def micro_batches(examples):
        dataset = tf.data.Dataset.from_tensor_slices((data["x"][:examples], data["y"][:examples]))
        return dataset.batch(micro_batch).with_options(options)

    with strategy.scope():
        model = build_model(keras)
        model.set_weights(initial)
        if IS_KERAS3:
            optimizer = keras.optimizers.SGD(0.2, momentum=0.9, gradient_accumulation_steps=steps)
        else:
            optimizer = keras.optimizers.SGD(0.2, momentum=0.9)
        model.compile(
            optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    if not IS_KERAS3:
        tdu.enable_gradient_accumulation(model, steps)
    history = model.fit(micro_batches(inputs["accumulation_fit_examples"]), epochs=1, verbose=0)
    out["fit"] = {
        "loss": float(history.history["loss"][0]),
        "iterations": int(model.optimizer.iterations.numpy()),
        "weights": [w.ravel().tolist() for w in model.get_weights()],
    }

    with strategy.scope():
        model = build_model(keras)
        model.set_weights(initial)
        optimizer = keras.optimizers.SGD(0.2, momentum=0.9)
    step = tdu.make_distributed_train_step(
        model,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
        optimizer=optimizer,
        strategy=strategy,
        accumulation_steps=steps,
    )
    dist = strategy.experimental_distribute_dataset(
        micro_batches(inputs["accumulation_step_examples"])
    )
    calls = 0
    for batch in dist:
        step(batch)
        calls += 1
    out["step"] = {
        "calls": calls,
        "iterations": int(optimizer.iterations.numpy()),
        "pending": step.pending_micro_steps,
        "weights": [w.ravel().tolist() for w in model.get_weights()],
    }
    return out


print("RESULT " + json.dumps(results), flush=True)
"""
)


def train_data(folder: Path) -> Path:
    """The train_step phase's examples and initial weights (also the reference's)."""
    import numpy as np

    from tfdp_utils._tf import keras

    rng = np.random.default_rng(3)
    x = rng.normal(size=(TRAIN_EXAMPLES, 5)).astype("float32")
    y = rng.integers(0, 3, size=TRAIN_EXAMPLES).astype("int64")
    namespace: dict[str, Any] = {}
    exec(MODEL, namespace)
    initial = namespace["build_model"](keras).get_weights()
    path = folder / "train_data.npz"
    np.savez(path, x=x, y=y, **{f"w{i}": w for i, w in enumerate(initial)})
    return path


def accumulation_data(folder: Path) -> Path:
    """The accumulation phase's examples and initial weights (also the reference's)."""
    import numpy as np

    from tfdp_utils._tf import keras

    rng = np.random.default_rng(14)
    x = rng.normal(size=(ACCUMULATION_FIT_EXAMPLES, 5)).astype("float32")
    y = rng.integers(0, 3, size=ACCUMULATION_FIT_EXAMPLES).astype("int64")
    namespace: dict[str, Any] = {}
    exec(MODEL, namespace)
    initial = namespace["build_model"](keras).get_weights()
    path = folder / "accumulation_data.npz"
    np.savez(path, x=x, y=y, **{f"w{i}": w for i, w in enumerate(initial)})
    return path


def fit_files(folder: Path) -> Path:
    """The fit_ids phase's text files: consecutive ids, one per line, uneven file sizes."""
    folder.mkdir()
    next_id = 0
    for index, size in enumerate(FIT_FILE_SIZES):
        lines = "".join(f"{i}\n" for i in range(next_id, next_id + size))
        (folder / f"part-{index}.txt").write_text(lines)
        next_id += size
    return folder


def launch(folder: Path) -> dict[str, Any]:
    """Run both workers once; ``{"inputs": ..., "workers": [results by task index]}``."""
    import json

    from support.processes import free_port, result_line, start_python, tf_config, wait_all

    inputs = {
        "examples": BATCHES * GLOBAL_BATCH,
        "batch": GLOBAL_BATCH,
        "epochs": EPOCHS,
        "train_data": str(train_data(folder)),
        "train_global_batch": TRAIN_GLOBAL_BATCH,
        "fit_dir": str(fit_files(folder / "fit")),
        "fit_arrays": FIT_ARRAYS,
        "fit_files": sum(FIT_FILE_SIZES),
        "accumulation_data": str(accumulation_data(folder)),
        "accumulation_steps": ACCUMULATION_STEPS,
        "accumulation_micro_batch": ACCUMULATION_MICRO_BATCH,
        "accumulation_fit_examples": ACCUMULATION_FIT_EXAMPLES,
        "accumulation_step_examples": ACCUMULATION_STEP_EXAMPLES,
    }
    ports = [free_port(), free_port()]
    processes = [
        start_python(
            WORKER,
            env={
                "TF_CONFIG": tf_config(ports, index),
                "TFDP_NO_KERAS_PATCHES": "1",
                "CUDA_VISIBLE_DEVICES": "",
                "PHASE_INPUTS": json.dumps(inputs),
            },
            preloaded=True,  # the phases check training, not a cold start
        )
        for index in range(2)
    ]
    workers = [result_line(outcome) for outcome in wait_all(processes, timeout=480)]
    return {"inputs": inputs, "workers": workers}


def phase_results(cluster: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """One phase's results, by task index; fails with the traceback if the phase raised."""
    results = [worker[name] for worker in cluster["workers"]]
    for index, result in enumerate(results):
        assert "phase_error" not in result, f"worker {index}, {name}:\n{result['phase_error']}"
    return results
