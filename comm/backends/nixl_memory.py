"""The ``nixl`` backend's memory: registrations of host buffers with one NIXL agent, and
a byte stream's places as NIXL descriptors.

A one-sided WRITE reads registered memory of the writer and writes registered memory of
the target, named by descriptors (address, bytes, device id). The memory registered is
the buffer itself, never a copy: a box that is rows of its shard moves straight from and
into the shard. :class:`Registrations` registers, per buffer handed to an operation, the
whole array it is a view of (the shard, a scratch buffer), once, and keeps that array
alive while registered, so its memory cannot be freed and reused under a registration
(a stale one). It holds at most ``limit`` arrays; the least recently used beyond that is
deregistered, never one an operation still uses: each operation pins the
registrations of its places from posting to completion (a receive whose places were
deregistered before the peer wrote would have the peer write into memory no longer the
receiver's).

A peer told of a registration keeps its keys after the deregistration (NIXL drops a
peer's keys only by disconnecting from it, which loses whatever is in flight between
the two), and the allocator may hand that memory to a new array; a WRITE there could
go through the stale keys (an RDMA transport refuses them; NIXL may pick either of two
registrations holding the place). So memory told of and since deregistered is *stale*
(:class:`Intervals`) for good, and a receive whose array overlaps stale memory lands in
a *staging* buffer instead (:meth:`Registrations.staging`: registered once and never
released, its memory never stale), copied into place as each piece lands. Peers are
told which registrations went (:meth:`Registrations.dropped`), so what each side
records of the other stays bounded.

:func:`runs_of` turns a stream's views into ``(address, bytes)`` runs, :func:`cut` takes
a byte range of them, and :func:`paired`
cuts a writer's runs and a target's runs of the same bytes at the union of their
boundaries (NIXL pairs descriptor ``i`` of the local list with descriptor ``i`` of the
remote list, of the same length), so the two sides may cut a message differently
(:attr:`~reshard.comm.backend.Capabilities.gathers`).
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np

Run = tuple[int, int]
"""A contiguous run of memory: ``(address, bytes)``."""

Reg = tuple[Run, int]
"""A registration as the peers know it: the array's run and its generation."""


def address_of(view: memoryview) -> int:
    """The address of a flat byte view's first byte (ctypes reads a writable buffer's
    in a fifth of the time numpy's array interface takes: a message of thousands of
    parts asks for thousands)."""
    if not len(view):
        return 0
    if not view.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    return int(np.frombuffer(view, np.uint8).ctypes.data)


def owner_of(view: memoryview, at: int | None = None,
             starts: dict[int, int] | None = None) -> tuple[Any, Run]:
    """The array ``view`` is a view of (followed to the array that owns the memory, or
    the last one before a non-array base) and its whole memory as a run; the view's own
    run where that array does not hold it. ``at``: the view's address, where known;
    ``starts``: arrays' addresses by ``id`` already looked up (filled in), for the many
    views of one array a message's parts are."""
    obj: Any = view.obj
    root = None
    while isinstance(obj, np.ndarray):
        root = obj
        obj = obj.base
    if at is None:
        at = address_of(view)
    n = len(view)
    if root is not None and root.flags.c_contiguous:
        start = None if starts is None else starts.get(id(root))
        if start is None:
            start = int(root.ctypes.data)
            if starts is not None:
                starts[id(root)] = start
        if start <= at and at + n <= start + root.nbytes:
            return root, (start, int(root.nbytes))
    return view, (at, n)


def runs_of(views: Sequence[memoryview]) -> list[Run]:
    """The stream made of ``views`` (in order) as runs, one per non-empty view."""
    return [(address_of(v), len(v)) for v in views if len(v)]


def cut(runs: Sequence[Run], a: int, b: int) -> list[Run]:
    """Bytes ``[a, b)`` of the stream whose places are ``runs`` (in order)."""
    if a == 0 and b >= sum(n for _, n in runs):
        return list(runs)  # the whole stream (a message written at once)
    out: list[Run] = []
    pos = 0
    for at, n in runs:
        lo, hi = max(a, pos), min(b, pos + n)
        if lo < hi:
            out.append((at + lo - pos, hi - lo))
        pos += n
        if pos >= b:
            break
    return out


