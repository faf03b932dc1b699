"""The registry of runtime changes: every change listed by status(), undone by undo(), switched off.

What each change does is tested where it matters (the workarounds in test_compat.py, the fit
checks in test_fit_binding.py, the builder in tests/data); here: that each is made through the
registry, listed with what, why, when and whether it can be undone after the thing that makes
it, taken back out by :func:`tfdp_utils.compat.undo`, and left off by
``TFDP_NO_KERAS_PATCHES=1`` (in a fresh process, where nothing was changed before).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.processes import run_python

import tfdp_utils as tdu
from tfdp_utils import compat
from tfdp_utils._tf import IS_KERAS3, keras, tf
from tfdp_utils.compat import _changes as compat_changes
from tfdp_utils.compat import _fit_binding as fit_binding
from tfdp_utils.compat._registry import Patch, change_of, replace_method

METHODS = ("fit", "evaluate", "predict")


def _status(name: str) -> compat.WorkaroundStatus:
    return {s.issue: s for s in compat.status()}[name]


def _keras_own(function: Any) -> Any:
    """Keras' own method under the fit binding's wrapper (functools.wraps keeps it)."""
    while change_of(function) == fit_binding.CHANGE.name:
        function = function.__wrapped__
    return function


def _dataset(strategy: Any, **kwargs: Any) -> Any:
    x = np.ones((32, 4), "float32")
    return tdu.build_distributed_dataset(
        (x, x[:, :1]), strategy=strategy, global_batch_size=8, **kwargs
    )


# ----------------------------------------------------------------- the registry's own tools


class _Base:
    def method(self) -> str:
        """The base's own method."""
        return "base"


class _Owner(_Base):
    def own(self) -> str:
        return "own"


def test_replace_method_marks_records_and_undoes() -> None:
    def method(self: Any) -> str:
        return "ours"

    def own(self: Any) -> str:
        return "ours"

    inherited = replace_method(_Owner, "method", method, change="test-change")
    defined = replace_method(_Owner, "own", own, change="test-change")
    assert _Owner().method() == _Owner().own() == "ours"
    assert change_of(_Owner.method) == "test-change" and change_of(_Base.method) is None
    assert _Owner.method.__doc__ == "The base's own method."  # the original's docstring
    assert inherited.describe() == "_Owner.method" and inherited.installed()
    inherited.undo()
    defined.undo()
    assert "method" not in vars(_Owner)  # inherited again, not copied down
    assert _Owner().method() == "base" and _Owner().own() == "own"


def test_a_patch_never_undoes_someone_elses_replacement() -> None:
    patch = replace_method(_Owner, "own", lambda self: "ours", change="test-change")
    later = Patch(_Owner, "own", _Owner.own, lambda self: "later")
    _Owner.own = later.replacement  # type: ignore[method-assign]
    patch.undo()  # ours is no longer installed: the later one stays
    assert _Owner().own() == "later"
    later.undo()
    assert _Owner().own() == "ours"
    patch.undo()
    assert _Owner().own() == "own"


def test_every_change_says_what_why_and_whether_it_can_be_undone() -> None:
    listed = compat.status()
    assert [s.issue for s in listed] == [c.name for c in compat.CHANGES]
    assert {s.kind for s in listed} == {"workaround", "process", "object"}
    names = {s.issue for s in listed}
    assert {
        "fit-binding",
        "tf_keras-datasets",
        "mirrored-collective-keys",
        "builder-dataset-class",
        "accumulation-train-step",
        "strategy-choice",
    } <= names
    for entry in listed:
        assert entry.changes and entry.why, entry
        # Undoable changes are the ones that replace code; the kill switch covers Keras code.
        assert entry.undoable == (entry.issue in _undoable())
    fit = _status("fit-binding")
    assert fit.changes == "keras.Model.fit/evaluate/predict wrapped (every model in the process)"
    assert fit.kill_switch and fit.undoable
    keys = _status("mirrored-collective-keys")
    assert not keys.kill_switch and not keys.undoable and "not a change to Keras" in keys.why


