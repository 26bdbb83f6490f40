"""The ``gloo`` backend: torch.distributed with gloo, CPU, one process per device.

One process group spans every worker of a runtime (the *world*; rank = index of the
device in the sorted device list). Rank 0 hosts the torch ``TCPStore`` on a free port
of its advertised address (never the wildcard) and publishes it through the driver's
rendezvous; the others connect to it. gloo's pair sockets bind to the interface that
holds the advertised address (``GLOO_SOCKET_IFNAME``).

Sub-groups, one per collective member set, are made with ``dist.new_group``, which
every rank of the world must call, members or not, in the same order. So they are
made in :meth:`GlooBackend.prepare`, which the worker host runs before every
``load_plan``, and the driver loads every plan on every worker of the world
(``Capabilities.groups_need_world``): each worker walks ``plan.communicator_groups()`` (first-use
order, identical everywhere) and creates the groups it has not cached yet. Since all
workers load the same plans in the same order, their caches stay identical.

Buffers are numpy (ml_dtypes' types for bfloat16 and float8); tensors wrap them with
``torch.from_numpy`` (zero copy). Data movement (broadcast, send/recv, all-gather) goes
as raw bytes, so any dtype works; reduce sums (or, for an amax, maxes) in the buffer's
dtype, which is a partial sum's accumulator (:func:`reshard.core.dtypes.accumulator`; 16-bit
integers, which gloo cannot sum, widened to int32 and wrapped back; unsigned 32/64-bit
as their signed twins, which wrap alike).
The timeout given to ``init_process_group`` / ``new_group`` bounds every operation;
a dead peer shows up sooner, as a closed connection.

Groups (:meth:`GlooBackend.group_start` .. :meth:`GlooBackend.group_end`, one per plan
step on a worker) run their operations concurrently: send/recv become ``isend`` /
``irecv`` of 256 KiB pieces tagged with the task's index (gloo matches them per peer
and tag, in posting order), an all-gather is such an exchange between every pair of
members, reductions run with ``async_op=True`` on their process group's threads, and
a chain broadcast posts the receives of all its pieces at once and passes each piece
on as it arrives. A receiver told ``landed`` hears of each piece as it arrives, so a
box received into scratch memory is copied into place meanwhile. ``group_end``
returns when all of them completed (see there for the polling of relays and why it
cannot deadlock). An operation outside a group is a group of its own: it has
completed when it returns.
"""

from __future__ import annotations

import copy
import datetime
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from reshard.comm.backend import Capabilities, Devices, Landed
from reshard.comm.backends.gloo_works import GATHER_TAG, Posted, Relay, gist, pieces_of
from reshard.comm.backends.host_memory import (
    CHAIN_PIECE,
    HostMemory,
    broadcast_neighbours,
    wire_piece,
)
from reshard.comm.bootstrap.sockets import (
    GLOO_IFNAME_ENV,
    gloo_interface,
    interface_of,
    listen_on,
)
from reshard.core.dtypes import ReduceOp, reduce_as
from reshard.core.errors import ExecutionError


def torch_op(dist: Any, op: ReduceOp) -> Any:
    """torch.distributed's reduce op for ``op``."""
    return {ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.MAX: dist.ReduceOp.MAX}[op]


def _barrier(store: Any, key: str, n: int, timeout: float) -> None:
    """Wait until ``n`` ranks have reached ``key`` on ``store`` (a torch Store)."""
    if store.add(key, 1) == n:
        store.set(f"{key}/all", b"1")
    store.wait([f"{key}/all"], datetime.timedelta(seconds=timeout))


