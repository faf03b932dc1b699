"""Which fits of a run resumed behind a step an earlier fit logged: the rule, as a table."""

from __future__ import annotations

import pytest

from tfdp_utils.throughput._restarts import FitSpan, StepsBack, steps_back

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    ("spans", "expected"),
    [
        ([(0, 910)], []),  # one fit
        ([(0, 910), (910, 1800)], []),  # fit again, or resumed where it stopped: goes on
        ([(0, 910), (900, 1800)], [StepsBack(2, 900, 910, 1)]),  # killed at 910, resumed at 900
        ([(0, 910), (0, 500)], [StepsBack(2, 0, 910, 1)]),  # trained again from scratch
        # The step reached is the largest of every earlier fit, not only the previous one's.
        (
            [(0, 910), (900, 905), (905, 2000)],
            [StepsBack(2, 900, 910, 1), StepsBack(3, 905, 910, 1)],
        ),
        ([(0, 400), (400, 910), (800, 2000)], [StepsBack(3, 800, 910, 2)]),
    ],
)
def test_a_fit_that_starts_behind_the_step_reached_is_named(
    spans: list[tuple[int, int]], expected: list[StepsBack]
) -> None:
    assert steps_back([FitSpan(*span) for span in spans]) == expected


def test_the_text_says_where_it_resumed_what_was_reached_and_what_ran_twice() -> None:
    (back,) = steps_back([FitSpan(10, 910), FitSpan(900, 1800)])
    assert back.describe() == (
        "fit 2 resumed at step 900, behind step 910 that fit 1 reached: steps 900-910 "
        "(10 steps) trained twice"
    )
    assert StepsBack(2, 909, 910, 1).describe().endswith("(1 step) trained twice")
