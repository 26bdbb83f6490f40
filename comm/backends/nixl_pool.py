"""The ``nixl`` backend's buffers, carved from large registered slabs.

A WRITE lands in memory the target registered and told its peer of; a registration
the target later drops leaves the peer holding keys it cannot be made to forget (NIXL
forgets a peer's keys only by disconnecting from it), so memory told of must stay
registered or be treated as stale (:mod:`reshard.comm.backends.nixl_memory`). The
buffers the executor asks the backend for (destination shards, scratch,
:meth:`~reshard.comm.backends.nixl.NixlBackend.empty`) come from here instead: slabs
of anonymous memory mapped for the purpose, registered once and kept (so never stale,
never a per-array registration or metadata), each buffer a block of one, handed back
to the slab when the last view of its array is gone (a finalizer; the array's views
keep it alive, numpy pointing them at it). The slabs stay mapped for the rank's life,
up to ``cap`` bytes in all; beyond that, and for nothing, :meth:`Pool.empty` answers
None and the caller allocates as usual.
"""

from __future__ import annotations

import bisect
import collections
import mmap
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

Run = tuple[int, int]

ALIGN = 64
"""Bytes every block starts on (a cache line; any dtype's alignment)."""


class Pool:
    """Blocks of registered slabs.

    Args:
        register: registers a new slab (given as an array) for good and returns its run;
            may refuse an allocation (return None: the slab lies on memory it will not
            use, e.g. stale), which the pool then keeps aside, so the next is elsewhere.
        slab: bytes of a slab (a larger request gets one of its own size).
        cap: bytes of slabs at most.
    """

    def __init__(self, register: Callable[[Any], Run | None], slab: int = 64 << 20,
                 cap: int = 8 << 30) -> None:
        self._register = register
        self.slab = slab
        self.cap = cap
        self.total = 0
        """Bytes of slabs mapped."""
        self._lock = threading.Lock()
        # blocks whose arrays are gone: a finalizer runs on whatever thread collects,
        # maybe inside a call holding the lock, so it only appends here (atomic)
        self._returned: collections.deque[Run] = collections.deque()
        self._starts: list[int] = []  # slabs by address: start, size, array, free blocks
        self._slabs: list[tuple[int, int, Any, list[Run]]] = []
        self._aside: list[Any] = []

    def empty(self, n: int, dtype: Any) -> np.ndarray | None:
        """A 1-d array of ``n`` elements of ``dtype`` in a block of a slab, or None
        (nothing asked for, or the pool is at its cap)."""
        dt = np.dtype(dtype)
        nbytes = n * dt.itemsize
        if nbytes <= 0:
            return None
        size = -(-nbytes // ALIGN) * ALIGN
        with self._lock:
            got = self._take(size)
            if got is None:
                return None
            slab, at = got
        arr = np.frombuffer(memoryview(slab)[at:at + nbytes], dtype=dt, count=n)
        gone = weakref.finalize(arr, self._returned.append, (int(slab.ctypes.data) + at, size))
        gone.atexit = False  # nothing to give back when the process ends
        return arr

    def slab_of(self, run: Run) -> Run | None:
        """The slab holding all of ``run``, as a run; None where none does."""
        i = bisect.bisect_right(self._starts, run[0]) - 1
        if i >= 0:
            start, size, _, _ = self._slabs[i]
            if run[0] + run[1] <= start + size:
                return start, size
        return None

    def _take(self, size: int) -> tuple[Any, int] | None:
        while self._returned:
            self._give(*self._returned.popleft())
        for start, _, slab, free in self._slabs:  # first fit
            for k, (at, n) in enumerate(free):
                if n >= size:
                    free[k:k + 1] = [(at + size, n - size)] if n > size else []
                    return slab, at - start
        want = max(self.slab, -(-size // (1 << 20)) * (1 << 20))
        if self.total + want > self.cap:
            return None
        for _ in range(64):
            slab = np.frombuffer(mmap.mmap(-1, want), np.uint8)
            if self._register(slab) is not None:
                break
            self._aside.append(slab)  # held, so the next mapping lands elsewhere
        else:
            return None
        start = int(slab.ctypes.data)
        free = [(start + size, want - size)] if want > size else []
        i = bisect.bisect(self._starts, start)
        self._starts.insert(i, start)
        self._slabs.insert(i, (start, want, slab, free))
        self.total += want
        return slab, 0

    def _give(self, at: int, size: int) -> None:
        """A block whose array is gone back among its slab's free blocks, merged with
        its neighbours (under the lock)."""
        i = bisect.bisect_right(self._starts, at) - 1
        free = self._slabs[i][3]
        k = bisect.bisect(free, (at, size))
        free.insert(k, (at, size))
        if k + 1 < len(free) and at + size == free[k + 1][0]:
            free[k:k + 2] = [(at, size + free[k + 1][1])]
        if k > 0 and free[k - 1][0] + free[k - 1][1] == at:
            free[k - 1:k + 1] = [(free[k - 1][0], free[k - 1][1] + free[k][1])]

    def free_bytes(self) -> int:
        """Bytes of the slabs in no live array's block (those gone counted)."""
        with self._lock:
            while self._returned:
                self._give(*self._returned.popleft())
            return sum(n for _, _, _, free in self._slabs for _, n in free)


__all__ = ["ALIGN", "Pool"]
