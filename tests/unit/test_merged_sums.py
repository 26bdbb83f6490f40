"""A floor's kinds with repeated arrays merged as whole bytes (merged_sums, issue 62
round twelve): where every value is a whole number and the bytes stay below 2**53, the
same keys in the same order and the same sums as the additions one by one; otherwise
refused (Inexact) and counted one by one, the same floors."""

from __future__ import annotations

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.cells.whole_sums import EXACT
from reshard.planner.cuts import cut_slices
from reshard.planner.plan import planned_tensors
from reshard.planner.schedule import floors
from reshard.planner.schedule.merged_sums import Inexact, MergedKind
from reshard.planner.values.strategy import Strategy

BIG = Cluster.preset("dgx-h100", 32)
A = DeviceMesh((16, 8), range(128))
B = DeviceMesh((16, 8), range(128, 256))
C = DeviceMesh((8, 16), range(64, 192))  # overlaps A and B
SMALL = Cluster.preset("dgx-h100", 8)
M = DeviceMesh((4, 8), range(32))
MOVES = [(BIG, A, B, "S10R", "RR", (4096, 64)), (BIG, A, A, "S10R", "RR", (4096, 64)),
         (BIG, A, B, "S01R", "RR", (1000, 5)), (BIG, B, A, "RS01", "RR", (640, 640)),
         (BIG, A, C, "S10R", "RR", (1000, 3)), (BIG, A, B, "S0R+P1", "RR", (512, 96)),
         (BIG, C, A, "RS1", "S0R", (1003, 77)), (BIG, A, B, "RR+P01", "RS0", (256, 64)),
         (SMALL, M, M, "S0R+P1", "RS0", (1024, 512)), (SMALL, M, M, "RS1+P0", "S0S1", (1000, 251)),
         (SMALL, M, M, "S0R", "RS1", (512, 512))]
BASELINES = (Strategy.SEND_RECV, Strategy.ALLGATHER)


def _additions(rng, whole: bool, arrays: int = 30):
    """Additions to both kinds alike: a few array pairs added again and again (the same
    objects, some with the same values), fresh arrays, and rows one by one between."""
    pairs = []
    for _ in range(4):
        n = int(rng.integers(1, 300))
        pairs.append((rng.integers(0, 200, n).astype(np.int64),
                      rng.integers(0, 3, n).astype(np.int64)))
    values = [0.0, 3.0, 4096.0, float(1 << 40), 12345.0] if whole else [0.1, 1e6 / 3, 3.0]
    out = []
    for _ in range(arrays):
        if rng.random() < 0.7:
            index, step = pairs[int(rng.integers(len(pairs)))]
        else:
            n = int(rng.integers(0, 100))
            index = rng.integers(0, 400, n).astype(np.int64)
            step = rng.integers(0, 3, n).astype(np.int64)
        out.append(("add", index, step, rng.choice(values, len(index))))
        for _ in range(int(rng.integers(0, 4))):
            out.append(("one", (int(rng.integers(0, 400)), int(rng.integers(0, 3)),
                                float(rng.choice(values)))))
    return out


def _fill(kind, additions):
    for what, *args in additions:
        if what == "add":
            kind.add(*args)
        else:
            kind.one(*args)
    return kind


@pytest.mark.parametrize("seed", range(8))
def test_merged_whole_bytes_are_the_sums_one_by_one(seed):
    rng = np.random.default_rng(seed)
    additions = _additions(rng, whole=True)
    want = _fill(floors._Kind(), additions).items()
    merged = _fill(MergedKind(), additions)
    assert len(merged.chunks) < sum(1 for a in additions if a[0] == "add")  # some merged
    assert floors._Kind(merged.exact_chunks()).items() == want
    assert len(want) > 100


@pytest.mark.parametrize("seed", range(4))
def test_bytes_not_whole_are_refused(seed):
    rng = np.random.default_rng(seed)
    with pytest.raises(Inexact):
        _fill(MergedKind(), _additions(rng, whole=False)).exact_chunks()


def test_merging_bytes_not_whole_would_change_a_sum():
    """Why the refusal: 0.1 added ten times is not 10 times 0.1."""
    index, step, tenth = np.zeros(1, np.int64), np.zeros(1, np.int64), np.array([0.1])
    ordered, merged = floors._Kind(), MergedKind()
    for kind in (ordered, merged):
        for _ in range(10):
            kind.add(index, step, tenth)
    assert ordered.items() != [((0, 0), float(tenth[0] * 10))]
    with pytest.raises(Inexact):
        merged.exact_chunks()


