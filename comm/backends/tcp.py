"""The ``tcp`` backend: reshard's own CPU data plane, TCP sockets with scatter / gather I/O.

Why a data plane of its own beside gloo: a gloo operation takes one contiguous buffer,
so a coalesced message of many small boxes is copied into scratch memory at its root
and out of it at every receiver, even where a box is one contiguous run of its shard.
With 1,000 tensors of 4 KiB - 1 MiB on the emulated testbed (each box strided in its
shard on exactly one side) those copies are half of the bytes reshard copies a run,
and on 2 cores they cost more than the network (``small_tensors --floor``'s replays:
plain sockets that copy only the strided boxes take 1.02x the bound, gloo with every
message copied 2.1-2.2x). Here every operation moves a *byte stream*: a sender hands
the kernel a list of pieces of memory (``sendmsg``), a receiver a list of places
(``recvmsg_into``), and the two lists may be cut differently
(:attr:`~reshard.comm.backend.Capabilities.gathers`).

Wire: one TCP connection per pair of devices and channel, made when a plan loads
(:meth:`TcpBackend.prepare`), else on first use (the lower device connects to the
listener the higher one published through the driver's rendezvous). Its introduction
is a challenge and a response: the listener sends a fresh nonce, the connector answers
with its device, the channel's name and an HMAC-SHA256 of them and the nonce under the
listener's secret (read from the rendezvous), so the secret never crosses the wire and
a recorded introduction cannot be replayed. The listener reads every pending
introduction at once (up to :data:`_PENDING`, the oldest dropped first), each within
one overall deadline (:data:`_HELLO_WAIT`): a silent or slow connection costs the real
ones nothing. A second connection that claims a (channel, device) already claimed is
refused loudly: before the channel took the first, both are closed and the channel's
accept fails naming the claim; after, the newcomer is closed and logged. On it travel
*frames*: a 24-byte header (the operation's tag, the body's bytes, the whole
operation's bytes) and a body of at most one pipelined piece (:func:`~reshard.comm.backends.host_memory.wire_piece`). A
receiver matches a frame to the receive posted for its (peer, tag), first posted
first, and reads its body straight into that receive's places. Frames of different
operations interleave on a connection, so a relay's pieces never wait behind a whole
message.

Groups: an operation posts (its frames queued, its receive registered) and moves what
it can at once without waiting (the kernel takes the first frames while the executor
packs the next message; what has already arrived lands); the group's end runs one
loop over the connections with work, non-blocking, writing what each can take and
reading what has arrived, passing a relay's pieces on as they land and telling a
receiver's ``landed`` of each, and polls when nothing moved. It returns when every
frame of the group is in the kernel and every receive has all its bytes.
Every rank issues its operations in the plan's one global order and the frames of a
pair travel in that order, so this cannot deadlock (as for gloo, the earliest
unfinished operation has every member at it or past it). A frame a peer sent for a
later group (it finished this one first) stays unread until that group posts its
receive. No threads: the calling thread does all of it.

Partial sums are not fused (``fuses_sums`` false: the executor runs a reduction, then
the broadcast of the sum); a reduction runs down a pipelined chain of the members in
group order to the root, each adding every frame of the running result (held in one
piece-sized buffer) into its own in numpy and passing it on. Failures: a peer that closes its connection
(dead) fails the operation at once naming it; no progress for the timeout fails it
naming the peers it waits on.
"""

from __future__ import annotations

import bisect
import collections
import copy
import hashlib
import hmac
import logging
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reshard.comm.backend import Capabilities, refuse_unsupported
from reshard.comm.backends.host_memory import HostMemory, wire_piece
from reshard.comm.sockets import listen_on, recv_exact
from reshard.dtypes import ReduceOp
from reshard.errors import ExecutionError

_log = logging.getLogger("reshard.tcp")

