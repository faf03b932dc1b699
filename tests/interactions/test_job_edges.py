"""A job's life at its edges, in real processes: a notice before fit, and a checkpoint resumed
under the other Keras.

Each case starts fresh Python processes (the Keras flavour is chosen when TensorFlow is
imported, and the exit status is what the scheduler sees).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.processes import run_python

pytestmark = pytest.mark.slow

PREEMPTED = 75

JOB = r"""
import os, signal, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tfdp_utils as tdu
from tfdp_utils._tf import keras, tf

directory, when = sys.argv[1], sys.argv[2]
checkpoint = tdu.callbacks.PreemptionCheckpoint(directory)
if when == "before-fit":
    os.kill(os.getpid(), signal.SIGTERM)  # while the program still builds its data and model
strategy = tdu.auto_strategy(verbose=False)
x = np.random.default_rng(0).normal(size=(40, 3)).astype("float32")
dist = tdu.build_distributed_dataset(
    (x, x[:, :1]), strategy=strategy, global_batch_size=8, shuffle_buffer_size=64, seed=1
)
with strategy.scope():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("adam", "mse")


class Stop(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if when == "during-fit" and batch == 2:
            os.kill(os.getpid(), signal.SIGTERM)


try:
    model.fit(dist, epochs=2, verbose=0, callbacks=[Stop(), checkpoint])
except tdu.ResumeMismatchError as error:
    print("REFUSED:", error)
    print("ITERATIONS:", int(model.optimizer.iterations.numpy()))
    sys.exit(3)
print("TRAINED:", int(model.optimizer.iterations.numpy()))
"""


def _job(directory: Path, when: str, *, legacy: bool) -> tuple[int, str, str]:
    env = {"TF_USE_LEGACY_KERAS": "1" if legacy else None}
    done = run_python(JOB, env=env, args=[str(directory), when], timeout=240, preloaded=True)
    return done.returncode, done.stdout, done.stderr


def test_a_notice_before_fit_exits_to_be_run_again(tmp_path: Path) -> None:
    status, out, err = _job(tmp_path, "before-fit", legacy=False)
    assert status == PREEMPTED, err[-2000:]
    assert "SIGTERM outside fit: nothing trained since the last checkpoint" in err
    assert "TRAINED" not in out
    assert not any(tmp_path.glob("ckpt-*"))


@pytest.mark.parametrize(
    "saved_legacy", [False, True], ids=["keras3-then-tf_keras", "tf_keras-then-keras3"]
)
def test_a_checkpoint_of_the_other_keras_is_refused_by_name(
    tmp_path: Path, saved_legacy: bool
) -> None:
    status, _, err = _job(tmp_path, "during-fit", legacy=saved_legacy)
    assert status == PREEMPTED, err[-2000:]
    status, out, err = _job(tmp_path, "resume", legacy=not saved_legacy)
    assert status == 3, (out, err[-2000:])
    saved, now = ("tf_keras", "Keras 3") if saved_legacy else ("Keras 3", "tf_keras")
    assert f"was saved under {saved}" in out and f"this run uses {now}" in out
    fix = "set TF_USE_LEGACY_KERAS=1" if saved_legacy else "unset TF_USE_LEGACY_KERAS"
    assert fix in out
    assert "ITERATIONS: 0" in out  # refused before the first step
