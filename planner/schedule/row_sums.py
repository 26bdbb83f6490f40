"""A floor's merged kind that holds rows alone, summed straight from its rows.

A floor (:mod:`reshard.planner.schedule.floors`) counts a partial source's cells of a
few receivers one row at a time: its merged kinds
(:class:`~reshard.planner.schedule.merged_sums.MergedKind`) then hold rows and no
arrays. Summing them the merged way turns the rows into arrays (to check that every
value is a whole number and that the kind's bytes stay below 2**53), then back into
rows to sum them in a dict: on a 4x8 partial source's ``send_recv`` floor, 4,096 rows a
kind, half the floor's time. :func:`row_items` makes the same checks on the rows
themselves and sums them in the same dict, in the same order:

* a value is whole and finite exactly where ``float(value).is_integer()`` (asked once
  per distinct value);
* the kind's magnitudes are summed by ``math.fsum`` (the exact sum, rounded once): it
  is below 2**53 exactly where the exact sum is (2**53 is a float, rounding is
  monotone). So is the arrays' sum: while its partial sums of whole numbers stay
  below 2**53 each addition is exact, and once one reaches 2**53 rounding keeps every
  later one at 2**53 or more: the same answer either way;
* each key's bytes are summed from 0.0 in the order added, keys in the order first
  added: the sums the arrays' path gives (it sums the same rows in a dict, or, where
  they are many, as ``np.add.at`` would: the same additions in the same order; a
  whole number below 2**53 added to 0.0 is the float it converts to).

Rows repeat: a partial source's floor adds each (device or NIC, step, bytes) once per
cell that sends it (140,288 rows, 6,400 keys over every third partial 4x8 request).
Once the checks pass, every partial sum of the kind's values in any order is a whole
number below 2**53, exact in a float, so :func:`row_items` counts each distinct row
once (``collections.Counter``, in C) and adds ``count * bytes`` (exact: below 2**53)
per distinct row: the exact sums, as the rows one by one give them. Each key comes
first in the same place: a key's first row is the first of its distinct rows, and
distinct rows keep the order first seen. The checks read the distinct rows: a value
and its count times its magnitude (``fsum`` of those is below 2**53 exactly where the
rows' is: equal where every product is below 2**53, a product of 2**53 or more
rounding to one of 2**53 or more).
"""

from __future__ import annotations

from collections import Counter
from math import fsum

from reshard.planner.cells.whole_sums import EXACT
from reshard.planner.schedule.merged_sums import Inexact, MergedKind

_PLAIN = frozenset((int, float))
"""The types of value :func:`row_items` sums (the floors' rows are Python numbers)."""

Items = list[tuple[tuple[int, int], float]]
"""Every ((index, step), bytes) of a kind, in the order each key was first added."""


def row_items(kind: MergedKind, up_to: int) -> Items | None:
    """``kind``'s items summed from its rows (module docstring) where it holds rows
    alone (and empty arrays), at most ``up_to`` of them, each value a Python number;
    None otherwise (the caller sums it the merged way). Raises
    :class:`~reshard.planner.schedule.merged_sums.Inexact` where the merged way would:
    some value not a whole number, or the kind's bytes too many."""
    rows = kind.rows
    if len(rows) > up_to or any(len(index) for index, _, _ in kind.chunks):
        return None  # arrays added (an empty one adds nothing)
    counts = Counter(rows)  # each distinct row, how many times, in the order first seen
    distinct = {v for _, _, v in counts}
    if not all(type(v) in _PLAIN for v in distinct):
        return None  # a numpy number: summed the merged way, as floats
    if not all(float(v).is_integer() for v in distinct) or \
            not fsum(float(abs(v)) * n for (_, _, v), n in counts.items()) < EXACT:
        raise Inexact
    return _counted_sums(counts)


def _counted_sums(counts: Counter[tuple[int, int, float]]) -> Items:
    """:func:`summed` of rows whose partial sums are exact in any order (module
    docstring): per distinct row, its bytes times its count added to its key."""
    total: dict[tuple[int, int], float] = {}
    get = total.get
    for (index, step, nbytes), n in counts.items():
        key = (index, step)
        total[key] = get(key, 0.0) + nbytes * n
    return list(total.items())

def summed(rows: list[tuple[int, int, float]]) -> Items:
    """Rows added one by one: each key's bytes summed from 0.0 in the order added (as
    ``np.add.at`` sums them), keys in the order first added."""
    total: dict[tuple[int, int], float] = {}
    get = total.get
    for index, step, nbytes in rows:
        key = (index, step)
        total[key] = get(key, 0.0) + nbytes
    return list(total.items())


__all__ = ["Items", "row_items", "summed"]
