"""Partial sums: reducing a partial source to one root per box, in pipelined pieces.

A partial source's groups are summed before any of the sum moves. A box is reduced in
``k`` pieces (:func:`reduce_pieces`), piece ``j`` at step ``j``; the transfers of a
piece follow at the next step (:func:`decompose_pieces`), so moving piece ``j`` overlaps
reducing piece ``j + 1``. Each piece is split again over one root per NIC (a
reduce-scatter), so the sums leave through every NIC.
"""

from __future__ import annotations

import numpy as np

from reshard.cluster import Cluster
from reshard.layout import Box, box_size
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.cell_tasks import split_box
from reshard.planner.cells.decompose import (
    Cell,
    CellTable,
    decompose,
    decompose_cells,
    decompose_rows,
    devices_by_box,
)
from reshard.planner.cells.gather_shares import gather_shares
from reshard.planner.cells.stepped_table import stepped_table
from reshard.planner.cells.wanting_hosts import wanting_hosts
from reshard.planner.values.tasks import Task, TaskKind, TensorSpec

PIPELINE_PIECES = (1, 2, 4, 8, 16)
"""Candidate numbers of pieces a partial-sum box is reduced in (pipelining)."""

FUSED_PIECE = 1 << 16
"""Smallest share of a partial-sum box one root reduces when the reductions are to be
fused with their deliveries: a fused sum costs one latency per hop, not one per piece
and stage, so small boxes still spread over one root per NIC (a 4 MiB S0R+P1 (4, 8) ->
RS0 (4, 8) on dgx-h100 reduces each host's 1 MiB over 8 roots, not 1)."""


def reduce_pieces(nbytes: int, group_size: int, cluster: Cluster) -> int:
    """How many pieces to reduce a partial box of ``nbytes`` in, so that moving piece
    ``j`` overlaps reducing piece ``j + 1``: the count minimising a two-stage pipeline
    estimate (per piece: bandwidth share plus a fixed latency per stage)."""
    r_bw = nbytes / cluster.intra_bandwidth
    r_lat = cluster.intra_latency * max(1, group_size - 1)
    x_bw = nbytes / cluster.nic_bandwidth
    x_lat = cluster.latency

    def pipeline(k: int) -> float:
        r, x = r_bw / k + r_lat, x_bw / k + x_lat
        return r + x + (k - 1) * max(r, x)

    return min(PIPELINE_PIECES, key=lambda k: (pipeline(k), k))


def reduce_sources(t: TensorSpec, index: int, loads: Loads,
                   needers: dict[Box, frozenset[int]], min_piece: int, whole: bool = False
                   ) -> tuple[dict[Box, frozenset[int]], list[Task]]:
    """Holders of each source box, after reducing partial sums to one root per box.

    A box is reduced in pieces (see :func:`reduce_pieces`), piece ``j`` at step
    ``j``; transfers of a piece follow at the next step. Each piece is split again
    over one root per NIC among the group's members on the hosts that want the box
    most (a reduce-scatter), so the sums leave through every NIC. ``whole``: one
    piece (the reductions are to be fused with their transfers, which pipeline), split
    over the roots down to :data:`FUSED_PIECE` bytes, whose deliveries keep off the
    other addends (``Loads.keep_off``).
    """
    if not t.src.spec.is_partial:
        return devices_by_box(t.src, t.shape), []
    boxes = t.src.boxes(t.shape)
    itemsize = t.sum_itemsize  # the reduction's messages carry the accumulator
    by_box: dict[Box, list[tuple[int, ...]]] = {}
    for group in t.src.partial_groups():
        by_box.setdefault(boxes[group[0]], []).append(group)
    out: dict[Box, frozenset[int]] = {}
    tasks: list[Task] = []
    wanted = wanting_hosts(list(by_box), needers, loads.host)
    for box, groups in by_box.items():
        want_hosts = wanted(box)  # hosts that need part of it: reduced where wanted
        # split along the dim the destination cuts least inside the box, so that every
        # piece feeds every destination (pipelining keeps all NICs busy)
        cuts = [{lo for dbox in needers for lo, _ in (dbox[d],) if a < lo < b}
                for d, (a, b) in enumerate(box)]
        dim = min(range(len(box)), key=lambda d: (len(cuts[d]), -(box[d][1] - box[d][0]), d))
        # several groups hold the box (a replicated partial sum): each reduces a share
        groups = sorted(groups, key=lambda g: (
            -sum(want_hosts.get(loads.host(d), 0) for d in g), g))
        shares = split_box(box, len(groups), dim) if box_size(box) else (box,)
        for share, group in zip(shares, groups):
            best = max(want_hosts.get(loads.host(d), 0) for d in group)
            roots = sorted(d for d in group if want_hosts.get(loads.host(d), 0) == best)
            nbytes = box_size(share) * itemsize
            if len(group) == 1 or not nbytes:
                out[share] = frozenset((roots[0],))
                continue
            reduce_share(index, share, group, roots, nbytes, itemsize, dim, loads,
                         min_piece, out, tasks, whole)
    return out, tasks


