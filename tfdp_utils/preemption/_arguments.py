"""What ``PreemptionCheckpoint`` checks in the arguments it is given, and says about them.

The constructor's ``directory``, the ``fit`` call's (one checkpoint among its callbacks, its
``steps_per_epoch``, ``initial_epoch`` and ``epochs``, the model's ``steps_per_execution``), the
custom loop's model and optimizer, and the dataset, which must be one the builder made: each
refused with what was received, what was expected and how to fix it (:mod:`tfdp_utils._validate`'s
form), or said as a WARNING where it only changes what the run does. Pure (no TensorFlow).
"""

from __future__ import annotations

import logging
import numbers
import os
from collections.abc import Sequence
from typing import Any

from tfdp_utils import _dataset_info, _validate
from tfdp_utils.preemption import _position as position

logger = logging.getLogger("tfdp_utils")


def checked_directory(directory: Any) -> str:
    """``directory`` as given (a folder path, checked and made absolute when fit starts)."""
    if not isinstance(directory, (str, os.PathLike)) or not str(os.fspath(directory)).strip():
        raise TypeError(
            f"directory must be a folder path, but received {directory!r}. Pass a folder "
            "on a volume that outlives the job's processes."
        )
    text = os.fspath(directory)
    if isinstance(text, str) and text != text.strip():
        # " /mnt/ckpt" is a folder under the working directory, which a restarted
        # container does not keep: the job would never resume.
        raise ValueError(
            f"directory={text!r} begins or ends with whitespace, so it names another "
            f"folder than {text.strip()!r} (a leading space makes it relative to the "
            f"working directory). Pass directory={text.strip()!r}."
        )
    return text


def positive_int_or_none(value: Any, name: str, hint: str) -> int | None:
    """``value``, an integer >= 1, or None."""
    return None if value is None else _validate.positive_int(value, name, hint=hint)


def initial_epoch(value: Any) -> int:
    """``initial_epoch`` of a job without a checkpoint, checked: an integer >= 0 (None: 0)."""
    if value is None:
        return 0
    return _validate.positive_int(
        value,
        "initial_epoch",
        minimum=0,
        hint="Pass the epoch a job without a checkpoint starts at, e.g. initial_epoch=0.",
    )


def loop_optimizer(model: Any, optimizer: Any) -> Any:
    """The optimizer a custom loop's state is saved with: ``optimizer``, or the model's."""
    # Looked up on the class: tf_keras raises from the property on a model not built yet.
    if not hasattr(type(model), "trainable_variables") or not callable(model):
        raise TypeError(
            f"model must be a Keras model, but received {model!r:.80} of type "
            f"{type(model).__name__}. Pass the model the loop trains (its weights are saved)."
        )
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    if optimizer is None:
        raise ValueError(
            "PreemptionCheckpoint.loop needs the optimizer the step applies (its state is "
            "saved): pass optimizer=..., or compile the model with it."
        )
    if not hasattr(optimizer, "apply_gradients") or not hasattr(optimizer, "iterations"):
        raise TypeError(
            f"optimizer must be a Keras optimizer object, but received {optimizer!r:.80} of "
            f"type {type(optimizer).__name__}. Pass the optimizer object the step applies "
            "(its state is saved), e.g. the one given to tdu.make_distributed_train_step, "
            "or leave optimizer out to use model.optimizer."
        )
    return optimizer


def check_one_checkpoint(directories: Sequence[str]) -> None:
    """One PreemptionCheckpoint per fit (``directories``: those of the fit's checkpoints): each
    would position the dataset and save the job."""
    if len(directories) < 2:
        return
    folders = ", ".join(repr(d) for d in directories)
    raise ValueError(
        f"fit received {len(directories)} PreemptionCheckpoint callbacks (directories "
        f"{folders}); one positions the dataset at its checkpoint and saves the whole job, so a "
        "second would position it again and save a second copy. Pass one PreemptionCheckpoint "
        "(every_steps= for periodic saves besides the notice's)."
    )


def check_steps_per_epoch(given: Any, steps_per_epoch: int) -> None:
    """A ``steps_per_epoch`` given to fit is the dataset's epoch, or left out."""
    if given is not None and (isinstance(given, bool) or not isinstance(given, numbers.Real)):
        raise TypeError(
            f"steps_per_epoch must be a number of steps, but received {given!r} of type "
            f"{type(given).__name__}. Leave steps_per_epoch out: PreemptionCheckpoint "
            f"hands fit the dataset's epoch of {steps_per_epoch} steps."
        )
    if given is not None and given != steps_per_epoch:
        raise ValueError(
            f"steps_per_epoch={given!r} differs from the dataset's epoch of "
            f"{steps_per_epoch} steps; PreemptionCheckpoint resumes whole "
            "epochs of the builder dataset. Leave steps_per_epoch out."
        )


