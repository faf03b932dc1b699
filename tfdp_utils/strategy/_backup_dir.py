"""One backup folder per worker for ``keras.callbacks.BackupAndRestore`` in a multi-worker job."""

from __future__ import annotations

import os
from typing import Any

from tfdp_utils._public import public


@public("tfdp_utils")
def worker_backup_dir(backup_dir: str | os.PathLike[str], strategy: Any = None) -> str:
    """The directory to hand ``keras.callbacks.BackupAndRestore`` on this worker.

    tf_keras's BackupAndRestore coordinates the workers of a MultiWorkerMirroredStrategy
    itself (the chief writes ``backup_dir``, the others scratch copies), so it gets
    ``backup_dir`` unchanged. Keras 3's has no multi-worker support: every worker writes the
    same files (measured here: ``FileExistsError`` from the racing ``makedirs``, and a file
    half-written by two processes), so under Keras 3 each worker of a multi-worker job gets
    ``backup_dir/worker_<rank>``. Workers keep their rank across a restart (TF_CONFIG index,
    SLURM_PROCID), so each restores its own copy; the copies are equal, as synchronous
    training keeps every worker's weights equal.

    Args:
        backup_dir: the job's backup directory (local path or ``tf.io.gfile`` URL).
        strategy: the training strategy. Defaults to `None` (the strategy in scope).

    Returns:
        The directory for this worker.

    Raises:
        TypeError: ``backup_dir`` is not a path, or ``strategy`` is not a
            ``tf.distribute.Strategy`` (a name such as ``"mirrored"`` is not one).
        ValueError: ``backup_dir`` is empty.

    Examples:
        >>> backup = tdu.worker_backup_dir("gs://bucket/job1/backup", strategy)  # doctest: +SKIP
        >>> model.fit(dist, callbacks=[keras.callbacks.BackupAndRestore(backup)])  # doctest: +SKIP
    """
    from tfdp_utils._tf import IS_KERAS3, tf
    from tfdp_utils._validate import strategy as check_strategy
    from tfdp_utils.cluster._topology import position_of

    if not isinstance(backup_dir, (str, os.PathLike)):
        raise TypeError(
            f"backup_dir must be a directory path (str or os.PathLike), but received "
            f"{backup_dir!r} of type {type(backup_dir).__name__}; pass e.g. '/tmp/backup'."
        )
    if strategy is not None:
        check_strategy(strategy)
    base = os.fspath(backup_dir)
    if not base.strip():
        raise ValueError(
            f"backup_dir={base!r} is empty; expected the job's backup directory. Pass e.g. "
            "'/tmp/backup' or 'gs://bucket/job1/backup'."
        )
    position = position_of(strategy if strategy is not None else tf.distribute.get_strategy())
    if not IS_KERAS3 or not position.is_multi_worker:
        return base
    return base.rstrip("/") + f"/worker_{position.index}"
