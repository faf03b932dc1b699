"""Whether a checkpoint is this run's: the same data, model, optimizer, Keras and shuffle seed.

The same data on another number of replicas or workers is accepted where the global batches
are the same on both shapes (:mod:`._elastic`).

A checkpoint's ``state.json`` (:mod:`._position`) is read against the run about to resume from
it; a difference that would not continue the same epochs, or would restore nothing, raises a
:class:`~tfdp_utils.errors.ResumeMismatchError` naming both values and the fix. Pure (no
TensorFlow): the model's weights are passed as names and shapes, the running Keras by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tfdp_utils.errors import ResumeMismatchError
from tfdp_utils.preemption import _elastic as elastic
from tfdp_utils.preemption._store import Saved

FACT_WORDS = {  # the causes first: the steps per epoch follow from them
    "global_batch_size": "global batch size",
    "num_replicas_in_sync": "replicas",
    "num_workers": "workers",
    "examples_per_epoch": "examples per epoch",
    "source_kind": "kind of source",
    "policy": "sharding policy",
    "files": "files (per worker)",
    "shuffle_buffer_size": "shuffle buffer size",
    "drop_remainder": "drop_remainder",
    "steps_per_epoch": "steps per epoch",
}
"""The dataset's facts a resume is checked against, in the words an error uses."""


def check_facts(saved: Saved, facts: Mapping[str, Any]) -> None:
    """Raise when the dataset's facts differ from those the checkpoint was saved with.

    Another number of replicas or workers is an elastic resume (:mod:`._elastic`): checked
    there (the same global batch, dividing over the replicas, a source that keeps its order),
    and every other fact must still be the same.
    """
    before = saved.state.get("dataset", {})
    reshaped = elastic.changed(before, facts)
    if reshaped:
        elastic.check_shape_change(saved.path, before, facts)
    # Files sharded by file: an epoch's steps depend on the shape (the rest is laid out anew).
    steps_follow = reshaped and elastic.redistributes(before, facts)
    for key, words in FACT_WORDS.items():
        if reshaped and key in elastic.SHAPE_FACTS:
            continue
        if steps_follow and key == "steps_per_epoch":
            continue
        if key in before and before[key] != facts.get(key):
            raise ResumeMismatchError(
                f"the checkpoint {saved.path} was saved with {words} {before[key]!r}, but this "
                f"run has {facts.get(key)!r}: resuming would not continue the same epochs. "
                "Resume with the same settings, or start afresh with another directory= "
                "(or delete the old checkpoints)."
            )


def check_optimizer(saved: Saved, optimizer: str) -> None:
    """Raise when the checkpoint holds the state of another optimizer than ``optimizer`` (this
    run's optimizer's class name)."""
    before = saved.state.get("optimizer")
    if before is not None and before != optimizer:
        raise ResumeMismatchError(
            f"the checkpoint {saved.path} holds the state of a {before} optimizer, but this "
            f"run's optimizer is {optimizer}. Train with {before} to resume, or start afresh "
            "with another directory=."
        )


def check_weights(saved: Saved, current: Sequence[Sequence[Any]]) -> None:
    """Raise when the checkpoint was saved from another model: ``current`` is ``[name, shape]``
    of each of this run's weights, in order (:func:`._position.model_variables`)."""
    shapes = saved.state.get("variables")
    if shapes is None:
        return
    if [shape for _, shape in shapes] == [shape for _, shape in current]:
        return
    pairs = zip(shapes, current, strict=False)
    differ = next(((a, b) for a, b in pairs if a[1] != b[1]), None)
    detail = (
        f"{differ[0][0]} has shape {differ[0][1]} there, {differ[1][0]} has {differ[1][1]} here"
        if differ is not None
        else f"{len(shapes)} weights there, {len(current)} here"
    )
    raise ResumeMismatchError(
        f"the checkpoint {saved.path} was saved from a different model: {detail}. Resume "
        "with the same model, or start afresh with another directory=."
    )


def check_flavour(saved: Saved, keras: str) -> None:
    """A checkpoint of the other Keras is refused: its variables carry other names, so a
    restore would match nothing and train from fresh weights without a word.

    Args:
        saved: the checkpoint.
        keras: the running Keras as a checkpoint records it: its version for Keras 3,
            ``"tf_keras"`` for tf_keras.
    """
    before = str(saved.state.get("keras", ""))
    if not before:
        return
    saved_flavour = "tf_keras" if before == "tf_keras" else "keras3"
    if saved_flavour == ("tf_keras" if keras == "tf_keras" else "keras3"):
        return
    words = {"tf_keras": "tf_keras (TF_USE_LEGACY_KERAS=1)", "keras3": f"Keras 3 ({before})"}
    fix = (
        "tf_keras: set TF_USE_LEGACY_KERAS=1"
        if saved_flavour == "tf_keras"
        else "Keras 3: unset TF_USE_LEGACY_KERAS"
    )
    now = "tf_keras (TF_USE_LEGACY_KERAS=1)" if keras == "tf_keras" else f"Keras 3 ({keras})"
    raise ResumeMismatchError(
        f"the checkpoint {saved.path} was saved under {words[saved_flavour]}, but this run "
        f"uses {now}: the two Kerases name their variables differently, so nothing would be "
        f"restored. Resume under {fix}, "
        "or start afresh with another directory=."
    )


def checked_seed(saved: Saved, given: int | None) -> Any:
    """The shuffle seed to resume with: the checkpoint's, which a seed= given differently
    must not silently replace (the epoch's order would change mid-epoch)."""
    before = saved.state.get("seed")
    if given is not None and before is not None and given != before:
        raise ResumeMismatchError(
            f"the checkpoint {saved.path} was saved with the shuffle seed {before!r}, but "
            f"this run's dataset has seed={given!r}: the interrupted epoch would continue in "
            f"another order, training some examples twice and others never. Resume with "
            f"seed={before!r}, or start afresh with another directory=."
        )
    return before
