"""What the receivers of a cell of several holders take in under an ``allgather`` plan.

:func:`~reshard.planner.cells.cell_tasks.plan_allgather` sends such a cell to each host
of its receivers: whole to each receiver where a holder is on the host or it has one
receiver (through the receiver's NIC where no holder is on its host), else a piece to
each receiver through its NIC, which the receivers all-gather at the step after (each
takes the others' pieces in and passes its own on). Which holder sends is the plan's
choice, so only the receipts (and the shares passed on) are the plan's whoever sends.
Both floors that count them read them here: the slices' whole floor
(:mod:`reshard.planner.schedule.floors`) and the quicker receipts floor
(:mod:`reshard.planner.passes.gather_floor`), and both size a cell's pieces by
:func:`piece_sizes` (the sizes read the box's extents alone, so cells of one shape,
item size and count of pieces share them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from reshard.layout import Box, box_size
from reshard.planner.cells.cell_tasks import split_box
from reshard.planner.values.resources import DEV_IN, DEV_OUT, NIC_IN

HostReceivers = tuple[tuple[bool, tuple[int, ...]], ...]
"""Per host of a cell's receivers (in the order its first receiver comes): whether a
holder is on it, and its receivers in the order given."""


def host_receivers(receivers: Iterable[int], holders: Iterable[int],
                   host: Mapping[int, int]) -> HostReceivers:
    """:data:`HostReceivers` of ``receivers`` (``holders``: the cell's holders)."""
    held = {host[d] for d in holders}
    by_host: dict[int, list[int]] = {}
    for r in receivers:
        by_host.setdefault(host[r], []).append(r)
    return tuple((h in held, tuple(members)) for h, members in by_host.items())


PieceSizes = dict[tuple[tuple[int, ...], int, int], list[int]]
"""Bytes of each piece of a box by the box's extents, the count of pieces and the
bytes per element (:func:`piece_sizes`' memo)."""


def piece_sizes(box: Box, k: int, item: int, known: PieceSizes) -> list[int]:
    """The bytes of ``box``'s ``k`` pieces (:func:`~reshard.planner.cells.cell_tasks.
    split_box`, ``item`` bytes an element), kept in ``known`` by the box's extents
    (:func:`split_box` cuts a box by its extents alone: a box of the same extents
    elsewhere has pieces of the same sizes)."""
    key = (tuple(hi - lo for lo, hi in box), k, item)
    sizes = known.get(key)
    if sizes is None:
        sizes = known[key] = [box_size(p) * item for p in split_box(box, k)]
    return sizes


def held_receipts(hosts: HostReceivers, nbytes: int, step: int, nic: Mapping[int, int],
                  pieces: Callable[[int], Sequence[int]]
                  ) -> Iterator[tuple[str, int, int, float]]:
    """Each (resource kind, device or NIC, step, bytes) the receivers of a cell of
    ``nbytes`` at ``step`` take in or pass on (module docstring), host by host in the
    order of ``hosts``; ``pieces(k)``: the bytes of the cell's ``k`` pieces."""
    for held, members in hosts:
        k = len(members)
        if held or k == 1:
            for m in members:
                yield DEV_IN, m, step, nbytes
            if not held:
                yield NIC_IN, nic[members[0]], step, nbytes
            continue
        for m, b in zip(members, pieces(k)):
            if b:
                yield DEV_IN, m, step, b
                yield NIC_IN, nic[m], step, b
        share = nbytes * (k - 1) / k
        for m in members:
            yield DEV_IN, m, step + 1, share
            yield DEV_OUT, m, step + 1, share


__all__ = ["HostReceivers", "PieceSizes", "held_receipts", "host_receivers", "piece_sizes"]