def test_ctrl_c_abort_is_listed_and_undone_by_the_registry() -> None:
    import os
    import signal
    import threading

    from tfdp_utils import _interrupts

    heard = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)  # this process goes on
    try:
        assert compat_changes.abort_on_ctrl_c(heard.set, applied_by="this test")
        entry = _status("ctrl-c-abort")
        assert entry.applied_by == "this test" and entry.undoable and not entry.kill_switch
        os.kill(os.getpid(), signal.SIGINT)
        assert heard.wait(5)
        compat.undo("ctrl-c-abort")
        assert _status("ctrl-c-abort").applied_at is None
        heard.clear()
        os.kill(os.getpid(), signal.SIGINT)
        assert not heard.wait(0.5)
    finally:
        compat.undo("ctrl-c-abort")
        _interrupts.uninstall()
        signal.signal(signal.SIGINT, previous)


def _undoable() -> set[str]:
    return {w.issue for w in compat.WORKAROUNDS} | {
        "fit-binding",
        "fit-one-iterator",
        "tf_keras-datasets",
        "exit-guard",
        "exit-barrier",
        "ctrl-c-abort",
        "tf_keras-autograph",
        "resume-position",
    }


def _autograph_skips_tf_keras() -> bool:
    from tensorflow.python.autograph.core import config

    return any(getattr(rule, "_prefix", None) == "tf_keras" for rule in config.CONVERSION_RULES)


@pytest.mark.keras
def test_tf_keras_autograph_rule_is_added_only_where_tensorflow_lacks_it() -> None:
    entry = _status("tf_keras-autograph")
    assert entry.kill_switch and entry.undoable and "2.17" in entry.why
    lacked = not _autograph_skips_tf_keras()
    made = compat_changes.skip_autograph_for_tf_keras(applied_by="test")
    # Only tf_keras on a TensorFlow whose autograph would convert tf_keras (2.16) needs it.
    assert made == (not IS_KERAS3 and (lacked or bool(_status("tf_keras-autograph").applied)))
    if made:
        assert _autograph_skips_tf_keras()
        compat.undo("tf_keras-autograph")
        assert not _autograph_skips_tf_keras()
        assert compat_changes.skip_autograph_for_tf_keras(applied_by="test")


def test_undo_refuses_unknown_and_permanent_changes() -> None:
    with pytest.raises(ValueError, match=r"no runtime change called 'fit'.*'fit-binding'"):
        compat.undo("fit")
    with pytest.raises(ValueError, match=r"strategy-choice .* cannot be undone"):
        compat.undo("strategy-choice")
    with pytest.raises(ValueError, match=r"mirrored-collective-keys .* cannot be undone"):
        compat.undo("mirrored-collective-keys")


# ---------------------------------------------- each change listed after what triggers it


@pytest.mark.keras
def test_a_builder_dataset_lists_the_fit_binding_and_undo_restores_keras_fit(
    tmp_path: Path,
) -> None:
    own = {m: _keras_own(getattr(keras.Model, m)) for m in METHODS}
    compat.undo("fit-binding")  # whichever earlier test or logger made it
    assert _status("fit-binding").applied is None and not fit_binding.installed()
    assert all(getattr(keras.Model, m) is own[m] for m in METHODS)
    swapped = _status("builder-dataset-class").count
    started = time.time()
    dist = _dataset(tf.distribute.OneDeviceStrategy("/cpu:0"))
    fit = _status("fit-binding")
    assert fit.applied == "change" and fit.kind == "process"
    assert fit.applied_by == "build_distributed_dataset()"
    assert fit.applied_at is not None and started <= fit.applied_at <= time.time()
    assert fit.patched == ("Model.fit", "Model.evaluate", "Model.predict")
    assert all(_keras_own(getattr(keras.Model, m)) is own[m] for m in METHODS)
    classes = _status("builder-dataset-class")
    assert classes.kind == "object" and classes.count == swapped + 1
    assert classes.applied_by is not None and not classes.undoable
    assert type(dist).__name__ == type(dist).__mro__[1].__name__  # the same-named subclass
    # Undone through the registry: Keras' own methods, the very same functions.
    compat.undo("fit-binding")
    assert all(getattr(keras.Model, m) is own[m] for m in METHODS)
    assert _status("fit-binding").applied is None and _status("fit-binding").patched == ()
    compat.undo("fit-binding")  # not applied: nothing happens
    # A logger asks for it again, and says so.
    tdu.callbacks.ThroughputLogger(tmp_path)
    assert _status("fit-binding").applied_by == "ThroughputLogger()"
    assert fit_binding.installed()


