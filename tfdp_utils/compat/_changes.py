"""The runtime changes made outside the compat package, described and recorded here.

The builder, :func:`tfdp_utils.auto_strategy` and :func:`tfdp_utils.enable_gradient_accumulation`
change TensorFlow or Keras objects for reasons of their own; each does it through a function of
this module, so that :func:`tfdp_utils.compat.status` lists the change with what, why, when
and whether it can be undone. None of them patches Keras code, so ``TFDP_NO_KERAS_PATCHES``
leaves them on; none can be undone through the registry (each says why).
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from tfdp_utils import _exit_guard as exit_guard
from tfdp_utils import _interrupts as interrupts
from tfdp_utils import schedules as _schedules  # noqa: F401  WarmupSchedule, for load_model
from tfdp_utils._tf import require_supported
from tfdp_utils.compat import _fit_binding as fit_binding
from tfdp_utils.compat import _one_iterator as one_iterator
from tfdp_utils.compat import _tf_keras_datasets as tf_keras_datasets
from tfdp_utils.compat._registry import (
    MARK,
    REGISTRY,
    RuntimeChange,
    change_object,
    replace_method,
    set_attribute,
)
from tfdp_utils.compat._switch import disabled, warn_features_off

COLLECTIVE_KEYS = RuntimeChange(
    name="mirrored-collective-keys",
    kind="process",
    changes="tf.distribute.MirroredStrategy._collective_key_base moved on by a range of keys "
    "before each MirroredStrategy auto_strategy() builds",
    why="every MirroredStrategy in a process starts its collective group keys at the same "
    "number, and TensorFlow aborts when one key meets two device sets (a 2-device strategy, "
    "then a 4-device one); TensorFlow's own tests move the base the same way. A correctness "
    "fix of TensorFlow's numbering, not a change to Keras' code, so TFDP_NO_KERAS_PATCHES "
    "leaves it on. Not undoable: strategies built since use the new keys, and moving the base "
    "back would give the next strategy keys already in use",
    undoable=False,
    kill_switch=False,
)

DATASET_CLASS = RuntimeChange(
    name="builder-dataset-class",
    kind="object",
    changes="each distributed dataset build_distributed_dataset() returns gets tfdp_info, "
    "tfdp_plan and an input clock (tfdp_input_clock), and its class is swapped for a "
    "same-named subclass whose cardinality is the builder's step count and whose iterators "
    "(same-named subclasses of TensorFlow's, with their type spec) time each worker's fetch of "
    "the next batch inside the step",
    why="Keras 3 takes a dataset's cardinality as the epoch's steps, and TensorFlow's counts "
    "one worker's per-replica batches, which is not the number of steps with several "
    "replicas and differs between workers; the time a step waits for its batch (the input-"
    "wait share, the stuck-worker diagnosis) can only be measured where the batch is fetched. "
    "Only the builder's own datasets change, never "
    "their class or Keras, so TFDP_NO_KERAS_PATCHES leaves it on. Not undoable: tfdp-utils "
    "keeps no reference to the datasets",
    undoable=False,
    kill_switch=False,
)

ACCUMULATION_STEP = RuntimeChange(
    name="accumulation-train-step",
    kind="object",
    changes="model.train_step replaced (and model._tfdp_accumulation set) on each model given "
    "to enable_gradient_accumulation()",
    why="tf_keras optimizers cannot accumulate gradients; the replaced step adds each batch's "
    "gradients to replica-local accumulators and applies their mean every k batches. Asked "
    "for by name on one model, so TFDP_NO_KERAS_PATCHES leaves it on. Not undoable: build "
    "and compile a new model for Keras' own step",
    undoable=False,
    kill_switch=False,
)

STRATEGY_CHOICE = RuntimeChange(
    name="strategy-choice",
    kind="object",
    changes="strategy._tfdp_choice set on each strategy auto_strategy() returns",
    why="tdu.strategy.explain(strategy) returns the StrategyChoice behind the strategy; an "
    "attribute of tfdp-utils' own, which TensorFlow never reads, so TFDP_NO_KERAS_PATCHES "
    "leaves it on. Not undoable (nothing to undo: TensorFlow's behaviour is unchanged)",
    undoable=False,
    kill_switch=False,
)

EXIT_GUARD = RuntimeChange(
    name="exit-guard",
    kind="process",
    changes="sys.excepthook wrapped (it records the exit status), sys.unraisablehook wrapped "
    "(a Ctrl-C a finalizer swallowed is delivered again), Python's SIGINT handler "
    "replaced by one that also notes Ctrl-C, and an atexit handler that frees what an "
    "uncaught error keeps alive, with a faulthandler backstop",
    why="after an uncaught error or Ctrl-C in fit, the traceback Python keeps holds a live "
    "tf.data iterator; destroyed during interpreter teardown, an iterator over a "
    "from_generator reader waits forever for Python threads the interpreter has ended, and "
    "the process never exits. The guard frees it before teardown, and ends a process still "
    "alive TFDP_EXIT_GRACE seconds later. Not a change to Keras, so TFDP_NO_KERAS_PATCHES "
    "leaves it on; TFDP_EXIT_GUARD=0 keeps it from being installed",
    undoable=True,
    kill_switch=False,
)

EXIT_BARRIER = RuntimeChange(
    name="exit-barrier",
    kind="process",
    changes="an atexit handler: on a clean exit, each worker of a MultiWorkerMirroredStrategy "
    "job marks its exit in the coordination service and waits for the other workers' marks "
    "(bounded: not for a peer whose port is closed, nor once the service is gone, nor past "
    "TFDP_EXIT_BARRIER seconds)",
    why="a worker that tears down while its peers are already gone runs TensorFlow's "
    "teardown with the coordination agent still running and already failed over the "
    "peer's absence; jobs whose workers ended more than ~4 s apart were reported to abort "
    "(SIGABRT) after their last output line. Installed by auto_strategy() over 2 or more "
    "workers. Not a change to Keras, so TFDP_NO_KERAS_PATCHES leaves it on; "
    "TFDP_EXIT_BARRIER=0 keeps it from being installed",
    undoable=True,
    kill_switch=False,
)

CTRL_C_ABORT = RuntimeChange(
    name="ctrl-c-abort",
    kind="process",
    changes="signal.set_wakeup_fd set to a socket read by a daemon thread (tfdp-interrupts), "
    "when no other wakeup descriptor is in place; on Ctrl-C, a training thread held inside "
    "one TensorFlow call for a second has the process's collectives aborted",
    why="a worker of a multi-worker job that Ctrl-C finds inside an all-reduce waits for a "
    "peer that Ctrl-C already stopped, and Python's KeyboardInterrupt comes only when the "
    "call returns: after collective_timeout, or once the peer's heartbeats stop. Installed "
    "by auto_strategy() over 2 or more workers. Not a change to Keras, so "
    "TFDP_NO_KERAS_PATCHES leaves it on",
    undoable=True,
    kill_switch=False,
)

SIGTERM_DEFAULT = RuntimeChange(
    name="sigterm-default",
    kind="process",
    changes="SIGTERM's handler set back to the default (end the process) after "
    "MultiWorkerMirroredStrategy is built, unless the program set a Python handler",
    why="TensorFlow's coordination service catches SIGTERM for its preemption notifier, so a "
    "multi-worker job told to stop (Kubernetes, SLURM, a spot VM) without a preemption "
    "handler keeps running until it is killed; with the default it ends at once, status "
    "-15 (143), as a one-process job does. A preemption handler installed afterwards "
    "(tdu.callbacks.PreemptionCheckpoint, TensorFlow's PreemptionCheckpointHandler) takes "
    "SIGTERM over as usual. Not a change to Keras, so TFDP_NO_KERAS_PATCHES leaves it on. Not "
    "undoable: the handler TensorFlow's C++ runtime installed cannot be put back from Python",
    undoable=False,
    kill_switch=False,
)

TF_KERAS_AUTOGRAPH = RuntimeChange(
    name="tf_keras-autograph",
    kind="process",
    changes="tf.autograph's conversion rules (autograph.core.config.CONVERSION_RULES) get "
    "DoNotConvert('tf_keras') on TensorFlow 2.16 with tf_keras",
    why="TensorFlow 2.16's autograph has DoNotConvert('keras') but not 'tf_keras' (added "
    "upstream in 2.17), so the first trace of every tf_keras train/test/predict function "
    "converts all of tf_keras's layers, losses and metrics: 15 s instead of 0.8 s for the "
    "demo's MLP on 2 CPUs (80 s on a loaded machine). The user's own functions (a custom "
    "train_step) are still converted. Applied by auto_strategy()/apply_for_strategy() and "
    "the builder; TFDP_NO_KERAS_PATCHES=1 keeps it out",
    undoable=True,
    kill_switch=True,
)

DIVERGENCE_GUARD = RuntimeChange(
    name="divergence-guard",
    kind="object",
    changes="apply_gradients, and the method each Keras hands the loss to (Keras 3's "
    "scale_loss, tf_keras's minimize), replaced on the optimizer object of each model a "
    "DivergenceGuard watches (and optimizer._tfdp_guard set)",
    why="a non-finite loss or gradient must be caught inside the step, before the update is "
    "applied, on every replica at once; Keras has no hook there. The replacement checks each "
    "replica's loss and gradients, agrees over all replicas in one small all-reduce, and runs "
    "Keras' own update only when every replica is finite. Asked for by name on one model, "
    "so TFDP_NO_KERAS_PATCHES leaves it on. Not undoable: a train function traced with the "
    "guard keeps it; compile the model again for Keras' own update",
    undoable=False,
    kill_switch=False,
)

CHANGES = (
    COLLECTIVE_KEYS,
    TF_KERAS_AUTOGRAPH,
    DATASET_CLASS,
    ACCUMULATION_STEP,
    STRATEGY_CHOICE,
    DIVERGENCE_GUARD,
    EXIT_GUARD,
    EXIT_BARRIER,
    CTRL_C_ABORT,
    SIGTERM_DEFAULT,
)


class ListenerPatch:
    """A Ctrl-C listener (:func:`tfdp_utils._interrupts.listen`), undone like a ``Patch``."""

    def __init__(self, remove: Any) -> None:
        self._remove = remove
        self._removed = False

    def installed(self) -> bool:
        """Whether the listener is still called on Ctrl-C."""
        return not self._removed and interrupts.installed()

    def undo(self) -> None:
        """Stop calling the listener."""
        self._remove()
        self._removed = True

    def describe(self) -> str:
        """What this patch added, in words."""
        return "a SIGINT listener on signal.set_wakeup_fd"


def abort_on_ctrl_c(listener: Any, *, applied_by: str) -> bool:
    """Call ``listener()`` on Ctrl-C from a helper thread (see :data:`CTRL_C_ABORT`); once.

    Returns:
        True when it is in place; False when Ctrl-C cannot be heard this way (not the main
        thread, or the program has its own wakeup descriptor).
    """
    with REGISTRY.lock:
        if REGISTRY.get(CTRL_C_ABORT.name) is not None:
            return True
        remove = interrupts.listen(listener)
        if remove is None:
            return False
        patches: list[Any] = [ListenerPatch(remove)]  # undone like a Patch (duck-typed)
        REGISTRY.record(CTRL_C_ABORT, applied_by=applied_by, patches=patches)
        return True


def restore_sigterm(*, applied_by: str) -> None:
    """Let SIGTERM end the process again after TensorFlow's runtime caught it (see
    :data:`SIGTERM_DEFAULT`). Nothing happens off the main thread, or when the program
    installed a Python handler for SIGTERM (its own, or a preemption callback's)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return
    with REGISTRY.lock:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        REGISTRY.record(SIGTERM_DEFAULT, applied_by=applied_by)


def guard_exits(*, applied_by: str) -> None:
    """Install the exit guard (:mod:`tfdp_utils._exit_guard`) once per process.

    Does nothing when ``TFDP_EXIT_GUARD`` is an off word (``0``, ``off``...).

    Raises:
        ValueError: ``TFDP_EXIT_GRACE`` is not a number of seconds >= 0.
    """
    with REGISTRY.lock:
        if REGISTRY.get(EXIT_GUARD.name) is not None or not exit_guard.wanted():
            return
        seconds = exit_guard.grace()
        exit_guard.register_at_exit()
        hook = exit_guard.make_excepthook(sys.excepthook)
        patches: list[Any] = [
            replace_method(sys, "excepthook", hook, change=EXIT_GUARD.name),
            replace_method(
                sys,
                "unraisablehook",
                exit_guard.make_unraisablehook(sys.unraisablehook),
                change=EXIT_GUARD.name,
            ),
            set_attribute(exit_guard, "GRACE", seconds),
            set_attribute(exit_guard, "ACTIVE", True),
        ]
        interrupts = exit_guard.note_interrupts()  # after Ctrl-C, every error is Ctrl-C's
        if interrupts is not None:
            patches.append(interrupts)
        REGISTRY.record(EXIT_GUARD, applied_by=applied_by, patches=patches)


def hold_exits(
    store: Any,
    *,
    rank: int,
    addresses: Any,
    before: Any = None,
    applied_by: str,
) -> None:
    """Install the exit barrier (:mod:`tfdp_utils._exit_barrier`) once per process.

    Does nothing when ``TFDP_EXIT_BARRIER`` is ``0`` or an off word.

    Raises:
        ValueError: ``TFDP_EXIT_BARRIER`` is not a number of seconds >= 0.
    """
    from tfdp_utils import _exit_barrier

    with REGISTRY.lock:
        seconds = _exit_barrier.bound()
        if REGISTRY.get(EXIT_BARRIER.name) is not None or seconds is None:
            return
        barrier = _exit_barrier.install(
            store, rank=rank, addresses=addresses, seconds=seconds, before=before
        )
        patches: list[Any] = [barrier]
        REGISTRY.record(EXIT_BARRIER, applied_by=applied_by, patches=patches)


def teach_tf_keras(*, applied_by: str) -> bool:
    """On tf_keras, let ``fit``/``evaluate`` take a builder dataset's steps (once per process).

    Returns:
        True when tf_keras's adapter is patched in this process; False on Keras 3, when
        ``TFDP_NO_KERAS_PATCHES=1`` (then one warning per process names what is off), or when
        this tf_keras has no adapter to patch.
    """
    from tfdp_utils._tf import IS_KERAS3

    with REGISTRY.lock:
        if IS_KERAS3:
            return False
        if tf_keras_datasets.installed():
            return True
        if disabled():
            warn_features_off(applied_by)
            return False
        return tf_keras_datasets.install(applied_by=applied_by)


def skip_autograph_for_tf_keras(*, applied_by: str) -> bool:
    """On tf_keras, keep autograph out of tf_keras's own code where TensorFlow does not.

    Once per process; only when the in-use Keras is tf_keras and this TensorFlow's conversion
    rules lack ``DoNotConvert('tf_keras')`` (TensorFlow 2.16). See :data:`TF_KERAS_AUTOGRAPH`.

    Returns:
        True when the rule is in place through this change.
    """
    from tfdp_utils import _tf

    with REGISTRY.lock:
        if REGISTRY.get(TF_KERAS_AUTOGRAPH.name) is not None:
            return True
        if _tf.IS_KERAS3 or disabled():
            return False
        rules = _tf.autograph_rules_without_tf_keras()
        if rules is None:
            return False
        module, extended = rules
        patch = set_attribute(module, "CONVERSION_RULES", extended)
        REGISTRY.record(TF_KERAS_AUTOGRAPH, applied_by=applied_by, patches=[patch])
        return True


def prepare_for_datasets(*, applied_by: str) -> None:
    """What a builder dataset needs of Keras: ``fit`` wrapped (with one iterator per ``fit``),
    and on tf_keras the adapter taught.

    The builder calls this for every dataset it returns; each change is made once per
    process. With ``TFDP_NO_KERAS_PATCHES=1`` neither is made, and one warning (per process)
    names the features that are then off.

    Args:
        applied_by: what asks for it, e.g. ``"build_distributed_dataset()"``.
    """
    require_supported()
    teach_tf_keras(applied_by=applied_by)
    skip_autograph_for_tf_keras(applied_by=applied_by)
    if fit_binding.install(applied_by=applied_by):
        one_iterator.install(applied_by=applied_by)
    guard_exits(applied_by=applied_by)


def bump_collective_keys(strategy_class: Any, stride: int, *, applied_by: str) -> None:
    """Move ``strategy_class``'s collective key base on by ``stride``, and record it."""
    from tfdp_utils import _tf

    with REGISTRY.lock:
        if _tf.bump_collective_keys(strategy_class, stride):
            REGISTRY.record(COLLECTIVE_KEYS, applied_by=applied_by)


def swap_dataset_class(dataset: Any, cls: type, *, applied_by: str) -> None:
    """Give one builder dataset the class ``cls`` (a same-named subclass of its own).

    Raises:
        TypeError: the dataset's class forbids ``__class__`` assignment.
    """
    change_object(dataset, "__class__", cls, change=DATASET_CLASS, applied_by=applied_by)


def replace_train_step(model: Any, train_step: Any, *, applied_by: str) -> None:
    """Replace ``train_step`` on one model (its class keeps Keras' own)."""
    change_object(model, "train_step", train_step, change=ACCUMULATION_STEP, applied_by=applied_by)


def guard_optimizer(optimizer: Any, methods: dict[str, Any], *, applied_by: str) -> None:
    """Set ``methods`` (name -> function) on one optimizer (see :data:`DIVERGENCE_GUARD`)."""
    for name, method in methods.items():
        setattr(method, MARK, DIVERGENCE_GUARD.name)
        setattr(optimizer, name, method)
    REGISTRY.record(DIVERGENCE_GUARD, applied_by=applied_by)


def record_strategy_choice(strategy: Any, choice: Any, *, applied_by: str) -> None:
    """Keep the choice behind ``strategy`` on it, for :func:`tfdp_utils.strategy.explain`."""
    change_object(strategy, "_tfdp_choice", choice, change=STRATEGY_CHOICE, applied_by=applied_by)
