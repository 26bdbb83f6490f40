"""An integer array as part of a comparable key, compared only when asked.

A work list's signature (:meth:`reshard.planner.schedule.work.WorkList.signature`)
names its slices by their arrays; most signatures are never compared, and a large
plan's arrays hold a million rows. :class:`ArrayKey` holds the array itself and
compares as its bytes (:meth:`numpy.ndarray.tobytes`) would: two one-dimensional
integer arrays of one dtype by their lengths and elements (bitwise the same test,
without the copy), any others by their bytes. The arrays are never written after
they are keyed (a work list's columns, read only).
"""

from __future__ import annotations

import numpy as np


class ArrayKey:
    """``array`` as a key: equal to another :class:`ArrayKey` of an equal array."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ArrayKey):
            return NotImplemented
        a, b = self.array, other.array
        if a is b:
            return True
        if a.dtype != b.dtype or a.ndim != 1 or b.ndim != 1 or a.dtype.kind not in "iub":
            return a.tobytes() == b.tobytes()
        return bool(np.array_equal(a, b))  # unequal lengths: unequal

    def __hash__(self) -> int:
        return hash(self.array.tobytes())
