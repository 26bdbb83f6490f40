"""Broadcast trees: a chain that crosses many hosts, reshaped so its bytes reach the
farthest host after a few hops.

A pipelined chain pays one latency per hop: through 16 hosts of 8 GPUs that is 16
network and 113 NVLink latencies, 40% of a 250 MiB broadcast on DGX H100 machines. A
binary tree over the hosts pays log2 of the network hops, but its inner hosts send
every byte twice, so their NICs carry double. Two complementary trees fix that, as
NCCL's double binary tree does for all-reduce: the box is halved, each half goes down
its own binary tree over the same hosts, and every host is an inner node of at most
one of them, so each host's NIC sends at most the box once and receives it once, as
in the chain. Inside each host the entry device passes the pieces on to the host's
other receivers, all at once (``star``: one more latency, the entry sends k times) or
in a chain (``chain``: the entry sends once).

Pure: :func:`treeify` rewrites tasks; the planner keeps whichever plan the cost model
says is faster (:func:`reshard.planner.plan.plan_many`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence

from reshard.layout import box_size
from reshard.planner.cell_tasks import split_box
from reshard.planner.ir import Task, TaskKind

MIN_HOSTS = 3
"""A chain is reshaped only when it enters at least this many hosts after its root's
(over two hosts a tree is the chain)."""

INTRA = ("star", "chain")
"""How a tree's entry device passes the pieces on inside its host."""


def _segments(task: Task, host: Callable[[int], int]) -> list[list[int]]:
    """The chain root -> receivers cut where it changes host (root's segment first)."""
    segs: list[list[int]] = [[task.root]]
    for d in task.receivers:
        if host(d) == host(segs[-1][0]):
            segs[-1].append(d)
        else:
            segs.append([d])
    return segs


def remote_hosts(task: Task, host: Callable[[int], int]) -> int:
    """How many hosts other than the root's a chain broadcast enters."""
    return len(_segments(task, host)) - 1


def _heap_parent(i: int) -> int:
    return (i - 1) // 2


def _tree_edges(order: Sequence[int], exit_dev: int, entry: dict[int, int],
                members: dict[int, list[int]], intra: str) -> list[tuple[int, int]]:
    """(parent, receiver) pairs of one binary tree over ``order`` (hosts in heap order:
    host ``order[i]``'s parent host is ``order[(i - 1) // 2]``, the first host's is
    ``exit_dev``'s), each host's entry then passing on to its members."""
    edges: list[tuple[int, int]] = []
    for i, h in enumerate(order):
        e = entry[h]
        edges.append((exit_dev if i == 0 else entry[order[_heap_parent(i)]], e))
        prev = e
        for m in members[h]:
            edges.append((e if intra == "star" else prev, m))
            prev = m
    return edges


def _split_task(task: Task, host: Callable[[int], int], intra: str) -> list[Task]:
    """``task`` (a chain broadcast) as two half-box tasks down complementary binary
    trees over its remote hosts."""
    segs = _segments(task, host)
    head, rest = segs[0], segs[1:]
    through = set(task.through)
    entry: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    hosts: list[int] = []
    for seg in rest:
        h = host(seg[0])
        hosts.append(h)
        entry[h] = seg[0]
        # a relay that only led out of the host is not needed: the entry sends on
        members[h] = [d for d in seg[1:] if d not in through]
    n = len(hosts)
    half = n // 2
    orders = (hosts, hosts[half:] + hosts[:half])
    itemsize = task.nbytes // box_size(task.box) if box_size(task.box) else 0
    out: list[Task] = []
    for box, order in zip(split_box(task.box, 2), orders):
        nbytes = box_size(box) * itemsize
        if nbytes == 0:
            continue
        edges = list(itertools.pairwise(head))
        edges += _tree_edges(order, head[-1], entry, members, intra)
        parents = tuple(a for a, _ in edges)
        receivers = tuple(b for _, b in edges)
        senders = set(parents)
        keep_through = tuple(d for d in receivers if d in through and d in senders)
        out.append(dataclasses.replace(task, box=box, nbytes=nbytes, receivers=receivers,
                                       parents=parents, through=keep_through))
    return out


def treeify(tasks: Iterable[Task], host: Callable[[int], int], intra: str) -> tuple[Task, ...]:
    """``tasks`` with every chain broadcast that enters at least :data:`MIN_HOSTS`
    hosts after its root's replaced, in place, by two half-box tasks down
    complementary binary trees over those hosts (same step, same source); inside a
    host the entry passes on as ``intra`` says (:data:`INTRA`)."""
    if intra not in INTRA:
        raise ValueError(f"intra must be one of {INTRA}, got {intra!r}")
    out: list[Task] = []
    for t in tasks:
        if t.kind is TaskKind.BROADCAST and not t.parents and \
                remote_hosts(t, host) >= MIN_HOSTS:
            out.extend(_split_task(t, host, intra))
        else:
            out.append(t)
    return tuple(out)


def has_long_chains(tasks: Iterable[Task], host: Callable[[int], int]) -> bool:
    """Whether :func:`treeify` would change any of ``tasks``."""
    return any(t.kind is TaskKind.BROADCAST and not t.parents and
               remote_hosts(t, host) >= MIN_HOSTS for t in tasks)
