"""A partial-sum box's needers counted by host at once
(:mod:`reshard.planner.cells.wanting_hosts`, issue 62 round seventeen) against the
count device by device it replaces, on random boxes of one to three dims (empty boxes,
boxes meeting none or all, needer sets empty, shared and on few or many hosts); and
the reductions of partial sources (1,024 devices' shapes at 4x8 sizes) the same tasks
and holders with the counts found either way."""

from __future__ import annotations

import random

import pytest

from reshard import Cluster
from reshard.planner.cells import wanting_hosts as wh
from reshard.planner.cells.balance import Loads
from reshard.planner.cells.decompose import devices_by_box
from reshard.planner.cells.reduce import reduce_sources

from .test_held_allgather_floor import H100, _tensors


def _box(rng: random.Random, shape):
    out = []
    for n in shape:
        a = rng.randrange(n + 1)
        out.append((a, rng.randrange(a, n + 1)))
    return tuple(out)


@pytest.mark.parametrize("seed", range(8))
def test_the_counts_device_by_device(seed):
    rng = random.Random(seed)
    for _ in range(60):
        shape = tuple(rng.randint(1, 9) for _ in range(rng.randint(1, 3)))
        boxes = list(dict.fromkeys(_box(rng, shape) for _ in range(rng.randint(1, 70))))
        needers = {_box(rng, shape): frozenset(rng.sample(range(40), rng.randint(0, 6)))
                   for _ in range(rng.randint(1, 70))}
        per = rng.choice([1, 3, 8, 40])
        host = {d: d // per for d in range(40)}.__getitem__
        at_once = wh._at_once(boxes, needers, host)
        wanted = wh.wanting_hosts(boxes, needers, host)
        for box in boxes:
            want = wh._one_by_one(box, needers, host)
            assert at_once[box] == want and wanted(box) == want
            assert all(type(h) is int and type(c) is int for h, c in at_once[box].items())


def test_no_needer_devices():
    boxes = [((0, 4),), ((4, 8),)] * 1
    needers = {((i, i + 1),): frozenset() for i in range(8)}
    assert wh._at_once(boxes, needers, int) == {b: {} for b in boxes}


@pytest.mark.parametrize("src,dst,shape,dims,how", [
    ("S0R+P1", "RS0", (4096, 4096), (32, 32), "cross"),
    ("RS1+P0", "S0S1", (1000, 4100), (16, 16), "overlap"),
    ("RR+P0", "RS0", (2048, 2048), (8, 32), "same"),
    ("S1R+P0", "RS0", (999, 4097), (4, 8), "cross")])
def test_a_partial_sources_reductions_either_way(monkeypatch, src, dst, shape, dims, how):
    cluster = H100 if dims[0] * dims[1] <= 32 else \
        Cluster.preset("dgx-h100", dims[0] * dims[1] * 2 // 8)
    (t,) = _tensors(src, dst, shape, how, cluster, dims)
    needers = devices_by_box(t.dst, t.shape)

    def run():
        loads = Loads(cluster)
        held, tasks = reduce_sources(t, 0, loads, needers, 1 << 16)
        return held, tasks, dict(loads.dev_in), dict(loads.nic_in)

    monkeypatch.setattr(wh, "TABLE_FROM", 1)
    fast = run()
    monkeypatch.setattr(wh, "TABLE_FROM", 1 << 60)
    assert fast == run()
