"""The ``tcp`` backend's frames and the memory they move from and into.

An operation moves a byte stream (:class:`Stream`: the pieces of memory a sender hands
the kernel, cut into frames of at most one pipelined piece); a receive is an
:class:`Inbound` (the places its frames' bodies land, in order; :class:`Reused` when a
reduction's running result lands in one piece-sized buffer); a :class:`Link` is one
connection to a peer with the frames queued for it and the receives it feeds. A frame
is a :data:`HEADER` and a body (:mod:`reshard.comm.backends.tcp`).
"""

from __future__ import annotations

import bisect
import collections
import os
import socket
import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from reshard.core.errors import ExecutionError

HEADER = struct.Struct("<QQQ")
"""A frame's header: the operation's tag, the body's bytes, the operation's bytes (a
receive of another size is refused at its first frame, even where the frames would
have fit)."""


IOV = 1024
"""Pieces of memory per ``sendmsg`` / ``recvmsg_into`` (Linux's ``IOV_MAX``)."""


def bytes_of(buf: Any) -> memoryview:
    """A flat byte view of a 1-d C-contiguous numpy array's memory (a memoryview of
    bytes: itself)."""
    if isinstance(buf, memoryview):
        if not buf.c_contiguous:
            raise ExecutionError("backend buffers must be C-contiguous memoryviews")
        return buf if buf.format == "B" and buf.ndim == 1 else buf.cast("B")
    if not buf.flags.c_contiguous:
        raise ExecutionError(f"backend buffers must be C-contiguous, got strides "
                             f"{buf.strides} for shape {buf.shape}")
    return memoryview(buf.reshape(-1).view(np.uint8)).cast("B")


class Stream:
    """A buffer as a byte stream: one array, or (``Capabilities.gathers``) a list of
    arrays moved as the concatenation of their bytes."""

    __slots__ = ("starts", "total", "views")

    def __init__(self, buf: Any) -> None:
        arrays = buf if isinstance(buf, (list, tuple)) else (buf,)
        self.views = [v for v in (bytes_of(a) for a in arrays) if len(v)]
        self.starts: list[int] = []
        pos = 0
        for v in self.views:
            self.starts.append(pos)
            pos += len(v)
        self.total = pos

    def frames(self, a: int, b: int, piece: int) -> Iterator[list[memoryview]]:
        """Stream bytes ``[a, b)`` cut every ``piece`` bytes: each piece's memory as
        views in order (one walk over the views)."""
        views = self.views
        if len(views) == 1:
            v = views[0]
            for lo in range(a, b, piece):
                yield [v[lo:min(b, lo + piece)]]
            return
        k = bisect.bisect_right(self.starts, a) - 1
        off = a - self.starts[k]
        while a < b:
            want = min(piece, b - a)
            a += want
            out = []
            while want:
                v = views[k]
                take = min(len(v) - off, want)
                out.append(v[off:off + take])
                want -= take
                off += take
                if off == len(v):
                    k, off = k + 1, 0
            yield out


class Inbound:
    """A posted receive: its bytes arrive in frames from ``peer`` tagged ``tag``;
    ``on_frame(a, b)`` hears of each frame's bytes ``[a, b)`` once they landed."""

    __slots__ = ("filled", "k", "off", "on_frame", "peer", "stream", "tag", "what")

    def __init__(self, what: str, peer: int, tag: int, stream: Stream,
                 on_frame: Callable[[int, int], None] | None) -> None:
        self.what, self.peer, self.tag, self.stream = what, peer, tag, stream
        self.on_frame = on_frame
        self.filled = 0
        self.k = self.off = 0  # where byte ``filled`` lies: view ``k``, at ``off``

    def places(self, n: int) -> list[memoryview]:
        """Where its next ``n`` bytes go, as views in order (at most :data:`IOV`)."""
        views, k, off = self.stream.views, self.k, self.off
        out: list[memoryview] = []
        while n and len(out) < IOV:
            v = views[k]
            take = min(len(v) - off, n)
            out.append(v[off:off + take])
            n -= take
            k, off = k + 1, 0
        return out

    def advance(self, n: int) -> None:
        """``n`` more bytes landed."""
        self.filled += n
        views, k, off = self.stream.views, self.k, self.off + n
        while k < len(views) and off >= len(views[k]):
            off -= len(views[k])
            k += 1
        self.k, self.off = k, off