def one_rank_a_process(store: Any, device: int, rank: int, n: int, timeout: float) -> None:
    """Refuse, on every rank of the world at once, a world with two ranks in one process.

    torch.distributed keeps one default world per process, so gloo ranks on threads of
    one process race for it and then wait on each other's keys until the timeout (a
    ``DistStoreError`` on every rank). Each rank counts its process (host name and pid)
    on the world's store; after every rank has, any process counted twice fails them
    all, before ``init_process_group``.

    Raises:
        ExecutionError: two or more ranks of the world share a process (the reason and
            the alternatives).
    """
    me = f"reshard/gloo/process/{socket.gethostname()}/{os.getpid()}"
    store.add(me, 1)
    _barrier(store, "reshard/gloo/counted", n, timeout)
    here = store.add(me, 0)
    if here > 1:
        store.add("reshard/gloo/shared", 1)
    _barrier(store, "reshard/gloo/checked", n, timeout)
    if store.add("reshard/gloo/shared", 0):
        # the store lives in rank 0's backend: it goes once every other rank has read
        if rank == 0:
            store.wait(["reshard/gloo/told/all"], datetime.timedelta(seconds=timeout))
        elif store.add("reshard/gloo/told", 1) == n - 1:
            store.set("reshard/gloo/told/all", b"1")
        where = (f"{here} of its {n} ranks run in this process (pid {os.getpid()})"
                 if here > 1 else f"some of its {n} ranks share another process")
        raise ExecutionError(
            f"device {device}: gloo needs a process per rank, but {where}: "
            f"torch.distributed holds one world per process, so ranks on threads would "
            f"wait on each other until the timeout; start each rank in a process of its "
            f"own (torchrun, multiprocessing, Runtime(backend='gloo')), or use backend "
            f"'tcp', whose ranks may share a process")


