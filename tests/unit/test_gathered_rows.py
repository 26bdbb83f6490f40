"""A floor's all-gather rows of a cell of many receivers found once per receivers,
bytes, box extents, step and root host among the receivers' (issue 62, round nine):
the same rows in the same order, and the same floors, as working them out per cell."""

from __future__ import annotations

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.layout import box_size
from reshard.planner.cells.cell_tasks import split_box
from reshard.planner.cuts import cut_slices
from reshard.planner.plan import planned_tensors
from reshard.planner.schedule import floors
from reshard.planner.values.strategy import Strategy

CLUSTER = Cluster.preset("dgx-h100", 32)
A = DeviceMesh((16, 8), range(128))
B = DeviceMesh((16, 8), range(128, 256))
MOVES = [(A, B, "S10R", "RR", (4096, 64)), (A, A, "S10R", "RR", (4096, 64)),
         (A, A, "S01R", "RR", (1024, 1000)), (A, B, "S01R", "RR", (1000, 5)),
         (B, A, "RS01", "RR", (640, 640)), (A, B, "S10R", "RR", (1000, 3))]


def _old_gathered(self, root, receivers, cell, nbytes, item, step):
    """The rows as they were worked out for every cell."""
    hosts = self.host[receivers]
    _, first = np.unique(hosts, return_index=True)
    rank_of = np.empty(int(hosts.max()) + 1, dtype=np.int64)
    rank_of[hosts[np.sort(first)]] = np.arange(len(first))
    rank = rank_of[hosts]
    order = np.argsort(rank, kind="stable")
    members, rank = receivers[order], rank[order]
    counts = np.bincount(rank)
    pos = np.arange(len(members)) - np.repeat(np.cumsum(counts) - counts, counts)
    k = counts[rank]
    whole = (k == 1) | (self.host[members] == self.host[root])
    piece = np.full(len(members), float(nbytes))
    share = np.zeros(len(members))
    for kk in np.unique(k[~whole]).tolist():
        at = ~whole & (k == kk)
        sizes = [box_size(p) * item for p in split_box(cell.box, kk)]
        piece[at] = np.array(sizes, dtype=np.float64)[pos[at]]
        share[at] = nbytes * (kk - 1) / kk
    sent = ~whole & (piece > 0) | whole & (pos == 0)
    chained = whole & (pos > 0)
    split = ~whole
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
    self.dev_in.add(dev, steps, vals)
    out = is_sent | is_share
    self.dev_out.add(np.where(is_sent, root, dev)[out], steps[out], vals[out])
    cross = is_sent & (self.host[dev] != self.host[root])
    self.nic_out.add(np.full(int(cross.sum()), self.nic[root], dtype=np.int64),
                     steps[cross], vals[cross])
    self.nic_in.add(self.nic[dev[cross]], steps[cross], vals[cross])


def _chunks(flows) -> list:
    """Every kind's additions, array by array, in order (the rows themselves)."""
    return [[tuple(a.tolist() for a in chunk) for chunk in kind.chunks]
            for kind in (flows.dev_out, flows.dev_in, flows.nic_out, flows.nic_in)]


def _flows(s):
    flows = floors._Flows(CLUSTER)
    steps, _ = s.work.steps()
    for (tensor, cell), step in zip(s.work.general, steps):
        nbytes = cell.size * s.itemsizes[tensor]
        if nbytes and not cell.needers <= cell.holders:
            flows.cell(cell, nbytes, s.itemsizes[tensor], step, False)
    return flows


@pytest.mark.parametrize("src_mesh,dst_mesh,src,dst,shape", MOVES)
def test_gathered_rows_found_once_are_the_rows_of_every_cell(src_mesh, dst_mesh, src, dst,
                                                            shape, monkeypatch):
    tensors, _ = planned_tensors([(shape, "bfloat16", Layout(src_mesh, src),
                                   Layout(dst_mesh, dst))], CLUSTER, None, None)
    got = []
    calls = []
    new = floors._Flows._gathered
    monkeypatch.setattr(floors._Flows, "_gathered",
                        lambda self, *a: (calls.append(a), new(self, *a))[1])
    for old in (False, True):
        if old:
            monkeypatch.setattr(floors._Flows, "_gathered", _old_gathered)
        for fine in (False, True):
            s = cut_slices(tensors, CLUSTER, Strategy.ALLGATHER, fine=fine)
            flows = _flows(s)
            floor = floors.baseline_floor(s.work, s.reduces, s.itemsizes, CLUSTER,
                                          Strategy.ALLGATHER)
            got.append((_chunks(flows), [k.items() for k in (flows.dev_out, flows.dev_in,
                                                             flows.nic_out, flows.nic_in)],
                        floor))
    assert len(calls) > 2  # the rows were reused, cell after cell
    assert got[:2] == got[2:]


def test_gathered_rows_of_mixed_cells_roots_steps_and_boxes(monkeypatch):
    """Cells of one receiver set and of another, roots on the receivers' hosts (not
    receivers), on none of them and among them, at several steps and box extents, in
    a shuffled order: the same additions as per cell."""
    from reshard.planner.cells.decompose import new_cell

    SHAPES = [(3, 8), (8, 3), (4, 6), (6, 4), (24, 1), (1, 24)]
    rng = np.random.default_rng(7)
    left = frozenset(h * 8 + i for h in range(16) for i in range(4))  # 4 a host
    wide = frozenset(range(128, 256)) | frozenset(range(0, 128, 8))
    cells = []
    for _ in range(300):
        needers = (left, wide)[int(rng.integers(2))]
        root = int(rng.integers(256))
        rows, cols = SHAPES[int(rng.integers(len(SHAPES)))]  # one size, split apart
        lo = int(rng.integers(50))
        cell = new_cell(((lo, lo + rows), (lo, lo + cols)), frozenset({root}), needers)
        cells.append((cell, int(rng.integers(3))))
    got = []
    for way in (floors._Flows._gathered, _old_gathered):
        monkeypatch.setattr(floors._Flows, "_gathered", way)
        flows = floors._Flows(CLUSTER)
        for cell, step in cells:
            flows.cell(cell, cell.size * 2, 2, step, False)
        got.append(_chunks(flows))
    assert len(got[0][1]) == len(cells)
    assert got[0] == got[1]


def test_a_cell_s_receivers_found_once_per_needer_set_are_its_needers_less_holders():
    """Cells of a few needer sets, held outside them or by some of them: each cell's
    receivers as :meth:`floors._Flows.cell` sorted them per cell."""
    from reshard.planner.cells.decompose import new_cell

    rng = np.random.default_rng(3)
    sets = [frozenset(rng.choice(256, 90, replace=False).tolist()) for _ in range(3)]
    flows = floors._Flows(CLUSTER)
    inside = 0
    for _ in range(200):
        needers = sets[int(rng.integers(3))]
        holders = frozenset(rng.choice(256, int(rng.integers(1, 4)), replace=False).tolist())
        inside += not holders.isdisjoint(needers)
        got = flows._receivers(new_cell(((0, 4),), holders, needers))
        want = np.array(sorted(needers - holders), dtype=np.int64)
        assert got.dtype == want.dtype and np.array_equal(got, want)
    assert inside and len(flows._sorted) == 3