class Reused(Inbound):
    """A posted receive whose frames all land in one piece-sized buffer (``held``), each
    consumed by ``on_frame`` before the next is read (a reduction's running sums)."""

    __slots__ = ("held",)

    def __init__(self, what: str, peer: int, tag: int, total: int, held: np.ndarray,
                 on_frame: Callable[[int, int], None]) -> None:
        super().__init__(what, peer, tag, Sized(total), on_frame)
        self.held = memoryview(held)  # type: ignore[arg-type]

    def places(self, n: int) -> list[memoryview]:
        """The piece buffer, from where the frame being read has got to."""
        off = self.filled % len(self.held)
        return [self.held[off:off + n]]

    def advance(self, n: int) -> None:
        """``n`` more bytes landed."""
        self.filled += n


class Sized(Stream):
    """The size of a receive whose bytes land in no stream of their own
    (:class:`Reused`)."""

    __slots__ = ()

    def __init__(self, total: int) -> None:
        self.views, self.starts, self.total = [], [], total


WINDOW = 256 << 10
"""Bytes a connection between hosts may hold unread at its receiver (``SO_RCVBUF``; the
kernel doubles it for its own bookkeeping). It bounds how far a sender runs ahead of a
receiver that has not posted the receive yet (a frame for a later step stays unread
until that step): bytes sent early cross the network while the receiver's host is still
taking in its present step, and on the testbed's paper case 7 (two chains, the second
one's root idle in the first step) the autotuned window let 1.28-1.39 s happen where
the model says 0.995 (0.997 with this cap; the partial sum 1.03 s against 1.07-1.15).
Between processes of one machine nothing is shared but the cores, where a small window
costs wakeups (one host: 10-35% slower), so a connection to the same address keeps the
kernel's autotuning."""

WINDOW_ENV = "RESHARD_TCP_WINDOW"
"""Overrides :data:`WINDOW` (bytes; 0: the kernel's autotuning on every connection)."""


def window() -> int:
    """The receive window of connections between hosts (:data:`WINDOW_ENV`, else
    :data:`WINDOW`)."""
    text = os.environ.get(WINDOW_ENV, "").strip()
    if not text:
        return WINDOW
    try:
        got = int(text)
    except ValueError:
        raise ExecutionError(f"{WINDOW_ENV} must be a number of bytes >= 0, got {text!r}") from None
    if got < 0:
        raise ExecutionError(f"{WINDOW_ENV} must be a number of bytes >= 0, got {got}")
    return got


class Link:
    """One connection to a peer: frames queued to write (a flat queue of their pieces
    of memory), and the frame being read (``into``: its receive; ``left``: bytes of its
    body still to read; or its header, ``got`` bytes of it so far)."""

    __slots__ = ("expect", "got", "head", "headview", "into", "left", "out", "parked",
                 "peer", "sock", "start")

    def __init__(self, sock: socket.socket, peer: int) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        limit = window()
        if limit and sock.getsockname()[0] != sock.getpeername()[0]:  # leaves the host
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, limit)
        self.sock, self.peer = sock, peer
        self.out: collections.deque[memoryview] = collections.deque()
        self.head = bytearray(HEADER.size)
        self.headview = memoryview(self.head)
        self.got = 0
        self.into: Inbound | None = None
        self.left = 0
        self.start = 0  # where the frame being read starts in its receive's stream
        self.expect = 0  # receives posted from this peer and not complete
        self.parked: tuple[int, int, int] | None = None  # a header nobody expects yet


__all__ = ["HEADER", "IOV", "WINDOW", "WINDOW_ENV", "Inbound", "Link", "Reused", "Sized",
           "Stream", "bytes_of", "window"]
