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
(:meth:`TcpBackend.prepare`), else on first use, introduced by a challenge, a response
and the listener's proof that it kept the connection, all under the run's link key
(:mod:`reshard.comm.backends.tcp_intro`, :mod:`reshard.comm.backends.tcp_hub`). On it
travel
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

import collections
import copy
import logging
import select
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from reshard.comm.backend import Devices, Landed
from reshard.comm.backends.host_memory import (
    Grouped,
    HostMemory,
    wire_piece,
)
from reshard.comm.backends.tcp_frames import HEADER, IOV, Inbound, Link, Reused, Stream
from reshard.comm.backends.tcp_hub import Hub
from reshard.comm.bootstrap.link_key import LinkKey
from reshard.core.dtypes import ReduceOp
from reshard.core.errors import ExecutionError

_log = logging.getLogger("reshard.tcp")

_SERVE = 0.25
"""The longest single wait for a connection to move (timeouts are longer)."""
_SERVE_EVERY = 0.05
"""Seconds at least between two rounds of reading introductions from a wait (a wait
is often short: a relay's next frame)."""
_BATCH = 1 << 21
"""Bytes handed to one ``sendmsg`` at most (about what a socket's send buffer takes)."""
_GATHER_TAG = 0x3FFF0000
"""The tag of all-gather frames (tasks' tags are their indices in the plan, far below)."""
_REDUCE_TAG = 0x3FFF0001
"""The tag of a reduction's addends."""
_COMBINE: dict[ReduceOp, Callable[..., Any]] = {ReduceOp.SUM: np.add, ReduceOp.MAX: np.maximum}


