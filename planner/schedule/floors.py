"""A baseline's floor from its slices alone: seconds the cost model cannot put any of
its plans below, known before a slice is planned.

The default strategy's planner also plans the baselines (``send_recv``, ``allgather``)
and keeps one only where the model says it is faster (:mod:`reshard.planner.plan`).
Building a baseline's tasks and simulating them costs as much as the broadcast plan
itself, yet most of its bytes are fixed by the slices: a slice with one holder is sent
by that holder, whoever receives it. Point to point (``send_recv``) it sends the slice
once per receiver; all-gathered (``allgather``) once per host that needs it, whole to a
host it holds or that has one receiver, else in one piece per receiver there. Those
bytes cross the holder's link out (``DEV_OUT``), each receiver's link in (``DEV_IN``)
and, where they change host, both NICs; an all-gather inside a host moves a share of
the slice in and out of each member's link; the partial sums' reductions (tasks
already built) cross their own routes. A slice of several holders is sent by a holder
the plan chooses, so only its receipts are counted: point to point, each receiver's
link in; all-gathered, the pieces and shares each receiver takes in as above (through
its NIC where no holder is on its host), and the shares it passes on. The model shares every resource at most at its
capacity (max-min fair rates, :mod:`reshard.planner.costing.fairshare`), so no plan of
these slices ends before the most loaded resource has carried its bytes.

Each of those bytes also has its step: a slice's transfers run at the step its cell may
start at, an all-gather at the step after (it reads what they delivered), a
reduction at its own. The model runs a device's steps one after another (it enters
the next once its tasks of this one have ended), so a device is busy at least, step
after step, for the longest its own resources (its links, and its NIC where no other
device shares it) take to carry that step's bytes (as
:func:`~reshard.planner.costing.cost.stepped_floor` reads a built plan): an all-gather
baseline receives its pieces through the NICs, then passes the rest through the
links, one after the other. Every byte counted is a transfer's (a copy crosses none of
these resources), which flows only once the transfer's latency has passed: at least
the cluster's least latency (``min(latency, intra_latency)``, a hop's) in each step
of a device, and once before the busiest resource's bytes. The floor is the larger of
the two bounds: :func:`baseline_floor`.

What the baselines' searches change keeps that floor: their passes' candidates are
the same sends one at a time a device (``least-concurrent``: a device then carries each
of its tasks alone, no faster than in groups), or the same request cut finer
(``finer``: other reductions where the sources are partial sums, so the caller takes
the lower of the coarse and the fine slices' floors); trees reshape broadcasts, not
the sends, pieces and receipts counted here (and a broadcast's root sends its bytes
once in any shape), in the same steps.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from functools import partial

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.cells.decompose import Cell
from reshard.planner.costing.cost import Hops, RouteMemo, task_routes
from reshard.planner.schedule.gathered_rows import GatheredRows, gathered_rows
from reshard.planner.schedule.held_receipts import (
    PieceSizes,
    held_receipts,
    host_receivers,
    piece_sizes,
)
from reshard.planner.schedule.merged_sums import Inexact, MergedKind, whole
from reshard.planner.schedule.row_sums import Items, row_items, summed
from reshard.planner.schedule.work import WorkList
from reshard.planner.values.resources import (
    COPY,
    DEV_IN,
    DEV_OUT,
    NIC_IN,
    NIC_OUT,
    Resource,
    capacities,
)
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task

FLOOR_MARGIN = 1e-9
"""A floor is compared with a model time after taking this share off it (the model's
rates fill each resource to its capacity up to rounding)."""

Loads = defaultdict[tuple[int, int], float]
"""Bytes by (resource index, step), for one kind of resource."""

StepLoads = dict[tuple[str, tuple[int, int]], float]
"""Bytes by resource kind and (index, step)."""


ARRAY_RECEIVERS = 64
"""Needers of a cell from which its transfers are counted as arrays (fewer: one by
one, without the arrays' fixed cost; the same bytes in the same order)."""


class _Kind:
    """Bytes by (index, step) for one kind of resource: every addition kept in order
    (one by one, or as arrays), then summed at once (``np.add.at``: one by one, the
    same sums as a dict's) and read back key by key in the order each key was first
    added to."""

    def __init__(self, chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
                 ) -> None:
        self.chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = chunks or []
        # additions one by one since the last chunk: (index, step, bytes)
        self.rows: list[tuple[int, int, float]] = []
        self.one = self.rows.append  # add one (index, step, bytes)

    def add(self, index: np.ndarray, step: np.ndarray, nbytes: np.ndarray) -> None:
        """Add ``nbytes[i]`` to ``(index[i], step[i])``, in order."""
        self._flush()
        self.chunks.append((index, step, nbytes))

    def _flush(self) -> None:
        if self.rows:
            index, step, nbytes = zip(*self.rows)
            self.chunks.append((np.array(index, dtype=np.int64), np.array(step, dtype=np.int64),
                                np.array(nbytes, dtype=np.float64)))
            self.rows.clear()

    def items(self) -> Items:
        """Every ((index, step), bytes), in the order each key was first added to."""
        if sum(len(c[0]) for c in self.chunks) + len(self.rows) <= DICT_SUM_UP_TO:
            # summed in a dict: the same sums in the same order as ``np.add.at``'s
            return summed([row for index, step, nbytes in self.chunks
                            for row in zip(index.tolist(), step.tolist(), nbytes.tolist())]
                           + self.rows)
        self._flush()
        if not self.chunks:
            return []
        index = np.concatenate([c[0] for c in self.chunks])
        step = np.concatenate([c[1] for c in self.chunks])
        nbytes = np.concatenate([c[2] for c in self.chunks])
        span = int(index.max(initial=0)) + 1
        lo, hi = int(step.min(initial=0)), int(step.max(initial=0))
        codes = index if lo == hi else (step - lo) * span + index  # one step: its index
        size = span * (hi - lo + 1)
        if size <= max(DENSE_UP_TO, 2 * len(codes)) and int(index.min(initial=0)) >= 0:
            keys, sums = _dense_sums(codes, nbytes, size)
        else:
            keys, first, at = np.unique(codes, return_index=True, return_inverse=True)
            # each key's bytes added from 0.0 in the order added (np.add.at's sums)
            total = np.bincount(at.reshape(-1), weights=nbytes, minlength=len(keys))
            order = np.argsort(first, kind="stable")
            keys, sums = keys[order], total[order]
        return list(zip(zip((keys % span).tolist(), (keys // span + lo).tolist()),
                        sums.tolist()))


DENSE_UP_TO = 1 << 16
"""Keys (resources times steps) up to which, or up to twice the additions, a kind is
summed in arrays by key (:func:`_dense_sums`, resources numbered from 0) rather than by
a sort of its keys."""


def _dense_sums(codes: np.ndarray, nbytes: np.ndarray, size: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Each distinct code of ``codes`` (all below ``size``) in the order first added,
    and its bytes summed from 0.0 in the order added: ``np.bincount`` by code (its
    weights added one by one in the order given into a float64 array of zeros, as
    ``np.add.at`` adds them: the same additions as into the distinct keys of a sort),
    each code's first position the least at which it comes."""
    n = len(codes)
    first = np.full(size, n, dtype=np.int64)
    np.minimum.at(first, codes, np.arange(n, dtype=np.int64))
    used = np.flatnonzero(first < n)
    total = np.bincount(codes, weights=nbytes, minlength=size)
    keys = used[np.argsort(first[used], kind="stable")]
    return keys, total[keys]


DICT_SUM_UP_TO = 4096
"""A kind of up to this many additions is summed in a dict
(:func:`~reshard.planner.schedule.row_sums.summed`, at a half to a tenth of the
arrays' cost on a 4x8 floor's few hundred to few thousand); more, as arrays
(``np.add.at``: the 1,024-device floors' cells of many receivers)."""


_Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Indices, steps and bytes of additions to one kind."""

_Parts = tuple[_Arrays, _Arrays, float | None, _Arrays, float | None, _Arrays]
"""A cell's gathered rows as merged kinds take them (:meth:`_Flows._parts`)."""


class _Flows:
    """Bytes by (index, step) per kind of resource a baseline's transfers cross
    (:class:`_Kind` a kind: counting them is the hot part, so a cell's or the rows'
    transfers are added as arrays, each key's bytes in the order the transfers come)."""

    def __init__(self, cluster: Cluster, merged: bool = False) -> None:
        self.host, self.nic = Hops().arrays(cluster)
        self.host_of, self.nic_of = cluster.host_map, cluster.nic_map
        # merged: each kind's repeated arrays summed as whole bytes (:mod:`merged_sums`)
        self.merged = merged
        kind = MergedKind if merged else _Kind
        self.dev_out, self.dev_in = kind(), kind()
        self.nic_out, self.nic_in = kind(), kind()
        # per receivers array, step and bytes: the rows' steps and bytes, each
        # receiver's NIC and whether it crosses from a root's host (:meth:`_filled`)
        self._fills: dict[tuple[int, int, int], tuple[np.ndarray, ...]] = {}
        self._crossing: dict[tuple[int, int, int, int], tuple[np.ndarray, ...]] = {}
        # per gathered rows (by id, the rows kept): their merged parts (:meth:`_parts`)
        self._parts_of: dict[int, tuple[GatheredRows, _Parts]] = {}
        self._sorted: dict[frozenset[int], np.ndarray] = {}  # per needer set (_receivers)
        # :func:`gathered_rows` by receivers, bytes, step and box extents, then by
        # the root's host (-1: none of the receivers')
        self._rows_of: dict[tuple[object, ...], tuple[frozenset[int],
                                                       dict[int, GatheredRows]]] = {}
        self._split: PieceSizes = {}  # pieces' bytes by a cell's extents (piece_sizes)

    def send(self, root: int, receiver: int, nbytes: float, step: int) -> None:
        """:meth:`sends` of one send."""
        self.dev_out.one((root, step, nbytes))
        self.dev_in.one((receiver, step, nbytes))
        if self.host_of[root] != self.host_of[receiver]:
            self.nic_out.one((self.nic_of[root], step, nbytes))
            self.nic_in.one((self.nic_of[receiver], step, nbytes))

    def sends(self, root: np.ndarray, receiver: np.ndarray, nbytes: np.ndarray,
              step: np.ndarray) -> None:
        """Each ``root[i]`` sends ``nbytes[i]`` to ``receiver[i]`` at ``step[i]`` (a
        send, or a chain's first edge), in order."""
        self.dev_out.add(root, step, nbytes)
        self.dev_in.add(receiver, step, nbytes)
        cross = self.host[root] != self.host[receiver]
        self.nic_out.add(self.nic[root[cross]], step[cross], nbytes[cross])
        self.nic_in.add(self.nic[receiver[cross]], step[cross], nbytes[cross])

    def cell(self, cell: Cell, nbytes: int, item: int, step: int, point_to_point: bool) -> None:
        """A general cell's ``receivers``' bytes at ``step``: sent one by one, or (an
        all-gather baseline) a piece to each receiver of a host then gathered there."""
        if len(cell.needers) < ARRAY_RECEIVERS:
            self._few(cell, nbytes, item, step, point_to_point)
            return
        receivers = self._receivers(cell)
        n = len(receivers)
        if len(cell.holders) != 1:  # the sender is a choice; the receipts are not
            if point_to_point:
                self.dev_in.add(receivers, *self._filled(receivers, step, nbytes))
            return
        (root,) = cell.holders
        if not n:
            return
        if point_to_point and self.merged:
            self._sends_merged(root, receivers, nbytes, step)
        elif point_to_point:
            steps, whole = self._filled(receivers, step, nbytes)
            self.sends(np.full(n, root, dtype=np.int64), receivers, whole, steps)
        else:
            self._gathered(root, receivers, cell, nbytes, item, step)

    def _filled(self, receivers: np.ndarray, step: int, nbytes: int
                ) -> tuple[np.ndarray, np.ndarray]:
        """``step`` and ``nbytes`` once per receiver, as arrays (read only), found once
        per receivers array, step and bytes (the same arrays: a merged kind merges
        them; the receivers are kept with them, so their id names them)."""
        key = (id(receivers), step, nbytes)
        got = self._fills.get(key)
        if got is None:
            n = len(receivers)
            got = self._fills[key] = (receivers, np.full(n, step, dtype=np.int64),
                                      np.full(n, float(nbytes)))
            for a in got[1:]:
                a.flags.writeable = False
        return got[1], got[2]

    def _sends_merged(self, root: int, receivers: np.ndarray, nbytes: int, step: int
                      ) -> None:
        """:meth:`sends` from one ``root`` of ``nbytes`` (a whole number) to each of
        ``receivers`` into merged kinds: the root's ``n`` equal rows (and its NIC's)
        as one of ``n`` times the bytes, the receipts' arrays found once per receivers
        array, step, bytes and root host (:mod:`merged_sums`)."""
        home = self.host_of[root]
        key = (id(receivers), step, nbytes, home)
        got = self._crossing.get(key)
        if got is None:
            steps, whole = self._filled(receivers, step, nbytes)
            cross = self.host[receivers] != home
            got = self._crossing[key] = (receivers, steps, whole, self.nic[receivers[cross]],
                                         steps[cross], whole[cross])
        _, steps, whole, nics, cross_steps, cross_bytes = got
        b = float(nbytes)
        self.dev_out.one((root, step, b * len(receivers)))
        self.dev_in.add(receivers, steps, whole)
        if len(nics):
            self.nic_out.one((self.nic_of[root], step, b * len(nics)))
            self.nic_in.add(nics, cross_steps, cross_bytes)

    def _receivers(self, cell: Cell) -> np.ndarray:
        """``cell``'s needers that do not hold it, sorted, as an array: found once per
        needer set where no holder needs it (then they are its needers; read only)."""
        needers = cell.needers
        if not cell.holders.isdisjoint(needers):
            return np.array(sorted(needers - cell.holders), dtype=np.int64)
        got = self._sorted.get(needers)
        if got is None:
            got = self._sorted[needers] = np.array(sorted(needers), dtype=np.int64)
            got.flags.writeable = False
        return got

    def _few(self, cell: Cell, nbytes: int, item: int, step: int, point_to_point: bool
             ) -> None:
        """:meth:`cell` of a cell of a few receivers, one by one."""
        receivers = sorted(cell.needers - cell.holders)
        dev_in = self.dev_in
        if len(cell.holders) != 1:
            if point_to_point:
                dev_in.rows.extend([(r, step, nbytes) for r in receivers])
            else:
                self._gathered_held(receivers, cell, nbytes, item, step)
            return
        (root,) = cell.holders
        if point_to_point:
            self._sends_of(root, receivers, nbytes, step)
            return
        self._gathered_few(root, receivers, cell, nbytes, item, step)

    def _gathered_few(self, root: int, receivers: list[int], cell: Cell, nbytes: int,
                      item: int, step: int) -> None:
        """:meth:`_gathered` of a few receivers, host by host (in the order its first
        receiver comes): each kind's rows in that loop's order, the sizes of a cell's
        ``k`` pieces found once per extents (:func:`piece_sizes`, kept for every cell
        of this floor)."""
        host, nic = self.host_of, self.nic_of
        dev_out, dev_in = self.dev_out.rows.append, self.dev_in.rows.append
        nic_out, nic_in = self.nic_out.rows.append, self.nic_in.rows.append
        by_host: dict[int, list[int]] = {}
        for r in receivers:
            by_host.setdefault(host[r], []).append(r)
        home, out_nic = host[root], nic[root]
        for h, members in by_host.items():
            k = len(members)
            if h == home or k == 1:  # whole, down a chain or sent
                first = members[0]
                dev_out((root, step, nbytes))
                dev_in((first, step, nbytes))
                if h != home:
                    nic_out((out_nic, step, nbytes))
                    nic_in((nic[first], step, nbytes))
                for m in members[1:]:
                    dev_in((m, step, nbytes))
                continue
            for m, b in zip(members, piece_sizes(cell.box, k, item, self._split)):  # another host: each piece crosses the NICs
                if b:
                    dev_out((root, step, b))
                    dev_in((m, step, b))
                    nic_out((out_nic, step, b))
                    nic_in((nic[m], step, b))
            share = nbytes * (k - 1) / k  # the all-gather's
            for m in members:
                dev_in((m, step + 1, share))
                dev_out((m, step + 1, share))

    def _gathered_held(self, receivers: list[int], cell: Cell, nbytes: int, item: int,
                       step: int) -> None:
        """:meth:`_gathered_few`'s receipts of a cell of several holders (which holder
        sends is a choice: no send out is counted), as
        :func:`~reshard.planner.cells.cell_tasks.plan_allgather` plans them, host by
        host: where a holder is on the host or it has one receiver, the cell whole to
        each receiver (through the receiver's NIC where no holder is on its host);
        else a piece to each receiver, through its NIC, then, at the step after, each
        one's share of the all-gather in and out."""
        rows = {DEV_IN: self.dev_in.rows, NIC_IN: self.nic_in.rows,
                DEV_OUT: self.dev_out.rows}
        hosts = host_receivers(receivers, cell.holders, self.host_of)
        for kind, index, at, b in held_receipts(
                hosts, nbytes, step, self.nic_of,
                partial(piece_sizes, cell.box, item=item, known=self._split)):
            rows[kind].append((index, at, b))

    def _sends_of(self, root: int, receivers: list[int], nbytes: int, step: int) -> None:
        """:meth:`send` of ``nbytes`` from ``root`` to each of ``receivers`` in turn (each
        kind's rows in the same order, without a call a send)."""
        host, nic = self.host_of, self.nic_of
        self.dev_out.rows.extend([(root, step, nbytes)] * len(receivers))
        self.dev_in.rows.extend([(r, step, nbytes) for r in receivers])
        cross = [r for r in receivers if host[r] != host[root]]
        if cross:
            self.nic_out.rows.extend([(nic[root], step, nbytes)] * len(cross))
            self.nic_in.rows.extend([(nic[r], step, nbytes) for r in cross])

    def _gathered(self, root: int, receivers: np.ndarray, cell: Cell, nbytes: int,
                  item: int, step: int) -> None:
        """:meth:`cell` for an all-gather baseline: per host (in the order its first
        receiver comes), the cell whole to its first receiver (the root's host, or one
        receiver), the others' receipts down a chain; else a piece to each receiver,
        then, at the step after, each one's share of the all-gather.

        The rows read the root only as its device and NIC (the root's sends) and its
        host where a receiver is on it: the rest (:func:`gathered_rows`) is found once
        per receivers, bytes, box extents (the pieces' sizes read only them), step and
        root host among the receivers' (:attr:`_rows_of`; a cell of a run broadcast
        from one device each to the same devices reuses them: the same arrays)."""
        key = (receivers.tobytes(), nbytes, item, step,
               tuple(hi - lo for lo, hi in cell.box))
        known = self._rows_of.get(key)
        if known is None:
            known = self._rows_of[key] = (frozenset(self.host[receivers].tolist()), {})
        hosts, by_home = known
        home = self.host_of[root]
        at = home if home in hosts else -1
        rows = by_home.get(at)
        if rows is None:
            rows = by_home[at] = gathered_rows(self.host, home, receivers, cell, nbytes,
                                               item, step)
        if self.merged:
            self._gathered_merged(root, rows, step)
            return
        dev, steps, vals, out, is_sent, cross = rows
        self.dev_in.add(dev, steps, vals)
        # the root's sends and the gatherers' shares out, in the loop's order
        self.dev_out.add(np.where(is_sent, root, dev)[out], steps[out], vals[out])
        self.nic_out.add(np.full(int(cross.sum()), self.nic[root], dtype=np.int64),
                         steps[cross], vals[cross])
        self.nic_in.add(self.nic[dev[cross]], steps[cross], vals[cross])

    def _gathered_merged(self, root: int, rows: GatheredRows, step: int) -> None:
        """:meth:`_gathered`'s rows from ``root`` into merged kinds: the root's sends
        (whole numbers: the cell, or its pieces) as one row where the first of them
        comes (between the gatherers' shares before it and after it), its NIC's as
        one, the rest the same arrays a cell (:meth:`_parts`)."""
        receipts, before, sent, after, crossed, nic_in = self._parts(rows)
        self.dev_in.add(*receipts)
        self.dev_out.add(*before)
        if sent is not None:
            self.dev_out.one((root, step, sent))
        self.dev_out.add(*after)
        if crossed is not None:
            self.nic_out.one((self.nic_of[root], step, crossed))
            self.nic_in.add(*nic_in)

    def _parts(self, rows: GatheredRows) -> _Parts:
        """``rows``' parts for :meth:`_gathered_merged`, found once per rows: the
        receipts; the sends out (the root's and the shares, in the rows' order) split at
        the first of the root's: the shares before it, the root's sends' bytes summed
        (None: none), the shares after; the bytes crossing the root's NIC summed (None:
        none) and the receipts on the NICs. Raises :class:`Inexact` where the root's
        bytes are not whole numbers (then their sum may not be the rows' sums)."""
        got = self._parts_of.get(id(rows))
        if got is not None:
            return got[1]
        dev, steps, vals, out, is_sent, cross = rows
        if not whole(vals[is_sent]):
            raise Inexact
        outs = np.flatnonzero(out)
        sent_at = np.flatnonzero(is_sent[outs])
        first = int(sent_at[0]) if len(sent_at) else len(outs)
        before = outs[:first]
        after = outs[first:][~is_sent[outs[first:]]]
        cut = [(dev[at], steps[at], vals[at]) for at in (before, after)]
        for part in cut:
            for a in part:
                a.flags.writeable = False
        parts = ((dev, steps, vals), cut[0],
                 float(vals[is_sent].sum()) if len(sent_at) else None, cut[1],
                 float(vals[cross].sum()) if cross.any() else None,
                 (self.nic[dev[cross]], steps[cross], vals[cross]))
        self._parts_of[id(rows)] = (rows, parts)
        return parts

    def add_to(self, load: StepLoads) -> None:
        """Add these bytes to ``load`` by resource kind (merged kinds all summed first:
        :class:`Inexact` leaves ``load`` as it was)."""
        parts = ((DEV_OUT, self.dev_out), (DEV_IN, self.dev_in),
                 (NIC_OUT, self.nic_out), (NIC_IN, self.nic_in))
        summed = [(kind, _merged_items(part) if isinstance(part, MergedKind)
                   else part.items()) for kind, part in parts]
        for kind, items in summed:
            for key, b in items:
                load[(kind, key)] += b


def _merged_items(part: MergedKind) -> Items:
    """A merged kind's items: summed from its rows where it holds rows alone
    (:func:`~reshard.planner.schedule.row_sums.row_items`, the same sums), else from
    its exact chunks."""
    got = row_items(part, DICT_SUM_UP_TO)
    return _Kind(part.exact_chunks()).items() if got is None else got


def reduction_loads(reduces: Sequence[Task], cluster: Cluster,
                    known: RouteMemo | None = None) -> StepLoads:
    """The bytes ``reduces`` put on each resource a step (by kind, (index, step)), in
    the order of the reductions and their routes: what :func:`baseline_floor` counts
    first. Every baseline of one cut has the same reductions, so a caller that floors
    several finds them once (``known``: as in :func:`baseline_floor`)."""
    load: defaultdict[tuple[str, tuple[int, int]], float] = defaultdict(float)
    routes = task_routes(reduces, cluster, known)
    for t, (path, _) in zip(reduces, routes):  # the reductions', by step
        for (kind, i), frac in path:
            load[(kind, (i, t.step))] += frac * t.nbytes
    return load


def baseline_floor(work: WorkList, reduces: Sequence[Task], itemsizes: Sequence[int],
                   cluster: Cluster, strategy: Strategy, known: RouteMemo | None = None,
                   reduced: StepLoads | None = None) -> float:
    """Seconds every plan of ``work``'s slices (after ``reduces``; ``itemsizes``: each
    tensor's bytes per element) under ``strategy`` (``send_recv`` or ``allgather``)
    takes at least in the cost model (module docstring), less :data:`FLOOR_MARGIN`.
    ``known``: routes already found on ``cluster`` (:func:`task_routes`' memo; the
    reductions' routes are read from it and kept in it: the same routes; default: a
    memo of this call's own). ``reduced``: :func:`reduction_loads` of ``reduces``,
    where the caller found them already (read, not changed: the same sums)."""
    load = defaultdict(float, reduced if reduced is not None else
                       reduction_loads(reduces, cluster, known))
    try:  # the transfers' bytes merged where whole, else one by one (merged_sums)
        _counted(work, itemsizes, cluster, strategy, True).add_to(load)
    except Inexact:
        _counted(work, itemsizes, cluster, strategy, False).add_to(load)
    return load_floor(load, cluster)


def load_floor(load: StepLoads, cluster: Cluster) -> float:
    """:func:`baseline_floor` of transfers' bytes ``load``: its busiest resource and its
    busiest device's steps end to end, each after the least latency (module docstring)."""
    wait = min(cluster.latency, cluster.intra_latency)  # each byte a transfer's
    busiest = _busiest(load, cluster)
    return max(busiest + wait if busiest > 0 else 0.0, _stepped(load, cluster, wait)) * \
        (1 - FLOOR_MARGIN)


def _counted(work: WorkList, itemsizes: Sequence[int], cluster: Cluster,
             strategy: Strategy, merged: bool) -> _Flows:
    """The bytes of ``work``'s transfers under ``strategy`` (:class:`_Flows`; ``merged``:
    its kinds' repeated arrays summed as whole bytes)."""
    flows = _Flows(cluster, merged)
    p2p = work.point_to_point()
    cell_steps, row_steps = work.steps()
    flows.sends(np.asarray(p2p.root, dtype=np.int64), np.asarray(p2p.recv, dtype=np.int64),
                np.asarray(p2p.nbytes, dtype=np.float64), np.asarray(row_steps, dtype=np.int64))
    point_to_point = strategy is Strategy.SEND_RECV
    for (tensor, cell), step in zip(work.general, cell_steps):
        nbytes = cell.size * itemsizes[tensor]
        if nbytes and not cell.needers <= cell.holders:
            flows.cell(cell, nbytes, itemsizes[tensor], step, point_to_point)
    return flows


def _busiest(load: StepLoads, cluster: Cluster) -> float:
    """The most loaded resource's seconds, its bytes of every step together."""
    total: defaultdict[Resource, float] = defaultdict(float)
    for (kind, (i, _)), b in load.items():
        total[(kind, i)] += b
    cap = capacities(cluster)  # a kind's capacity is each of its resources'
    return max((b / cap[res[0]] for res, b in total.items()), default=0.0)


_OWN = frozenset((DEV_IN, DEV_OUT, COPY))
"""Resources a device has alone (its links, its copy engine)."""

_NIC = frozenset((NIC_IN, NIC_OUT))
"""A NIC's resources (a device's own where no other device is on that NIC)."""


def _stepped(load: StepLoads, cluster: Cluster, wait: float = 0.0) -> float:
    """The busiest device's steps end to end: per device, over its steps, its own
    resources' longest time a step, after ``wait`` (the least latency of a transfer)
    a step (module docstring)."""
    on_nic = Counter(cluster.nic_map.values())
    alone = {n: d for d, n in cluster.nic_map.items() if on_nic[n] == 1}
    cap = capacities(cluster)  # a kind's capacity is each of its resources'
    window: dict[tuple[int, int], float] = {}  # (device, step)
    for (kind, (i, step)), b in load.items():
        if kind in _OWN:
            owner = i
        elif kind in _NIC and i in alone:
            owner = alone[i]
        else:
            continue
        seconds = b / cap[kind]
        key = (owner, step)
        window[key] = max(window.get(key, 0.0), seconds)
    busy: defaultdict[int, float] = defaultdict(float)
    for (owner, _), seconds in window.items():
        if seconds > 0:
            busy[owner] += wait + seconds
    return max(busy.values(), default=0.0)


__all__ = ["FLOOR_MARGIN", "baseline_floor", "load_floor", "reduction_loads"]
