"""What a source is: its kind, its files, its size, whether it reads files or is batched.

TensorFlow glue for the planner: :func:`gather_facts` turns whatever the user passed
(a ``tf.data.Dataset``, arrays, paths or a glob, a ``fn(input_context)``) into the pure
:class:`~tfdp_utils.data._sharding.SourceFacts`. Private tf.data classes and graph ops are
read only through :mod:`tfdp_utils._tf`'s named helpers.
"""

from __future__ import annotations

import glob
import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

from tfdp_utils import _tf
from tfdp_utils._tf import tf
from tfdp_utils.data._sharding import SourceFacts, SourceKind, check_policy

# Dataset ops that read files; tf.data's FILE autoshard rewrite looks for the same ones.
READER_OPS = frozenset(
    {
        "TFRecordDataset",
        "TFRecordDatasetV2",
        "TextLineDataset",
        "FixedLengthRecordDataset",
        "FixedLengthRecordDatasetV2",
        "ArrayRecordDataset",
        "RecordIODataset",
        "SSTableDataset",
    }
)


def is_dataset(source: Any) -> bool:
    """Whether ``source`` is a ``tf.data.Dataset``."""
    return isinstance(source, tf.data.Dataset)


def _is_path_like(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike))


def _looks_like_arrays(source: Any) -> bool:
    leaves = tf.nest.flatten(source)
    return bool(leaves) and all(
        hasattr(leaf, "shape") and hasattr(leaf, "dtype") for leaf in leaves
    )


def source_kind(source: Any) -> SourceKind:
    """``"dataset"``, ``"files"``, ``"function"`` or ``"arrays"``, else a clear error.

    Raises:
        ValueError: an empty list.
        TypeError: anything else the builder does not take.
    """
    if is_dataset(source):
        return "dataset"
    if _is_path_like(source):
        return "files"
    if isinstance(source, (list, tuple)) and source and all(_is_path_like(s) for s in source):
        return "files"
    if isinstance(source, (list, tuple)) and not source:
        raise ValueError(
            "source=[] is an empty list: expected file paths, a glob, arrays or a "
            "tf.data.Dataset. Check the list you built (e.g. a glob that matched nothing)."
        )
    if callable(source):
        _check_takes_context(source)
        return "function"
    if _looks_like_arrays(source):
        return "arrays"
    raise TypeError(
        f"source of type {type(source).__name__} is not supported; expected an unbatched "
        "tf.data.Dataset, numpy arrays (or a tuple/dict of them), a file path, a list of paths "
        "or a glob, or a function fn(input_context) -> tf.data.Dataset."
    )


def _check_takes_context(function: Callable[..., Any]) -> None:
    """A source function must take one argument, the ``tf.distribute.InputContext``."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # builtins and some C callables have none
        return
    try:
        signature.bind(None)
    except TypeError:
        raise TypeError(
            f"the source function {getattr(function, '__name__', function)}{signature} cannot "
            "take an input context: a function source is called as fn(input_context) on every "
            "worker. Give it one argument (def dataset_fn(input_context): ...), or pass the "
            "dataset itself instead of a function that makes it."
        ) from None


def array_length(source: Any) -> int:
    """Examples in an arrays source (the common leading dimension), else a clear error."""
    lengths = {int(leaf.shape[0]) if len(leaf.shape) else -1 for leaf in tf.nest.flatten(source)}
    if -1 in lengths:
        raise ValueError(
            "source holds a scalar array; every array needs a leading example dimension."
        )
    if len(lengths) != 1:
        raise ValueError(
            f"source arrays have different lengths {sorted(lengths)}; every array needs the "
            "same number of examples along its first dimension."
        )
    return lengths.pop()


def _expand_glob(path: str) -> list[str]:
    matched = sorted(tf.io.gfile.glob(path)) if "://" in path else sorted(glob.glob(path))
    if not matched:
        raise ValueError(
            f"the glob {path!r} matches no file. Check the pattern and the working "
            f"directory ({os.getcwd()})."
        )
    return matched


def _check_file(path: str) -> str:
    if not tf.io.gfile.exists(path):
        raise ValueError(
            f"file {path!r} does not exist. Pass existing paths or a glob such as "
            f"'{os.path.join(os.path.dirname(path) or '.', '*.tfrecord')}'."
        )
    if tf.io.gfile.isdir(path):
        raise ValueError(
            f"{path!r} is a directory, not a file. Pass a glob such as '{os.path.join(path, '*')}'."
        )
    return path


def resolve_files(source: Any) -> tuple[str, ...]:
    """Expand a path, list of paths or glob to a sorted tuple of existing files.

    Raises:
        ValueError: a glob matches nothing, a list is empty, or a file does not exist.
    """
    paths = [source] if _is_path_like(source) else list(source)
    files: list[str] = []
    for raw in paths:
        path = os.fspath(raw)
        if any(ch in path for ch in "*?["):
            files.extend(_expand_glob(path))
        else:
            files.append(_check_file(path))
    if len(set(files)) != len(files):
        seen: set[str] = set()
        dupes = sorted({f for f in files if f in seen or seen.add(f)})  # type: ignore[func-returns-value]
        raise ValueError(
            f"files {dupes} are listed more than once; each would be read twice per epoch. "
            "Remove the duplicates."
        )
    return tuple(sorted(files))


def file_sizes(files: Sequence[str]) -> tuple[int, ...]:
    """Byte size of each file."""
    return tuple(int(tf.io.gfile.stat(f).length) for f in files)


def cardinality(dataset: Any) -> int | None:
    """Known finite cardinality, -1 for infinite, None for unknown."""
    value = int(dataset.cardinality())
    if value == int(tf.data.INFINITE_CARDINALITY):
        return -1
    if value < 0:
        return None
    return value


def reads_files(dataset: Any) -> bool:
    """Whether ``dataset``'s graph holds an op that reads files (what FILE autoshard needs)."""
    try:
        return bool(_tf.dataset_graph_ops(dataset) & READER_OPS)
    except Exception:  # a dataset that cannot be serialised: treat as not readable
        return False


