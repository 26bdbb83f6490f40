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