_HEADER = struct.Struct("<QQQ")
"""A frame's header: the operation's tag, the body's bytes, the operation's bytes (a
receive of another size is refused at its first frame, even where the frames would
have fit)."""
_CHALLENGE = struct.Struct("<4s16s")
"""A listener's first bytes on a new connection: magic, a fresh nonce."""
_HELLO = struct.Struct("<4s32sqH")
"""A connector's answer: magic, HMAC-SHA256(listener's secret, nonce + device + channel
name), the connecting device, the length of the channel's name (which follows, UTF-8)."""
_MAGIC = b"RSH2"
_HELLO_WAIT = 2.0
"""Seconds a new connection has, in all, to introduce itself (not per byte)."""
_PENDING = 64
"""Introductions a listener reads at once; past it the oldest pending one is dropped."""
_BACKLOG = 4096
"""Connections the listener queues before they are accepted (the first all-gather of
an SPMD world connects every lower device at once)."""
_POLL = 60.0
"""The longest single wait for a connection to move (timeouts are longer)."""
_IOV = 1024
"""Pieces of memory per ``sendmsg`` / ``recvmsg_into`` (Linux's ``IOV_MAX``)."""
_BATCH = 1 << 21
"""Bytes handed to one ``sendmsg`` at most (about what a socket's send buffer takes)."""
_GATHER_TAG = 0x3FFF0000
"""The tag of all-gather frames (tasks' tags are their indices in the plan, far below)."""
_REDUCE_TAG = 0x3FFF0001
"""The tag of a reduction's addends."""
_COMBINE: dict[ReduceOp, Callable[..., Any]] = {ReduceOp.SUM: np.add, ReduceOp.MAX: np.maximum}


def _bytes_of(buf: Any) -> memoryview:
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


class _Stream:
    """A buffer as a byte stream: one array, or (``Capabilities.gathers``) a list of
    arrays moved as the concatenation of their bytes."""

    __slots__ = ("starts", "total", "views")

    def __init__(self, buf: Any) -> None:
        arrays = buf if isinstance(buf, (list, tuple)) else (buf,)
        self.views = [v for v in (_bytes_of(a) for a in arrays) if len(v)]
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


class _Inbound:
    """A posted receive: its bytes arrive in frames from ``peer`` tagged ``tag``;
    ``on_frame(a, b)`` hears of each frame's bytes ``[a, b)`` once they landed."""

    __slots__ = ("filled", "k", "off", "on_frame", "peer", "stream", "tag", "what")

    def __init__(self, what: str, peer: int, tag: int, stream: _Stream,
                 on_frame: Callable[[int, int], None] | None) -> None:
        self.what, self.peer, self.tag, self.stream = what, peer, tag, stream
        self.on_frame = on_frame
        self.filled = 0
        self.k = self.off = 0  # where byte ``filled`` lies: view ``k``, at ``off``

    def places(self, n: int) -> list[memoryview]:
        """Where its next ``n`` bytes go, as views in order (at most :data:`_IOV`)."""
        views, k, off = self.stream.views, self.k, self.off
        out: list[memoryview] = []
        while n and len(out) < _IOV:
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


class _Reused(_Inbound):
    """A posted receive whose frames all land in one piece-sized buffer (``held``), each
    consumed by ``on_frame`` before the next is read (a reduction's running sums)."""

    __slots__ = ("held",)

    def __init__(self, what: str, peer: int, tag: int, total: int, held: np.ndarray,
                 on_frame: Callable[[int, int], None]) -> None:
        super().__init__(what, peer, tag, _Sized(total), on_frame)
        self.held = memoryview(held)  # type: ignore[arg-type]

    def places(self, n: int) -> list[memoryview]:
        """The piece buffer, from where the frame being read has got to."""
        off = self.filled % len(self.held)
        return [self.held[off:off + n]]

    def advance(self, n: int) -> None:
        """``n`` more bytes landed."""
        self.filled += n


class _Sized(_Stream):
    """The size of a receive whose bytes land in no stream of their own
    (:class:`_Reused`)."""

    __slots__ = ()

    def __init__(self, total: int) -> None:
        self.views, self.starts, self.total = [], [], total


class _Link:
    """One connection to a peer: frames queued to write (a flat queue of their pieces
    of memory), and the frame being read (``into``: its receive; ``left``: bytes of its
    body still to read; or its header, ``got`` bytes of it so far)."""

    __slots__ = ("expect", "got", "head", "headview", "into", "left", "out", "parked",
                 "peer", "sock", "start")

    def __init__(self, sock: socket.socket, peer: int) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.peer = sock, peer
        self.out: collections.deque[memoryview] = collections.deque()
        self.head = bytearray(_HEADER.size)
        self.headview = memoryview(self.head)
        self.got = 0
        self.into: _Inbound | None = None
        self.left = 0
        self.start = 0  # where the frame being read starts in its receive's stream
        self.expect = 0  # receives posted from this peer and not complete
        self.parked: tuple[int, int, int] | None = None  # a header nobody expects yet