def check_executions_fit_epochs(
    per_execution: int, steps_per_epoch: int, *, whole_executions: bool
) -> None:
    """Keras 3 runs whole executions (``whole_executions``): one that does not end with the
    epoch would take the next epoch's first batches from the stream of epochs (tf_keras cuts
    it at the epoch)."""
    if not whole_executions or per_execution <= 1 or steps_per_epoch % per_execution == 0:
        return
    divisors = position.divisors(steps_per_epoch)
    shown = ", ".join(str(d) for d in divisors[:6]) + (", ..." if len(divisors) > 6 else "")
    raise ValueError(
        f"PreemptionCheckpoint received a model compiled with steps_per_execution="
        f"{per_execution}, which does not divide the dataset's epoch of {steps_per_epoch} "
        f"steps: Keras 3 runs every execution whole, so the epoch's last one would train "
        f"{per_execution - steps_per_epoch % per_execution} batches of the next epoch, and "
        f"no epoch would be the one a resume continues. Compile with a steps_per_execution "
        f"that divides {steps_per_epoch} ({shown}), or change the global batch size."
    )


def check_executions_fit_rest(
    per_execution: int, steps_per_epoch: int, start: int | None, *, whole_executions: bool
) -> None:
    """Keras 3 runs whole executions: the rest of an interrupted epoch laid out anew (files
    sharded by file on another shape) starts at a step that the executions must divide up to
    the epoch's end, or its last execution would take the next epoch's first batches."""
    if start is None:
        return
    left = steps_per_epoch - start
    if not whole_executions or per_execution <= 1 or left % per_execution == 0:
        return
    divisors = position.divisors(left)
    raise ValueError(
        f"PreemptionCheckpoint resumes the rest of an epoch of files sharded by file in "
        f"{left} steps (from step {start} of {steps_per_epoch} on this shape), but the model "
        f"is compiled with steps_per_execution={per_execution}: Keras 3 runs every execution "
        f"whole, so the rest's last one would train batches of the next epoch. Compile with "
        f"a steps_per_execution that divides both {left} and {steps_per_epoch} (e.g. "
        f"{max(d for d in divisors if steps_per_epoch % d == 0)}) until this epoch ends, or "
        "resume on the saved shape."
    )


def resumable(x: Any, receiver: str = "fit") -> Any:
    """The position-aware view of a builder dataset ``x`` (``receiver``, the call that took
    ``x``, is named when it is not one)."""
    factory = _dataset_info.resumable_of(x)
    if factory is None:
        raise TypeError(
            f"PreemptionCheckpoint resumes a dataset from tdu.build_distributed_dataset(), "
            f"but {receiver} received {type(x).__name__}. Build the training data with "
            "tdu.build_distributed_dataset(...) (not through the tf.data service): the "
            "same arrays or tf.data.Dataset go where x was, and the job then resumes at "
            "the step it stopped. For a resume at the last epoch's end instead, use "
            "keras.callbacks.BackupAndRestore."
        )
    found = factory()
    if found is None:
        raise ValueError(
            "PreemptionCheckpoint needs a dataset whose epochs it can count and align: a "
            "source of known size (files with count_examples=True, arrays, a sized "
            "tf.data.Dataset) of dense elements, read per worker (not through tf.data's "
            "FILE/HINT autoshard of a dataset). This dataset's epochs are of unknown size "
            "or hold sparse or ragged elements."
        )
    return found


def say_if_finished(epoch: int, step: int, epochs: Any, resumed_from: str | None) -> None:
    """A job whose checkpoint (at ``step`` of ``epoch``) is at or past the fit's last epoch
    trains nothing: say so."""
    if resumed_from is None or isinstance(epochs, bool) or not isinstance(epochs, int):
        return
    if epoch < epochs:
        return
    logger.warning(
        "tfdp_utils: PreemptionCheckpoint: the checkpoint %s is at the end of epoch %d, and "
        "this fit runs to epoch %d: the job has finished, so fit trains nothing (the "
        "checkpoint's weights are restored). To train more, raise epochs=; to train afresh, "
        "pass another directory= (or delete the old checkpoints).",
        resumed_from,
        epoch if step == 0 else epoch + 1,
        epochs,
    )


def say_save_granularity(every_steps: int | None, per_execution: int, accumulate: int) -> None:
    """Periodic saves come at batch hooks and accumulation boundaries: say when that makes
    the steps a kill can lose more than ``every_steps``."""
    if not every_steps:
        return
    unit = position.save_unit(per_execution, accumulate)
    if unit <= 1 or every_steps % unit == 0:
        return
    causes = []
    if per_execution > 1:
        causes.append(
            f"steps_per_execution={per_execution} (Keras calls the batch hooks once per execution)"
        )
    if accumulate > 1:
        causes.append(
            f"gradient accumulation over {accumulate} batches (a save waits for the update)"
        )
    logger.warning(
        "tfdp_utils: PreemptionCheckpoint(every_steps=%d) saves at the first step after each "
        "multiple of %d where %s allows: at most %d steps are lost to a kill, not %d. Use a "
        "multiple of %d to save exactly every N steps.",
        every_steps,
        every_steps,
        " and ".join(causes),
        every_steps + unit - 1,
        every_steps,
        unit,
    )
