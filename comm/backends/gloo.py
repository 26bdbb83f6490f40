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

Buffers are numpy; tensors wrap them with ``torch.from_numpy`` (zero copy). Data
movement (broadcast, send/recv, all-gather) goes as raw bytes, so any dtype works;
reduce sums in the real dtype (16-bit integers, which gloo cannot sum, widened to
int32 and wrapped back; unsigned 32/64-bit as their signed twins, which wrap alike).
The timeout given to ``init_process_group`` / ``new_group`` bounds every operation;
a dead peer shows up sooner, as a closed connection.
"""

from __future__ import annotations

import copy
import datetime
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from reshard.comm.backend import Capabilities
from reshard.comm.backends.host_memory import HostMemory
from reshard.comm.sockets import interface_of, listen_on
from reshard.errors import ExecutionError

CHAIN_PIECE = 1 << 20
"""Bytes per pipelined piece of a chain broadcast."""

# Sum dtypes gloo lacks, as (dtype to reduce in, widen first?).
_REDUCE_AS: dict[np.dtype, tuple[np.dtype, bool]] = {
    np.dtype(np.uint32): (np.dtype(np.int32), False),
    np.dtype(np.uint64): (np.dtype(np.int64), False),
    np.dtype(np.int16): (np.dtype(np.int32), True),
    np.dtype(np.uint16): (np.dtype(np.int32), True),
}


def _gist(exc: BaseException) -> str:
    """The informative part of a gloo error: no source path, no advice, one line."""
    text = " ".join(str(exc).split())
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text)
    return text.split(". ")[0].rstrip(".")


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
    # Bytes move as uint8 (any dtype); sums: gloo's own types plus _REDUCE_AS.
    capabilities = Capabilities(
        moves=None,
        sums=frozenset({"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                        "uint64", "float16", "float32", "float64", "complex64",
                        "complex128"}),
        groups_need_world=True, device="cpu")

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
        # gloo's pair sockets bind to the advertised address's interface, not whatever
        # the host name resolves to (a caller's GLOO_SOCKET_IFNAME wins).
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface_of(advertise))
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
        dist.init_process_group("gloo", store=self._store, rank=rank, world_size=n,
                                timeout=self._td)
        self._groups: dict[tuple[int, ...], Any] = {self.world: dist.group.WORLD}
        self._p2p: Any = None  # group of send/recv (None: the world)
        self._channel = ""  # "" for the main backend, else the channel's name
        # all_gather_single supersedes all_gather_into_tensor (deprecated in torch 2.13)
        self._gather_into = getattr(dist, "all_gather_single", None) or \
            dist.all_gather_into_tensor
        self._closed = False

    # ----- communicators -------------------------------------------------------------
    def channel(self, name: str) -> GlooBackend:
        """This rank on an independent channel: its own sub-groups and its own
        world-wide group for send/recv, made (like every group) in :meth:`prepare`."""
        child = copy.copy(self)
        child._groups = {}
        child._p2p = None
        child._channel = f"{self._channel}/{name}"
        return child

    def prepare(self, plan: Any) -> None:
        """Create the plan's missing sub-groups (every rank, same order)."""
        if self._channel and self.world not in self._groups:
            self._groups[self.world] = self._p2p = self._dist.new_group(
                list(range(len(self.world))), timeout=self._td, backend="gloo")
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
        self._groups[group] = self._dist.new_group(
            [self.rank_of[d] for d in group], timeout=self._td, backend="gloo")

    def _group(self, group: Sequence[int]) -> Any:
        key = tuple(group)
        pg = self._groups.get(key)
        if pg is None:
            raise ExecutionError(
                f"device {self.device}: no process group for members {list(key)}; gloo "
                f"sub-groups are created when a plan is loaded on every worker "
                f"(WorkerHost.call('load_plan', ...))")
        return pg

    def _bytes(self, buf: np.ndarray) -> Any:
        """A uint8 tensor sharing ``buf``'s memory (buffers are contiguous by contract)."""
        if not buf.flags.c_contiguous:
            raise ExecutionError(
                f"device {self.device}: backend buffers must be C-contiguous, got strides "
                f"{buf.strides} for shape {buf.shape}")
        return self._torch.from_numpy(buf.reshape(-1).view(np.uint8))

    # ----- operations ----------------------------------------------------------------
    def _run(self, what: str, peers: Sequence[int], fn: Any, *args: Any, **kwargs: Any) -> None:
        """Run a torch.distributed call; its errors become one-line ExecutionErrors."""
        try:
            fn(*args, **kwargs)
        except RuntimeError as e:
            raise ExecutionError(
                f"gloo {what} with device(s) {list(peers)} failed: {_gist(e)}") from e

    def broadcast(self, buf: np.ndarray, root: int, group: Sequence[int],
                  chain: Sequence[int] | None = None) -> None:
        """Broadcast from ``root`` to ``group``.

        With a ``chain`` order (the plan's: the root's host first, then host by host),
        a pipelined chain root -> chain[0] -> chain[1] ... of send/recv in pieces of
        :data:`CHAIN_PIECE` bytes: each host boundary is crossed once and every link
        is busy at once, as NCCL's ring broadcast does. gloo's own broadcast (a
        binomial tree of whole buffers, so the root's NIC sends once per tree level)
        serves when no order is given.
        """
        if not buf.size:
            return
        if chain is None:
            self._run("broadcast", group, self._dist.broadcast, self._bytes(buf),
                      src=self.rank_of[root], group=self._group(group))
            return
        order = [root, *(d for d in chain if d != root)]
        at = order.index(self.device)
        prev = order[at - 1] if at else None
        nxt = order[at + 1] if at + 1 < len(order) else None
        data = self._bytes(buf)
        pieces = [data[a:a + CHAIN_PIECE] for a in range(0, data.numel(), CHAIN_PIECE)]
        self._run("chain broadcast", group, self._chain, pieces, prev, nxt)

    def _chain(self, pieces: list, prev: int | None, nxt: int | None) -> None:
        """Receive each piece from ``prev`` (unless root) and pass it on to ``nxt``
        (unless last), keeping the next receive and every send in flight."""
        dist, p2p = self._dist, self._p2p
        src = self.rank_of[prev] if prev is not None else -1
        sends = []
        recv = dist.irecv(pieces[0], src=src, group=p2p) if src >= 0 else None
        for j, piece in enumerate(pieces):
            if recv is not None:
                recv.wait()
                recv = (dist.irecv(pieces[j + 1], src=src, group=p2p)
                        if j + 1 < len(pieces) else None)
            if nxt is not None:
                sends.append(dist.isend(piece, dst=self.rank_of[nxt], group=p2p))
        for s in sends:
            s.wait()

    def send(self, buf: np.ndarray, peer: int) -> None:
        """``dist.send`` to ``peer``."""
        if buf.size:
            self._run("send", (peer,), self._dist.send, self._bytes(buf),
                      dst=self.rank_of[peer], group=self._p2p)

    def recv(self, buf: np.ndarray, peer: int) -> None:
        """``dist.recv`` from ``peer`` into ``buf``."""
        if buf.size:
            self._run("recv", (peer,), self._dist.recv, self._bytes(buf),
                      src=self.rank_of[peer], group=self._p2p)

    def all_gather(self, out: np.ndarray, inp: np.ndarray, group: Sequence[int]) -> None:
        """``all_gather_single`` into the flattened rows (rows in group order)."""
        if inp.size:
            self._run("all-gather", group, self._gather_into, self._bytes(out),
                      self._bytes(inp), group=self._group(group))

    def reduce(self, buf: np.ndarray, root: int, group: Sequence[int]) -> None:
        """``dist.reduce(op=SUM)`` into ``root``'s ``buf``."""
        if not buf.size:
            return
        pg = self._group(group)
        as_dt, widen = _REDUCE_AS.get(buf.dtype, (buf.dtype, False))
        work = buf.astype(as_dt) if widen else buf.view(as_dt)
        self._run("reduce", group, self._dist.reduce, self._torch.from_numpy(work),
                  dst=self.rank_of[root], op=self._dist.ReduceOp.SUM, group=pg)
        if widen and self.device == root:
            buf[...] = work.astype(buf.dtype)  # wraps like the narrow sum would

    def group_start(self) -> None:
        """Operations are blocking and issued in plan order; nothing to batch."""

    def group_end(self) -> None:
        """See :meth:`group_start`."""

    def close(self) -> None:
        """Destroy the process groups (idempotent; a channel leaves that to the main
        backend)."""
        if self._closed or self._channel:
            return
        self._closed = True
        self._groups.clear()
        if self._dist.is_initialized():
            self._dist.destroy_process_group()