def _mac(secret: bytes, nonce: bytes, device: int, name: bytes) -> bytes:
    """The response to a challenge: HMAC-SHA256 of the nonce, the device and the
    channel's name under the listener's secret."""
    return hmac.new(secret, nonce + struct.pack("<q", device) + name, hashlib.sha256).digest()


@dataclass
class _Pending:
    """A new connection whose introduction is being read: when it must be complete,
    the nonce it was sent, and the bytes so far."""

    deadline: float
    nonce: bytes
    got: bytearray


class _Hub:
    """What the channels of one rank share: its listener (and its secret), the
    connections accepted for any channel until that channel asks, and the peers'
    published addresses. Channels run on threads of their own: one of them at a time
    takes the listener (``listening``) for one short round of accepting and reading
    introductions (the pending ones live only under it); the table of accepted
    connections has a lock of its own, held only to look; the rendezvous (one
    connection, not thread-safe) a third."""

    def __init__(self, advertise: str, rendezvous: Any, timeout: float) -> None:
        self.listener = listen_on(advertise, backlog=_BACKLOG)
        self.listener.setblocking(False)
        self.secret = secrets.token_bytes(16)
        self.rendezvous, self.timeout = rendezvous, timeout
        self.listening = threading.Lock()  # the listener, pending
        self.lock = threading.Lock()  # accepted, taken, conflicts, closed
        self.asking = threading.Lock()  # the rendezvous, addresses
        self.accepted: dict[tuple[str, int], socket.socket] = {}
        self.taken: set[tuple[str, int]] = set()
        self.conflicts: dict[tuple[str, int], str] = {}
        self.pending: dict[socket.socket, _Pending] = {}
        self.addresses: dict[int, tuple[str, int, bytes]] = {}
        self.closed = False
        host, port = self.listener.getsockname()[:2]
        self.published = f"{host}|{port}|{self.secret.hex()}".encode()

    def address(self, peer: int) -> tuple[str, int, bytes]:
        """Where ``peer`` listens, and its secret (from the rendezvous, once)."""
        with self.asking:
            got = self.addresses.get(peer)
            if got is None:
                raw = self.rendezvous.get(f"tcp/{peer}", self.timeout).decode()
                host, port, secret = raw.split("|")
                got = self.addresses[peer] = (host, int(port), bytes.fromhex(secret))
            return got

    def connect(self, me: int, peer: int, channel: str) -> socket.socket:
        """A new connection to ``peer`` for ``channel``, introduced (its challenge
        answered)."""
        host, port, secret = self.address(peer)
        sock = None
        try:
            sock = socket.create_connection((host, port), timeout=self.timeout)
            sock.settimeout(min(self.timeout, _HELLO_WAIT))
            magic, nonce = _CHALLENGE.unpack(recv_exact(sock, _CHALLENGE.size,
                                                        "the listener's challenge"))
            if magic != _MAGIC:
                raise ConnectionError("it sent no reshard tcp challenge")
            name = channel.encode()
            sock.sendall(_HELLO.pack(_MAGIC, _mac(secret, nonce, me, name), me, len(name))
                         + name)
        except OSError as e:
            if sock is not None:
                sock.close()
            raise ExecutionError(f"device {me}: cannot connect to device {peer} at "
                                 f"{host}:{port}: {e}") from e
        return sock

    def accept(self, me: int, peer: int, channel: str) -> socket.socket:
        """The connection ``peer`` made (or makes within the timeout) for ``channel``;
        others introduced meanwhile are kept for whoever asks for them."""
        deadline = time.monotonic() + self.timeout
        key = (channel, peer)
        while True:
            with self.lock:
                if self.closed:
                    raise ExecutionError(f"device {me}: closed while waiting for device "
                                         f"{peer} to connect")
                if key in self.conflicts:
                    raise ExecutionError(f"device {me}: {self.conflicts[key]}")
                sock = self.accepted.pop(key, None)
                if sock is not None:
                    self.taken.add(key)
                    return sock
            if self.listening.acquire(timeout=0.05):
                try:
                    self._introduce(0.05)
                finally:
                    self.listening.release()
            if time.monotonic() > deadline:
                raise ExecutionError(f"device {me}: device {peer} did not connect within "
                                     f"{self.timeout:g}s (channel {channel or 'main'!r}; "
                                     f"peer dead or stuck)")

    def _introduce(self, wait: float) -> None:
        """One round, holding ``listening``: take every connection the listener has
        (each sent its challenge), read what the pending ones sent (waiting at most
        ``wait`` for anything), claim the complete introductions, and drop the wrong
        ones and those past their deadline."""
        try:
            ready, _, _ = select.select([self.listener, *self.pending], [], [], wait)
        except (OSError, ValueError):  # closed under us
            return
        now = time.monotonic()
        if self.listener in ready:
            self._take_new(now)
        for conn in ready:
            if conn is not self.listener and conn in self.pending:
                self._read(conn)
        for conn, p in list(self.pending.items()):
            if now > p.deadline:
                self._drop(conn)

    def _take_new(self, now: float) -> None:
        """Accept what the listener queued, send each a challenge, keep it pending."""
        while True:
            try:
                conn = self.listener.accept()[0]
            except (BlockingIOError, OSError):
                return
            nonce = secrets.token_bytes(16)
            try:
                conn.setblocking(False)
                conn.send(_CHALLENGE.pack(_MAGIC, nonce))  # a fresh socket's buffer takes it
            except OSError:
                conn.close()
                continue
            if len(self.pending) >= _PENDING:
                self._drop(min(self.pending, key=lambda c: self.pending[c].deadline))
            self.pending[conn] = _Pending(now + _HELLO_WAIT, nonce, bytearray())

    def _read(self, conn: socket.socket) -> None:
        """Read what ``conn`` sent of its introduction (never past it: the frames
        after it are the channel's), and claim or drop it once complete."""
        p = self.pending[conn]
        want = _HELLO.size - len(p.got)
        if want <= 0:
            want = _HELLO.size + _HELLO.unpack(bytes(p.got[:_HELLO.size]))[3] - len(p.got)
        try:
            chunk = conn.recv(want)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        p.got += chunk
        if len(p.got) < _HELLO.size:
            return
        magic, mac, peer, n = _HELLO.unpack(bytes(p.got[:_HELLO.size]))
        if magic != _MAGIC:
            self._drop(conn)
            return
        if len(p.got) < _HELLO.size + n:
            return
        name = bytes(p.got[_HELLO.size:])
        del self.pending[conn]
        if not hmac.compare_digest(mac, _mac(self.secret, p.nonce, peer, name)):
            conn.close()
            return
        try:
            channel = name.decode()
        except UnicodeDecodeError:
            conn.close()
            return
        self._claim((channel, int(peer)), conn)

    def _claim(self, key: tuple[str, int], conn: socket.socket) -> None:
        """Keep ``conn`` for the channel that asks for ``key``, unless another already
        claimed it (refused loudly: module docstring)."""
        channel, peer = key
        what = (f"two connections claimed to be device {peer} on channel "
                f"{channel or 'main'!r}; both refused (only a process that knows this "
                f"listener's secret can introduce itself: another process of this run is "
                f"confused, or the secret leaked)")
        with self.lock:
            if key in self.taken:
                conn.close()
                _log.error("reshard tcp: a second connection claimed to be device %d on "
                           "channel %r after the first was in use; closed it", peer,
                           channel or "main")
            elif key in self.accepted:
                conn.close()
                self.accepted.pop(key).close()
                self.conflicts[key] = what
            elif key in self.conflicts:
                conn.close()
            else:
                self.accepted[key] = conn

    def _drop(self, conn: socket.socket) -> None:
        self.pending.pop(conn, None)
        conn.close()

    def close(self) -> None:
        """Close the listener and the connections no channel took."""
        with self.lock:
            self.closed = True
            for sock in self.accepted.values():
                sock.close()
            self.accepted.clear()
        self.listener.close()
        if self.listening.acquire(timeout=1.0):  # a round in progress ends within 0.05 s
            try:
                for conn in list(self.pending):
                    self._drop(conn)
            finally:
                self.listening.release()


