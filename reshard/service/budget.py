"""Sizing a request before any work: how many cells (about as many tasks) its plan
implies, from its layouts alone.

A tensor's source and destination boxes cut each dim at most at the chunk edges of
both layouts, so the cells of its decomposition number at most the product, over its
dims, of those cuts (and of its size plus one); the planner makes about one task per
cell and receiver group. The server refuses a request over its budget
(``--max-plan-cells``) before planning, runs a small one inline and a larger one in a
worker process (:mod:`reshard.service.workpool`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from reshard.layout import Layout

INLINE_CELLS = 4096
"""Requests of at most this many cells are planned on the serving thread (a few ms);
larger ones in a worker process, where a deadline can stop them."""

INLINE_TASKS = 4096
"""Plans of at most this many tasks are verified on the serving thread."""


def _cuts(layout: Layout, dim: int, size: int) -> int:
    return min(size, layout.num_chunks(dim))


def tensor_cells(shape: Sequence[int], src: Layout, dst: Layout) -> int:
    """At most how many cells one tensor's decomposition has (at least 1)."""
    cells = 1
    for d, n in enumerate(shape):
        cells *= max(1, min(n, _cuts(src, d, n) + _cuts(dst, d, n)))
    groups = math.prod(src.mesh.shape[a] for a in src.spec.partial)
    return cells * max(1, groups)


def request_cells(requests: Sequence[tuple[Any, ...]]) -> int:
    """At most how many cells the plan of ``requests`` (``(shape, dtype, src, dst,
    ...)`` each, already checked) has, summed over its tensors."""
    return sum(tensor_cells(r[0], r[2], r[3]) for r in requests)


__all__ = ["INLINE_CELLS", "INLINE_TASKS", "request_cells", "tensor_cells"]
