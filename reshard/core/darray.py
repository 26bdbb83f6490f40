"""A handle to a tensor distributed over a Runtime's workers."""

from __future__ import annotations

import itertools
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reshard.core.dtypes import itemsize, storage
from reshard.core.errors import ReshardError, ShapeError
from reshard.core.layout import Layout


@dataclass(frozen=True)
class DArray:
    """A handle to a tensor distributed over workers.

    Attributes:
        key: the name its shards are stored under on every worker.
        shape: global shape.
        dtype: dtype name (:mod:`reshard.core.dtypes`).
        layout: how it is laid out.
        scales: the scales a scaled cast delivered with it (``x ~= values * scales``
            per block; see :mod:`reshard.core.dtypes`), or None.
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


class LiveArrays:
    """The arrays alive on one Runtime's workers, by key: keys start with a tag of the
    Runtime's own, so a handle of another (or a freed one) is told apart and named."""

    def __init__(self) -> None:
        self._tag = secrets.token_hex(3)
        self._ids = itertools.count()
        self._live: dict[str, DArray] = {}

    def new_key(self) -> str:
        """A key no array of this Runtime had."""
        return f"{self._tag}:{next(self._ids)}"

    def add(self, x: DArray) -> None:
        self._live[x.key] = x

    def remove(self, x: DArray) -> None:
        del self._live[x.key]

    def check(self, xs: Sequence[Any]) -> None:
        """Raise unless every handle is a live array of this Runtime."""
        for x in xs:
            if not isinstance(x, DArray):
                raise ReshardError(
                    f"expected a DArray returned by this Runtime's put/reshard, got "
                    f"{type(x).__name__}")
            have = self._live.get(x.key)
            if have is None:
                if x.key.startswith(self._tag + ":"):
                    raise ReshardError(
                        f"array {x.key} ({x.shape} {x.dtype} on {x.layout}) was freed "
                        f"(Runtime.free); use an array that is still alive")
                raise ReshardError(
                    f"array {x.key} ({x.shape} {x.dtype}) does not belong to this Runtime "
                    f"(made by another or a closed one); put it on this Runtime first")
            if have != x:
                raise ReshardError(
                    f"handle {x} does not match the array stored under {x.key!r} ({have}); "
                    f"use the DArray the Runtime returned")


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


__all__ = ["DArray", "LiveArrays", "as_array", "typed_shard"]
