"""The rest of an interrupted epoch of files, laid out on another shape. Pure.

Under FILE sharding each worker reads its own files, so the examples of a global step depend
on the number of workers, and a position "step k of epoch e" names other examples on another
shape. When such a job resumes mid-epoch on another number of workers, the rest of epoch e is
laid out from the facts of the shape the epoch began on (all in the checkpoint):

* stream ``w``: the examples worker ``w`` of that shape trains in epoch ``e``, ``kept[w]`` of
  them (its files, in the order its seed gives them; the builder rebuilds it on any worker);
* step ``s`` of that shape trains examples ``[s * S, (s + 1) * S)`` of every stream (``S``
  examples per worker per step), clipped to the stream's length;
* the rest is steps ``from_step ..`` of that shape, in order, each step's examples stream by
  stream, as one sequence;
* the sequence is cut into global batches of ``B`` examples (the very global batches of the
  first shape wherever its steps were full), and each global batch into one contiguous part
  per new worker (``B / W'`` each; a partial last batch as evenly as possible).

Every example of the rest is then trained once, every new worker runs the same number of
steps (a worker with an empty part gets an empty batch), and the global batches are those
of an uninterrupted run up to its partial steps. ``trained`` examples of the sequence were
trained already (a run stopped again during the rest: whole global batches).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

Run = tuple[int, int, int]
"""``(stream, start, end)``: examples ``start .. end - 1`` of one stream, in order."""


def _split_evenly(examples: int, parts: int) -> tuple[int, ...]:
    return tuple(examples // parts + (1 if i < examples % parts else 0) for i in range(parts))


@dataclasses.dataclass(frozen=True)
class EpochRest:
    """The rest of epoch ``epoch``, as laid out from the shape it began on (see the module).

    Attributes:
        epoch: the interrupted epoch (0-based).
        num_workers: workers of the shape the epoch began on.
        policy: that shape's sharding policy (``"file"``, ``"data"`` or ``"off"``).
        files: that shape's files of each worker.
        kept: the examples each of its workers trains per epoch.
        step_examples: examples each of its workers trains per step (``S``).
        from_step: its steps done when it stopped: the rest starts there.
        global_batch_size: examples per global step (``B``), the same on every shape.
        trained: examples of the rest trained since (by runs on other shapes).
    """

    epoch: int
    num_workers: int
    policy: str
    files: tuple[tuple[str, ...], ...]
    kept: tuple[int, ...]
    step_examples: int
    from_step: int
    global_batch_size: int
    trained: int = 0

    @classmethod
    def interrupted(cls, facts: Mapping[str, Any], epoch: int, step: int) -> EpochRest:
        """The rest of ``epoch`` after ``step`` steps of a run whose dataset had ``facts``
        (a checkpoint's; they must hold ``examples_per_worker``)."""
        workers = int(facts.get("num_workers") or 1)
        batch = int(facts["global_batch_size"])
        per_worker = batch // workers
        held = [int(n) for n in facts["examples_per_worker"]]
        if facts.get("drop_remainder"):
            held = [int(facts["steps_per_epoch"]) * per_worker] * workers
        return cls(
            epoch=epoch,
            num_workers=workers,
            policy=str(facts.get("policy")),
            files=tuple(tuple(files) for files in facts.get("files") or ()),
            kept=tuple(held),
            step_examples=per_worker,
            from_step=step,
            global_batch_size=batch,
        )

    @classmethod
    def from_json(cls, saved: Mapping[str, Any]) -> EpochRest:
        """The rest a checkpoint's ``state.json`` records (:meth:`to_json`)."""
        return cls(
            epoch=int(saved["epoch"]),
            num_workers=int(saved["num_workers"]),
            policy=str(saved["policy"]),
            files=tuple(tuple(files) for files in saved["files"]),
            kept=tuple(int(n) for n in saved["kept"]),
            step_examples=int(saved["step_examples"]),
            from_step=int(saved["from_step"]),
            global_batch_size=int(saved["global_batch_size"]),
            trained=int(saved["trained"]),
        )

    def to_json(self) -> dict[str, Any]:
        """The rest as a checkpoint records it."""
        saved = dataclasses.asdict(self)
        saved["files"] = [list(files) for files in self.files]
        saved["kept"] = list(self.kept)
        return saved

    def sequence(self) -> list[Run]:
        """The whole rest (before ``trained``), one run per step and stream, in order."""
        size = self.step_examples
        steps = max((math.ceil(n / size) for n in self.kept), default=0)
        runs = []
        for step in range(self.from_step, steps):
            for stream, held in enumerate(self.kept):
                start, end = step * size, min((step + 1) * size, held)
                if start < end:
                    runs.append((stream, start, end))
        return runs

    @property
    def size(self) -> int:
        """Examples of the whole rest (before ``trained``)."""
        done = self.from_step * self.step_examples
        return sum(max(0, held - done) for held in self.kept)

    @property
    def remaining(self) -> int:
        """Examples of the rest not trained yet."""
        return max(0, self.size - self.trained)

    @property
    def steps(self) -> int:
        """Global steps that train the remaining examples."""
        return math.ceil(self.remaining / self.global_batch_size)

    def after(self, steps: int) -> EpochRest:
        """The rest once ``steps`` more global steps of it are trained."""
        trained = min(self.size, self.trained + steps * self.global_batch_size)
        return dataclasses.replace(self, trained=trained)

    def part_sizes(self, worker: int, workers: int) -> list[int]:
        """The examples worker ``worker`` of ``workers`` trains in each remaining step."""
        batch, left = self.global_batch_size, self.remaining
        sizes = []
        for _ in range(self.steps):
            n = min(batch, left)
            parts = (batch // workers,) * workers if n == batch else _split_evenly(n, workers)
            sizes.append(parts[worker])
            left -= n
        return sizes

    def runs_for(self, worker: int, workers: int) -> list[Run]:
        """The examples worker ``worker`` of ``workers`` trains, in order, as runs."""
        runs = self.sequence()
        starts = list(_offsets(runs))
        batch, begin, left = self.global_batch_size, self.trained, self.remaining
        mine: list[Run] = []
        for _ in range(self.steps):
            n = min(batch, left)
            parts = (batch // workers,) * workers if n == batch else _split_evenly(n, workers)
            first = begin + sum(parts[:worker])
            mine.extend(_slice(runs, starts, first, first + parts[worker]))
            begin, left = begin + n, left - n
        return _merged(mine)


def _offsets(runs: list[Run]) -> list[int]:
    # Where each run starts in the sequence.
    offsets, at = [], 0
    for _, start, end in runs:
        offsets.append(at)
        at += end - start
    return offsets


def _slice(runs: list[Run], starts: list[int], first: int, end: int) -> list[Run]:
    """Examples ``first .. end - 1`` of the sequence ``runs`` (whose offsets are ``starts``)."""
    found: list[Run] = []
    index = bisect.bisect_right(starts, first) - 1
    while first < end and 0 <= index < len(runs):
        stream, start, stop = runs[index]
        begin = start + first - starts[index]
        take = min(stop, begin + end - first)
        if begin < take:
            found.append((stream, begin, take))
            first += take - begin
        index += 1
    return found


def _merged(runs: list[Run]) -> list[Run]:
    # Adjacent runs of one stream become one (the steps of one old worker, back to back).
    merged: list[Run] = []
    for stream, start, end in runs:
        if merged and merged[-1][0] == stream and merged[-1][2] == start:
            merged[-1] = (stream, merged[-1][1], end)
        else:
            merged.append((stream, start, end))
    return merged
