"""A handle to a tensor distributed over a Runtime's workers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from reshard.dtypes import itemsize, storage
from reshard.errors import ShapeError
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


def typed_shard(shard: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A worker's shard as ``dtype``: a backend without the type (cupy: bfloat16,
    float8) hands its bits back as unsigned integers of the same width."""
    if shard.dtype != dtype and shard.dtype.name == storage(dtype.name):
        return shard.view(dtype)
    return shard


def as_array(value: Any) -> np.ndarray:
    """``np.asarray(value)``; a ragged nesting is a ShapeError."""
    try:
        return np.asarray(value)
    except ValueError as e:
        raise ShapeError(
            f"cannot make an array of {type(value).__name__}: {e}; pass a numpy array or a "
            f"nesting of equal-length sequences") from None


__all__ = ["DArray", "as_array", "typed_shard"]
