"""The chains :meth:`Loads.relay_chain <reshard.planner.cells.balance.Loads.relay_chain>`
worked out, remembered by what their answers read (:class:`ChainMemo`)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Protocol

from reshard.cluster import Cluster


class Loads(Protocol):
    """What :class:`ChainMemo` reads of a :class:`~reshard.planner.cells.balance.Loads`
    (which imports it)."""

    @property
    def host(self) -> Callable[[int], int]: ...

    @property
    def nic(self) -> Callable[[int], int]: ...

    @property
    def cluster(self) -> Cluster: ...

    @property
    def nic_out(self) -> dict[int, float]: ...

    @property
    def nic_in(self) -> dict[int, float]: ...

    @property
    def keep_off(self) -> dict[int, frozenset[int]]: ...

    @property
    def _epoch(self) -> int: ...

    def _relay_through(self, root: int, receivers: Iterable[int], nbytes: int
                       ) -> tuple[tuple[int, ...], tuple[int, ...]]: ...

MEMO_NICS = 256
"""The most NICs whose loads key a chain :meth:`Loads.relay_chain` remembers."""


INDEX_RANKS = 12
"""Values from which :func:`_ranks` looks each up in a table (fewer: its place in the
sorted distinct values, found by a scan that costs less than the table's build)."""


def _ranks(values: tuple[float, ...]) -> tuple[int, ...]:
    """Each value's dense rank among ``values`` (the same comparisons, ties included,
    as the values themselves): its place among the sorted distinct values."""
    distinct = sorted(set(values))
    if len(values) <= INDEX_RANKS:
        return tuple(map(distinct.index, values))
    return tuple(map(dict(zip(distinct, range(len(distinct)))).__getitem__, values))


Reader = Callable[[dict[int, float]], tuple[float, ...]]
"""Some NICs' loads read from a table of loads, as a tuple (:func:`_reader`)."""


def _reader(nics: list[int]) -> Reader:
    """A function reading the loads of ``nics`` from a table of loads (a
    ``defaultdict``: an unseen NIC reads 0.0), as a tuple."""
    if len(nics) == 1:
        (n,) = nics
        return lambda table: (table[n],)
    return operator.itemgetter(*nics)


Memo = tuple[Reader | None,
             dict[tuple[object, ...], tuple[tuple[int, ...], tuple[int, ...]]] | None]
"""A root and receivers' entry in :class:`ChainMemo`: their reader (None: too many
NICs) and their answers by what they read (None: asked once)."""


class ChainMemo:
    """The chains :meth:`Loads.relay_chain` worked out for one accumulator (a
    planning call's), per root and receivers: the NICs whose loads the answer reads,
    and the answers by what they read. Keyed by all an answer reads: the order of
    the NIC loads (``nic_out``, ``nic_in``) of every NIC on the hosts it touches
    (:meth:`Loads.chain` and :meth:`Loads._relay` only compare them; their dense
    ranks keep every comparison, ties included), and, with several NICs per host,
    the bytes, the root's ``keep_off`` and the accumulator's epoch (its expectations,
    relays' moves and shared total change only with a new one,
    :meth:`Loads.expected_changed`). An answer that relays moves bytes (a new epoch)
    and is not kept. A root and receivers asked for the first time are only noted
    (most chains of a plan are asked for once: keys would cost more than they save);
    above :data:`MEMO_NICS` NICs a call is worked out afresh (the keys would outweigh
    the answers)."""

    def __init__(self) -> None:
        self.chains: dict[tuple[int, frozenset[int] | tuple[int, ...]], Memo] = {}
        # each touched host set's reader (its hosts' NICs, sorted), found once
        self.readers: dict[frozenset[int], Reader | None] = {}

    def _noted(self, loads: Loads, root: int, members: frozenset[int] | tuple[int, ...],
               group: Iterable[int]) -> Memo | None:
        """What :meth:`answer` notes of a question before it reads the loads: a root
        and receivers (``members``: ``group`` as a key) asked the first time noted
        (None), the second time given their reader; their entry."""
        memo = self.chains.get((root, members))
        if memo is None:  # asked once: most are never asked again, keep only that
            self.chains[(root, members)] = (None, None)
            return None
        if memo[1] is None:
            host = loads.host
            touched = frozenset({host(root), *map(host, group)})
            if touched not in self.readers:
                hosts, nic = loads.cluster.hosts, loads.nic
                nics = sorted({nic(d) for h in touched for d in hosts[h]})
                self.readers[touched] = _reader(nics) if len(nics) <= MEMO_NICS else None
            memo = self.chains[(root, members)] = (self.readers[touched], {})
        return memo

    def reads(self, loads: Loads, root: int, group: frozenset[int]) -> bool:
        """:meth:`answer`'s notes of a question, and whether it then reads the NIC
        loads (a reader kept: it looks the answer up by them, adding every unseen NIC
        it reads to the tables); else it works the chain out afresh, reading no
        table."""
        memo = self._noted(loads, root, group, group)
        return memo is not None and memo[0] is not None

    def answer(self, loads: Loads, root: int, group: frozenset[int] | tuple[int, ...],
               nbytes: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``loads._relay_through(root, group, nbytes)``, remembered."""
        members = group if isinstance(group, frozenset) else tuple(sorted(group))
        memo = self._noted(loads, root, members, group)
        read, answers = memo if memo is not None else (None, None)
        if read is None or answers is None:
            return loads._relay_through(root, group, nbytes)
        key = (_ranks(read(loads.nic_out)), _ranks(read(loads.nic_in)),
               (nbytes, loads._epoch, loads.keep_off.get(root))
               if loads.cluster.nics_per_host > 1 else None)
        got = answers.get(key)
        if got is None:
            epoch = loads._epoch
            got = loads._relay_through(root, group, nbytes)
            if loads._epoch == epoch:
                answers[key] = got
        return got


__all__ = ["MEMO_NICS", "ChainMemo"]
