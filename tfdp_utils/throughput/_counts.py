"""Examples each replica trained over a range of optimizer steps. Pure Python, no TensorFlow.

The counts come from the dataset's :class:`~tfdp_utils._dataset_info.DatasetInfo` (exact,
partial last batch included) or, for other datasets, from a global batch size split evenly
over the replicas. :class:`ExampleCounter` keeps the cumulative counts of one ``fit`` and
advances them to a step; the ThroughputLogger reads the step, this module does the arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfdp_utils._dataset_info import DatasetInfo


def even_split(global_batch_size: int, replicas: int) -> tuple[int, ...]:
    """Examples per replica when ``global_batch_size`` is split over ``replicas``.

    tf.distribute splits a global batch as evenly as it can, the first replicas taking the
    remainder.

    Examples:
    >>> even_split(10, 4)
    (3, 3, 2, 2)
    """
    base, extra = divmod(global_batch_size, replicas)
    return tuple(base + (1 if i < extra else 0) for i in range(replicas))


class ExampleCounter:
    """Cumulative examples per replica over one ``fit``, advanced to an optimizer step.

    Steps are the optimizer's iteration count. ``fit`` starts at step ``origin``; each epoch
    starts where the previous one ended (:meth:`end_epoch`). A repeating builder dataset
    follows its own layout from the start of iteration; a non-repeating one restarts its
    layout at every epoch; without a :class:`DatasetInfo` every step counts
    ``global_batch_size`` examples, split evenly.

    Args:
        num_replicas: replicas in sync, over all workers.
        step: the step at which ``fit`` starts.
        carried: counts from earlier ``fit`` calls to continue from (ignored unless there is
            one per replica). Defaults to `()`.
        global_batch_size: examples per step, for datasets without a ``DatasetInfo``.
            Defaults to `None`.

    Attributes:
        counts: cumulative examples per replica, by global replica id.
        info: the dataset layout counted with, or None (then ``global_batch_size``).
        source: where the counts come from, in words (``""`` until known).

    Examples:
    >>> counter = ExampleCounter(num_replicas=2, step=0, global_batch_size=8)
    >>> counter.count_to(3)
    >>> counter.counts
    [12, 12]
    """

    def __init__(
        self,
        *,
        num_replicas: int,
        step: int,
        carried: Sequence[int] = (),
        global_batch_size: int | None = None,
    ) -> None:
        self.num_replicas = num_replicas
        self.global_batch_size = global_batch_size
        self.origin = step
        self.epoch_start = step
        self.counted_step = step
        self.counts = list(carried) if len(carried) == num_replicas else [0] * num_replicas
        self.info: DatasetInfo | None = None
        self.source = ""
        # Steps the job trained before its dataset's layout counts from (a rest of an epoch of
        # files laid out on a shape whose epochs have another number of steps): step s of the
        # job is step s - layout_offset of the repeating dataset's layout.
        self.layout_offset = 0

    def count_to(self, step: int) -> None:
        """Add the examples of the steps from the last counted one up to ``step``."""
        if step <= self.counted_step:
            return
        added = self._between(self.counted_step - self.origin, step - self.origin)
        for i, value in enumerate(added):
            self.counts[i] += value
        self.counted_step = step

    def continue_job(self) -> None:
        """Count a resumed job from its first step: positions in the layout of a repeating
        dataset from the optimizer's step 0, and the examples of every step before this
        ``fit`` (those of the runs before it) carried.

        For a ``PreemptionCheckpoint`` resume, whose dataset is a stream of whole epochs that
        starts at the step the optimizer's count is at.
        """
        info = self.info
        if info is None or not info.repeat:
            return
        self.origin = 0
        self.counts = list(info.examples_in_steps(0, self.counted_step - self.layout_offset))

    def end_epoch(self, step: int) -> None:
        """Count up to ``step``, where the epoch ended and the next one starts."""
        self.count_to(step)
        self.epoch_start = step

    def _between(self, first: int, last: int) -> tuple[int, ...]:
        info = self.info
        if info is not None and info.repeat:
            # A repeating dataset is iterated on across fit's epochs: its own layout, counted
            # from the start of iteration, decides.
            return info.examples_in_steps(first - self.layout_offset, last - self.layout_offset)
        if info is not None:
            # Epochs as fit ran them (not the dataset's steps_per_epoch): positions count
            # from the step at which this epoch began.
            start = self.epoch_start - self.origin
            return info.examples_in_epoch_range(first - start, last - start)
        if self.global_batch_size is None:
            raise ValueError("ExampleCounter needs a DatasetInfo or a global_batch_size to count.")
        per_step = even_split(self.global_batch_size, self.num_replicas)
        return tuple(n * (last - first) for n in per_step)
