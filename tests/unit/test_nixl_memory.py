"""The nixl backend's registrations, against a recording stand-in for NIXL's agent (the
real one is held to its signatures by tests/contract/test_nixl_contract.py): an array is
registered once however many views of it move, at most ``limit`` arrays stay registered,
the least recently used go first, and never one an operation has pinned."""

from __future__ import annotations

from typing import Any

import numpy as np

from reshard.comm.backends.nixl_memory import Registrations, cut, paired


class _Agent:
    """Records registrations; a registration is its run."""

    def __init__(self) -> None:
        self.live: set[tuple[int, int]] = set()

    def register_memory(self, descs: list, kind: str) -> Any:
        at, n, _, _ = descs[0]
        self.live.add((at, n))
        return (at, n)

    def deregister_memory(self, reg: Any) -> None:
        self.live.remove(reg)


def _view(a: np.ndarray) -> memoryview:
    return memoryview(a.reshape(-1)).cast("B")


def test_an_array_is_registered_once_for_all_its_views():
    agent = _Agent()
    regs = Registrations(agent, limit=8)
    a = np.zeros((4, 16), np.float32)
    got = regs.ensure([_view(a[0]), _view(a[2]), _view(a)])
    assert len({run for run, _ in got}) == 1 and regs.registered == 1
    assert agent.live == {(a.ctypes.data, a.nbytes)}


def test_pinned_registrations_outlive_the_limit_and_go_once_unpinned():
    agent = _Agent()
    regs = Registrations(agent, limit=2)
    arrays = [np.zeros(64 + i, np.uint8) for i in range(4)]
    pins = [regs.ensure([_view(a)]) for a in arrays]
    assert regs.held == 4 and regs.trimmed == 0  # every one in use: none may go
    regs.unpin(pins[2])
    regs.unpin(pins[0])
    # two over the limit, both unpinned: the oldest first (0, then 2)
    assert regs.held == 2 and regs.trimmed == 2
    assert agent.live == {(a.ctypes.data, a.nbytes) for a in (arrays[1], arrays[3])}
    regs.unpin(pins[1])
    regs.unpin(pins[3])
    assert regs.held == 2  # within the limit: nothing more goes


def test_a_registration_used_again_is_the_most_recent():
    agent = _Agent()
    regs = Registrations(agent, limit=2)
    a, b, c = (np.zeros(32 + i, np.uint8) for i in range(3))
    for x in (a, b, a, c):
        regs.unpin(regs.ensure([_view(x)]))
    assert agent.live == {(a.ctypes.data, a.nbytes), (c.ctypes.data, c.nbytes)}
    assert regs.registered == 3  # a's second use registered nothing


def test_both_sides_cut_at_the_union_of_their_boundaries():
    mine, theirs = paired(cut([(100, 10), (200, 6)], 2, 14), [(0, 4), (50, 8)])
    assert mine == [(102, 4), (106, 4), (200, 4)]
    assert theirs == [(0, 4), (50, 4), (54, 4)]


def test_intervals_merge_and_answer_overlaps():
    from reshard.comm.backends.nixl_memory import Intervals

    iv = Intervals()
    for run in [(100, 10), (200, 10), (105, 20), (300, 5), (210, 40), (250, 50)]:
        iv.add(run)
    # [100, 125), [200, 305): the touching and overlapping ones merged
    assert len(iv) == 2
    assert iv.hits((124, 1)) and not iv.hits((125, 75)) and iv.hits((90, 11))
    assert not iv.hits((0, 100)) and iv.hits((304, 10)) and not iv.hits((305, 10))
    rng = np.random.default_rng(3)
    iv, marked = Intervals(), np.zeros(2000, bool)
    for _ in range(60):
        a, n = int(rng.integers(0, 1900)), int(rng.integers(1, 60))
        iv.add((a, n))
        marked[a:a + n] = True
    for _ in range(300):  # against a bitmap of the same ranges
        a, n = int(rng.integers(0, 1990)), int(rng.integers(1, 10))
        assert iv.hits((a, n)) == bool(marked[a:a + n].any()), (a, n)


def test_memory_told_and_deregistered_is_stale_and_receives_there_are_staged():
    """A registration a peer was told of becomes stale memory when it goes (one never
    told does not), is reported once as dropped, and a receive into an array over it
    lands in a staging buffer: registered for good, never on stale memory, reused."""
    agent = _Agent()
    regs = Registrations(agent, limit=1)
    told, untold = np.zeros(4096, np.uint8), np.zeros(2048, np.uint8)
    got = regs.ensure([_view(told)])
    regs.told(got)
    regs.unpin(got)
    regs.unpin(regs.ensure([_view(untold)]))  # over the limit: the told one goes
    assert regs.trimmed == 1 and len(regs.stale) == 1
    assert regs.dropped() == got and regs.dropped() == []
    inside = told[1000:1100]  # a view of memory now stale, and one of fresh memory
    fresh = np.zeros(64, np.uint8)
    views = [_view(fresh), _view(inside)]
    from reshard.comm.backends.nixl_memory import runs_of

    assert regs.stale_under(views, runs_of(views)) == [1]
    slab = regs.staging(100)
    assert slab.nbytes >= 100 and not regs.stale.hits((slab.ctypes.data, slab.nbytes))
    assert (slab.ctypes.data, slab.nbytes) in agent.live
    for _ in range(3):  # pinned for good: other arrays come and go, the slab stays
        regs.unpin(regs.ensure([_view(np.zeros(512, np.uint8))]))
    assert (slab.ctypes.data, slab.nbytes) in agent.live
    regs.restage(slab)
    assert regs.staging(50) is slab  # the free one serves the next receive
    other = regs.staging(50)
    assert other is not slab
    big = regs.staging(3 << 20)  # larger than any free one: a new, larger buffer
    for s in (big, other, slab):
        regs.restage(s)
    assert regs.staging(2 << 20) is big and regs.staging(10) is not big
