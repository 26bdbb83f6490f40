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
    at = int(slab.ctypes.data)
    assert slab.nbytes == 100 and not regs.stale.hits((at, slab.nbytes))
    # a block of a slab registered for good: other arrays come and go, it stays
    (run,) = [r for r in agent.live if r[0] <= at < r[0] + r[1]]
    for _ in range(3):
        regs.unpin(regs.ensure([_view(np.zeros(512, np.uint8))]))
    assert run in agent.live
    # a view of the block is the slab's registration, not one of its own
    before = regs.registered
    assert [r for r, _ in regs.ensure([_view(slab[10:20])])] == [run]
    assert regs.registered == before
    # with no pool (a cap of 0), staging still has buffers of its own, off stale memory
    bare = Registrations(_Agent(), limit=1)
    bare.pool.cap = 0
    assert bare.pool.empty(10, np.uint8) is None
    got = bare.staging(5000)
    assert got.nbytes == 5000 and bare.pool.total == 0


def test_the_pool_carves_registered_slabs_and_takes_blocks_back():
    from reshard.comm.backends.nixl_pool import ALIGN, Pool

    made: list = []

    def register(slab):
        made.append(slab)
        return None if len(made) == 1 else (int(slab.ctypes.data), slab.nbytes)

    pool = Pool(register, slab=1 << 20, cap=3 << 20)
    a = pool.empty(1000, np.float32)
    b = pool.empty(10, np.int8)
    assert len(made) == 2  # the first mapping refused (as on stale memory): another
    assert a.dtype == np.float32 and a.shape == (1000,) and a.flags.writeable
    pa, pb = int(a.ctypes.data), int(b.ctypes.data)
    assert pa % ALIGN == 0 and pb % ALIGN == 0 and pb >= pa + a.nbytes  # apart
    assert pool.slab_of((pb, 10)) == pool.slab_of((pa, 4000)) is not None
    assert pool.slab_of((pa - 1, 4)) is None
    a[:] = 1.5
    b[:] = 7
    assert (a == 1.5).all() and (b == 7).all()
    view = a[100:200].reshape(10, 10)  # a view keeps the block
    del a
    assert pool.empty(1000, np.float32).ctypes.data != pa
    del view
    again = pool.empty(1000, np.float32)  # the block is back (first fit)
    assert int(again.ctypes.data) == pa
    big = pool.empty(3 << 19, np.uint8)  # 1.5 MiB: a slab of its own (2 MiB)
    assert big is not None and pool.total == 3 << 20
    assert pool.empty(1 << 20, np.uint8) is None  # a new slab would pass the cap
    assert pool.empty(0, np.uint8) is None
    del again, b, big
    assert pool.free_bytes() == pool.total  # every block back, merged


def test_the_pool_cap_is_read_from_the_environment(monkeypatch):
    import pytest

    from reshard.comm.backends.nixl_memory import POOL_ENV

    monkeypatch.setenv(POOL_ENV, "1.5")
    assert Registrations(_Agent()).pool.cap == 3 << 19
    monkeypatch.setenv(POOL_ENV, "0")
    assert Registrations(_Agent()).pool.cap == 0
    for bad in ("-1", "lots", "nan"):
        monkeypatch.setenv(POOL_ENV, bad)
        with pytest.raises(ValueError, match=POOL_ENV):
            Registrations(_Agent())
    monkeypatch.delenv(POOL_ENV)
    assert Registrations(_Agent()).pool.cap > 0  # half the machine's memory


def test_a_failed_operation_s_registrations_are_given_up_and_its_buffers_kept():
    """Issue 61, item 11: a receive whose peer died is abandoned: its registrations are
    deregistered at once (a told one becomes stale and is reported dropped), one
    another operation still pins stays, and the buffers live until release."""
    agent = _Agent()
    regs = Registrations(agent, limit=8)
    a, b = np.zeros(100, np.uint8), np.zeros(200, np.uint8)
    failed = regs.ensure([_view(a), _view(b)])
    other = regs.ensure([_view(b)])  # another operation in flight uses b too
    regs.told(failed)
    regs.abandon(failed, keep=(a, b))
    assert agent.live == {(b.ctypes.data, b.nbytes)} and regs.pinned == 1
    assert regs.abandoned == 1 and regs.stale.hits((a.ctypes.data, 1))
    assert [run for run, _ in regs.dropped()] == [(a.ctypes.data, a.nbytes)]
    assert regs.kept == [(a, b)]
    regs.unpin(other)
    regs.release()
    assert not agent.live and not regs.kept and regs.pinned == 0
