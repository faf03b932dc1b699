"""The pairwise rows the interaction matrix runs: every pair of levels covered, the same rows
on every run. Pure."""

from __future__ import annotations

import itertools

import pytest
from support.matrix import FACTORS
from support.pairwise import all_pairs

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    "factors",
    [
        FACTORS,
        {"a": (1, 2, 3), "b": (True, False), "c": ("x", "y", "z", "w")},
        {"only": (1, 2)},
        {"a": (1,), "b": (1, 2)},
    ],
    ids=["matrix", "mixed", "one-factor", "one-level"],
)
def test_every_pair_of_levels_is_in_some_row(factors: dict[str, tuple[object, ...]]) -> None:
    rows = all_pairs(factors)
    for a, b in itertools.combinations(factors, 2):
        for x, y in itertools.product(factors[a], factors[b]):
            assert any(row[a] == x and row[b] == y for row in rows), (a, x, b, y)
    for row in rows:
        assert set(row) == set(factors)
        assert all(row[name] in factors[name] for name in factors)
    if len(factors) == 1:
        assert len(rows) == len(next(iter(factors.values())))


def test_rows_are_few_and_always_the_same() -> None:
    rows = all_pairs(FACTORS)
    exhaustive = 1
    for levels in FACTORS.values():
        exhaustive *= len(levels)
    assert len(rows) <= 14 < exhaustive  # 2 x 3 levels at least; far below 768 combinations
    assert rows == all_pairs(dict(FACTORS))


def test_a_factor_without_levels_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one level"):
        all_pairs({"a": (1, 2), "b": ()})