POSITIONS_FROM = 8
"""Roots from which :func:`reduce_share` finds each group member's index once (each
root's addends then sliced at its index, not searched for it)."""


def reduce_share(index: int, box: Box, group: tuple[int, ...], roots: list[int],
                 nbytes: int, itemsize: int, dim: int, loads: Loads, min_piece: int,
                 out: dict[Box, frozenset[int]], tasks: list[Task], whole: bool = False
                 ) -> None:
    """Reduce ``box`` over ``group`` in pipelined pieces (one if ``whole``), each
    split over one root per NIC among ``roots``; record the roots as the pieces'
    holders."""
    k = 1 if whole else reduce_pieces(nbytes, len(group), loads.cluster)
    by_nic: dict[int, int] = {}
    for d in roots:
        by_nic.setdefault(loads.nic(d), d)
    nic_roots = list(by_nic.values())
    at = _positions(group) if len(nic_roots) >= POSITIONS_FROM else None
    n = 0
    others_of: dict[int, tuple[int, ...]] = {}
    shares: list[tuple[int, int]] = []  # gathered at the end, in bulk (nothing reads)
    for j, piece in enumerate(split_box(box, k, dim)):
        pbytes = box_size(piece) * itemsize
        r = max(1, min(len(nic_roots), pbytes // (FUSED_PIECE if whole else min_piece)))
        for sub in split_box(piece, r, dim):
            sbytes = box_size(sub) * itemsize
            if not sbytes:
                continue
            root = nic_roots[n % len(nic_roots)]
            n += 1
            others = others_of.get(root)
            if others is None:
                others = others_of[root] = _others(group, root, at)
            tasks.append(Task(TaskKind.REDUCE, index, sub, root, others, sbytes, step=j))
            if whole:  # to be fused: its deliveries must not relay through an addend
                loads.keep_off[root] = loads.keep_off.get(root, frozenset()).union(others)
            shares.append((root, sbytes))
            out[sub] = frozenset((root,))
    gather_shares(loads, group, shares)


def _positions(group: tuple[int, ...]) -> dict[int, int] | None:
    """Each member's index in ``group`` where every member is in it once, else None."""
    at = {d: i for i, d in enumerate(group)}
    return at if len(at) == len(group) else None


def _others(group: tuple[int, ...], root: int, at: dict[int, int] | None = None
            ) -> tuple[int, ...]:
    """``group``'s members but ``root``, in order (by slicing where ``root`` is in it
    once: the same tuple as filtering; ``at``: :func:`_positions` of ``group``, its
    index found there instead of searched)."""
    if at is not None:
        i = at.get(root)
        return tuple(group) if i is None else group[:i] + group[i + 1:]
    if root in group:
        i = group.index(root)
        if root not in group[i + 1:]:
            return group[:i] + group[i + 1:]
    return tuple(d for d in group if d != root)


def decompose_pieces(shape: tuple[int, ...], holders: dict[Box, frozenset[int]],
                     needers: dict[Box, frozenset[int]], ready: dict[Box, int],
                     table: bool = False
                     ) -> tuple[list[Cell] | CellTable, list[int] | np.ndarray]:
    """:func:`~reshard.planner.cells.decompose.decompose`, keeping apart the cells of pieces
    reduced at different steps: a cell merged across two pieces would wait for the
    later one, and its transfer would no longer overlap the reduction (pieces with one
    root, and so equal holders, would all merge into one cell).

    Returns:
        The cells, and per cell the first step at which every reduced piece it
        overlaps is complete (``ready``'s step of the pieces it lies in; 0 for a cell
        no one holds). A cell with holders lies inside the holder boxes of one step's
        part (the holder boxes are disjoint, and a cell's every element is held by its
        holders), so its step is that part's, found without comparing boxes. With
        ``table``, the cells of one step's pieces as their
        :class:`~reshard.planner.cells.decompose.CellTable` and the steps as an array
        where :func:`~reshard.planner.cells.decompose.decompose_rows` gives one (the
        same rows in the same order: a work list keeps its point-to-point rows, or
        rows that all broadcast from one holder, as columns).
    """
    by_step: dict[int, dict[Box, frozenset[int]]] = {}
    for box, devs in holders.items():
        by_step.setdefault(ready.get(box, 0), {})[box] = devs
    if len(by_step) == 1:
        (step,) = by_step
        cells = decompose_rows(shape, holders, needers) if table else \
            decompose_cells(shape, holders, needers)
        if isinstance(cells, CellTable) and not _mostly_point_to_point(cells) and \
                not _one_holder_broadcasts(cells):
            cells = cells.cells()  # general cells all the same: the list planners read
        if isinstance(cells, CellTable):
            held = np.array([bool(s) for s in cells.holder_sets], dtype=bool)
            return cells, np.where(held[cells.holder], step, 0).astype(np.int64)
        steps = [step if c.holders else 0 for c in cells]
        return _as_rows(cells, steps, len(shape)) if table else (cells, steps)
    joint = stepped_table(shape, holders, needers, ready)
    if joint is not None:  # every step's grid at once: the same cells and steps
        got_table, got_steps = joint
        if table and _mostly_point_to_point(got_table):
            return got_table, got_steps
        return got_table.cells(), got_steps.tolist()
    stepped = [(c, step) for step, part in by_step.items()
               for c in decompose(shape, part, needers, held_only=True)]
    stepped.sort(key=lambda cs: cs[0].box)
    got, steps = [c for c, _ in stepped], [s for _, s in stepped]
    return _as_rows(got, steps, len(shape)) if table else (got, steps)


def _as_rows(cells: list[Cell], steps: list[int], ndim: int
             ) -> tuple[list[Cell] | CellTable, list[int] | np.ndarray]:
    """``cells`` and ``steps`` as a :class:`~reshard.planner.cells.decompose.CellTable`
    and an array where half or more of the cells go point to point (one holder, one
    needer, another device: :func:`_mostly_point_to_point`), else as they are."""
    if not cells:
        return cells, steps
    table = CellTable.from_cells(cells, ndim)
    if not _mostly_point_to_point(table):
        return cells, steps
    return table, np.array(steps, dtype=np.int64)


def point_rows(table: CellTable) -> tuple[int, list[Cell]]:
    """How many of ``table``'s rows go point to point (one holder, one needer, another
    device: a work list keeps them as columns, never split), and the other rows as
    cells, in order (those it plans as cells)."""
    p2p = _point_mask(table)
    return int(p2p.sum()), table.cells(np.flatnonzero(~p2p))


def _point_mask(table: CellTable) -> np.ndarray:
    """Per row of ``table`` whether it goes point to point (one holder, one needer,
    another device)."""
    root, recv = _singles(table.holder_sets)[table.holder], \
        _singles(table.needer_sets)[table.needer]
    mask: np.ndarray = (root >= 0) & (recv >= 0) & (root != recv)
    return mask


def _singles(sets: tuple[frozenset[int], ...]) -> np.ndarray:
    """Per set its one member, -1 where it has none or several (and -1 after the
    last)."""
    return np.array([next(iter(s)) if len(s) == 1 else -1 for s in sets] + [-1],
                    dtype=np.int64)


def _one_holder_broadcasts(table: CellTable) -> bool:
    """Whether every row of ``table`` goes from one holder to two or more needers (none
    point to point: a work list keeps them as a table's rows). The sets used, in
    ascending order, by a count per set (the rows index the sets: ``np.unique``'s
    answer without numpy 2.4's hashing)."""
    hold, need = table.holder_sets, table.needer_sets
    return bool(len(table)) and \
        all(len(hold[h]) == 1 for h in np.flatnonzero(np.bincount(table.holder)).tolist()) \
        and all(len(need[n]) >= 2 for n in np.flatnonzero(np.bincount(table.needer)).tolist())


def _mostly_point_to_point(table: CellTable) -> bool:
    """Whether half or more of ``table``'s rows go point to point (one holder, one
    needer, another device: a work list keeps them as columns)."""
    return 2 * int(_point_mask(table).sum()) >= len(table)