def test_bytes_at_two_to_the_53_are_refused():
    index, step = np.zeros(2, np.int64), np.arange(2, dtype=np.int64)
    kind = MergedKind()
    kind.add(index, step, np.array([EXACT / 4, 0.0]))
    kind.add(index, step, np.array([EXACT / 4, 0.0]))
    kind.one((0, 0, EXACT / 4))
    assert len(kind.exact_chunks()) == 2  # 3/4 of it: exact
    kind.add(index, step, np.array([0.0, EXACT / 4]))
    with pytest.raises(Inexact):
        kind.exact_chunks()


def _tensors(cluster, src_mesh, dst_mesh, src, dst, shape):
    tensors, _ = planned_tensors([(shape, "float32", Layout(src_mesh, src),
                                   Layout(dst_mesh, dst))], cluster, None, None)
    return tensors


def _items(flows):
    return [floors._Kind(k.exact_chunks()).items() if isinstance(k, MergedKind) else k.items()
            for k in (flows.dev_out, flows.dev_in, flows.nic_out, flows.nic_in)]


_COUNTED = floors._counted


def _one_by_one(work, itemsizes, cluster, strategy, merged):
    """:func:`floors._counted` never merged."""
    return _COUNTED(work, itemsizes, cluster, strategy, False)


@pytest.mark.parametrize("move", MOVES)
def test_merged_flows_are_the_flows_one_by_one(move, monkeypatch):
    cluster = move[0]
    tensors = _tensors(*move)
    merged_paths = 0
    for baseline in BASELINES:
        for fine in (False, True):
            s = cut_slices(tensors, cluster, baseline, fine=fine)
            want = _items(floors._counted(s.work, s.itemsizes, cluster, baseline, False))
            try:
                got = _items(floors._counted(s.work, s.itemsizes, cluster, baseline, True))
            except Inexact:
                got = None
            if got is not None:
                merged_paths += 1
                assert got == want
            floor = floors.baseline_floor(s.work, s.reduces, s.itemsizes, cluster, baseline)
            with monkeypatch.context() as m:  # every kind one by one
                m.setattr(floors, "_counted", _one_by_one)
                assert floors.baseline_floor(s.work, s.reduces, s.itemsizes, cluster,
                                             baseline) == floor
    assert merged_paths or move[5] == (1000, 3)


def test_a_run_of_like_cells_is_merged_and_refused_where_its_shares_are_not_whole():
    """The 1,024-device shape in small: 128 cells, one root each, to the same 128
    receivers; all-gathered shares of 4096*64*4 bytes are whole, of cells of 7*3*4 bytes not."""
    for shape, whole in (((4096, 64), True), ((1001, 3), False)):
        s = cut_slices(_tensors(BIG, A, B, "S10R", "RR", shape), BIG, Strategy.ALLGATHER)
        flows = floors._counted(s.work, s.itemsizes, BIG, Strategy.ALLGATHER, True)
        if whole:
            # every cell's receipts and shares: one array pair (after the no
            # point-to-point rows), added once per cell
            assert [len(c[0]) for c in flows.dev_in.chunks] == [0, 256]
            assert sum(n for _, n in flows.dev_in.chunks[1][2].values()) == \
                len(s.work.general) == 128
        else:
            with pytest.raises(Inexact):
                _items(flows)


def _rows(sent_bytes: float):
    """Gathered rows by hand (device, step, bytes, sent out, the root's, crossing): a
    share first, then the root's one send, then a share."""
    rows = (np.array([5, 6, 7]), np.array([1, 0, 1]), np.array([10.0, sent_bytes, 30.0]),
            np.array([True, True, True]), np.array([False, True, False]),
            np.array([False, True, False]))
    return rows


def test_a_roots_send_after_a_share_keeps_the_order_first_added():
    flows = floors._Flows(BIG, True)
    flows._gathered_merged(0, _rows(20.0), 0)
    ordered = floors._Kind()
    dev, steps, vals, out, is_sent, _ = _rows(20.0)
    ordered.add(np.where(is_sent, 0, dev)[out], steps[out], vals[out])
    assert floors._Kind(flows.dev_out.exact_chunks()).items() == ordered.items() == \
        [((5, 1), 10.0), ((0, 0), 20.0), ((7, 1), 30.0)]
    assert floors._Kind(flows.nic_out.exact_chunks()).items() == [((flows.nic_of[0], 0), 20.0)]


def test_a_roots_sends_not_whole_are_refused():
    with pytest.raises(Inexact):
        floors._Flows(BIG, True)._gathered_merged(0, _rows(0.5), 0)
