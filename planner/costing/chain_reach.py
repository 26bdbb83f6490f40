"""Long chains' latencies as arrays (issue 62, round twelve).

A chain of :data:`~reshard.planner.costing.cost.ARRAY_EDGES` edges or more (a
broadcast's ``root -> receivers[0] -> ...``, or a reduction's ``receivers[0] -> ... ->
root``) through distinct devices has its latency summed by :func:`~reshard.planner.
costing.cost._reach`'s chain branch: the running sum of each edge's wait (the NICs'
latency where it changes host, else the link's) and, after the first edge, each
relay's fill (its one child's piece over the edge's rate, where the cluster pipelines
relay pieces), its maximum. A partial source's 1,024 reductions over every device to
each in turn cross hosts at a different set of places each, so no two share a pattern
to look up once (:mod:`~reshard.planner.costing.chain_columns` for short chains); here
every chain's steps are laid out as one row of one array and summed along the rows:
``np.cumsum`` adds each row's steps one after another, as the 1-D sum of one chain
does, so each row's maximum is the same float as that chain's.
"""

from __future__ import annotations

import numpy as np

from reshard.cluster import Cluster, pipeline_piece

ROWS_AT_ONCE = 256
"""Chains summed as one array (a thousand chains of a thousand edges: 16 MB of steps
a pass; a few hundred rows stay nearer the cache)."""


def chain_latencies(sizes: np.ndarray, cross: np.ndarray, cluster: Cluster) -> np.ndarray:
    """Each chain's latency (its bytes ``sizes``; ``cross[i, e]``: whether edge ``e``
    of chain ``i`` changes host) on ``cluster``: :func:`~reshard.planner.costing.cost.
    _reach` of its edges, every device distinct (module docstring)."""
    n, m = cross.shape
    pieces = np.array([pipeline_piece(cluster.relay_piece, s) for s in sizes.tolist()],
                      dtype=np.int64)
    out = np.empty(n)
    for lo in range(0, n, ROWS_AT_ONCE):
        hi = min(lo + ROWS_AT_ONCE, n)
        on = cross[lo:hi]
        steps = np.zeros((hi - lo, 2 * m))
        steps[:, 0::2] = np.where(on, cluster.latency, cluster.intra_latency)
        piece = pieces[lo:hi]
        fed = piece > 0  # a relay's fill: its one child's piece over the edge's rate
        if fed.any():
            rate = np.where(on[fed, 1:], cluster.nic_capacity, cluster.intra_bandwidth)
            fill = np.zeros((hi - lo, m - 1))
            fill[fed] = piece[fed, None] / rate
            steps[:, 3::2] = fill
        out[lo:hi] = np.cumsum(steps, axis=1).max(axis=1)
    return out


__all__ = ["ROWS_AT_ONCE", "chain_latencies"]
