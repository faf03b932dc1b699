"""Steps that go back between the fits logged into one TensorBoard run. Pure.

A ThroughputLogger opens a new event file per run folder at every ``fit``, and its first point
is the count at the step the fit starts from. A job killed without notice (SIGKILL) and
resumed from an older periodic checkpoint starts behind the step the killed fit had logged:
its points from there on overlap the killed fit's (e.g. steps 810, 910, then the resumed fit
writes 900), and TensorBoard shows both, the line going back. :func:`steps_back` finds each
such restart from the fits' step spans, so that ``tfdp-utils report`` can say it.

Example:
>>> [s.describe() for s in steps_back([FitSpan(0, 910), FitSpan(900, 1800)])]
['fit 2 resumed at step 900, behind step 910 that fit 1 reached: steps 900-910 (10 steps) \
trained twice']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class FitSpan:
    """The steps one fit logged into a run (one event file), in the order fits started.

    Attributes:
        first_step: the step of its first point (the step the fit started from).
        last_step: the largest step it logged.
    """

    first_step: int
    last_step: int


@dataclasses.dataclass(frozen=True)
class StepsBack:
    """A fit that started behind a step an earlier fit of the same run had logged.

    Attributes:
        fit: the fit that went back, numbered from 1 in the order the fits started.
        resumed_at: the step it started from.
        reached: the largest step the earlier fits had logged.
        reached_by: the fit that logged ``reached``.
    """

    fit: int
    resumed_at: int
    reached: int
    reached_by: int

    @property
    def repeated_steps(self) -> int:
        """How many steps were trained twice (by the earlier fit, then again by this one)."""
        return self.reached - self.resumed_at

    def describe(self) -> str:
        """``fit 2 resumed at step 900, behind step 910 that fit 1 reached: ...``."""
        count = self.repeated_steps
        return (
            f"fit {self.fit} resumed at step {self.resumed_at}, behind step {self.reached} that "
            f"fit {self.reached_by} reached: steps {self.resumed_at}-{self.reached} "
            f"({count} step{'s' if count != 1 else ''}) trained twice"
        )


def steps_back(fits: Sequence[FitSpan]) -> list[StepsBack]:
    """Every fit that started behind the largest step logged before it.

    A fit that starts where the previous one ended (``fit`` called again, or a job resumed
    from the step it stopped at) goes on and is not listed.

    Args:
        fits: each fit's span, in the order the fits started.

    Returns:
        One :class:`StepsBack` per fit that went back, in fit order.
    """
    found = []
    reached, reached_by = None, 0
    for number, fit in enumerate(fits, start=1):
        if reached is not None and fit.first_step < reached:
            found.append(StepsBack(number, fit.first_step, reached, reached_by))
        if reached is None or fit.last_step > reached:
            reached, reached_by = fit.last_step, number
    return found
