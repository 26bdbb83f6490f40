"""A handle to a tensor distributed over a Runtime's workers."""

from __future__ import annotations

import math
from dataclasses import dataclass

from reshard.dtypes import itemsize
from reshard.layout import Layout


@dataclass(frozen=True)
class DArray:
    """A handle to a tensor distributed over workers.

    Attributes:
        key: the name its shards are stored under on every worker.
        shape: global shape.
        dtype: dtype name (:mod:`reshard.dtypes`).
        layout: how it is laid out.
        scales: the scales a scaled cast delivered with it (``x ~= values * scales``
            per block; see :mod:`reshard.dtypes`), or None.
    """

    key: str
    shape: tuple[int, ...]
    dtype: str
    layout: Layout
    scales: DArray | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the global tensor."""
        return math.prod(self.shape) * itemsize(self.dtype)


__all__ = ["DArray"]
