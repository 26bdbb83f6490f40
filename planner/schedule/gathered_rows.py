"""An all-gather baseline's rows of one cell broadcast from one device to many, apart
from the root (:func:`gathered_rows`): what a floor (:mod:`reshard.planner.schedule.
floors`) adds per resource kind, found once for every cell of a run that differs only
in its root."""

from __future__ import annotations

import numpy as np

from reshard.layout import box_size
from reshard.planner.cells.cell_tasks import split_box
from reshard.planner.cells.decompose import Cell

GatheredRows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""A cell's all-gather rows (:func:`gathered_rows`): per row, in the loop's order, the
device, the step and the bytes (each a receipt, ``DEV_IN``), whether it is a send out
(the root's or a gatherer's share, ``DEV_OUT``), whether the root sends it, and whether
it crosses the NICs (the root's sends to other hosts)."""


def gathered_rows(host: np.ndarray, home: int, receivers: np.ndarray, cell: Cell,
                  nbytes: int, item: int, step: int) -> GatheredRows:
    """The rows of ``cell`` (``nbytes``, ``item`` bytes an element) sent from a root on
    host ``home`` to ``receivers`` (sorted; ``host``: each device's host): per host (in
    the order its first receiver comes), the cell whole to its first receiver (the
    root's host, or one receiver), the others' receipts down a chain; else a piece to
    each receiver, then, at ``step + 1``, each one's share of the all-gather. The
    pieces' sizes read the box's extents alone (:func:`split_box`)."""
    hosts = host[receivers]
    _, first = np.unique(hosts, return_index=True)
    rank_of = np.empty(int(hosts.max()) + 1, dtype=np.int64)
    rank_of[hosts[np.sort(first)]] = np.arange(len(first))
    rank = rank_of[hosts]
    order = np.argsort(rank, kind="stable")  # by host, receivers in order
    members, rank = receivers[order], rank[order]
    counts = np.bincount(rank)
    pos = np.arange(len(members)) - np.repeat(np.cumsum(counts) - counts, counts)
    k = counts[rank]
    whole = (k == 1) | (host[members] == home)
    share_k = {kk: nbytes * (kk - 1) / kk for kk in np.unique(k[~whole]).tolist()}
    pieces = {kk: [box_size(p) * item for p in split_box(cell.box, kk)] for kk in share_k}
    piece = np.full(len(members), float(nbytes))
    share = np.zeros(len(members))
    for kk, each in share_k.items():
        at = ~whole & (k == kk)
        piece[at] = np.array(pieces[kk], dtype=np.float64)[pos[at]]
        share[at] = each
    sent = ~whole & (piece > 0) | whole & (pos == 0)  # from the root
    chained = whole & (pos > 0)  # down the chain from the first
    split = ~whole
    # every entry's place in the loop over hosts: (host, phase, position)
    entries = [(rank[sent], 0, pos[sent]), (rank[chained], 0, pos[chained]),
               (rank[split], 1, pos[split])]
    order_of = np.lexsort((np.concatenate([p for _, _, p in entries]),
                           np.concatenate([np.full(len(r), ph) for r, ph, _ in entries]),
                           np.concatenate([r for r, _, _ in entries])))
    n_sent, n_chain = int(sent.sum()), int(chained.sum())
    dev = np.concatenate([members[sent], members[chained], members[split]])[order_of]
    vals = np.concatenate([piece[sent], piece[chained], share[split]])[order_of]
    steps = np.concatenate([np.full(n_sent + n_chain, step, dtype=np.int64),
                            np.full(int(split.sum()), step + 1, dtype=np.int64)])[order_of]
    is_sent = np.concatenate([np.ones(n_sent, dtype=bool),
                              np.zeros(len(dev) - n_sent, dtype=bool)])[order_of]
    is_share = np.concatenate([np.zeros(n_sent + n_chain, dtype=bool),
                               np.ones(len(dev) - n_sent - n_chain, dtype=bool)])[order_of]
    rows = (dev, steps, vals, is_sent | is_share, is_sent, is_sent & (host[dev] != home))
    for a in rows:
        a.flags.writeable = False  # shared by every cell that reads them
    return rows


__all__ = ["GatheredRows", "gathered_rows"]
