"""What every CPU backend shares: numpy buffers in host memory, nothing outstanding to
synchronize, and a barrier made of token send/recv."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from reshard.dtypes import is_torch, numpy_of_torch


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
