"""reduce._others with each member's index found once (reduce._positions, what
reduce_share uses from POSITIONS_FROM roots) against filtering the group: groups with
and without repeated members, roots in and not in them; and reduce_share's tasks and
loads with the positions against without them (POSITIONS_FROM past every root)."""

from __future__ import annotations

import random

import pytest

from reshard.planner.cells import reduce


def test_addends_by_positions_equal_filtering():
    rng = random.Random(11)
    seen_none = seen_some = 0
    for _ in range(600):
        group = tuple(rng.choice(range(40)) for _ in range(rng.randint(1, 30)))
        at = reduce._positions(group)
        if at is None:
            assert len(set(group)) < len(group)
            seen_none += 1
            continue
        seen_some += 1
        assert at == {d: group.index(d) for d in group}
        for root in range(42):  # in the group and not
            got = reduce._others(group, root, at)
            assert got == tuple(d for d in group if d != root)
            assert type(got) is tuple
    assert seen_none > 50 and seen_some > 50


@pytest.mark.parametrize("devices,per_nic", [(64, 1), (128, 2), (48, 4)])
def test_reduce_share_with_positions_is_reduce_share_searching(devices, per_nic, monkeypatch):
    from reshard.planner.cells.balance import Loads
    from tests.unit._regular_clusters import regular_clusters

    cluster = regular_clusters(devices // 8, 8)["two-nics" if per_nic > 1 else "preset"]

    def run():
        loads = Loads(cluster)
        out, tasks = {}, []
        group = tuple(range(0, devices, 1))
        reduce.reduce_share(0, ((0, 4096), (0, 512)), group, list(group), 4096 * 512 * 4,
                            4, 0, loads, 1 << 12, out, tasks)
        return out, tasks, {k: dict(v) for k, v in vars(loads).items()
                            if isinstance(v, dict)}

    got, threshold = run(), reduce.POSITIONS_FROM
    monkeypatch.setattr(reduce, "POSITIONS_FROM", 1 << 30)
    want = run()
    assert got[1] == want[1] and got[0] == want[0] and got[2] == want[2]
    assert len({t.root for t in got[1]}) >= threshold
