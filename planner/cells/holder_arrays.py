"""A holder set's devices read once (:class:`Holders`), and the root among many
holders picked by arrays (:func:`pick_root_arrays`): what
:meth:`Loads.pick_root <reshard.planner.cells.balance.Loads.pick_root>` and
:func:`~reshard.planner.cells.balance.slice_demand` read of a holder set apart from the
loads, found once per set (a replicated source's cells all share theirs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

ARRAY_HOLDERS = 64
"""Holders from which :func:`pick_root_arrays` picks the root (fewer: one by one)."""


class Holders:
    """A holder set's hosts and NICs: ``hosts`` (a frozenset), ``out`` (its NICs as
    the set built from it in its iteration order iterates them), and, for
    :data:`ARRAY_HOLDERS` or more, its devices sorted, their hosts and NICs as arrays
    and their NICs as a frozenset."""

    __slots__ = ("devices", "host_of", "hosts", "members", "nic_of", "nics", "out")

    def __init__(self, host: Callable[[int], int], nic: Callable[[int], int],
                 holders: frozenset[int]) -> None:
        self.members = holders
        self.hosts = frozenset({host(d) for d in holders})
        self.out = tuple({nic(d) for d in holders})
        self.nics = frozenset(self.out)
        self.devices: np.ndarray | None = None
        self.host_of: np.ndarray | None = None
        self.nic_of: list[int] | None = None
        if len(holders) >= ARRAY_HOLDERS:
            devs = sorted(holders)
            self.devices = np.array(devs, dtype=np.int64)
            self.host_of = np.fromiter(map(host, devs), dtype=np.int64, count=len(devs))
            self.nic_of = list(map(nic, devs))


HolderMemo = dict[frozenset[int], Holders]
""":class:`Holders` by holder set (it reads only the cluster)."""


def holders_of(memo: HolderMemo, host: Callable[[int], int], nic: Callable[[int], int],
               holders: frozenset[int]) -> Holders:
    """``holders``' :class:`Holders`, found once per set."""
    got = memo.get(holders)
    if got is None:
        got = memo[holders] = Holders(host, nic, holders)
    return got


class Loads(Protocol):
    """What :func:`pick_root_arrays` reads of a
    :class:`~reshard.planner.cells.balance.Loads` (which imports it)."""

    @property
    def nic_out(self) -> dict[int, float]: ...

    @property
    def dev_out(self) -> dict[int, float]: ...


def pick_root_arrays(loads: Loads, held: Holders, needer_hosts: set[int] | frozenset[int],
                     nbytes: int) -> int | None:
    """:meth:`Loads.pick_root` of many holders (``held``'s arrays), or ``None`` where
    the loads lack a holder's NIC or device (the loop reads them into the tables:
    only it adds them, in its order) or read NaN.

    The loop keeps the least key (NIC out load plus ``nbytes`` where the slice
    leaves the host, whether the host needs none, the device's send load, id), the
    same float sum per holder; the keys are distinct (the id), so the least is the
    one found by narrowing on each part in turn."""
    nic_out, dev_out = loads.nic_out, loads.dev_out
    devices, host_of, nic_of = held.devices, held.host_of, held.nic_of
    if devices is None or host_of is None or nic_of is None or \
            not nic_out.keys() >= held.nics or not dev_out.keys() >= held.members:
        return None
    n = len(devices)
    sent = np.fromiter(map(nic_out.__getitem__, nic_of), dtype=np.float64, count=n)
    if len(needer_hosts) == 1:
        (only,) = needer_hosts
        away = host_of != only
    else:
        away = ~np.isin(host_of, list(needer_hosts))
    remote = away if len(needer_hosts) <= 1 else np.ones(n, dtype=bool)
    first = sent + np.where(remote, nbytes, 0)
    if np.isnan(first).any():
        return None
    at = np.flatnonzero(first == first.min())
    if len(at) > 1:
        second = away[at]
        at = at[second == second.min()]
    if len(at) > 1:
        third = np.fromiter(map(dev_out.__getitem__, devices[at].tolist()), dtype=np.float64,
                            count=len(at))
        if np.isnan(third).any():
            return None
        at = at[third == third.min()]
    return int(devices[at[0]])


__all__ = ["ARRAY_HOLDERS", "HolderMemo", "Holders", "holders_of", "pick_root_arrays"]
