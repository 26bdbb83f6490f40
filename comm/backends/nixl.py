"""The ``nixl`` backend: one-sided WRITEs of registered host memory through NVIDIA's NIXL.

NIXL (the transfer library of Dynamo, vLLM's KV connectors and NeMo-RL's refit) moves
bytes by one-sided READ / WRITE of memory registered with an *agent*, named by
descriptor lists, and tells the target of a finished transfer by a *notification*
(bytes it polls for). Each rank is one agent (``reshard-<device>-<random>``, the UCX plug-in);
its metadata (connection and registration keys) travels through the run's rendezvous,
loaded by every peer it shares a task with.

A transfer of the Backend protocol (two-sided: a ``send`` on one rank, a ``recv`` on
the other) runs as:

1. the receiver registers its places (the buffers themselves: a shard, or scratch,
   which the backend hands out as blocks of slabs registered once,
   :mod:`reshard.comm.backends.nixl_pool`; a caller's arrays one by one,
   :mod:`reshard.comm.backends.nixl_memory`) and notifies the sender *ready*: the
   operation's tag and number (the how-many-th operation of that tag between the pair:
   both sides count alike, every rank issuing its operations in the plan's order), its
   places as (address, bytes) runs, the partial metadata of any registration the
   sender has not seen, and the registrations it was told of that are gone since (a
   receive into memory the sender may hold stale keys of lands in a staging buffer and
   is copied into place as it lands: :mod:`~reshard.comm.backends.nixl_memory`);
2. the sender WRITEs from its own registered places into those, each WRITE's
   descriptor lists cut at the union of the two sides' boundaries, with a notification
   *landed* (tag, number, bytes ``[a, b)``) that NIXL delivers after the WRITE's bytes:
   piece by piece (:func:`~reshard.comm.backends.host_memory.wire_piece`) where the
   receiver said it acts on pieces as they land (a relay, a reduction, a caller's
   ``landed``), else all the sender holds in one WRITE;
3. the receiver's operation is complete once every byte has landed; the sender's once
   every WRITE reports ``DONE``.

A relay of a broadcast chain or tree passes each piece on as it lands (a WRITE from its
own buffer into the next member's), so chains pipeline; ``landed`` hears of each piece.
A reduction runs down the members in group order to the root, each member's running
result landing in a scratch buffer the member adds piece by piece into its own and
passes on. An all-gather writes each member's input straight into the others' rows.

Groups: operations post (ready notifications sent, writes started where the target is
ready) and :meth:`NixlBackend.group_end` polls the agent's notifications and the
writes' states until all are complete. Every failure names the device and peer: a
WRITE NIXL reports failed (a peer that died, a registration gone), a notification from
an agent outside the world, metadata naming another agent than the one asked for, and
no progress within the timeout (a notification that never comes).
"""

from __future__ import annotations

import collections
import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reshard.comm.backend import Devices, Landed
from reshard.comm.backends.host_memory import (
    Grouped,
    HostMemory,
    wire_piece,
)
from reshard.comm.backends.nixl_agent import (
    HEAD,
    LANDED,
    RANGE,
    READY,
    Agent,
    Ready,
    agent_prefix,
)
from reshard.comm.backends.nixl_memory import Registrations, Run, cut, paired, runs_of
from reshard.comm.backends.tcp_frames import Stream
from reshard.comm.bootstrap.link_key import LinkKey
from reshard.core.dtypes import ReduceOp
from reshard.core.errors import ExecutionError

_GATHER_TAG = -1
_REDUCE_TAG = -2
_COMBINE: dict[ReduceOp, Callable[..., Any]] = {ReduceOp.SUM: np.add, ReduceOp.MAX: np.maximum}
_IN_FLIGHT = 4
"""Pieces of one send written at once. WRITEs in flight together share the link and
land together, so a relay would get every piece of a chain near its end; with a few
in flight they land in turn (the testbed's paper case 1, a chain over a NIC and a relay
in the host: 0.45-0.48 s with 4, 0.45-0.49 with every piece at once, tcp 0.42)."""
_IDLE = (2e-5, 2e-4)
"""Seconds a group's loop sleeps when nothing moved: from the first to the second,
doubling (a rank of 2 cores' worth of processes must not spin). The loop is also what
progresses the agent: NIXL's own progress thread polls without pause (its delay is
fixed at 0 by the Python API), and 16 of them on 2 cores made a paper case at 8 MiB
take 380-535 ms where tcp took 21-43 (without them: 28-74 ms)."""


