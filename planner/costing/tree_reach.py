"""When the last device of a shallow tree's edges is reached, a depth at a time
(issue 62, round ten).

A tree's route (:func:`~reshard.planner.costing.cost._edges_path`) reaches each device
by one edge ``a[i] -> b[i]``: the edge's time is its sender's (the time of the earlier
edge that reached the sender, else 0) plus its wait, plus a relay fill where its sender
was reached by an earlier edge. :func:`by_levels` finds every edge's depth first, as
integers (each edge's sender's edge by pointer doubling: a few array operations however
deep the tree), then sums the times a depth at a time over the edges sorted by depth:
each edge's time from its sender's, found at a smaller depth, by the same float
operations in the same order as edge by edge (``(sender + wait) + fill``), so the same
floats. Sorting by depth moves no sum: each edge's time is its own path's, computed once.
"""

from __future__ import annotations

import itertools

import numpy as np


def by_levels(a: np.ndarray, b: np.ndarray, wait: np.ndarray, fill: np.ndarray | None,
              size: int, deepest: int) -> float | None:
    """The latest time any edge ``a[i] -> b[i]`` (devices below ``size``) reaches its
    receiver: each edge's ``wait`` after its sender was reached by an earlier edge
    (else after 0, without a fill), plus its ``fill`` where it was (None: no fills),
    found a depth at a time (module docstring). None where a device is reached twice or
    an edge lies deeper than ``deepest`` (then edge by edge is cheaper)."""
    n = len(a)
    edge = np.arange(n)
    by = np.full(size, n, dtype=np.int64)  # the edge reaching each device
    by[b] = edge
    if not np.array_equal(by[b], edge):
        return None  # a device reached twice
    up = by[a]
    early = up < edge  # the sender was reached by an earlier edge
    up = np.where(early, up, 0)
    add = np.where(early, fill, 0.0) if fill is not None else np.zeros(n)
    depth = _depths(up, early, edge)
    most = int(depth.max(initial=0))
    if most > deepest:
        return None
    order = np.argsort(depth, kind="stable")  # by depth (an edge's sender's is less)
    place = np.empty(n, dtype=np.int64)
    place[order] = edge
    sender = place[up[order]]  # where each edge's sender's edge lies in that order
    w, extra = wait[order], add[order]
    bounds = np.cumsum(np.bincount(depth, minlength=most + 1)).tolist()
    at = np.empty(n)
    top = bounds[0]
    np.add(w[:top], extra[:top], out=at[:top])  # 0.0 + wait, then + 0.0: the same float
    for lo, hi in itertools.pairwise(bounds):
        got = at[sender[lo:hi]]
        got += w[lo:hi]
        np.add(got, extra[lo:hi], out=at[lo:hi])  # (sender's + wait) + fill
    return float(at.max())


def _depths(up: np.ndarray, early: np.ndarray, edge: np.ndarray) -> np.ndarray:
    """Each edge's depth: 0 where ``early`` is false, else one more than its sender's
    edge ``up``'s (an earlier edge: no cycle). Pointer doubling over integers: each
    edge's known ancestor and the steps to it, both doubled a round until every
    ancestor is a depth-0 edge."""
    anc = np.where(early, up, edge)  # a depth-0 edge is its own ancestor, 0 steps on
    steps = early.astype(np.int64)
    while True:
        nxt = anc[anc]
        if np.array_equal(nxt, anc):  # every ancestor at depth 0: steps are depths
            return steps
        steps = steps + steps[anc]
        anc = nxt


__all__ = ["by_levels"]