class TcpBackend(Grouped, HostMemory):
    """One rank of the ``tcp`` backend (module docstring).

    Args:
        device: the global device id served.
        world: every device of the runtime, sorted.
        rendezvous: a connected rendezvous client (``set`` / ``get``).
        timeout: seconds an operation may go without progress.
        advertise: the address other ranks reach this process at (its listener's).
        link_key: the run's key for introducing connections (a
            :class:`~reshard.comm.bootstrap.link_key.LinkKey` or its bytes), the same on
            every rank and never in the rendezvous: reshard's launchers make one per
            run. None: each listener's own secret, published with its address in the
            rendezvous (whoever reads the rendezvous can then introduce itself).
        host, local_index: placement facts (unused).
    """

    name = "tcp"

    def __init__(self, device: int, world: Sequence[int], rendezvous: Any, timeout: float,
                 *, advertise: str = "127.0.0.1", link_key: LinkKey | bytes | None = None,
                 host: int = 0, local_index: int = 0) -> None:
        self._join(device, tuple(int(d) for d in world), timeout)
        self._hub = Hub(self.device, advertise, rendezvous, self.timeout, LinkKey.of(link_key))
        try:
            rendezvous.set(f"tcp/{self.device}", self._hub.published)
        except BaseException:
            self._hub.close()
            raise
        self._channel = ""
        self._links: dict[int, Link] = {}
        self._posted: dict[tuple[int, int], collections.deque[Inbound]] = {}
        self._pending = 0  # receives posted and not complete
        self._open = False
        self._closed = False
        self._failed: ExecutionError | None = None  # this channel's first failure


    # ----- connections and channels --------------------------------------------------
    def channel(self, name: str) -> TcpBackend:
        """This rank on an independent channel: connections of its own (made on first
        use, like the main ones)."""
        child = copy.copy(self)
        child._channel = f"{self._channel}/{name}"
        child._links, child._posted = {}, {}
        child._pending, child._open, child._failed = 0, False, None
        self._hub.open_channel(child._channel)
        return child

    def _link(self, peer: int) -> Link:
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
            link = self._links[peer] = Link(sock, peer)
        return link


    def prepare(self, plan: Any) -> None:
        """Check that the plan's groups are within the world, and connect to every
        device this rank's tasks share (a ReshardPlan's or a WorkerProgram's), in
        ascending order: the lowest device only connects, which never waits, so each
        rank's accepts are answered in turn; a run then never stops its traffic to wait
        for a connection."""
        for peer in self.peers_of(plan):
            self._link(peer)


    # ----- posting ----------------------------------------------------------------------
    def _send_whole(self, peer: int, tag: int, stream: Stream) -> None:
        self._queue(peer, tag, stream, 0, stream.total)

    def _queue(self, peer: int, tag: int, stream: Stream, a: int, b: int) -> None:
        """Frames of stream bytes ``[a, b)`` to ``peer``, a piece each."""
        link = self._link(peer)
        out = link.out
        piece = wire_piece(self.relay_piece, stream.total)
        pack = HEADER.pack
        total = stream.total
        for views in stream.frames(a, b, piece):
            out.append(memoryview(pack(tag, sum(map(len, views)), total)))
            out.extend(views)
        self._write(link)  # what the kernel takes now goes while the caller packs on

    def _post(self, what: str, peer: int, tag: int, stream: Stream,
              on_frame: Callable[[int, int], None] | None = None) -> None:
        """Register a receive of ``stream`` from ``peer`` (:meth:`_register`)."""
        self._register(Inbound(what, peer, tag, stream, on_frame))

    def _register(self, into: Inbound) -> None:
        """Register a posted receive (first posted, first matched by its peer and tag)."""
        link = self._link(into.peer)
        self._posted.setdefault((into.peer, into.tag), collections.deque()).append(into)
        link.expect += 1
        self._pending += 1
        self._read(link)  # what has arrived lands (and a relay passes it on) already


    def send(self, buf: Any, peer: int, *, tag: int = 0) -> None:
        """Frames of ``buf`` (an array, or a list of them) to ``peer``, tagged ``tag``."""
        stream = Stream(buf)
        if stream.total:
            self._queue(peer, tag, stream, 0, stream.total)
            self._run()

    def recv(self, buf: Any, peer: int, *, tag: int = 0, landed: Landed | None = None) -> None:
        """Receive ``buf`` (an array, or a list of them: scattered) from ``peer``;
        ``landed`` hears of the bytes filled after each frame."""
        stream = Stream(buf)
        if stream.total:
            self._post("recv", peer, tag, stream,
                       None if landed is None else lambda a, b: landed(b))
            self._run()

    def broadcast(self, buf: Any, root: int, group: Devices, chain: Devices | None = None,
                  *, tag: int = 0, parents: Devices | None = None, addends: Devices = (),
                  addend_parents: Devices | None = None, landed: Landed | None = None) -> None:
        """From ``root`` down the chain (``chain`` order; the group's without one) or
        the tree ``parents`` give, pipelined: a member others receive from passes each
        frame on as it lands. ``landed`` (a receiver's) hears of the bytes filled so
        far after each frame."""
        part = self._broadcast_part(buf, root, group, chain, parents, addends, tag)
        if part is None:
            return
        stream, what, prev, nxts = part
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
        rows = self._gather_rows(out, inp, group)
        if rows is None:
            return
        me = self.device
        mine = Stream(inp)
        for d in group:
            if d != me:
                self._send_whole(d, _GATHER_TAG, mine)
        for row, d in enumerate(group):
            if d != me:
                self._post("all-gather", d, _GATHER_TAG, Stream(rows[row]))
        self._run()

    def reduce(self, buf: np.ndarray, root: int, group: Sequence[int], *,
               op: ReduceOp = ReduceOp.SUM) -> None:
        """A pipelined chain through the members in group order, ending at the root:
        each member adds every frame of the running result, as it lands in one
        piece-sized buffer, into its own ``buf`` (numpy, in the buffer's dtype: integers
        wrap) and passes that piece on; the root's ``buf`` ends with the result (a
        member's with a partial one). Each member receives and sends the buffer once
        and holds one piece beside it, whatever the group's size."""
        part = self._reduce_part(buf, root, group, _REDUCE_TAG)
        if part is None:
            return
        mine, prev, nxt = part
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
        self._register(Reused("reduce", prev, _REDUCE_TAG, mine.total, held,
                               on_frame))
        self._run()

    # ----- groups -------------------------------------------------------------------------


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
                self._check_claims()
                return
            if moved:
                last = time.monotonic()
                continue
            left = self.timeout - (time.monotonic() - last)
            if left <= 0:
                raise self._stuck()
            self._wait(left)

    def _check_claims(self) -> None:
        """Fail if another connection claimed to be a peer of one of this channel's
        links (:mod:`~reshard.comm.backends.tcp_hub`): one of the two is an impostor,
        so no operation on the link may succeed."""
        conflicts = self._hub.conflicts
        if conflicts:
            for peer in self._links:
                why = conflicts.get((self._channel, peer))
                if why is not None:
                    raise self._fail(ExecutionError(f"device {self.device}: {why}"))

    def _wait(self, seconds: float) -> None:
        """Wait until a connection with work can move, or ``seconds`` passed (at most
        :data:`_SERVE`: between waits the rank reads new introductions, so a peer's
        connection is answered, and a second claim of a link seen, while it waits)."""
        hub = self._hub
        now = time.monotonic()
        if now - hub.served > _SERVE_EVERY and hub.listening.acquire(blocking=False):
            try:
                hub.served = now
                hub.introduce(0.0)
            finally:
                hub.listening.release()
        self._check_claims()
        seconds = min(seconds, _SERVE)
        poll = select.poll()
        for link in self._links.values():
            mask = (select.POLLOUT if link.out else 0) | \
                (select.POLLIN if link.expect and link.parked is None else 0)
            if mask:
                poll.register(link.sock, mask)
        poll.poll(max(1, int(seconds * 1000)))

    def _write(self, link: Link) -> bool:
        """Write what the kernel takes of ``link``'s queue; True if anything went."""
        out, sock = link.out, link.sock
        moved = False
        while out:
            iov, size = [], 0
            for v in out:  # what the kernel may take at once (its send buffer's worth)
                iov.append(v)
                size += len(v)
                if size >= _BATCH or len(iov) == IOV:
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

    def _read(self, link: Link) -> bool:
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
                if link.got < HEADER.size:
                    n = self._receive(link, [link.headview[link.got:]])
                    if n is None:
                        return moved
                    moved = True
                    link.got += n
                    continue
                link.got = 0
                tag, size, total = HEADER.unpack(link.head)
                if not self._match(link, tag, size, total):
                    link.parked = (tag, size, total)
                    return moved
                continue
            left = link.left
            views = into.places(left)
            if len(views) < IOV:  # they hold the rest: the next header may come along
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

    def _receive(self, link: Link, views: list[memoryview]) -> int | None:
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

    def _match(self, link: Link, tag: int, size: int, total: int) -> bool:
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

    def _landed(self, link: Link, into: Inbound) -> None:
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

    def _broken(self, link: Link, e: OSError | None) -> ExecutionError:
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