def available() -> str | None:
    """Why the nixl backend cannot run here (the package missing), or None."""
    import importlib.util

    if importlib.util.find_spec("nixl") is None:
        return ("--backend nixl needs NIXL, which is not installed: pip install -c "
                "constraints.txt 'reshard[nixl]', or use --backend tcp")
    return None


OnPiece = Callable[[int, int, int], None]
"""Told of a piece that landed: its bytes ``[a, b)``, and the bytes complete from the
stream's start."""


@dataclass
class _Inbound:
    """A posted receive from ``peer``: ``stream``'s bytes land in pieces (in any order);
    ``on_piece`` hears of each."""

    what: str
    peer: int
    key: tuple[int, int]  # (tag, number)
    stream: Stream
    on_piece: OnPiece | None
    regs: list[tuple[Run, int]] = field(default_factory=list)  # pinned until complete
    filled: int = 0
    spans: list[Run] = field(default_factory=list)  # landed byte ranges, merged
    # parts landing in a staging buffer: (stream position, their place, where they land)
    staged: list[tuple[int, memoryview, memoryview]] = field(default_factory=list)
    slab: Any = None  # the staging buffer

    def land(self, a: int, b: int) -> int:
        """Record bytes ``[a, b)`` (copied into place from staging, where they landed
        there); the bytes complete from the start."""
        for at, place, landing in self.staged:
            lo, hi = max(a, at), min(b, at + len(place))
            if lo < hi:
                place[lo - at:hi - at] = landing[lo - at:hi - at]
        self.filled += b - a
        return _contiguous_done(self.spans, a, b)


@dataclass
class _Outbound:
    """A posted send to ``peer`` of ``stream``'s bytes (``runs``: its places);
    ``ready``: the target's places once told; ``have``: bytes of the stream this rank
    holds (a relay's grow)."""

    peer: int
    key: tuple[int, int]
    stream: Stream
    runs: list[Run]
    have: int
    piece: int
    regs: list[tuple[Run, int]] = field(default_factory=list)  # pinned until complete
    ready: list[Run] | None = None
    pieces: bool = True  # the target acts on each piece as it lands
    sent: int = 0
    handles: list[Any] = field(default_factory=list)


