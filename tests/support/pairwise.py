"""All-pairs (pairwise) rows over a table of factors: every pair of levels at least once.

Pure and deterministic (the same rows on every run and machine). The greedy construction of
AETG: each row starts from the first pair not yet covered, and every other factor takes the
level that covers the most new pairs with the factors already set (ties: the first level).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

Row = dict[str, Any]


def pairs_of(row: Mapping[str, Any], names: Sequence[str]) -> set[tuple[str, Any, str, Any]]:
    """The pairs ``(factor, level, factor, level)`` a row covers, in ``names`` order."""
    return {(a, row[a], b, row[b]) for a, b in itertools.combinations(names, 2)}


def all_pairs(factors: Mapping[str, Sequence[Any]]) -> list[Row]:
    """Rows covering every pair of levels of every two factors.

    Args:
        factors: factor name -> its levels (at least one each).
    """
    names = list(factors)
    if any(not factors[name] for name in names):
        raise ValueError("every factor needs at least one level")
    uncovered = {
        (a, x, b, y)
        for a, b in itertools.combinations(names, 2)
        for x in factors[a]
        for y in factors[b]
    }
    rows: list[Row] = []
    if len(names) == 1:
        return [{names[0]: level} for level in factors[names[0]]]
    while uncovered:
        first = min(uncovered, key=lambda p: (names.index(p[0]), names.index(p[2]), _key(p)))
        row: Row = {first[0]: first[1], first[2]: first[3]}
        for name in names:
            if name in row:
                continue
            row[name] = max(
                factors[name],
                key=lambda level, n=name: (
                    sum(_pair(n, level, other, row[other], names) in uncovered for other in row),
                    -list(factors[n]).index(level),
                ),
            )
        uncovered -= pairs_of(row, names)
        rows.append({name: row[name] for name in names})
    return rows


def _pair(a: str, x: Any, b: str, y: Any, names: Sequence[str]) -> tuple[str, Any, str, Any]:
    return (a, x, b, y) if names.index(a) < names.index(b) else (b, y, a, x)


def _key(pair: tuple[str, Any, str, Any]) -> str:
    return repr(pair)