@pytest.mark.keras
def test_auto_strategy_lists_the_key_base_and_the_strategy_attribute() -> None:
    before = {name: _status(name).count for name in ("mirrored-collective-keys", "strategy-choice")}
    base = tf.distribute.MirroredStrategy._collective_key_base
    strategy = tdu.auto_strategy("mirrored", devices=["/cpu:0", "/cpu:1"], verbose=False)
    assert tf.distribute.MirroredStrategy._collective_key_base > base
    keys = _status("mirrored-collective-keys")
    assert keys.applied == "change" and keys.kind == "process"
    assert keys.count == before["mirrored-collective-keys"] + 1
    assert keys.applied_by == "auto_strategy()" and keys.applied_at is not None
    choice = _status("strategy-choice")
    assert choice.count == before["strategy-choice"] + 1 and choice.kind == "object"
    assert tdu.strategy.explain(strategy) is not None
    for entry in (keys, choice):
        assert not entry.undoable and not entry.kill_switch and entry.patched == ()
    # The workarounds it applied say what asked for them.
    for issue in compat.needed_for(strategy):
        if _status(issue).bug_present:
            assert _status(issue).applied_by is not None


@pytest.mark.keras
@pytest.mark.skipif(IS_KERAS3, reason="enable_gradient_accumulation is for tf_keras")
def test_gradient_accumulation_lists_the_models_train_step() -> None:
    before = _status("accumulation-train-step").count
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    tdu.enable_gradient_accumulation(model, 2)
    entry = _status("accumulation-train-step")
    assert entry.count == before + 1 and entry.kind == "object"
    assert entry.applied_by == "enable_gradient_accumulation()" and not entry.undoable
    assert "train_step" in vars(model) and "train_step" not in vars(type(model))


@pytest.mark.keras
@pytest.mark.skipif(IS_KERAS3, reason="Keras 3 needs no help with distributed datasets")
def test_tf_keras_adapter_is_listed_and_undone_through_the_registry() -> None:
    from tf_keras.src.engine import data_adapter

    adapter = data_adapter.DatasetAdapter
    _dataset(tf.distribute.OneDeviceStrategy("/cpu:0"))
    entry = _status("tf_keras-datasets")
    assert entry.applied == "change" and entry.undoable and entry.kill_switch
    assert set(entry.patched) == {
        "DatasetAdapter._validate_args",
        "DatasetAdapter.get_size",
        "DatasetAdapter.should_recreate_iterator",
        "DataHandler.enumerate_epochs",
        "DataHandler._validate_data_handler",
    }
    compat.undo("tf_keras-datasets")
    assert change_of(adapter.get_size) is None and change_of(adapter._validate_args) is None
    handler = data_adapter.DataHandler
    assert change_of(handler.enumerate_epochs) is None
    assert change_of(handler._validate_data_handler) is None
    assert _status("tf_keras-datasets").applied is None
    assert compat.apply_for_datasets() is True
    assert _status("tf_keras-datasets").applied_by == "tdu.compat.apply_for_datasets()"


@pytest.mark.keras
@pytest.mark.skipif(not IS_KERAS3, reason="Keras 3 only")
def test_on_keras3_the_tf_keras_adapter_is_listed_and_never_applied() -> None:
    _dataset(tf.distribute.OneDeviceStrategy("/cpu:0"))
    assert _status("tf_keras-datasets").applied is None
    assert compat_changes.teach_tf_keras(applied_by="test") is False


# ------------------------------------------------------------------------- the kill switch