class TcpBackend(HostMemory):
    """One rank of the ``tcp`` backend (module docstring).

    Args:
        device: the global device id served.
        world: every device of the runtime, sorted.
        rendezvous: a connected rendezvous client (``set`` / ``get``).
        timeout: seconds an operation may go without progress.
        advertise: the address other ranks reach this process at (its listener's).
        host, local_index: placement facts (unused).
    """

    name = "tcp"
    capabilities = Capabilities(moves=None, sums=None, groups_need_world=False, device="cpu",
                                lands_pieces=True, sized_pieces=True, batch_scheduled=True,
                                gathers=True)
    relay_piece = 0
    """The running program's piece (:meth:`use_piece`; 0: the default piece)."""

    def __init__(self, device: int, world: Sequence[int], rendezvous: Any, timeout: float,
                 *, advertise: str = "127.0.0.1", host: int = 0, local_index: int = 0) -> None:
        self.device = int(device)
        self._world = tuple(int(d) for d in world)
        if self.device not in self._world:
            raise ExecutionError(f"device {device} is not in the world {list(self._world)}")
        self.timeout = float(timeout)
        self._hub = _Hub(advertise, rendezvous, self.timeout)
        try:
            rendezvous.set(f"tcp/{self.device}", self._hub.published)
        except BaseException:
            self._hub.close()
            raise
        self._channel = ""
        self._links: dict[int, _Link] = {}
        self._posted: dict[tuple[int, int], collections.deque[_Inbound]] = {}
        self._pending = 0  # receives posted and not complete
        self._after: list[Callable[[], None]] = []  # to run once the group completed
        self._open = False
        self._closed = False
        self._failed: ExecutionError | None = None  # this channel's first failure

    @property
    def world(self) -> tuple[int, ...]:
        """Every device of the runtime, in rank order."""
        return self._world

    # ----- connections and channels --------------------------------------------------
    def channel(self, name: str) -> TcpBackend:
        """This rank on an independent channel: connections of its own (made on first
        use, like the main ones)."""
        child = copy.copy(self)
        child._channel = f"{self._channel}/{name}"
        child._links, child._posted, child._after = {}, {}, []
        child._pending, child._open, child._failed = 0, False, None
        return child

    def _link(self, peer: int) -> _Link:
        link = self._links.get(peer)
        if link is None:
            if self._failed is not None:
                raise self._failed
            if peer == self.device or peer not in self._world:
                raise ExecutionError(f"device {self.device}: no connection to device {peer} "
                                     f"(the world is {list(self._world)})")
            hub = self._hub
            try:
                sock = (hub.connect(self.device, peer, self._channel) if self.device < peer
                        else hub.accept(self.device, peer, self._channel))
            except ExecutionError as e:
                raise self._fail(e) from None
            link = self._links[peer] = _Link(sock, peer)
        return link

    def _fail(self, e: ExecutionError) -> ExecutionError:
        """Record this channel's first failure (its connections' state is unknown after
        it: every later operation is refused) and return ``e``."""
        if self._failed is None:
            self._failed = ExecutionError(f"device {self.device}: this tcp channel failed "
                                          f"earlier ({e}); make a new backend")
        return e

    def prepare(self, plan: Any) -> None:
        """Check that the plan's groups are within the world, and connect to every
        device this rank's tasks share (a ReshardPlan's or a WorkerProgram's), in
        ascending order: the lowest device only connects, which never waits, so each
        rank's accepts are answered in turn; a run then never stops its traffic to wait
        for a connection."""
        for group in plan.communicator_groups():
            unknown = [d for d in group if d not in self._world]
            if unknown:
                raise ExecutionError(
                    f"device {self.device}: group {list(group)} has devices {unknown} "
                    f"outside the world {list(self._world)}")
        me, peers = self.device, set()
        for task in getattr(plan, "tasks", ()):
            t = task[1] if isinstance(task, tuple) else task
            if me in t.devices:
                peers.update(t.devices)
        for peer in sorted(peers - {me}):
            if peer in self._world:
                self._link(peer)

    def use_piece(self, nbytes: int) -> None:
        """Pipeline the operations that follow in pieces of the plan's
        ``Cluster.relay_piece`` ``nbytes`` (:func:`wire_piece`)."""
        self.relay_piece = max(0, int(nbytes))

    # ----- posting ----------------------------------------------------------------------
    def _queue(self, peer: int, tag: int, stream: _Stream, a: int, b: int) -> None:
        """Frames of stream bytes ``[a, b)`` to ``peer``, a piece each."""
        link = self._link(peer)
        out = link.out
        piece = wire_piece(self.relay_piece, stream.total)
        pack = _HEADER.pack
        total = stream.total
        for views in stream.frames(a, b, piece):
            out.append(memoryview(pack(tag, sum(map(len, views)), total)))
            out.extend(views)
        self._write(link)  # what the kernel takes now goes while the caller packs on

    def _post(self, what: str, peer: int, tag: int, stream: _Stream,
              on_frame: Callable[[int, int], None] | None = None) -> None:
        """Register a receive of ``stream`` from ``peer`` (:meth:`_register`)."""
        self._register(_Inbound(what, peer, tag, stream, on_frame))

    def _register(self, into: _Inbound) -> None:
        """Register a posted receive (first posted, first matched by its peer and tag)."""
        link = self._link(into.peer)
        self._posted.setdefault((into.peer, into.tag), collections.deque()).append(into)
        link.expect += 1
        self._pending += 1
        self._read(link)  # what has arrived lands (and a relay passes it on) already

    def _run(self) -> None:
        """Outside a group an operation is a group of its own."""
        if self._failed is not None:
            raise self._failed
        if not self._open:
            self._open = True
            self.group_end()

    def send(self, buf: Any, peer: int, *, tag: int = 0) -> None:
        """Frames of ``buf`` (an array, or a list of them) to ``peer``, tagged ``tag``."""
        stream = _Stream(buf)
        if stream.total:
            self._queue(peer, tag, stream, 0, stream.total)
            self._run()

    def recv(self, buf: Any, peer: int, *, tag: int = 0,
             landed: Callable[[int], None] | None = None) -> None:
        """Receive ``buf`` (an array, or a list of them: scattered) from ``peer``;
        ``landed`` hears of the bytes filled after each frame."""
        stream = _Stream(buf)
        if stream.total:
            self._post("recv", peer, tag, stream,
                       None if landed is None else lambda a, b: landed(b))
            self._run()

    def broadcast(self, buf: Any, root: int, group: Sequence[int],
                  chain: Sequence[int] | None = None, *, tag: int = 0,
                  parents: Sequence[int] | None = None, addends: Sequence[int] = (),
                  addend_parents: Sequence[int] | None = None,
                  landed: Callable[[int], None] | None = None) -> None:
        """From ``root`` down the chain (``chain`` order; the group's without one) or
        the tree ``parents`` give, pipelined: a member others receive from passes each
        frame on as it lands. ``landed`` (a receiver's) hears of the bytes filled so
        far after each frame."""
        refuse_unsupported(self.name, self.capabilities, addends)
        stream = _Stream(buf)
        if not stream.total:
            return
        if chain is None:
            chain = [d for d in group if d != root]
        receivers = [d for d in chain if d != root]
        if parents is None:
            parents = [root, *receivers[:-1]]
        me = self.device
        nxts = [b for a, b in zip(parents, receivers) if a == me]
        if me == root:
            for nxt in nxts:
                self._queue(nxt, tag, stream, 0, stream.total)
        elif me in receivers:
            prev = parents[receivers.index(me)]
            what = "chain broadcast" if len(receivers) > 1 else "broadcast"
            for nxt in nxts:  # connected now: the group's loop makes no connection
                self._link(nxt)

            def on_frame(a: int, b: int) -> None:
                for nxt in nxts:
                    self._queue(nxt, tag, stream, a, b)
                if landed is not None:
                    landed(b)

            self._post(what, prev, tag, stream, on_frame if nxts or landed else None)
        self._run()

    def all_gather(self, out: np.ndarray, inp: np.ndarray, group: Sequence[int]) -> None:
        """Row ``i`` of ``out`` = member ``group[i]``'s ``inp``: this member's input
        goes to every other, theirs land straight in their rows."""
        if not inp.size:
            return
        me = self.device
        if me not in group:
            return
        rows = out.reshape(len(group), -1)
        rows[list(group).index(me)] = inp.reshape(-1)
        mine = _Stream(inp)
        for d in group:
            if d != me:
                self._queue(d, _GATHER_TAG, mine, 0, mine.total)
        for row, d in enumerate(group):
            if d != me:
                self._post("all-gather", d, _GATHER_TAG, _Stream(rows[row]))
        self._run()

    def reduce(self, buf: np.ndarray, root: int, group: Sequence[int], *,
               op: ReduceOp = ReduceOp.SUM) -> None:
        """A pipelined chain through the members in group order, ending at the root:
        each member adds every frame of the running result, as it lands in one
        piece-sized buffer, into its own ``buf`` (numpy, in the buffer's dtype: integers
        wrap) and passes that piece on; the root's ``buf`` ends with the result (a
        member's with a partial one). Each member receives and sends the buffer once
        and holds one piece beside it, whatever the group's size."""
        me = self.device
        if not buf.size or me not in group:
            return
        chain = [d for d in group if d != root] + [root]
        at = chain.index(me)
        mine = _Stream(buf)
        nxt = chain[at + 1] if at + 1 < len(chain) else None
        if at == 0:
            if nxt is not None:
                self._queue(nxt, _REDUCE_TAG, mine, 0, mine.total)
            self._run()
            return
        if nxt is not None:
            self._link(nxt)  # connected now: the group's loop makes no connection
        piece = wire_piece(self.relay_piece, mine.total)
        held = np.empty(min(piece, mine.total), np.uint8)
        combine, flat, size = _COMBINE[op], buf.reshape(-1), buf.itemsize

        def on_frame(a: int, b: int) -> None:
            got = held[:b - a].view(buf.dtype)
            part = flat[a // size:b // size]
            combine(part, got, out=part)
            if nxt is not None:
                self._queue(nxt, _REDUCE_TAG, mine, a, b)

        # every frame lands at the start of ``held``, consumed before the next is read
        self._register(_Reused("reduce", chain[at - 1], _REDUCE_TAG, mine.total, held,
                               on_frame))
        self._run()

    # ----- groups -------------------------------------------------------------------------
    def group_start(self) -> None:
        """Open a group: operations only post until :meth:`group_end`."""
        if self._failed is not None:
            raise self._failed
        if self._open:
            raise ExecutionError(f"device {self.device}: group_start inside an open group")
        self._open = True

    def group_end(self) -> None:
        """Move every frame of the group and every byte it receives (module docstring);
        on return the group's operations are complete."""
        if not self._open:
            raise ExecutionError(f"device {self.device}: group_end without group_start")
        self._open = False
        try:
            self._progress()
        except ExecutionError as e:
            raise self._fail(e) from e.__cause__
        finally:
            after, self._after = self._after, []
        for fn in after:
            fn()

    def _progress(self) -> None:
        links = self._links.values()
        last = time.monotonic()
        while True:
            moved = False
            busy = False
            for link in links:
                if link.out:
                    moved |= self._write(link)
                    busy = True
                if link.expect:
                    moved |= self._read(link)
                    busy = True
            if not busy and not self._pending:
                return
            if moved:
                last = time.monotonic()
                continue
            left = self.timeout - (time.monotonic() - last)
            if left <= 0:
                raise self._stuck()
            self._wait(left)

    def _wait(self, seconds: float) -> None:
        """Wait until a connection with work can move, or ``seconds`` passed."""
        poll = select.poll()
        for link in self._links.values():
            mask = (select.POLLOUT if link.out else 0) | \
                (select.POLLIN if link.expect and link.parked is None else 0)
            if mask:
                poll.register(link.sock, mask)
        poll.poll(max(1, int(min(seconds, _POLL) * 1000)))

    def _write(self, link: _Link) -> bool:
        """Write what the kernel takes of ``link``'s queue; True if anything went."""
        out, sock = link.out, link.sock
        moved = False
        while out:
            iov, size = [], 0
            for v in out:  # what the kernel may take at once (its send buffer's worth)
                iov.append(v)
                size += len(v)
                if size >= _BATCH or len(iov) == _IOV:
                    break
            try:
                n = sock.sendmsg(iov)
            except BlockingIOError:
                break
            except OSError as e:
                raise self._broken(link, e) from e
            moved = True
            while n:
                v = out[0]
                if len(v) <= n:
                    n -= len(v)
                    out.popleft()
                else:
                    out[0] = v[n:]
                    n = 0
        return moved

    def _read(self, link: _Link) -> bool:
        """Read what has arrived on ``link`` into the receives it belongs to; True if
        anything did."""
        moved = False
        while link.expect:
            into = link.into
            if into is None:
                if link.parked is not None:
                    if not self._match(link, *link.parked):
                        return moved
                    continue
                if link.got < _HEADER.size:
                    n = self._receive(link, [link.headview[link.got:]])
                    if n is None:
                        return moved
                    moved = True
                    link.got += n
                    continue
                link.got = 0
                tag, size, total = _HEADER.unpack(link.head)
                if not self._match(link, tag, size, total):
                    link.parked = (tag, size, total)
                    return moved
                continue
            left = link.left
            views = into.places(left)
            if len(views) < _IOV:  # they hold the rest: the next header may come along
                views.append(link.headview)
            got = self._receive(link, views)
            if got is None:
                return moved
            n, moved = got, True
            if n > left:  # the frame's end and (part of) the next one's header
                link.got, n = n - left, left
            into.advance(n)
            link.left -= n
            if not link.left:
                self._landed(link, into)
        return moved

    def _receive(self, link: _Link, views: list[memoryview]) -> int | None:
        """Bytes read from ``link`` into ``views`` (in order) without waiting; None if
        none had arrived. A closed or failed connection raises, naming the peer."""
        sock = link.sock
        try:
            n = sock.recvmsg_into(views)[0] if len(views) > 1 else sock.recv_into(views[0])
        except BlockingIOError:
            return None
        except OSError as e:
            raise self._broken(link, e) from e
        if not n:
            raise self._broken(link, None)
        return n

    def _match(self, link: _Link, tag: int, size: int, total: int) -> bool:
        """Start reading a ``size``-byte frame tagged ``tag`` (of a ``total``-byte
        operation) into the receive posted first for it; False if none is posted (yet)."""
        queue = self._posted.get((link.peer, tag))
        if not queue:
            return False
        into = queue[0]
        if total != into.stream.total or size > into.stream.total - into.filled:
            raise self._fail(ExecutionError(
                f"device {self.device}: tcp {into.what} from device {link.peer} (tag {tag}) "
                f"sends {total} bytes in frames of up to {size}, where {into.stream.total} "
                f"are expected ({into.filled} landed): the two ranks run different plans"))
        link.parked = None
        link.into, link.left, link.start = into, size, into.filled
        if not size:
            self._landed(link, into)
        return True

    def _landed(self, link: _Link, into: _Inbound) -> None:
        """A frame's body is in: report it; a receive with all its bytes completes."""
        link.into = None
        if into.filled == into.stream.total:
            queue = self._posted[(into.peer, into.tag)]
            queue.popleft()
            if not queue:
                del self._posted[(into.peer, into.tag)]
            link.expect -= 1
            self._pending -= 1
        if into.on_frame is not None:
            into.on_frame(link.start, into.filled)

    def _broken(self, link: _Link, e: OSError | None) -> ExecutionError:
        why = "closed the connection" if e is None else f"failed ({e})"
        doing = (link.into.what if link.into is not None else
                 next((q[0].what for (p, _), q in self._posted.items() if p == link.peer),
                      "send"))
        return self._fail(ExecutionError(
            f"device {self.device}: tcp {doing} with device(s) [{link.peer}] failed: device "
            f"{link.peer} {why} (peer dead or its run failed)"))

    def _stuck(self) -> ExecutionError:
        waiting = sorted({p for p, _ in self._posted})
        writing = sorted(link.peer for link in self._links.values() if link.out)
        parts = []
        if waiting:
            parts.append(f"receiving from device(s) {waiting}")
        if writing:
            parts.append(f"sending to device(s) {writing}")
        parked = sorted((link.peer, link.parked[0]) for link in self._links.values()
                        if link.parked is not None and link.expect)
        also = (f"; unexpected frames (device, tag): {parked}" if parked else "")
        where = f" (channel {self._channel!r})" if self._channel else ""
        return ExecutionError(f"device {self.device}: tcp: no progress {' and '.join(parts)} "
                              f"within {self.timeout:g}s{where} (peer dead or stuck){also}")

    def close(self) -> None:
        """Close this channel's connections (the main rank: its listener too)."""
        if self._closed:
            return
        self._closed = True
        for link in self._links.values():
            link.sock.close()
        self._links.clear()
        if not self._channel:
            self._hub.close()


__all__ = ["TcpBackend"]