def paired(mine: Sequence[Run], theirs: Sequence[Run]) -> tuple[list[Run], list[Run]]:
    """``mine`` and ``theirs`` (runs of the same number of bytes) cut at the union of
    their boundaries: two lists of equal length whose ``i``-th runs are of one size."""
    if sum(n for _, n in mine) != sum(n for _, n in theirs):
        raise ValueError("the two sides of a transfer are of different sizes")
    if len(mine) == len(theirs) and all(
            m[1] == t[1] for m, t in zip(mine, theirs, strict=True)):
        return list(mine), list(theirs)  # cut alike already (parts of the same sizes)
    out_a: list[Run] = []
    out_b: list[Run] = []
    i = j = 0
    ia, na = mine[0] if mine else (0, 0)
    jb, nb = theirs[0] if theirs else (0, 0)
    while i < len(mine) and j < len(theirs):
        take = min(na, nb)
        out_a.append((ia, take))
        out_b.append((jb, take))
        ia, na, jb, nb = ia + take, na - take, jb + take, nb - take
        if not na:
            i += 1
            if i < len(mine):
                ia, na = mine[i]
        if not nb:
            j += 1
            if j < len(theirs):
                jb, nb = theirs[j]
    return out_a, out_b


class Intervals:
    """A set of byte ranges (merged, sorted), asked whether a run overlaps it."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def add(self, run: Run) -> None:
        """Add ``[a, a + n)``, merging it with the ranges it touches."""
        a, n = run
        b = a + n
        i = bisect.bisect_left(self._ends, a)  # the first range ending at or after a
        j = bisect.bisect_right(self._starts, b)  # past the last one starting by b
        if i < j:
            a, b = min(a, self._starts[i]), max(b, self._ends[j - 1])
        self._starts[i:j] = [a]
        self._ends[i:j] = [b]

    def hits(self, run: Run) -> bool:
        """Whether ``[a, a + n)`` overlaps a range of the set."""
        a, n = run
        i = bisect.bisect_right(self._ends, a)  # the first range ending after a
        return i < len(self._starts) and self._starts[i] < a + n

    def __len__(self) -> int:
        return len(self._starts)


class Registrations:
    """Host memory registered with one agent, by the array that holds it (module
    docstring).

    Args:
        agent: the NIXL agent (``register_memory`` / ``deregister_memory`` /
            ``get_partial_agent_metadata``).
        limit: arrays held registered at most.
    """

    def __init__(self, agent: Any, limit: int = 4096) -> None:
        self.agent = agent
        self.limit = limit
        # run -> (the array kept alive, its registration, a generation number)
        self._held: collections.OrderedDict[Run, tuple[Any, Any, int]] = \
            collections.OrderedDict()
        self._pins: collections.Counter[Run] = collections.Counter()  # operations using
        self._generation = 0
        self.registered = 0
        """Registrations made so far (a test reads it: one per array, not per call)."""
        self.trimmed = 0
        """Registrations deregistered to keep within the limit, so far."""
        self.stale = Intervals()
        """Memory told of to a peer and deregistered since (module docstring)."""
        self.staged = 0
        """Receives that landed in a staging buffer, so far."""
        self._told: set[Run] = set()  # registrations held that a peer was told of
        self._dropped: list[Reg] = []  # told of, deregistered, not yet reported
        self._slabs: list[Any] = []  # staging buffers free (registered for good)
        self._quarantine: list[Any] = []  # allocations that fell on stale memory

    def ensure(self, views: Sequence[memoryview],
               runs: Sequence[Run] | None = None) -> list[tuple[Run, int]]:
        """Register the arrays under ``views`` not yet registered and pin them (until
        :meth:`unpin`); each array's run and generation (a new generation: a
        registration the peers have not seen). ``runs``: the non-empty views' own runs
        (:func:`runs_of`), where the caller has them."""
        out = []
        starts: dict[int, int] = {}
        nonempty = [v for v in views if len(v)]
        ats = [r[0] for r in runs] if runs is not None else [None] * len(nonempty)
        last: tuple[Run, int] | None = None
        for v, at in zip(nonempty, ats, strict=True):
            owner, run = owner_of(v, at, starts)
            if last is not None and last[0] == run:
                self._pins[run] += 1  # the next part of the array just seen
                out.append(last)
                continue
            got = self._held.get(run)
            if got is None:
                reg = self.agent.register_memory([(run[0], run[1], 0, "")], "DRAM")
                if reg is None:
                    raise RuntimeError(f"NIXL refused to register {run[1]} bytes of host "
                                       f"memory at {run[0]:#x}")
                self._generation += 1
                self.registered += 1
                got = self._held[run] = (owner, reg, self._generation)
            else:
                self._held.move_to_end(run)
            self._pins[run] += 1
            last = (run, got[2])
            out.append(last)
        self._trim()
        return out

    def unpin(self, regs: Sequence[tuple[Run, int]]) -> None:
        """The operation that :meth:`ensure` returned ``regs`` for is complete."""
        for run, _ in regs:
            left = self._pins[run] - 1
            if left > 0:
                self._pins[run] = left
            else:
                del self._pins[run]
        self._trim()

    @property
    def held(self) -> int:
        """Arrays registered now."""
        return len(self._held)

    def told(self, regs: Sequence[Reg]) -> None:
        """A peer is being told of ``regs``: once deregistered, their memory is stale."""
        self._told.update(run for run, _ in regs)

    def dropped(self) -> list[Reg]:
        """The registrations told of and deregistered since the last call."""
        out, self._dropped = self._dropped, []
        return out

    def stale_under(self, views: Sequence[memoryview], runs: Sequence[Run]) -> list[int]:
        """Indices of ``views`` (the non-empty ones, ``runs`` their own runs) whose
        array overlaps stale memory: a receive must not let a peer write there."""
        if not len(self.stale):
            return []
        starts: dict[int, int] = {}
        return [i for i, (v, (at, _)) in enumerate(zip(views, runs, strict=True))
                if self.stale.hits(owner_of(v, at, starts)[1])]

    def staging(self, nbytes: int) -> Any:
        """A registered buffer of at least ``nbytes`` for a receive that may not land in
        place (:meth:`stale_under`), kept registered and pinned for good (give it back
        with :meth:`restage`); never one on stale memory (an allocation there is held
        aside so the allocator moves on)."""
        fits = [i for i, s in enumerate(self._slabs) if s.nbytes >= nbytes]
        if fits:  # the smallest that fits (by position: arrays do not compare as values)
            return self._slabs.pop(min(fits, key=lambda i: self._slabs[i].nbytes))
        size = 1 << max(20, (nbytes - 1).bit_length())
        for _ in range(64):
            # a mapping of its own: the heap's free blocks are where stale memory is
            slab = np.frombuffer(mmap.mmap(-1, size), np.uint8)
            if not self.stale.hits((int(slab.ctypes.data), size)):
                break
            self._quarantine.append(slab)
        else:
            raise RuntimeError(f"no memory for a {size}-byte staging buffer off stale memory")
        ((run, _),) = self.ensure([slab.data], [(int(slab.ctypes.data), size)])
        self._told.discard(run)  # told or not, never deregistered: never stale
        return slab

    def restage(self, slab: Any) -> None:
        """A staging buffer's receive is complete: it may serve another."""
        self._slabs.append(slab)

    def metadata(self, runs: Sequence[Run]) -> bytes:
        """The agent's partial metadata for the registrations of ``runs`` (what a peer
        loads to write into them)."""
        if not runs:
            return b""
        regs = self.agent.get_reg_descs([(a, n, 0, "") for a, n in runs], "DRAM")
        return bytes(self.agent.get_partial_agent_metadata(regs, False))

    def _trim(self) -> None:
        """Deregister the least recently used unpinned arrays beyond the limit."""
        over = len(self._held) - self.limit
        if over <= 0:
            return
        free = []
        for run in self._held:  # oldest first
            if run not in self._pins:
                free.append(run)
                if len(free) == over:
                    break
        for run in free:
            _, reg, generation = self._held.pop(run)
            self.agent.deregister_memory(reg)
            if run in self._told:
                self._told.remove(run)
                self.stale.add(run)
                self._dropped.append((run, generation))
        self.trimmed += len(free)

    def release(self) -> None:
        """Deregister everything (the agent is closing)."""
        while self._held:
            _, (_, reg, _) = self._held.popitem()
            self.agent.deregister_memory(reg)


__all__ = ["Intervals", "Reg", "Registrations", "Run", "address_of", "cut", "owner_of", "paired",
           "runs_of"]
