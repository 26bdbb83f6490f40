"""A baseline floor's few-receiver sends added as rows at once, and the global order's
keys read as arrays (issue 62, round five): each gives exactly what its one-by-one form
gave (the same rows in the same order, the same keys, the same floors)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.layout import box_size
from reshard.planner.builds import Builds
from reshard.planner.cells.cell_tasks import split_box
from reshard.planner.costing.cost import Routes
from reshard.planner.cuts import cut_slices
from reshard.planner.plan import _best_plan, plan_tasks, planned_tensors
from reshard.planner.schedule import floors
from reshard.planner.schedule.order import PHASE, OrderKeys
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import TaskKind

CLUSTER = Cluster.preset("dgx-h100", 8)
MESH = DeviceMesh((4, 8), range(32))
MOVES = [("R+P0", "R", (4096,)), ("S0R+P1", "RS0", (1024, 512)), ("S0RR+P1", "S0RR", (64, 64, 8)),
         ("RR+P01", "RS0", (256, 64)), ("S0R+P1", "RS0", (1000, 251))]


def _tensors(src: str, dst: str, shape: tuple[int, ...], mesh: DeviceMesh = MESH):
    tensors, _ = planned_tensors([(shape, "bfloat16", Layout(mesh, src), Layout(mesh, dst))],
                                 CLUSTER, None, None)
    return tensors


def _old_sends_of(self, root, receivers, nbytes, step):
    """The loop the rows replace: one :meth:`send` a receiver."""
    for r in receivers:
        self.send(root, r, nbytes, step)


def _old_gathered_few(self, root, receivers, cell, nbytes, item, step):
    """The all-gather loop the rows replace: one :meth:`send` a piece."""
    host = self.host_of
    by_host: dict[int, list[int]] = {}
    for r in receivers:
        by_host.setdefault(host[r], []).append(r)
    for h, members in by_host.items():
        if h == host[root] or len(members) == 1:
            self.send(root, members[0], nbytes, step)
            for m in members[1:]:
                self.dev_in.one((m, step, nbytes))
            continue
        for m, piece in zip(members, split_box(cell.box, len(members))):
            if box_size(piece):
                self.send(root, m, box_size(piece) * item, step)
        share = nbytes * (len(members) - 1) / len(members)
        for m in members:
            self.dev_in.one((m, step + 1, share))
            self.dev_out.one((m, step + 1, share))


OLD = {Strategy.SEND_RECV: ("_sends_of", _old_sends_of),
       Strategy.ALLGATHER: ("_gathered_few", _old_gathered_few)}


def _rows(flows) -> list:
    return [kind.items() for kind in (flows.dev_out, flows.dev_in, flows.nic_out,
                                      flows.nic_in)]


@pytest.mark.parametrize("src,dst,shape", MOVES)
@pytest.mark.parametrize("strategy", list(OLD))
def test_few_receivers_rows_at_once_are_the_sends_one_by_one(src, dst, shape, strategy,
                                                             monkeypatch):
    tensors = _tensors(src, dst, shape)
    got: dict[bool, tuple] = {}
    calls = []
    name, old_way = OLD[strategy]
    new = getattr(floors._Flows, name)
    monkeypatch.setattr(floors._Flows, name,
                        lambda self, *a: (calls.append(a), new(self, *a))[1])
    for old in (False, True):
        if old:
            monkeypatch.setattr(floors._Flows, name, old_way)
        for fine in (False, True):
            s = cut_slices(tensors, CLUSTER, strategy, fine=fine)
            flows = floors._Flows(CLUSTER)
            steps, _ = s.work.steps()
            for (tensor, cell), step in zip(s.work.general, steps):
                nbytes = cell.size * s.itemsizes[tensor]
                if nbytes and not cell.needers <= cell.holders:
                    flows.cell(cell, nbytes, s.itemsizes[tensor], step,
                               strategy is Strategy.SEND_RECV)
            floor = floors.baseline_floor(s.work, s.reduces, s.itemsizes, CLUSTER, strategy)
            got.setdefault(old, ())
            got[old] += (_rows(flows), floor)
    assert calls and any(rows for rows in got[False][0])  # the rows were added
    assert got[False] == got[True]


def _old_keys(tasks, seq, cluster) -> OrderKeys:
    """:meth:`OrderKeys.of_tasks` task by task, as it was."""
    nh = max(1, cluster.num_hosts)
    host = cluster.host_of
    width = 2 * max((len(t.box) for t in tasks), default=0)
    box = np.zeros((len(tasks), width), dtype=np.int64)
    for i, t in enumerate(tasks):
        flat = [v for pair in t.box for v in pair]
        box[i, :len(flat)] = flat
    return OrderKeys(
        np.array([t.step for t in tasks], dtype=np.int64),
        np.array([PHASE[t.kind] for t in tasks], dtype=np.int64),
        np.array([(host(t.receivers[0]) - host(t.root)) % nh
                  if t.root >= 0 and t.kind is not TaskKind.COPY else 0 for t in tasks],
                 dtype=np.int64),
        np.array([t.nbytes for t in tasks], dtype=np.int64),
        np.array([t.tensor for t in tasks], dtype=np.int64),
        box,
        np.array([t.root for t in tasks], dtype=np.int64),
        np.asarray(seq, dtype=np.int64))


def _same(a: OrderKeys, b: OrderKeys) -> None:
    for name in ("step", "phase", "dist", "nbytes", "tensor", "box", "root", "seq"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name
    assert np.array_equal(a.order(), b.order())


def test_order_keys_as_arrays_are_the_keys_task_by_task():
    tasks = []
    for src, dst, shape in MOVES:  # one and two dims, partial sums, copies, all-gathers
        for strategy in Strategy:
            tensors = _tensors(src, dst, shape)
            tasks += list(plan_tasks(tensors, CLUSTER, strategy, fan_out=False)[0])
    kinds = {t.kind for t in tasks}
    assert {TaskKind.COPY, TaskKind.SEND} <= kinds and len({len(t.box) for t in tasks}) == 3
    rng = np.random.default_rng(0)
    for part in (tasks, [t for t in tasks if len(t.box) == 1], tasks[:1], []):
        seq = rng.permutation(len(part))
        _same(OrderKeys.of_tasks(part, seq, CLUSTER), _old_keys(part, seq, CLUSTER))


@pytest.mark.parametrize("relay_piece", [0, 1 << 20])
@pytest.mark.parametrize("src,dst,shape", MOVES[:2] + MOVES[3:])
def test_a_floor_reading_the_calls_routes_is_the_floor_finding_its_own(src, dst, shape,
                                                                       relay_piece):
    """The reductions' routes read from the planning call's memo (filled by its
    candidates, then by the floors themselves): the same floor, float for float."""
    cluster = dataclasses.replace(CLUSTER, relay_piece=relay_piece)
    tensors, _ = planned_tensors([(shape, "bfloat16", Layout(MESH, src), Layout(MESH, dst))],
                                 cluster, None, None)
    builds = Builds()
    _best_plan(tensors, cluster, Strategy.BROADCAST, builds)
    assert builds.known
    seen = 0
    for strategy in (Strategy.SEND_RECV, Strategy.ALLGATHER):
        for fine in (False, True):
            s = cut_slices(tensors, cluster, strategy, fine=fine)
            seen += len(s.reduces)
            alone = floors.baseline_floor(s.work, s.reduces, s.itemsizes, cluster, strategy)
            for known in (builds.known, Routes()):
                assert floors.baseline_floor(s.work, s.reduces, s.itemsizes, cluster,
                                             strategy, known) == alone
    assert seen