KILL_SWITCH = """
import json, logging, sys
import numpy as np

records = []


class Collect(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage()))


compat_logger = logging.getLogger("tfdp_utils.compat")
compat_logger.addHandler(Collect())
compat_logger.setLevel(logging.INFO)

import tensorflow as tf
import tfdp_utils as tdu
from tfdp_utils._tf import IS_KERAS3, keras

own = {m: getattr(keras.Model, m) for m in ("fit", "evaluate", "predict")}
strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
x = np.ones((64, 4), "float32")
y = np.ones((64, 1), "float32")
once = tdu.build_distributed_dataset((x, y), strategy=strategy, global_batch_size=16)
endless = tdu.build_distributed_dataset(
    (x, y), strategy=strategy, global_batch_size=16, repeat=True
)
with_dataset = tdu.callbacks.ThroughputLogger(sys.argv[1] + "/a", dataset=once, warmup_steps=1)
without = tdu.callbacks.ThroughputLogger(sys.argv[1] + "/b")
report = {"untouched": all(getattr(keras.Model, m) is f for m, f in own.items())}

with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
# tf_keras needs the steps too: its adapter is not taught builder datasets either.
model.fit(once, epochs=1, steps_per_epoch=4, verbose=0, callbacks=[with_dataset])
report["examples"] = with_dataset.summary()["examples"]
try:
    model.fit(once, epochs=1, steps_per_epoch=4, verbose=0, callbacks=[without])
    report["without"] = "trained"
except ValueError as exc:
    report["without"] = str(exc)


class StopAfter(keras.callbacks.Callback):
    batches = 0

    def on_train_batch_end(self, batch, logs=None):
        StopAfter.batches += 1
        if StopAfter.batches >= 6:
            self.model.stop_training = True


try:  # the endless-epoch check is off: only the callback (or Keras) stops it
    model.fit(endless, epochs=1, verbose=0, callbacks=[StopAfter()])
    report["endless"] = ["ran", StopAfter.batches]
except Exception as exc:
    report["endless"] = [type(exc).__name__, str(exc)[:500]]
report["status"] = {
    s.issue: [s.applied, s.kill_switch, s.count] for s in tdu.compat.status()
}
report["warnings"] = [message for level, message in records if level == "WARNING"]
report["keras3"] = IS_KERAS3
print(json.dumps(report))
"""


@pytest.mark.slow
@pytest.mark.keras
def test_the_kill_switch_leaves_keras_fit_alone_and_says_what_is_off(tmp_path: Path) -> None:
    result = run_python(
        f"import sys; sys.argv[1:] = [{str(tmp_path)!r}]\n" + KILL_SWITCH,
        env={"TFDP_NO_KERAS_PATCHES": "1"},
        timeout=300,
        preloaded=True,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["untouched"] is True  # Keras' own Model.fit/evaluate/predict
    status = report["status"]
    assert status["fit-binding"][0] is None and status["tf_keras-datasets"][0] is None
    assert status["builder-dataset-class"][:2] == ["change", False]  # only our datasets
    # One warning, naming every feature that is off and what to do instead.
    assert len(report["warnings"]) == 1, report["warnings"]
    warning = report["warnings"][0]
    for needed in (
        "TFDP_NO_KERAS_PATCHES=1",
        "ThroughputLogger(..., dataset=",
        "EndlessEpochError",
        "steps_per_epoch=",
        "StrategyMismatchError",
        "validation_split",
    ):
        assert needed in warning, (needed, warning)
    # ThroughputLogger(dataset=...) still counts exactly: 4 steps of 16.
    assert report["examples"] == 64
    assert "TFDP_NO_KERAS_PATCHES=1" in report["without"] and "dataset=" in report["without"]
    # An endless builder dataset without steps is no longer stopped by tfdp-utils: Keras 3
    # trains past the data's 4 steps until a callback stops it; tf_keras refuses it itself.
    if report["keras3"]:
        assert report["endless"] == ["ran", 6]
    else:
        assert report["endless"][0] == "ValueError"
        assert "must specify the number of steps" in report["endless"][1]
        assert "EndlessEpochError" not in report["endless"][1]


def test_every_workaround_is_an_entry_of_the_known_issues_table() -> None:
    # The table is the one home of each bug's title and address; the doctor prints it.
    from tfdp_utils._known_issues import ISSUES

    for workaround in compat.WORKAROUNDS:
        entry = ISSUES[workaround.issue]
        assert entry.workaround == "compat", entry
        assert workaround.summary == entry.title and workaround.url == entry.url