class GlooBackend(HostMemory):
    """One rank of the gloo backend.

    Args:
        device: the global device id served.
        world: every device of the runtime, sorted.
        rendezvous: a connected rendezvous client (``set`` / ``get``).
        timeout: seconds any operation may wait.
        advertise: the address other ranks reach this process at (rank 0 publishes
            its store there).
        host, local_index: placement facts (unused by gloo).
    """

    name = "gloo"
    # Bytes move as uint8 (any dtype); every accumulator sums (gloo's own types plus
    # reshard.core.dtypes.reduce_as); numpy with ml_dtypes converts every dtype.
    capabilities = Capabilities(moves=None, sums=None, groups_need_world=True, device="cpu",
                                fuses_sums=True, lands_pieces=True, sized_pieces=True,
                                batch_scheduled=True, all_reduces=True)
    relay_piece = 0
    """The running program's piece (:meth:`use_piece`; 0: :data:`CHAIN_PIECE` for every
    operation; a rank's own, subclasses' too)."""
    _ifname: str | None = None
    """The interface gloo's sockets bind to while this backend makes groups (None: the
    process's ``GLOO_SOCKET_IFNAME`` as it is, for a caller's own process group)."""

    def __init__(self, device: int, world: Sequence[int], rendezvous: Any, timeout: float,
                 *, advertise: str = "127.0.0.1", host: int = 0, local_index: int = 0) -> None:
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:  # torch may predate the variable
            torch.set_num_threads(int(threads))     # (imported by a fork server)
        self.device = int(device)
        self.world = tuple(int(d) for d in world)
        self.rank_of = {d: r for r, d in enumerate(self.world)}
        if self.device not in self.rank_of:
            raise ExecutionError(f"device {device} is not in the world {list(self.world)}")
        self.timeout = float(timeout)
        self._td = datetime.timedelta(seconds=self.timeout)
        if dist.is_initialized():
            raise ExecutionError(
                f"device {device}: this process already has a torch.distributed world; "
                f"a gloo worker needs a process of its own")
        rank, n = self.rank_of[self.device], len(self.world)
        self._store: Any = None  # the TCPStore this backend bootstrapped through
        # gloo's pair sockets bind to the advertised address's interface, not whatever
        # the host name resolves to (a caller's GLOO_SOCKET_IFNAME wins); set only while
        # a group is made, so that the process's children never inherit it.
        self._ifname = os.environ.get(GLOO_IFNAME_ENV) or interface_of(advertise)
        if rank == 0:
            # The store listens on the advertised address only (TCPStore alone binds
            # every interface): hand it a socket already bound there.
            listener = listen_on(advertise)
            port = listener.getsockname()[1]
            self._store = dist.TCPStore(advertise, port, n, True, timeout=self._td,
                                        wait_for_workers=False,
                                        master_listen_fd=listener.detach())
            rendezvous.set("gloo/store", f"{advertise}:{port}".encode())
        else:
            addr = rendezvous.get("gloo/store", self.timeout).decode()
            host_name, _, port = addr.rpartition(":")
            self._store = dist.TCPStore(host_name, int(port), n, False, timeout=self._td)
        one_rank_a_process(self._store, self.device, rank, n, self.timeout)
        with gloo_interface(self._ifname):
            dist.init_process_group("gloo", store=self._store, rank=rank, world_size=n,
                                    timeout=self._td)
        self._groups: dict[tuple[int, ...], Any] = {self.world: dist.group.WORLD}
        self._p2p: Any = None  # group of send/recv (None: the world)
        self._channel = ""  # "" for the main backend, else the channel's name
        self._open: list[Posted] | None = None  # operations of the open group
        self._closed = False

    # ----- communicators -------------------------------------------------------------
    def channel(self, name: str) -> GlooBackend:
        """This rank on an independent channel: its own sub-groups and its own
        world-wide group for send/recv, made (like every group) in :meth:`prepare`."""
        child = copy.copy(self)
        child._groups = {}
        child._p2p = None
        child._open = None
        child._channel = f"{self._channel}/{name}"
        return child

    def use_piece(self, nbytes: int) -> None:
        """Pipeline the operations that follow in pieces of the plan's
        ``Cluster.relay_piece`` ``nbytes`` (:meth:`piece_for`; 0: :data:`CHAIN_PIECE`)."""
        self.relay_piece = max(0, int(nbytes))

    def _cut(self, data: Any) -> list[Any]:
        """A byte tensor as the pieces an operation on it moves (:meth:`piece_for`)."""
        return pieces_of(data, self.piece_for(data.numel()))

    def piece_for(self, nbytes: int) -> int:
        """Bytes per piece of an operation on an ``nbytes`` buffer
        (:func:`~reshard.comm.backends.host_memory.wire_piece` of the program's piece)."""
        return wire_piece(self.relay_piece, nbytes)

    def prepare(self, plan: Any) -> None:
        """Create the plan's missing sub-groups (every rank, same order)."""
        if self._channel and self.world not in self._groups:
            self._groups[self.world] = self._p2p = self._new_group(range(len(self.world)))
        for group in plan.communicator_groups():
            self._ensure_group(tuple(group))

    def _ensure_group(self, group: tuple[int, ...]) -> None:
        if group in self._groups:
            return
        unknown = [d for d in group if d not in self.rank_of]
        if unknown:
            raise ExecutionError(
                f"device {self.device}: group {list(group)} has devices {unknown} outside "
                f"the world {list(self.world)}")
        self._groups[group] = self._new_group([self.rank_of[d] for d in group])

    def _new_group(self, ranks: Sequence[int]) -> Any:
        """A gloo process group of ``ranks`` (every rank of the world calls this, members
        or not), its sockets on this backend's interface."""
        with gloo_interface(self._ifname):
            return self._dist.new_group(list(ranks), timeout=self._td, backend="gloo")

    def _group(self, group: Sequence[int]) -> Any:
        key = tuple(group)
        pg = self._groups.get(key)
        if pg is None:
            raise ExecutionError(
                f"device {self.device}: no process group for members {list(key)}; gloo "
                f"sub-groups are created when a plan is loaded on every worker "
                f"(a LoadPlan call, reshard.comm.calls)")
        return pg

    def _bytes(self, buf: np.ndarray) -> Any:
        """A uint8 tensor sharing ``buf``'s memory (buffers are contiguous by contract)."""
        if not buf.flags.c_contiguous:
            raise ExecutionError(
                f"device {self.device}: backend buffers must be C-contiguous, got strides "
                f"{buf.strides} for shape {buf.shape}")
        flat = buf.reshape(-1).view(np.uint8)
        if flat.flags.writeable:
            return self._torch.from_numpy(flat)
        # a read-only source (a JAX array's host view): only ever sent, never written;
        # torch warns that it cannot mark the tensor read-only
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return self._torch.from_numpy(flat)

    # ----- operations ----------------------------------------------------------------
    def _call(self, what: str, peers: Sequence[int], fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a torch.distributed call (start an operation, wait for one); its errors
        become one-line ExecutionErrors. Returns what the call returns."""
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:
            raise ExecutionError(
                f"gloo {what} with device(s) {list(peers)} failed: {gist(e)}") from e

    def _sends(self, what: str, peer: int, pieces: list[Any], tag: int) -> list[Any]:
        """``isend`` of every piece to ``peer``, in order, tagged ``tag``."""
        return [self._call(what, (peer,), self._dist.isend, p, dst=self.rank_of[peer],
                           group=self._p2p, tag=tag) for p in pieces]

    def _recvs(self, what: str, peer: int, pieces: list[Any], tag: int) -> list[Any]:
        """``irecv`` of every piece from ``peer``, in order, tagged ``tag``."""
        return [self._call(what, (peer,), self._dist.irecv, p, src=self.rank_of[peer],
                           group=self._p2p, tag=tag) for p in pieces]

    def _add(self, op: Posted) -> None:
        """Make ``op`` part of the open group, or (outside a group) a group of its own."""
        if self._open is not None:
            self._open.append(op)
            return
        self._open = [op]
        self.group_end()

    def broadcast(self, buf: np.ndarray, root: int, group: Devices, chain: Devices | None = None,
                  *, tag: int = 0, parents: Devices | None = None, addends: Devices = (),
                  addend_parents: Devices | None = None, landed: Landed | None = None) -> None:
        """Broadcast from ``root`` to ``group``.

        With a ``chain`` order (the plan's: the root's host first, then host by host),
        a pipelined chain root -> chain[0] -> chain[1] ... of send/recv in pieces
        (:meth:`piece_for`), all tagged ``tag``: each host boundary is crossed
        once and every link is busy at once, as NCCL's ring broadcast does; with
        ``parents`` too (one per ``chain`` entry), a pipelined tree: ``chain[i]``
        receives from ``parents[i]``. Every receive is posted at once; a member that
        others receive from passes piece ``j`` on to each of them as soon as it
        arrived (see :meth:`group_end`). gloo's own broadcast (a binomial tree of whole
        buffers, so the root's NIC sends once per tree level) serves when no order is
        given.

        With ``addends`` (``Capabilities.fuses_sums``), the chain starts at
        ``addends[0]`` and runs through the other addends to the root: each of them
        adds its own piece ``j`` to the running sum's piece ``j`` as it arrives (in
        numpy, in the buffer's dtype) and passes the sum on, so summing and delivery
        overlap piece by piece. With ``addend_parents`` too (one per addend), the sums
        go up that tree instead: a member adds piece ``j`` of every running sum it
        receives (once all arrived, in the order of ``addends``) to its own.

        ``landed`` (``Capabilities.lands_pieces``; a receiver's): called with the bytes
        of ``buf`` filled so far, piece by piece as they arrive (a relay: as it passes
        them on), on this thread.
        """
        if not buf.size:
            return
        dist = self._dist
        if chain is None and not addends:
            work = self._call("broadcast", group, dist.broadcast, self._bytes(buf),
                              src=self.rank_of[root], group=self._group(group), async_op=True)
            self._add(Posted(self, "broadcast", group, [work]))
            return
        what = ("chain broadcast" if parents is None else "tree broadcast") + \
            (" of a sum" if addends else "")
        me = self.device
        prevs, nxts = broadcast_neighbours(me, root, group, chain, parents, addends,
                                          addend_parents)
        data = self._bytes(buf)
        piece = self.piece_for(data.numel())
        pieces = pieces_of(data, piece)
        if not prevs:  # the root of a plain broadcast, or a first addend: all at once
            self._send_all(what, pieces, nxts, tag)
            return
        if me != root and me not in addends:  # a receiver: straight into its buffer
            recvs = self._recvs(what, prevs[0], pieces, tag)
            if not nxts:  # a leaf
                self._add(Posted(self, what, prevs, recvs, landed=landed,
                                  total=data.numel()))
            else:
                self._add(Relay(self, what, pieces, [(prevs[0], recvs)], nxts, tag,
                                 landed=landed, total=data.numel()))
            return
        self._sum_relay(what, buf, pieces, piece, prevs, nxts, tag, landed)

    def _send_all(self, what: str, pieces: list[Any], nxts: Sequence[int], tag: int) -> None:
        """Post every piece to every member of ``nxts`` at once."""
        sends = [self._call(what, (nxt,), self._dist.isend, p, dst=self.rank_of[nxt],
                            group=self._p2p, tag=tag) for p in pieces for nxt in nxts]
        if sends:
            self._add(Posted(self, what, list(nxts), sends))

    def _sum_relay(self, what: str, buf: np.ndarray, pieces: list[Any], piece: int,
                   prevs: Sequence[int], nxts: Sequence[int], tag: int,
                   landed: Callable[[int], None] | None) -> None:
        """An addend or the root of a broadcast that sums: each running sum it receives
        apart, added to its own piece by piece, and the sum passed on (``pieces``:
        ``buf``'s bytes cut at ``piece``)."""
        mine, per = buf.reshape(-1), piece // buf.itemsize
        theirs, streams = [], []
        for prev in prevs:
            extra = np.empty_like(buf)
            theirs.append(extra.reshape(-1))
            streams.append((prev, self._recvs(what, prev, pieces_of(self._bytes(extra), piece),
                                              tag)))

        def add(j: int) -> None:
            part = slice(j * per, (j + 1) * per)
            for other in theirs:
                mine[part] += other[part]

        self._add(Relay(self, what, pieces, streams, list(nxts), tag, add, landed,
                         buf.nbytes))

    def send(self, buf: np.ndarray, peer: int, *, tag: int = 0) -> None:
        """``dist.isend`` to ``peer`` (tagged ``tag``), in pieces (:meth:`piece_for`; so
        the receiver can put each in place as it lands)."""
        if buf.size:
            works = self._sends("send", peer, self._cut(self._bytes(buf)), tag)
            self._add(Posted(self, "send", (peer,), works))

    def recv(self, buf: np.ndarray, peer: int, *, tag: int = 0,
             landed: Landed | None = None) -> None:
        """``dist.irecv`` from ``peer`` (tagged ``tag``) into ``buf``, piece by piece as
        :meth:`send` sends them; ``landed`` as for :meth:`broadcast`."""
        if buf.size:
            data = self._bytes(buf)
            works = self._recvs("recv", peer, self._cut(data), tag)
            self._add(Posted(self, "recv", (peer,), works, landed=landed,
                              total=data.numel()))

    def all_gather(self, out: np.ndarray, inp: np.ndarray, group: Sequence[int]) -> None:
        """Row ``i`` of ``out`` = member ``group[i]``'s ``inp``, point to point: this
        member's input goes to every other in pieces (:meth:`piece_for`) and
        theirs land straight in their rows. gloo's own all-gather copies through
        temporary tensors: between two processes on loopback it took 80-170 ms for
        18 MB each way, where the exchange itself takes about 10. The pieces carry
        :data:`GATHER_TAG` (above any task's index); every member posts them in the
        plan's one order, and gloo matches a pair's messages of one tag in order."""
        if not inp.size:
            return
        me = self.device
        rows = out.reshape(len(group), -1)
        rows[list(group).index(me)] = inp.reshape(-1)  # the result holds every row
        mine = self._cut(self._bytes(inp))  # every row as long as the input
        works = []
        for d in group:
            if d != me:
                works += self._sends("all-gather", d, mine, GATHER_TAG)
        for row, d in enumerate(group):
            if d != me:
                works += self._recvs("all-gather", d, self._cut(self._bytes(rows[row])),
                                     GATHER_TAG)
        self._add(Posted(self, "all-gather", group, works))

    def reduce(self, buf: np.ndarray, root: int, group: Sequence[int], *,
               op: ReduceOp = ReduceOp.SUM) -> None:
        """``dist.reduce`` (SUM or MAX) into ``root``'s ``buf``."""
        self._summed("reduce", self._dist.reduce, buf, group, op, self.device == root,
                     dst=self.rank_of[root])

    def all_reduce(self, buf: np.ndarray, group: Sequence[int], *,
                   op: ReduceOp = ReduceOp.SUM) -> None:
        """``dist.all_reduce`` (SUM or MAX; gloo's ring) into every member's ``buf``."""
        self._summed("all-reduce", self._dist.all_reduce, buf, group, op, True)

    def _summed(self, what: str, call: Any, buf: np.ndarray, group: Sequence[int],
                op: ReduceOp, keeps: bool, **where: Any) -> None:
        """Post ``call`` (a reduction) of ``buf`` over ``group``, in a dtype gloo sums
        (:func:`reshard.core.dtypes.reduce_as`); where this member ``keeps`` the result and
        it was widened, it is wrapped back into ``buf`` once done."""
        if not buf.size:
            return
        as_name, widen = reduce_as(buf.dtype.name)
        work = buf.astype(as_name) if widen else buf.view(np.dtype(as_name))
        handle = self._call(what, group, call, self._torch.from_numpy(work),
                            op=torch_op(self._dist, op), group=self._group(group),
                            async_op=True, **where)
        after = None
        if widen and keeps:
            def after() -> None:
                buf[...] = work.astype(buf.dtype)  # wraps like the narrow sum would
        self._add(Posted(self, what, group, [handle], after))

    def group_start(self) -> None:
        """Open a group: the operations issued until :meth:`group_end` are all started
        at once and may run concurrently (p2p asynchronous, collectives
        ``async_op``)."""
        if self._open is not None:
            raise ExecutionError(f"device {self.device}: group_start inside an open group")
        self._open = []

    def group_end(self) -> None:
        """Complete every operation of the open group; on return they are done.

        Chain members between root and last pass pieces on as they arrive: with two or
        more such relays in the group, each relay's receives are watched by a thread
        (gloo's send/recv Work reports ``is_completed()`` only once ``wait()`` has
        run; pytorch/pytorch#30723), which wake this thread on each arrival; it
        forwards whatever arrived, never blocking on one chain, and raises when none
        progressed for the timeout. Then every operation is waited
        in issue order (collectives and sends need nothing more from this rank; a lone
        relay forwards its pieces there, blocking on each). Every rank issues its
        operations in the plan's one global order, so this cannot deadlock: the
        earliest unfinished operation always has every member at it or past it.
        """
        ops, self._open = self._open, None
        if ops is None:
            raise ExecutionError(f"device {self.device}: group_end without group_start")
        relays = [op for op in ops if isinstance(op, Relay)]
        if len(relays) > 1:
            self._forward(relays)
        for op in ops:
            op.finish()

    def _forward(self, relays: list[Relay]) -> None:
        """Pass pieces on as the watchers see them arrive, until each relay has passed
        every piece on (see :meth:`group_end`). The wake-up is cleared before each
        look, so an arrival after the look sets it again and is not missed."""
        wake = threading.Event()
        for r in relays:
            r.watch(wake)
        last = time.monotonic()
        while True:
            wake.clear()
            waiting = [r for r in relays if r.pending]
            if not waiting:
                return
            if sum(r.poll() for r in waiting):
                last = time.monotonic()
                continue
            left = self.timeout - (time.monotonic() - last)
            if left <= 0:
                peers = sorted({p for r in waiting for p in r.behind()})
                raise ExecutionError(
                    f"gloo chain broadcast: no piece from device(s) {peers} within "
                    f"{self.timeout:g}s (peer dead or stuck)")
            wake.wait(left)

    def close(self) -> None:
        """Destroy the process groups (idempotent; a channel leaves that to the main
        backend)."""
        if self._closed or self._channel:
            return
        self._closed = True
        self._groups.clear()
        if self._dist.is_initialized():
            self._dist.destroy_process_group()


__all__ = ["CHAIN_PIECE", "GlooBackend", "torch_op"]