class NixlBackend(Grouped, HostMemory):
    """One rank of the ``nixl`` backend (module docstring).

    Args:
        device: the global device id served.
        world: every device of the runtime.
        rendezvous: a connected rendezvous client (``set`` / ``get``).
        timeout: seconds an operation may go without progress.
        link_key: the run's key (a :class:`~reshard.comm.bootstrap.link_key.LinkKey` or its
            bytes), the same on every rank and never in the rendezvous: the metadata
            each rank publishes is signed with it and every notification tagged
            (:mod:`~reshard.comm.backends.nixl_agent`); reshard's launchers make one per
            run. None: only the agents' names are checked.
        advertise, host, local_index: placement facts (UCX finds its interfaces).
    """

    name = "nixl"

    def __init__(self, device: int, world: Sequence[int], rendezvous: Any, timeout: float,
                 *, advertise: str = "127.0.0.1", link_key: LinkKey | bytes | None = None,
                 host: int = 0, local_index: int = 0) -> None:
        self._join(device, tuple(sorted(int(d) for d in world)), timeout)
        self._shared = Agent(self.device, self._world, rendezvous, self.timeout,
                             LinkKey.of(link_key))
        self._channel = ""
        self._reset()
        self._closed = False

    def _reset(self) -> None:
        self._counts: collections.Counter[tuple[int, int, str]] = collections.Counter()
        self._inbound: dict[tuple[int, int, int], _Inbound] = {}
        self._outbound: dict[tuple[int, int, int], _Outbound] = {}
        self._early: dict[tuple[int, int, int], Ready] = {}  # ready before posted
        self._writing: list[tuple[_Outbound, Any]] = []
        # ready, but naming registrations whose metadata has not arrived yet
        self._parked: list[tuple[tuple[int, int, int], Ready]] = []
        self._open = False
        self._failed: ExecutionError | None = None

    @property
    def registrations(self) -> Registrations:
        """This rank's registered memory (shared by its channels)."""
        return self._shared.memory

    def empty(self, n: int, dtype: Any) -> np.ndarray:
        """A new 1-d buffer, a block of this rank's registered slabs
        (:mod:`~reshard.comm.backends.nixl_pool`: never registered on its own, never
        stale), or where the pool is at its cap, as every host-memory backend's."""
        sh = self._shared
        with sh.lock:  # the pool registers a new slab through the shared registrations
            got = sh.memory.pool.empty(n, dtype)
        return got if got is not None else super().empty(n, dtype)

    def channel(self, name: str) -> NixlBackend:
        """This rank on an independent channel (the same agent; its notifications
        carry the channel's name)."""
        child = copy.copy(self)
        child._channel = f"{self._channel}/{name}"
        child._reset()
        return child

    def prepare(self, plan: Any) -> None:
        """Check the plan's groups are within the world and load the agent metadata of
        every device this rank shares a task with."""
        for peer in self.peers_of(plan):
            self._shared.load(self.device, peer)

    # ----- posting ----------------------------------------------------------------------
    def _number(self, peer: int, tag: int, way: str) -> tuple[int, int]:
        """The how-many-th operation of ``tag`` with ``peer`` this is, one way."""
        k = self._counts[(peer, tag, way)]
        self._counts[(peer, tag, way)] = k + 1
        return (tag, k)

    def _message(self, kind: bytes, key: tuple[int, int], body: bytes, peer: int) -> bytes:
        """A notification for ``peer`` (tagged with the run's key where there is one)."""
        ch = self._channel.encode()
        return self._shared.seal(peer, HEAD.pack(kind, len(ch), key[0], key[1]) + ch + body)

    def _expect(self, what: str, peer: int, tag: int, stream: Stream,
                on_piece: OnPiece | None) -> None:
        """Post a receive of ``stream`` from ``peer``: register its places and tell the
        peer it may write."""
        sh = self._shared
        key = self._number(peer, tag, "in")
        with sh.lock:
            sh.load(self.device, peer)
            runs = runs_of(stream.views)
            inb = _Inbound(what, peer, key, stream, on_piece)
            stale = sh.memory.stale_under(stream.views, runs)
            if stale:
                stream, runs = self._stage(inb, stale)
            inb.regs = regs = sh.memory.ensure(stream.views, runs)
            told, dropped = sh.tell(peer, regs)
            meta = sh.memory.metadata([run for (run, _), new in told if new])
            self._inbound[(peer, *key)] = inb
            ready = Ready(runs, on_piece is not None, told, meta, dropped)
            sh.agent.send_notif(sh.agents[peer], self._message(READY, key, ready.pack(), peer))

    def _stage(self, inb: _Inbound, stale: list[int]) -> tuple[Stream, list[Run]]:
        """``inb``'s places with its parts ``stale`` (indices of its stream's views,
        whose arrays overlap memory a peer may hold stale keys of) in a staging buffer
        instead, copied into place as their bytes land: the stream the peer writes,
        and its runs."""
        memory = self._shared.memory
        stream = inb.stream
        views = list(stream.views)
        inb.slab = slab = memory.staging(sum(len(views[i]) for i in stale))
        flat = slab.data
        at = 0
        for i in stale:
            n = len(views[i])
            inb.staged.append((stream.starts[i], views[i], flat[at:at + n]))
            views[i] = flat[at:at + n]
            at += n
        memory.staged += 1
        landing = Stream(views)
        return landing, runs_of(landing.views)

    def _send_whole(self, peer: int, tag: int, stream: Stream) -> None:
        self._give(peer, tag, stream, stream.total)

    def _give(self, peer: int, tag: int, stream: Stream, have: int) -> _Outbound:
        """Post a send of ``stream`` to ``peer``; ``have`` bytes of it are here now."""
        sh = self._shared
        key = self._number(peer, tag, "out")
        out = _Outbound(peer, key, stream, runs_of(stream.views), have,
                        wire_piece(self.relay_piece, stream.total))
        with sh.lock:
            sh.load(self.device, peer)
            out.regs = sh.memory.ensure(stream.views, out.runs)
            self._outbound[(peer, *key)] = out
            ready = self._early.pop((peer, *key), None)
            if ready is not None:
                self._ready(out, ready)
        return out

    def _ready(self, out: _Outbound, ready: Ready) -> None:
        """``out``'s target is ready to take its bytes at its places (and says whether
        it acts on each piece as it lands): write what is here."""
        size = sum(n for _, n in ready.places)
        if size != out.stream.total:
            raise self._fail(ExecutionError(
                f"device {self.device}: nixl: device {out.peer} receives {size} bytes "
                f"(tag {out.key[0]}) where this rank sends {out.stream.total}: the two "
                f"ranks run different plans"))
        out.ready = ready.places
        out.pieces = ready.pieces
        self._push(out)

    def _push(self, out: _Outbound) -> None:
        """Write what ``out``'s target is ready for and this rank holds: piece by
        piece where the target acts on pieces, else all that is here in one WRITE."""
        if out.ready is None:
            return
        agent = self._shared.agent
        while out.sent < out.have and len(out.handles) < _IN_FLIGHT:
            a = out.sent
            b = min(a + out.piece, out.stream.total) if out.pieces else out.have
            if b > out.have:
                return  # a relay's partial piece: wait for the rest of it
            try:
                mine, theirs = paired(cut(out.runs, a, b), cut(out.ready, a, b))
            except ExecutionError as e:
                raise self._fail(ExecutionError(
                    f"device {self.device}: WRITE to device {out.peer} (tag {out.key[0]}): "
                    f"{e}")) from None
            local = agent.get_xfer_descs([(x, n, 0) for x, n in mine], "DRAM")
            remote = agent.get_xfer_descs([(x, n, 0) for x, n in theirs], "DRAM")
            note = self._message(LANDED, out.key, RANGE.pack(a, b), out.peer)
            handle = agent.initialize_xfer("WRITE", local, remote,
                                           self._shared.agents[out.peer], note)
            if handle is None:
                raise self._fail(ExecutionError(
                    f"device {self.device}: nixl could not start a WRITE to device "
                    f"{out.peer} (its agent or registration is unknown here)"))
            state = agent.transfer(handle)
            if state == "ERR":
                raise self._fail(ExecutionError(
                    f"device {self.device}: nixl WRITE to device {out.peer} failed at once"))
            out.handles.append(handle)
            self._writing.append((out, handle))
            out.sent = b

    def send(self, buf: Any, peer: int, *, tag: int = 0) -> None:
        """WRITE ``buf`` (an array, or a list of them) into ``peer``'s receive."""
        stream = Stream(buf)
        if stream.total:
            self._give(peer, tag, stream, stream.total)
            self._run()

    def recv(self, buf: Any, peer: int, *, tag: int = 0, landed: Landed | None = None) -> None:
        """Let ``peer`` WRITE into ``buf`` (an array, or a list of them)."""
        stream = Stream(buf)
        if stream.total:
            self._expect("recv", peer, tag, stream,
                         None if landed is None else lambda a, b, done: landed(done))
            self._run()

    def broadcast(self, buf: Any, root: int, group: Devices, chain: Devices | None = None,
                  *, tag: int = 0, parents: Devices | None = None, addends: Devices = (),
                  addend_parents: Devices | None = None, landed: Landed | None = None) -> None:
        """From ``root`` down the chain or tree; a relay passes each piece on as it
        lands (``landed`` hears of the bytes filled so far)."""
        part = self._broadcast_part(buf, root, group, chain, parents, addends, tag)
        if part is None:
            return
        stream, what, prev, nxts = part
        outs = [self._give(nxt, tag, stream, 0) for nxt in nxts]

        def on_piece(a: int, b: int, done: int) -> None:
            for out in outs:
                out.have = done
                self._push(out)
            if landed is not None:
                landed(done)

        self._expect(what, prev, tag, stream, on_piece if outs or landed else None)
        self._run()

    def all_gather(self, out: np.ndarray, inp: np.ndarray, group: Sequence[int]) -> None:
        """Row ``i`` of ``out`` = member ``group[i]``'s ``inp``, written straight into
        the rows."""
        rows = self._gather_rows(out, inp, group)
        if rows is None:
            return
        me = self.device
        for row, d in enumerate(group):
            if d != me:
                self._expect("all-gather", d, _GATHER_TAG, Stream(rows[row]), None)
        mine = Stream(inp)
        for d in group:
            if d != me:
                self._send_whole(d, _GATHER_TAG, mine)
        self._run()

    def reduce(self, buf: np.ndarray, root: int, group: Sequence[int], *,
               op: ReduceOp = ReduceOp.SUM) -> None:
        """Down the members in group order to the root: each adds the running result,
        landing piece by piece in a scratch buffer, into its own ``buf`` and passes the
        piece on; the root's ``buf`` ends with the result."""
        part = self._reduce_part(buf, root, group, _REDUCE_TAG)
        if part is None:
            return
        mine, prev, nxt = part
        out = self._give(nxt, _REDUCE_TAG, mine, 0) if nxt is not None else None
        held = self.empty(buf.nbytes, np.uint8)
        combine, flat, size = _COMBINE[op], buf.reshape(-1), buf.itemsize

        def on_piece(a: int, b: int, done: int) -> None:
            part = flat[a // size:b // size]
            combine(part, held[a:b].view(buf.dtype), out=part)
            if out is not None:
                out.have = done
                self._push(out)

        self._expect("reduce", prev, _REDUCE_TAG, Stream(held), on_piece)
        self._run()

    # ----- groups -------------------------------------------------------------------------
    def _progress(self) -> None:
        sh = self._shared
        agent = sh.agent
        last = time.monotonic()
        idle = _IDLE[0]
        while self._inbound or self._outbound or self._writing or self._parked:
            with sh.lock:
                moved = self._step(sh, agent)
            if moved:
                last = time.monotonic()
                idle = _IDLE[0]
                continue
            if time.monotonic() - last > self.timeout:
                raise self._stuck()
            time.sleep(idle)
            idle = min(_IDLE[1], idle * 2)

    def _step(self, sh: Agent, agent: Any) -> bool:
        """One pass over the notifications and the writes; True if anything moved."""
        moved = False
        sh.poll(self.device)
        box = sh.inbox.get(self._channel)
        while box:
            self._take(*box.popleft())
            moved = True
        if self._parked:
            parked, self._parked = self._parked, []
            for key, ready in parked:
                self._target(key, ready)
            moved = moved or len(self._parked) < len(parked)
        writing, self._writing = self._writing, []
        freed = []
        for out, handle in writing:
            state = agent.check_xfer_state(handle)
            if state == "DONE":
                agent.release_xfer_handle(handle)
                out.handles.remove(handle)
                freed.append(out)
                moved = True
            elif state == "ERR":
                raise ExecutionError(
                    f"device {self.device}: nixl WRITE to device {out.peer} failed "
                    f"(peer dead, or its registration gone)")
            else:
                self._writing.append((out, handle))
        for out in freed:
            self._push(out)  # its next pieces may go
            if (out.sent == out.stream.total and not out.handles
                    and self._outbound.pop((out.peer, *out.key), None) is not None):
                sh.memory.unpin(out.regs)
        return moved

    def _take(self, peer: int, msg: bytes, ready: Ready | None) -> None:
        """Act on one notification from ``peer`` (``ready``: parsed where it is one)."""
        kind, n, tag, num = HEAD.unpack_from(msg)
        key = (peer, tag, num)
        if ready is not None:
            self._target(key, ready)
        elif kind == LANDED:
            a, b = RANGE.unpack_from(msg, HEAD.size + n)
            inb = self._inbound.get(key)
            if inb is None:
                raise ExecutionError(f"device {self.device}: nixl: device {peer} wrote "
                                     f"bytes [{a}, {b}) of an operation (tag {tag}, number "
                                     f"{num}) this rank did not post")
            done = inb.land(a, b)
            if inb.filled >= inb.stream.total:
                del self._inbound[key]
                self._shared.memory.unpin(inb.regs)
                inb.slab = None  # its block goes back to the pool
            if inb.on_piece is not None:
                inb.on_piece(a, b, done)
        else:
            raise ExecutionError(f"device {self.device}: nixl: unknown notification "
                                 f"{kind!r} from device {peer}")

    def _target(self, key: tuple[int, int, int], ready: Ready) -> None:
        """A receive's places are ready: write into them once this rank has loaded the
        metadata of every registration they lie in (else park them until it has)."""
        if not self._shared.loaded_all(key[0], ready):
            self._parked.append((key, ready))
            return
        out = self._outbound.get(key)
        if out is None:
            self._early[key] = ready
        else:
            self._ready(out, ready)

    def _fail(self, e: ExecutionError) -> ExecutionError:
        """Record this channel's first failure and abandon what it has in flight
        (:meth:`_abandon`)."""
        first = self._failed is None
        out = super()._fail(e)
        if first:
            self._abandon()
        return out

    def _abandon(self) -> None:
        """After this channel's failure (a peer dead or stuck): each receive in flight
        gives its registrations up (:meth:`Registrations.abandon`: deregistered now,
        its buffers kept alive until close), so neither a dead peer's registrations nor
        its receives' stay pinned for the rank's life. Sends in flight keep theirs until
        close: NIXL may still be reading them for a WRITE."""
        sh = self._shared
        with sh.lock:
            for inb in self._inbound.values():
                sh.memory.abandon(inb.regs, (inb.stream, inb.slab))
            self._inbound.clear()
            self._early.clear()
            self._parked.clear()

    def _stuck(self) -> ExecutionError:
        waiting = sorted({inb.peer for inb in self._inbound.values()})
        unready = sorted({o.peer for o in self._outbound.values() if o.ready is None})
        writing = sorted({o.peer for o, _ in self._writing})
        unknown = sorted({key[0] for key, _ in self._parked})
        parts = []
        if unknown:
            parts.append(f"waiting for the registration metadata of device(s) {unknown}")
        if waiting:
            parts.append(f"waiting for bytes from device(s) {waiting}")
        if unready:
            parts.append(f"waiting for device(s) {unready} to be ready")
        if writing:
            parts.append(f"writing to device(s) {writing}")
        where = f" (channel {self._channel!r})" if self._channel else ""
        return ExecutionError(f"device {self.device}: nixl: no progress "
                              f"{' and '.join(parts)} within {self.timeout:g}s{where} "
                              f"(peer dead or stuck: a notification never came)")

    def close(self) -> None:
        """Release the registrations and the peers' metadata (the main rank)."""
        if self._closed:
            return
        self._closed = True
        if not self._channel:
            self._shared.close()


def _contiguous_done(done: list[Run], a: int, b: int) -> int:
    """Add ``[a, b)`` to the sorted disjoint ranges ``done``; the bytes complete from
    the start."""
    done.append((a, b))
    done.sort()
    merged: list[Run] = []
    for lo, hi in done:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    done[:] = merged
    return merged[0][1] if merged and merged[0][0] == 0 else 0


__all__ = ["NixlBackend", "agent_prefix", "available"]
