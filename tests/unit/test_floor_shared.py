"""A baseline floor's reductions counted once a cut and its resources' capacities read
once a kind (issue 62, round six): each gives exactly what the old form gave (the same
loads in the same order, the same floors), and a floor shared by the planning call's
baselines is the floor each finds alone."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.builds import Builds
from reshard.planner.costing.cost import Routes
from reshard.planner.cuts import cut_slices
from reshard.planner.passes.send_floor import send_floor
from reshard.planner.plan import planned_tensors
from reshard.planner.schedule import floors
from reshard.planner.values.resources import COPY, DEV_IN, DEV_OUT, NIC_IN, NIC_OUT, capacity
from reshard.planner.values.strategy import Strategy

CLUSTER = Cluster.preset("dgx-h100", 8)
MESH = DeviceMesh((4, 8), range(32))
MOVES = [("R+P0", "R", (4096,)), ("S0R+P1", "RS0", (1024, 512)), ("RR+P01", "RS0", (256, 64)),
         ("RS1+P0", "S0S1", (1000, 251)), ("S0R", "RS1", (512, 512))]
BASELINES = (Strategy.SEND_RECV, Strategy.ALLGATHER)


def _tensors(src: str, dst: str, shape: tuple[int, ...]):
    tensors, _ = planned_tensors([(shape, "float32", Layout(MESH, src), Layout(MESH, dst))],
                                 CLUSTER, None, None)
    return tensors


def _old_busiest(load, cluster) -> float:
    """:func:`floors._busiest` as it was: each resource's capacity asked for."""
    total: defaultdict = defaultdict(float)
    for (kind, (i, _)), b in load.items():
        total[(kind, i)] += b
    return max((b / capacity(res, cluster) for res, b in total.items()), default=0.0)


def _old_stepped(load, cluster, wait: float = 0.0) -> float:
    """:func:`floors._stepped` as it was."""
    on_nic = Counter(cluster.nic_map.values())
    alone = {n: d for d, n in cluster.nic_map.items() if on_nic[n] == 1}
    window: defaultdict = defaultdict(float)
    for (kind, (i, step)), b in load.items():
        if kind in (DEV_IN, DEV_OUT, COPY):
            owner = i
        elif kind in (NIC_IN, NIC_OUT) and i in alone:
            owner = alone[i]
        else:
            continue
        window[(owner, step)] = max(window[(owner, step)], b / capacity((kind, i), cluster))
    busy: defaultdict = defaultdict(float)
    for (owner, _), seconds in window.items():
        if seconds > 0:
            busy[owner] += wait + seconds
    return max(busy.values(), default=0.0)


@pytest.mark.parametrize("src,dst,shape", MOVES)
def test_reductions_counted_once_give_each_baselines_own_floor(src, dst, shape):
    tensors = _tensors(src, dst, shape)
    builds = Builds()  # one memo: both baselines, both cuts, the reductions shared
    found = []
    for fine in (False, True):
        for baseline in BASELINES:
            s = cut_slices(tensors, CLUSTER, baseline, fine=fine)
            alone = floors.baseline_floor(s.work, s.reduces, s.itemsizes, CLUSTER, baseline,
                                          Routes())
            if baseline is Strategy.SEND_RECV:  # and the copies its hosts send out
                cells = builds.cut(tensors, CLUSTER, False, fine).cells
                alone = max(alone, send_floor(zip(cells, s.itemsizes), CLUSTER))
            assert builds.floor(tensors, CLUSTER, baseline, fine) == alone
            found.append(alone)
    assert max(found) > 0
    # the shared loads are read, never added to: found again, they are the same
    for key, loads in builds._reduced.items():
        partial = any(t.src.spec.is_partial for t in tensors)
        assert bool(loads) == partial
        s = cut_slices(tensors, CLUSTER, Strategy.SEND_RECV, fine=key[-1])
        assert loads == floors.reduction_loads(s.reduces, CLUSTER)
        assert list(loads) == list(floors.reduction_loads(s.reduces, CLUSTER))


@pytest.mark.parametrize("src,dst,shape", MOVES)
def test_capacities_read_once_a_kind_are_each_resources(src, dst, shape, monkeypatch):
    tensors = _tensors(src, dst, shape)
    seen = []
    for old in (False, True):
        if old:
            monkeypatch.setattr(floors, "_busiest", _old_busiest)
            monkeypatch.setattr(floors, "_stepped", _old_stepped)
        got = []
        for baseline in BASELINES:
            for fine in (False, True):
                s = cut_slices(tensors, CLUSTER, baseline, fine=fine)
                load = floors.reduction_loads(s.reduces, CLUSTER)
                got.append((floors._busiest(load, CLUSTER), floors._stepped(load, CLUSTER, 1e-6),
                            floors.baseline_floor(s.work, s.reduces, s.itemsizes, CLUSTER,
                                                  baseline)))
        seen.append(got)
    assert seen[0] == seen[1]
    assert any(floor > 0 for _, _, floor in seen[0])


def _additions(rng, n):
    """``n`` additions: repeated keys, whole bytes and shares (floats whose sums depend
    on the order)."""
    return [(int(rng.integers(40)), int(rng.integers(-1, 5)),
             float(rng.random() * 1e6) if rng.random() < 0.5 else int(rng.integers(1, 1 << 40)))
            for _ in range(n)]


def _kind(chunks, rows):
    kind = floors._Kind()
    for chunk in chunks:
        index, step, nbytes = zip(*chunk) if chunk else ((), (), ())
        kind.add(np.array(index, dtype=np.int64), np.array(step, dtype=np.int64),
                 np.array(nbytes, dtype=np.float64))
    kind.rows.extend(rows)
    return kind


@pytest.mark.parametrize("n", [0, 1, 7, 300, 3000])
def test_additions_summed_in_a_dict_are_the_arrays_sums(n, monkeypatch):
    rng = np.random.default_rng(n)
    # rows alone, arrays (a cell of many receivers, the point-to-point rows) then rows
    for chunks in ([], [_additions(rng, n // 3), []], [_additions(rng, n), _additions(rng, 5)]):
        rows = _additions(rng, n)
        got = _kind(chunks, rows).items()
        monkeypatch.setattr(floors, "DICT_SUM_UP_TO", -1)  # the arrays' sums
        want = _kind(chunks, rows).items()
        monkeypatch.undo()
        assert got == want
        assert [type(b) for _, b in got] == [float] * len(got)
        keys = {(i, s) for chunk in chunks for i, s, _ in chunk} | {(i, s) for i, s, _ in rows}
        assert len(got) == len(keys)
