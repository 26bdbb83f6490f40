"""What every CPU backend shares: numpy buffers in host memory, nothing outstanding to
synchronize, a barrier made of token send/recv, and the size of the pieces its
transfers are pipelined in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from reshard.cluster import pipeline_piece
from reshard.dtypes import is_torch, numpy_of_torch

CHAIN_PIECE = 1 << 18
"""Bytes per pipelined piece of a chain broadcast when the program names none. A relay
passes a piece on only once it has all of it, so a chain's fill costs one piece per
hop: 256 KiB pieces measured 1.15x the bound on the testbed's weight-sync slice (many
small boxes, 2-hop chains) where 1 MiB pieces measured 1.22x, with the paper cases
unchanged (1.05-1.19x)."""


def wire_piece(relay_piece: int, nbytes: int) -> int:
    """Bytes per piece of an operation on an ``nbytes`` buffer, for a program whose
    ``Cluster.relay_piece`` is ``relay_piece``: the cost model's
    (:func:`reshard.cluster.pipeline_piece`), rounded down to whole 64 bytes (any
    element divides them), at least 4 KiB; :data:`CHAIN_PIECE` without one. Every
    member of an operation computes the same: they run the same program on buffers of
    the same size."""
    if not relay_piece:
        return CHAIN_PIECE
    piece = pipeline_piece(relay_piece, nbytes)
    return piece if piece >= nbytes else max(4096, piece // 64 * 64)


class HostMemory:
    """Mixin for backends whose buffers are numpy arrays and whose operations are
    complete when they return. Needs ``send`` / ``recv`` for :meth:`barrier`."""

    @property
    def xp(self) -> Any:
        """numpy."""
        return np

    def empty(self, n: int, dtype: Any) -> np.ndarray:
        """A new 1-d buffer."""
        return np.empty(n, dtype=dtype)

    def asarray(self, array: Any) -> np.ndarray:
        """numpy array (no copy when already one, or a CPU torch tensor: its memory, in
        ml_dtypes' type for torch's bfloat16 and float8)."""
        if is_torch(array):
            return numpy_of_torch(array.detach().cpu())
        return np.asarray(array)

    def to_host(self, array: Any) -> np.ndarray:
        """Identity."""
        return np.asarray(array)

    def synchronize(self) -> None:
        """Nothing outstanding on CPU."""

    def activate(self) -> None:
        """Nothing to make current on CPU."""

    def barrier(self, group: Sequence[int]) -> None:
        """Everyone reports to the first member, which releases everyone."""
        token = np.zeros(1, dtype=np.uint8)
        lead = group[0]
        if self.device == lead:  # type: ignore[attr-defined]
            for d in group[1:]:
                self.recv(token, d)  # type: ignore[attr-defined]
            for d in group[1:]:
                self.send(token, d)  # type: ignore[attr-defined]
        else:
            self.send(token, lead)  # type: ignore[attr-defined]
            self.recv(token, lead)  # type: ignore[attr-defined]
