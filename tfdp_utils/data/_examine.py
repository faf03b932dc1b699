"""The source, examined once: what it is, what its elements are, what the planner needs.

At the start of a call the builder looks at its source once (:func:`examine_source`) and
passes the answer down as one :class:`ExaminedSource`: the source's kind
(:mod:`~tfdp_utils.data._sources`), whether its elements are examples or batches
(:mod:`~tfdp_utils.data._elements`), the source as the pipeline reads it, one element's spec
where one look tells it, and what the planner needs (the pure
:class:`~tfdp_utils.data._sharding.SourceFacts`: files, sizes, examples, file readers).

A ``fn(input_context)`` source is looked at by calling it once with this worker's context: the
call builds its dataset (reading nothing), shows what its elements are and the global batch
size it asks ``input_context`` to split (:class:`ProbedFunction`), and that first dataset is
kept for the pipeline's first call, so the function still runs once per worker.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tfdp_utils._tf import tf
from tfdp_utils.data import _elements as element_kinds
from tfdp_utils.data._arguments import BuilderCall
from tfdp_utils.data._elements import EXAMPLES, SourceElements, classify
from tfdp_utils.data._sharding import SourceFacts, SourceKind
from tfdp_utils.data._sources import (
    array_length,
    cardinality,
    gather_facts,
    is_dataset,
    source_kind,
)


@dataclasses.dataclass(frozen=True)
class ExaminedSource:
    """What the builder knows of its source, from one look at it.

    Attributes:
        kind: ``"dataset"``, ``"arrays"``, ``"files"`` or ``"function"``.
        elements: whether its elements are examples or batches (their static size, the
            global batch size a function asks for), and why.
        readable: the source as the pipeline reads it: arrays as a dataset of examples, a
            dataset of batches unbatched, a function as the :class:`ProbedFunction` the
            builder called (unless ``element="example"`` was given), files as given.
        facts: what the planner needs: the files and their sizes, the examples when known
            (-1 for a source without end), whether a dataset reads files. For a function
            that batches itself, its kind only.
        element_spec: one element's spec as the pipeline reads it, where one look tells it:
            an example of a dataset or of arrays, a per-replica batch of a function that
            batches itself; None for files (each worker reads its own first file) and a
            function of examples.
    """

    kind: SourceKind
    elements: SourceElements
    readable: Any
    facts: SourceFacts
    element_spec: Any = None

    @property
    def batches_itself(self) -> bool:
        """Whether the source is a ``fn(input_context)`` returning per-replica batches."""
        return self.kind == "function" and self.elements.kind == "batch"


def examine_source(call: BuilderCall, context: Any) -> ExaminedSource:
    """Look at ``call.source`` once: everything the later phases need to know of it.

    Args:
        call: the checked call.
        context: this worker's ``tf.distribute.InputContext`` (a function is called with it).

    Raises:
        ValueError: an empty list, ``element='batch'`` on arrays or files, elements that
            cannot be told apart (see :func:`~tfdp_utils.data._elements.classify`), arrays of
            different lengths, files that do not exist or a glob that matches nothing.
        TypeError: an unsupported source, a function that takes no input context or returns
            no dataset.
    """
    kind = source_kind(call.source)
    elements, readable = _elements_of(call.source, call.element, kind=kind, context=context)
    if kind == "function" and elements.kind == "batch":
        batch = readable.first[0] if isinstance(readable, ProbedFunction) else None
        spec = None if batch is None else batch.element_spec
        return ExaminedSource(kind, elements, readable, SourceFacts("function"), spec)
    if kind == "arrays":
        array_length(readable)
        readable = tf.data.Dataset.from_tensor_slices(readable)
        facts = SourceFacts("arrays", num_examples=cardinality(readable))
    else:
        if kind == "dataset":
            readable = element_kinds.examples_of(readable, elements)
        facts = gather_facts(
            readable,
            shard_policy=call.shard_policy,
            reader=call.reader,
            count_examples=call.count_examples,
            kind=kind,
        )
    spec = readable.element_spec if kind in ("arrays", "dataset") else None
    return ExaminedSource(kind, elements, readable, facts, spec)


# ------------------------------------------------------------------ a source function


class _RecordingContext(tf.distribute.InputContext):  # type: ignore[misc]
    """An ``InputContext`` that notes the global batch size the function asks to split."""

    def __init__(self, context: Any) -> None:
        super().__init__(
            num_input_pipelines=int(context.num_input_pipelines),
            input_pipeline_id=int(context.input_pipeline_id),
            num_replicas_in_sync=int(context.num_replicas_in_sync),
        )
        self.requested: int | None = None

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        per_replica = int(super().get_per_replica_batch_size(global_batch_size))
        self.requested = int(global_batch_size)
        return per_replica


class ProbedFunction:
    """A source function whose first call, the builder's look at it, is kept for the pipeline.

    :meth:`call` returns the kept dataset (and the batch size it asked for) once, to the
    first call with the same input context; every other call runs the function.
    """

    def __init__(self, function: Callable[[Any], Any], context: Any) -> None:
        self.function = function
        self._key = _context_key(context)
        self.first: tuple[Any, int | None] = _call(function, context)
        self._kept: tuple[Any, int | None] | None = self.first

    def call(self, context: Any) -> tuple[Any, int | None]:
        """``(dataset, requested global batch size)`` for ``context``."""
        kept, self._kept = self._kept, None
        if kept is not None and _context_key(context) == self._key:
            return kept
        return _call(self.function, context)

    def __call__(self, context: Any) -> Any:
        return self.call(context)[0]


def _context_key(context: Any) -> tuple[int, int, int]:
    return (
        int(context.num_input_pipelines),
        int(context.input_pipeline_id),
        int(context.num_replicas_in_sync),
    )


def call_function(source: Callable[[Any], Any], context: Any) -> tuple[Any, int | None]:
    """``source(context)`` checked to be a dataset, and the global batch size it asked for."""
    if isinstance(source, ProbedFunction):
        return source.call(context)
    return _call(source, context)


def _call(source: Callable[[Any], Any], context: Any) -> tuple[Any, int | None]:
    recording = _RecordingContext(context)
    dataset = source(recording)
    if not is_dataset(dataset):
        raise TypeError(
            f"the source function returned {type(dataset).__name__}; expected a "
            "tf.data.Dataset for input pipeline "
            f"{context.input_pipeline_id} of {context.num_input_pipelines}."
        )
    return dataset, recording.requested


def classify_function(source: ProbedFunction, element: str) -> SourceElements:
    """What a ``fn(input_context)`` source returns, from its first call (this worker's context).

    The call builds the function's dataset (reading nothing) to look at its elements and at
    the batch size it asks ``input_context`` for.
    """
    dataset, requested = source.first
    what = "the dataset returned by the source function"
    elements = classify(dataset, element, what=what, source_kind="function")
    if requested is not None and elements.kind == "example" and element == "auto":
        raise ValueError(
            f"the source function called input_context.get_per_replica_batch_size({requested}) "
            f"but {what} does not end in a batch the builder can see "
            f"({elements.reason.split(':')[0]}). Say what its elements are: element='batch' if "
            "it returns per-replica batches, element='example' if each element is one example."
        )
    return dataclasses.replace(elements, requested_global_batch_size=requested)


def _elements_of(
    source: Any, element: str, *, kind: str, context: Any
) -> tuple[SourceElements, Any]:
    """What the elements of a source of ``kind`` are, and the source to build from.

    A function is called once with ``context`` (this worker's) to look at what it returns;
    the source to build from is then a :class:`ProbedFunction` that hands that dataset to the
    pipeline's first call, so the function still runs once per worker.

    Raises:
        ValueError: ``element='batch'`` on arrays or files, or what :func:`classify` raises.
    """
    if kind == "dataset":
        return classify(source, element, what="source", source_kind="dataset"), source
    if kind == "function":
        if element == "example":
            return SourceElements("example", "element='example' given"), source
        probed = ProbedFunction(source, context)
        return classify_function(probed, element), probed
    if element == "batch":
        raise ValueError(
            f"element='batch' applies to a tf.data.Dataset or a fn(input_context) source, but "
            f"the source is {'in-memory arrays' if kind == 'arrays' else 'files'}, whose "
            "elements are examples (arrays are cut along their first dimension). Pass "
            "element='auto' (or reshape the arrays so that their first dimension counts "
            "examples)."
        )
    return EXAMPLES, source