def reader_dataset(reader: Callable[[Any], Any], path: str) -> Any:
    """``reader(path)``, checked to be a ``tf.data.Dataset``."""
    dataset = reader(path)
    if not is_dataset(dataset):
        raise TypeError(
            f"reader({path!r}) returned {type(dataset).__name__}; expected a tf.data.Dataset "
            "such as tf.data.TFRecordDataset(path) or tf.data.TextLineDataset(path)."
        )
    return dataset


def dense_only(element_spec: Any) -> bool:
    """Whether every component of ``element_spec`` is a dense ``tf.TensorSpec``."""
    return all(type(spec) is tf.TensorSpec for spec in tf.nest.flatten(element_spec))


def count_records(
    files: Sequence[str], reader: Callable[[Any], Any] | None = None
) -> tuple[int, ...]:
    """Examples in each file as ``reader`` reads it (reads every file once, in parallel).

    Args:
        files: file paths.
        reader: ``path -> tf.data.Dataset``. Defaults to `None` (``tf.data.TFRecordDataset``).

    Returns:
        The number of elements in each file, in the order of ``files``.
    """
    read = reader or tf.data.TFRecordDataset
    if not files:
        return ()

    def count(path: Any) -> Any:
        return read(path).reduce(tf.constant(0, tf.int64), lambda total, _: total + 1)

    names = tf.data.Dataset.from_tensor_slices(list(files))
    counts = names.map(count, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return tuple(int(n) for n in counts.as_numpy_iterator())


def gather_facts(
    source: Any,
    *,
    shard_policy: str,
    reader: Callable[[Any], Any] | None = None,
    count_examples: bool = False,
    kind: SourceKind | None = None,
) -> SourceFacts:
    """What the planner needs to know about ``source`` (files, sizes, examples, readers).

    Args:
        source: what :func:`~tfdp_utils.build_distributed_dataset` accepts.
        shard_policy: the requested policy (a dataset's graph is only searched for file
            readers under ``"file"``).
        reader: ``path -> tf.data.Dataset`` for counting. Defaults to `None`
            (``tf.data.TFRecordDataset``).
        count_examples: count the examples of file sources. Defaults to `False`.
        kind: the source's kind when it is known already (:func:`source_kind`). Defaults to
            `None` (looked at here).

    Returns:
        A :class:`~tfdp_utils.data._sharding.SourceFacts`.
    """
    kind = source_kind(source) if kind is None else kind
    if kind == "files":
        files = resolve_files(source)
        counts = count_records(files, reader) if count_examples else None
        return SourceFacts(
            kind,
            files=files,
            sizes=file_sizes(files),
            num_examples=None if counts is None else sum(counts),
            file_counts=counts,
        )
    if kind == "dataset":
        return SourceFacts(
            kind,
            num_examples=cardinality(source),
            # Serialising the graph copies any constants in it, so only look when it matters.
            has_reader=check_policy(shard_policy) == "file" and reads_files(source),
        )
    if kind == "arrays":
        return SourceFacts(kind, num_examples=array_length(source))
    return SourceFacts(kind)
