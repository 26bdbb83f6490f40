"""How many devices of each host need part of a partial-sum box: where its reduction's
roots go (:func:`~reshard.planner.cells.reduce.reduce_sources` reduces a box on the
hosts that want it most).

Per source box, every destination box it meets adds one for each of its needers to the
needer's host. Counted device by device, a 1,024-device S0R+P1 -> RS0 walks 128
source boxes times 1,024 needers (131,072 additions, half the planning of the cut).
Where the boxes make :data:`TABLE_FROM` pairs or more, the counts are found at once:
which boxes meet (a matrix of the pairs, each the test of
:func:`~reshard.layout.boxes_meet`), read per needer device and summed host by host
(whole numbers, exact). The counts are the same; only ``get`` reads them, so their
order is free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from reshard.layout import Box, boxes_meet

TABLE_FROM = 1024
"""Pairs of source and destination boxes from which the counts are found as arrays."""

Wanted = Callable[[Box], dict[int, int]]
"""A source box's count of needers by host (hosts with none left out)."""


def wanting_hosts(boxes: list[Box], needers: Mapping[Box, frozenset[int]],
                  host: Callable[[int], int]) -> Wanted:
    """Per box of ``boxes``, its needers' count by host (module docstring)."""
    if len(boxes) * len(needers) < TABLE_FROM or not boxes or not len(boxes[0]):
        return lambda box: _one_by_one(box, needers, host)
    return _at_once(boxes, needers, host).__getitem__


def _one_by_one(box: Box, needers: Mapping[Box, frozenset[int]],
                host: Callable[[int], int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for dbox, devs in needers.items():
        if boxes_meet(box, dbox):
            for d in devs:
                h = host(d)
                counts[h] = counts.get(h, 0) + 1
    return counts


def _at_once(boxes: list[Box], needers: Mapping[Box, frozenset[int]],
             host: Callable[[int], int]) -> dict[Box, dict[int, int]]:
    ndim = len(boxes[0])
    dst = list(needers)
    src_b = np.array(boxes, dtype=np.int64).reshape(len(boxes), 1, ndim, 2)
    dst_b = np.array(dst, dtype=np.int64).reshape(1, len(dst), ndim, 2)
    p, q = src_b[..., 0], src_b[..., 1]
    r, t = dst_b[..., 0], dst_b[..., 1]
    meet = np.asarray(((p < q) & (r < t) & (p < t) & (r < q)).all(axis=2))  # boxes x needer boxes
    dev_box: list[int] = []  # per needer device (box by box): its box, its host
    dev_host: list[int] = []
    for i, dbox in enumerate(dst):
        for d in needers[dbox]:
            dev_box.append(i)
            dev_host.append(host(d))
    if not dev_box:
        return {box: {} for box in boxes}
    hosts = np.array(dev_host, dtype=np.int64)
    order = np.argsort(hosts, kind="stable")  # the devices host by host
    hosts = hosts[order]
    starts = np.flatnonzero(np.concatenate(([True], hosts[1:] != hosts[:-1])))
    wants = meet[:, np.array(dev_box, dtype=np.int64)[order]].astype(np.int64)
    counts = np.add.reduceat(wants, starts, axis=1).tolist()  # (boxes, hosts)
    named = hosts[starts].tolist()
    return {box: {named[j]: c for j, c in enumerate(row) if c}
            for box, row in zip(boxes, counts)}


__all__ = ["TABLE_FROM", "Wanted", "wanting_hosts"]
