"""Whether a bulk addition to loads is exact: whole numbers below 2**53 add exactly in
float64, in any order, so a run's loads may be charged by one sum per key instead of
cell by cell, with the same floats (issue 62). Each bulk path asks :func:`stays_whole`
before it writes, and falls back to the one-by-one additions where it says no."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

EXACT = 2 ** 53
"""Whole numbers below this add exactly in float64 (in any order)."""


def stays_whole(table: Mapping[Any, float], keys: Iterable[Any],
                adds: Iterable[float]) -> bool:
    """Whether adding each of ``adds`` to ``table[keys[i]]`` (0.0 where absent) adds a
    whole number to a whole, non-negative number, every result below :data:`EXACT`."""
    for key, add in zip(keys, adds):
        start, add = table.get(key, 0.0), float(add)
        if not (start >= 0 and float(start).is_integer() and add.is_integer() and
                start + add < EXACT):
            return False
    return True


__all__ = ["EXACT", "stays_whole"]
