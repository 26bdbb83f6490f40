"""The expected NIC demand of a work list's general cells, each distinct one's found once.

A broadcast's pieces (a cell split for balance, a reduced piece's every share) repeat
one (holders, needers, bytes); :class:`DemandMemo` asks :meth:`Loads.demand` once per
distinct one and adds the amounts found in the same order each time: the same sums as
:meth:`Loads.expect` of every cell in turn (:class:`~reshard.planner.schedule.work.
WorkList`'s ``_Demand``)."""

from __future__ import annotations

from reshard.planner.cells.balance import Loads
from reshard.planner.values.resources import NIC_OUT


class DemandMemo:
    """:meth:`Loads.expect` for the general cells of one work list, each distinct
    (holders, needers, bytes) worked out once (:meth:`Loads.demand`, which reads
    nothing but its arguments and the cluster): a broadcast's pieces (a cell split for
    balance, a reduced piece's every share) repeat it. Each call adds the amounts
    found once in the same order (:meth:`Loads.add_demand`): the same sums, bit for
    bit."""

    def __init__(self, loads: Loads) -> None:
        self.loads = loads
        self.known: dict[tuple[frozenset[int], frozenset[int], int],
                         tuple[list[tuple[tuple[str, int], float]], float]] = {}
        self.one: dict[tuple[frozenset[int], int, int],
                       tuple[float | None, list[tuple[tuple[str, int], float]], float]] = {}

    def expect(self, holders: frozenset[int], needers: frozenset[int], nbytes: int) -> None:
        """``loads.expect(holders, needers - holders, nbytes)``."""
        if len(holders) == 1 and len(needers) > 1 and holders.isdisjoint(needers):
            self._one(holders, needers, nbytes)
            return
        key = (holders, needers, nbytes)
        got = self.known.get(key)
        if got is None:
            got = self.known[key] = self.loads.demand(holders, needers - holders, nbytes)
        self.loads.add_demand(*got)

    def _one(self, holders: frozenset[int], needers: frozenset[int], nbytes: int) -> None:
        """:meth:`expect` of one holder that needs nothing, its demand found once per
        needers, bytes and holder's host: :func:`~reshard.planner.cells.balance.
        slice_demand` reads nothing else of one holder but its NIC, which only names
        the ``NIC_OUT`` amount (the first, with any: ``nbytes * hosts entered / 1``).
        The same amounts added in the same order."""
        loads = self.loads
        (h,) = holders
        key = (needers, nbytes, loads.host(h))
        got = self.one.get(key)
        if got is None:
            amounts, shared = loads.demand(holders, needers, nbytes)
            got = self.one[key] = (amounts[0][1] if amounts else None, amounts[1:], shared)
        out, entries, shared = got
        expected = loads.expected
        if out is not None:
            expected[(NIC_OUT, loads.nic(h))] += out
        for k, amount in entries:
            expected[k] += amount
        if loads.cluster.shared_bandwidth:
            loads.shared += shared
        loads.expected_changed()


__all__ = ["DemandMemo"]
