"""Turning cells into tasks, one function per strategy (the Strategy enum itself is in
strategy.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from reshard.layout import Box, box_size, chunk_size
from reshard.planner.cells import allgather_runs
from reshard.planner.cells.balance import ARRAY_CHAIN, Loads
from reshard.planner.cells.broadcast_runs import CellRun, Group, one_host, plan_run
from reshard.planner.cells.chain_arrays import NicMirror
from reshard.planner.cells.decompose import Cell
from reshard.planner.cells.grid_runs import plan_grid_run
from reshard.planner.cells.holder_arrays import ARRAY_HOLDERS
from reshard.planner.cells.kept_chains import KeptChains
from reshard.planner.cells.new_tasks import moved_task, new_task
from reshard.planner.values.resources import NIC_IN, NIC_OUT
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Buffer, Task, TaskKind

CellPlanner = Callable[[Cell, int, int, Loads, int], list[Task]]
"""A strategy's tasks of one cell: ``planner(cell, tensor, itemsize, loads, step)``,
its transfers at ``step`` and what reads what they delivered (``source=dst``) at the
step after."""

RunPlanner = Callable[[CellRun, Loads], list[list[Task]]]
"""A strategy's tasks of a run of cells, each cell's as its :data:`CellPlanner` plans
it in turn (:data:`RUN_PLANNERS`)."""


def _copies(cell: Cell, tensor: int, nbytes: int, step: int) -> list[Task]:
    if cell.needers.isdisjoint(cell.holders):
        return []
    return [new_task(TaskKind.COPY, tensor, cell.box, d, (d,), nbytes, step)
            for d in sorted(cell.needers & cell.holders)]


def _send(cell_box: Box, tensor: int, root: int, receiver: int, nbytes: int,
          loads: Loads, step: int) -> Task:
    loads.charge(root, (receiver,), nbytes)
    return new_task(TaskKind.SEND, tensor, cell_box, root, (receiver,), nbytes, step)


def plan_send_recv(cell: Cell, tensor: int, itemsize: int, loads: Loads,
                   step: int = 0) -> list[Task]:
    """Every needer receives the cell point to point from a holder."""
    nbytes = box_size(cell.box) * itemsize
    tasks = _copies(cell, tensor, nbytes, step)
    for n in sorted(cell.needers - cell.holders):
        root = loads.pick_sender(cell.holders, n, nbytes)
        tasks.append(_send(cell.box, tensor, root, n, nbytes, loads, step))
    return tasks


def plan_send_recvs(run: CellRun, loads: Loads) -> list[list[Task]]:
    """:func:`plan_send_recv` of each cell of ``run`` in turn, the facts it reads of a
    (holders, needers) pair found once (the copies, each other needer's host and NIC,
    each holder's host and NIC) and :meth:`Loads.pick_sender` and :meth:`Loads.charge`
    of each send inline: the same keys read and the same additions made in the same
    order, so the same tasks and loads. A cell of no holder, or of
    :data:`~reshard.planner.cells.holder_arrays.ARRAY_HOLDERS` or more (picked by
    arrays), goes through :func:`plan_send_recv` itself.

    Exact: :meth:`Loads.pick_root` of a few holders for one receiver host ``h`` is
    the least (NIC out load plus the bytes where the holder is off ``h``, whether it
    is off ``h``, its send load, id) over the holders in their iteration order (the
    tables' unseen keys added in it); the facts are kept per pair of set objects
    (their identities: equal sets built apart may iterate apart)."""
    facts: dict[tuple[int, int], _SendFacts | None] = {}
    nic_out, nic_in, dev_out, dev_in = loads.nic_out, loads.nic_in, loads.dev_out, loads.dev_in
    copy, send = TaskKind.COPY, TaskKind.SEND
    out: list[list[Task]] = []
    for cell, tensor, itemsize, step in run:
        holders, needers = cell.holders, cell.needers
        key = (id(holders), id(needers))
        got = facts[key] if key in facts else facts.setdefault(key, _send_facts(loads, cell))
        if got is None:
            out.append(plan_send_recv(cell, tensor, itemsize, loads, step))
            continue
        copies, others, pairs = got
        nbytes, box = cell.size * itemsize, cell.box
        tasks = [new_task(copy, tensor, box, d, (d,), nbytes, step) for d in copies]
        for n, h, nic_n in others:
            if len(pairs) == 1:
                root, root_host, root_nic = pairs[0]
            else:  # pick_root's key, in the holders' order
                _, _, _, root, root_host, root_nic = min([
                    (nic_out[nd] + (0 if hd == h else nbytes), hd != h, dev_out[d], d, hd, nd)
                    for d, hd, nd in pairs])
            dev_out[root] += nbytes  # charge(root, (n,), nbytes)'s additions, in order
            dev_in[n] += nbytes
            if h != root_host:
                nic_out[root_nic] += nbytes
                nic_in[nic_n] += nbytes
            tasks.append(new_task(send, tensor, box, root, (n,), nbytes, step))
        out.append(tasks)
    return out


_SendFacts = tuple[list[int], list[tuple[int, int, int]], list[tuple[int, int, int]]]
"""A cell's copies (the needers that hold it, in id order), its other needers in id
order with each one's host and NIC, and its holders in their order with each one's
host and NIC."""


def _send_facts(loads: Loads, cell: Cell) -> _SendFacts | None:
    """``cell``'s :data:`_SendFacts` (it reads the cluster alone), or None where
    :meth:`Loads.pick_root` would not read the holders one by one (none, or many)."""
    holders, needers = cell.holders, cell.needers
    if not holders or len(holders) >= ARRAY_HOLDERS:
        return None
    host, nic = loads.host, loads.nic
    copies = [] if needers.isdisjoint(holders) else sorted(needers & holders)
    return (copies, [(n, host(n), nic(n)) for n in sorted(needers - holders)],
            [(d, host(d), nic(d)) for d in holders])


def plan_broadcast(cell: Cell, tensor: int, itemsize: int, loads: Loads,
                   step: int = 0) -> list[Task]:
    """One broadcast from one holder to every needer that does not hold the cell."""
    nbytes = cell.size * itemsize
    holders = cell.holders
    tasks = _copies(cell, tensor, nbytes, step)
    receivers = cell.needers - holders
    if not receivers:
        return tasks
    if len(receivers) == 1 and len(holders) == 1:  # point to point: every a2a cell
        (root,), (r,) = holders, receivers
        chain, through = loads.send(root, r, nbytes)
        kind = TaskKind.SEND if len(chain) == 1 else TaskKind.BROADCAST
        tasks.append(new_task(kind, tensor, cell.box, root, chain, nbytes, step, through=through))
        return tasks
    if len(holders) == 1:
        (root,) = holders
        if (got := one_host(loads, receivers)) is not None and \
                (quick := _one_host_chain(loads, root, got, nbytes)):
            tasks.append(new_task(TaskKind.BROADCAST, tensor, cell.box, root, quick, nbytes, step))
            return tasks
    else:
        root = loads.pick_root(holders, set(map(loads.host, receivers)), nbytes)
    chain, through = loads.relay_chain(root, receivers, nbytes)
    loads.charge(root, chain, nbytes)
    kind = TaskKind.SEND if len(chain) == 1 else TaskKind.BROADCAST
    tasks.append(new_task(kind, tensor, cell.box, root, chain, nbytes, step, through=through))
    return tasks


def plan_broadcasts(run: CellRun, loads: Loads) -> list[list[Task]]:
    """:func:`plan_broadcast` of each cell of ``run`` in turn, a cell of one holder
    sending to needers all on one other host (:func:`_one_host_chain`) without the
    general path's steps: its needers are its receivers (none holds it: no copies). A
    run of one-holder cells to many receivers laid out as whole host rows is planned on
    those rows up to its first cell that is not (or whose chain may relay):
    :func:`~reshard.planner.cells.grid_runs.plan_grid_run`."""
    whole = plan_run(run, loads)
    if whole is not None:
        return whole
    out = plan_grid_run(run, loads)
    mirror: NicMirror | None = None  # only along cells of many receivers
    kept = KeptChains(loads)
    hosted = loads._needers.one_host  # one_host's memo, read here
    for cell, tensor, itemsize, step in itertools.islice(run, len(out), None):
        holders = cell.holders
        held = len(holders)
        needers = cell.needers  # (its receivers: those not among the few holders)
        many = len(needers) >= ARRAY_CHAIN and \
            len(needers) - len(holders & needers) >= ARRAY_CHAIN
        if mirror is not None and not many:  # it may add other receive loads
            mirror.flush(loads.dev_in)
            mirror = None
        if held == 1:
            group = hosted[needers] if needers in hosted else one_host(loads, needers)
            if group is not None:
                (root,) = holders
                nbytes = cell.size * itemsize
                chain = _one_host_chain(loads, root, group, nbytes)
                if chain:
                    out.append([new_task(TaskKind.BROADCAST, tensor, cell.box, root, chain,
                                         nbytes, step)])
                    continue  # (few receivers: no mirror held)
        if many:
            tasks, mirror = _mirrored(mirror or NicMirror(), loads, cell, tensor, itemsize,
                                      step)
        elif (got := kept.plan(cell, tensor, itemsize, step) if held == 1
              else kept.plan_held(cell, tensor, itemsize, step) if held < ARRAY_HOLDERS
              else None) is None:  # (plan_held's own first test, asked here)
            tasks = plan_broadcast(cell, tensor, itemsize, loads, step)
        else:
            tasks = got
        out.append(tasks)
    if mirror is not None:
        mirror.flush(loads.dev_in)
    return out


def _mirrored(mirror: NicMirror, loads: Loads, cell: Cell, tensor: int, itemsize: int,
              step: int) -> tuple[list[Task], NicMirror | None]:
    """:func:`plan_broadcast` of ``cell`` with ``mirror`` as ``loads``'
    :class:`~reshard.planner.cells.chain_arrays.NicMirror`: a long chain to the
    receivers of the cell before reads their NIC loads from it. The mirror kept for
    the next cell where the cell's only writes to the NIC loads were its one
    :func:`~reshard.planner.cells.chain_arrays.charge_crossings` (which kept it in
    step); else none (the next reads the tables afresh).

    Exact: :func:`plan_broadcast` writes the NIC loads only in :meth:`Loads.send`,
    :func:`_one_host_chain` or its one :meth:`Loads.charge`, each path ending the
    cell; of those only a long chain's charge calls ``charge_crossings``."""
    mirror.charges = 0
    loads.nic_mirror = mirror
    try:
        tasks = plan_broadcast(cell, tensor, itemsize, loads, step)
    finally:
        loads.nic_mirror = None
    if mirror.charges == 1:
        return tasks, mirror
    mirror.flush(loads.dev_in)
    return tasks, None


def _one_host_chain(loads: Loads, root: int, got: Group, nbytes: int
                    ) -> tuple[int, ...] | None:
    """:meth:`Loads.relay_chain` and then :meth:`Loads.charge` of a broadcast from
    ``root`` to two or more receivers all on one other host (their :func:`one_host`
    group, ``got``), where neither end of
    the host boundary may relay (:meth:`Loads.may_relay_end`): the chain (every cell
    of a partial sum's reduced pieces sent to a destination host). Else None, having
    changed nothing (the general path then decides).

    Exact: :meth:`Loads.relay_chain` of such receivers (fewer than
    :data:`~reshard.planner.cells.balance.ARRAY_CHAIN`, several NICs per host) answers
    :func:`~reshard.planner.cells.short_chain.remote_chain`'s quick chain: the
    receiver with the least (NIC in load, id) enters, the rest follow in id order;
    :meth:`Loads.charge` of it crosses one host boundary, root to entry. The same
    reads and the same additions in the same order, the receivers' host and NICs
    found once per receiver set."""
    if loads.host(root) == got[0]:
        return None
    nic_in = loads.nic_in
    _, entry = min([(nic_in[n], d) for d, n in got[1]])
    # may_relay_end of either end, its cached answers read here
    cached = loads._may_relay
    relays = cached.get((NIC_OUT, root))
    if relays or (relays is None and loads.may_relay_end(NIC_OUT, root)):
        return None
    relays = cached.get((NIC_IN, entry))
    if relays or (relays is None and loads.may_relay_end(NIC_IN, entry)):
        return None
    chain = (entry, *[d for d, _ in got[1] if d != entry])
    loads.dev_out[root] += nbytes
    dev_in = loads.dev_in
    for r in chain:
        dev_in[r] += nbytes
    nic = loads.nic
    loads.nic_out[nic(root)] += nbytes
    nic_in[nic(entry)] += nbytes
    return chain


def fan_out(tasks: list[Task], host: Callable[[int], int]) -> list[Task]:
    """``tasks`` (of one cell, steps set) with each broadcast chain that ends inside
    another host than its root's split in two: the chain up to its first receiver on
    that host (it crosses every host boundary, as before), and at the next step the
    fan-out from that receiver to the rest of the host (``source=dst``). The same
    devices move the same bytes over the same links; the intra-host fan-out of one
    pipelined piece then overlaps the host crossing of the next, instead of every step
    waiting for a whole chain (a step ends when its chains end).
    """
    out: list[Task] = []
    for t in tasks:
        chain = t.receivers
        if t.kind is not TaskKind.BROADCAST or t.source is not Buffer.SRC or t.parents:
            out.append(t)
            continue
        last = host(chain[-1])
        i = len(chain)
        while i > 0 and host(chain[i - 1]) == last:
            i -= 1
        while chain[i] in t.through:  # a relay-only entry keeps nothing
            i += 1
        if host(t.root) == last or i + 2 > len(chain):
            out.append(t)
            continue
        head, tail = chain[:i + 1], chain[i + 1:]
        through = tuple(d for d in t.through if d in head) if t.through else ()
        # dataclasses.replace of each half, built slot by slot (the same values)
        out.append(moved_task(t, TaskKind.BROADCAST if len(head) > 1 else TaskKind.SEND,
                              t.root, head, through, t.step, t.source))
        out.append(moved_task(t, TaskKind.BROADCAST if len(tail) > 1 else TaskKind.SEND,
                              chain[i], tail, (), t.step + 1, Buffer.DST))
    return out


UNEVEN = 0.05
"""How much larger than the mean the largest of a default split's pieces may be when
:func:`split_box` cuts the outermost dim."""


def split_dim(box: Box, k: int) -> int:
    """The dim :func:`split_box` cuts by default: the outermost one that ``k`` pieces
    share within :data:`UNEVEN`, else the longest. A box contiguous in a row-major
    shard stays so in pieces cut along its outermost dim, so a backend receives them in
    place instead of through scratch memory and a copy (on the testbed the copies of
    column-cut halves added 3-9% to a transfer)."""
    for i, (a, b) in enumerate(box):
        n = b - a
        if n >= k and chunk_size(n, k) * k <= n * (1 + UNEVEN):
            return i
    return max(range(len(box)), key=lambda i: (box[i][1] - box[i][0], -i))


def split_box(box: Box, k: int, dim: int | None = None) -> tuple[Box, ...]:
    """Split ``box`` into ``k`` pieces along ``dim`` (default: :func:`split_dim`) by
    the chunk rule (trailing pieces may be empty)."""
    if not box:
        return (box, *(() for _ in range(k - 1)))
    d = dim if dim is not None else split_dim(box, k)
    lo, hi = box[d]
    n = hi - lo
    c = chunk_size(n, k)  # chunk_bounds(n, k, i) of each piece, the size found once
    head, tail = box[:d], box[d + 1:]
    if c > 0:  # each piece's bounds lo + min(i * c, n) (= min(lo + i * c, hi)), found once
        cuts = map(min, range(lo, lo + c * k + 1, c), itertools.repeat(hi))
        return tuple([(*head, cut, *tail) for cut in itertools.pairwise(cuts)])
    return tuple([(*head, (lo + min(i * c, n), lo + min(i * c + c, n)), *tail)
                  for i in range(k)])


def _remote_sends(cell: Cell, loads: Loads) -> Callable[[int, int], int]:
    """``send(m, pbytes)``: :func:`_send` of a piece from ``loads.pick_sender`` to a
    needer ``m`` on a host that holds none of ``cell`` (every holder is remote: the
    same key without the host terms, the same charges in the same order); returns the
    sender."""
    holders = cell.holders
    nic = loads.nic
    nic_out, nic_in, dev_out, dev_in = loads.nic_out, loads.nic_in, loads.dev_out, loads.dev_in
    if len(holders) == 1:
        (only,) = holders
        pairs = [(only, nic(only))]
    else:
        pairs = [(d, nic(d)) for d in holders]

    def send(m: int, pbytes: int) -> int:
        if len(pairs) == 1:
            root, n = pairs[0]
        else:
            _, _, root, n = min([(nic_out[n] + pbytes, dev_out[d], d, n) for d, n in pairs])
        dev_out[root] += pbytes
        dev_in[m] += pbytes
        nic_out[n] += pbytes
        nic_in[nic(m)] += pbytes
        return root

    return send


_Hosts = tuple[tuple[int, ...], tuple[tuple[int, tuple[int, ...], list[int] | None], ...]]
"""A cell's devices as :func:`plan_allgather` reads them: the needers that hold it (in
id order, each a copy), then each other needer's host in host order with its needers
(in id order) and its holders (None where it holds none)."""


def _hosts(cell: Cell, host: Callable[[int], int]) -> _Hosts:
    """:data:`_Hosts` of ``cell`` (it reads the cell's holders and needers alone)."""
    by_host: dict[int, list[int]] = {}
    for n in sorted(cell.needers - cell.holders):
        by_host.setdefault(host(n), []).append(n)
    held_on: dict[int, list[int]] = {}  # each host's holders, in the holders' order
    for d in cell.holders:
        held_on.setdefault(host(d), []).append(d)
    copies = () if cell.needers.isdisjoint(cell.holders) else \
        tuple(sorted(cell.needers & cell.holders))
    return copies, tuple((h, tuple(members), held_on.get(h))
                         for h, members in sorted(by_host.items()))


def plan_allgather(cell: Cell, tensor: int, itemsize: int, loads: Loads,
                   step: int = 0) -> list[Task]:
    """Each needer host receives the cell once, split over its needers, who then
    all-gather it inside the host (at the step after). A host that holds the cell
    broadcasts it locally."""
    return _allgather(cell, tensor, itemsize, loads, step, _hosts(cell, loads.host), None)


def plan_allgathers(run: CellRun, loads: Loads) -> list[list[Task]]:
    """:func:`plan_allgather` of each cell of ``run`` in turn, each distinct (holders,
    needers) pair's hosts (:func:`_hosts`) and remote senders (:func:`_remote_sends`)
    found once: they read only those sets (and ``loads``' tables, the same objects
    throughout), and every choice among the holders is by a key that ends in the
    device's id, so the holders' iteration order decides nothing. A run with nothing
    to choose is planned in bulk (:func:`~reshard.planner.cells.allgather_runs.plan_run`)."""
    whole = allgather_runs.plan_run(run, loads, split_dim)
    if whole is not None:
        return whole
    memo: dict[tuple[frozenset[int], frozenset[int]],
               tuple[_Hosts, list[Callable[[int, int], int]]]] = {}
    host = loads.host
    out: list[list[Task]] = []
    for cell, tensor, itemsize, step in run:
        key = (cell.holders, cell.needers)
        got = memo.get(key)
        if got is None:
            got = memo[key] = (_hosts(cell, host), [])
        out.append(_allgather(cell, tensor, itemsize, loads, step, got[0], got[1]))
    return out


def _allgather(cell: Cell, tensor: int, itemsize: int, loads: Loads, step: int,
               hosts: _Hosts, senders: list[Callable[[int, int], int]] | None
               ) -> list[Task]:
    """:func:`plan_allgather` of ``cell`` from its :data:`_Hosts`; ``senders``: where
    its :func:`_remote_sends` is kept for the next cell of the same holders (None:
    not kept)."""
    nbytes = box_size(cell.box) * itemsize
    box = cell.box
    copies, groups = hosts
    tasks = [new_task(TaskKind.COPY, tensor, box, d, (d,), nbytes, step) for d in copies]
    # the box's pieces and their bytes, per count (hosts repeat it)
    split: dict[int, tuple[tuple[Box, ...], list[int]]] = {}
    sent: Callable[[int, int], int] | None = None
    for h, members, local in groups:
        if local or len(members) == 1:
            root = loads.pick_root(local or cell.holders, {h}, nbytes)
            loads.charge(root, members, nbytes)
            kind = TaskKind.SEND if len(members) == 1 else TaskKind.BROADCAST
            tasks.append(new_task(kind, tensor, box, root, members, nbytes, step))
            continue
        got = split.get(len(members))
        if got is None:
            pieces = split_box(box, len(members))
            got = split[len(members)] = (pieces, [box_size(p) * itemsize for p in pieces])
        pieces, sizes = got
        if sent is None:
            if senders:
                sent = senders[0]
            else:
                sent = _remote_sends(cell, loads)
                if senders is not None:
                    senders.append(sent)
        for m, piece, pbytes in zip(members, pieces, sizes):
            if pbytes:
                tasks.append(new_task(TaskKind.SEND, tensor, piece, sent(m, pbytes), (m,),
                                  pbytes, step))
        share = nbytes * (len(members) - 1) / len(members)
        for m in members:
            loads.dev_in[m] += share
        tasks.append(new_task(TaskKind.ALLGATHER, tensor, box, -1, members, nbytes,
                          step + 1, source=Buffer.DST, pieces=pieces))
    return tasks


CELL_PLANNERS: dict[Strategy, CellPlanner] = {
    Strategy.SEND_RECV: plan_send_recv,
    Strategy.ALLGATHER: plan_allgather,
    Strategy.BROADCAST: plan_broadcast,
}

RUN_PLANNERS: dict[CellPlanner, RunPlanner] = {plan_broadcast: plan_broadcasts,
                                                plan_allgather: plan_allgathers,
                                                plan_send_recv: plan_send_recvs}
"""The strategies' planners of runs of cells where one is quicker than each cell's
planner in turn (the same tasks and loads)."""
