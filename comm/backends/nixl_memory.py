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
a *staging* buffer (:meth:`Registrations.staging`), copied into place as each piece
lands. Peers are told which registrations went (:meth:`Registrations.dropped`), so what
each side records of the other stays bounded. The buffers the backend hands out itself
(destination shards, scratch, staging) are blocks of slabs registered for good
(:class:`~reshard.comm.backends.nixl_pool.Pool`): a view of one is the slab's
registration, never one of its own, and never stale; arrays from elsewhere (a caller's)
take the path above.

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
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from reshard.comm.backends.nixl_pool import Pool
from reshard.core.errors import ExecutionError

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
        raise ExecutionError(f"nixl: the two sides of a transfer are of different sizes "
                             f"({sum(n for _, n in mine)} and {sum(n for _, n in theirs)} "
                             f"bytes)")
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
        device: the rank's device (its errors name it).
    """

    def __init__(self, agent: Any, limit: int = 4096, device: int | None = None) -> None:
        self.agent = agent
        self.where = "" if device is None else f"device {device}: "
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
        self.abandoned = 0
        """Registrations deregistered because their operation failed, so far."""
        self.kept: list[Any] = []
        """Buffers of failed operations, alive until :meth:`release` (:meth:`abandon`)."""
        self._told: set[Run] = set()  # registrations held that a peer was told of
        self._dropped: list[Reg] = []  # told of, deregistered, not yet reported
        self.pool = Pool(self._slab, cap=_pool_cap())
        """Buffers carved from slabs registered for good (:mod:`.nixl_pool`)."""
        # staging buffers' own slabs: needed whatever the pool's cap (as many bytes as
        # receives are staged at once)
        self._staging = Pool(self._slab, slab=1 << 20, cap=1 << 62)

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
            if (self.pool.total or self._staging.total) and run not in self._held:
                # a block of a slab: the slab's registration
                run = self.pool.slab_of(run) or self._staging.slab_of(run) or run
            if last is not None and last[0] == run:
                self._pins[run] += 1  # the next part of the array just seen
                out.append(last)
                continue
            got = self._held.get(run)
            if got is None:
                reg = self.agent.register_memory([(run[0], run[1], 0, "")], "DRAM")
                if reg is None:
                    raise ExecutionError(f"{self.where}nixl: NIXL refused to register "
                                         f"{run[1]} bytes of host memory at {run[0]:#x}")
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
        """A buffer of ``nbytes`` for a receive that may not land in place
        (:meth:`stale_under`): a block of a slab registered for good, never stale; it
        goes back to its slab when dropped."""
        got = self.pool.empty(nbytes, np.uint8)
        if got is None:  # the pool is at its cap (or has none)
            got = self._staging.empty(nbytes, np.uint8)
        if got is None:
            raise ExecutionError(f"{self.where}nixl: no memory off stale memory for a "
                                 f"{nbytes}-byte staging buffer")
        return got

    def _slab(self, slab: Any) -> Run | None:
        """Register a new slab of the pool for good (pinned: never deregistered); None
        where it lies on stale memory (the pool then maps another)."""
        run = (int(slab.ctypes.data), int(slab.nbytes))
        if self.stale.hits(run):
            return None
        self.ensure([slab.data], [run])
        return run

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

    def abandon(self, regs: Sequence[tuple[Run, int]], keep: Any) -> None:
        """The operation that :meth:`ensure` returned ``regs`` for failed (its peer dead
        or stuck): unpin them and deregister those no other operation uses now, so a
        late WRITE through their keys fails. ``keep`` (what the peer may still write
        into: the operation's buffers) stays alive until :meth:`release`: a transport
        that writes without keys (shared memory) cannot land in memory reused since."""
        self.kept.append(keep)
        for run, _ in regs:
            left = self._pins[run] - 1
            if left > 0:
                self._pins[run] = left
                continue
            self._pins.pop(run, None)
            got = self._held.pop(run, None)
            if got is None:
                continue
            self.agent.deregister_memory(got[1])
            self.abandoned += 1
            if run in self._told:
                self._told.remove(run)
                self.stale.add(run)
                self._dropped.append((run, got[2]))

    @property
    def pinned(self) -> int:
        """Registrations an operation in flight uses now."""
        return len(self._pins)

    def release(self) -> None:
        """Deregister everything (the agent is closing)."""
        while self._held:
            _, (_, reg, _) = self._held.popitem()
            self.agent.deregister_memory(reg)
        self._pins.clear()
        self.kept.clear()


POOL_ENV = "RESHARD_NIXL_POOL_MB"
"""Environment variable: MiB of slabs a rank's pool maps at most (0: none, every buffer
registered on its own); half the machine's memory by default."""


def _pool_cap() -> int:
    """Bytes of slabs a rank's pool maps at most (:data:`POOL_ENV`)."""
    given = os.environ.get(POOL_ENV)
    if given is not None:
        try:
            mib = float(given)
        except ValueError:
            mib = -1.0
        if not mib >= 0:
            raise ValueError(f"{POOL_ENV} must be a number of MiB >= 0, got {given!r}")
        return int(mib * (1 << 20))
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):
        return 8 << 30


__all__ = ["POOL_ENV", "Intervals", "Reg", "Registrations", "Run", "address_of", "cut",
           "owner_of", "paired", "runs_of"]
