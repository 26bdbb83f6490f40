"""What every CPU backend shares: numpy buffers in host memory, nothing outstanding to
synchronize, a barrier made of token send/recv, and the size of the pieces its
transfers are pipelined in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from reshard.comm.backend import Capabilities, Devices, refuse_unsupported
from reshard.comm.backends.tcp_frames import Stream
from reshard.core.cluster import pipeline_piece
from reshard.core.dtypes import is_torch, numpy_of_torch
from reshard.core.errors import ExecutionError
from reshard.planner.values.tasks import sum_targets

CHAIN_PIECE = 1 << 18
"""Bytes per pipelined piece of a chain broadcast when the program names none. A relay
passes a piece on only once it has all of it, so a chain's fill costs one piece per
hop: 256 KiB pieces measured 1.15x the bound on the testbed's weight-sync slice (many
small boxes, 2-hop chains) where 1 MiB pieces measured 1.22x, with the paper cases
unchanged (1.05-1.19x)."""


def wire_piece(relay_piece: int, nbytes: int) -> int:
    """Bytes per piece of an operation on an ``nbytes`` buffer, for a program whose
    ``Cluster.relay_piece`` is ``relay_piece``: the cost model's
    (:func:`reshard.core.cluster.pipeline_piece`), rounded down to whole 64 bytes (any
    element divides them), at least 4 KiB; :data:`CHAIN_PIECE` without one. Every
    member of an operation computes the same: they run the same program on buffers of
    the same size."""
    if not relay_piece:
        return CHAIN_PIECE
    piece = pipeline_piece(relay_piece, nbytes)
    return piece if piece >= nbytes else max(4096, piece // 64 * 64)


def broadcast_route(me: int, root: int, group: Sequence[int], chain: Sequence[int] | None,
                    parents: Sequence[int] | None) -> tuple[list[int], int | None, list[int]]:
    """A broadcast's shape as member ``me`` sees it (the Backend protocol's ``chain``
    and ``parents``; without them the group's order, a chain): every receiver, the
    member ``me`` receives from (None: the root, or not a receiver), and those it
    passes the bytes on to."""
    if chain is None:
        chain = [d for d in group if d != root]
    receivers = [d for d in chain if d != root]
    if parents is None:
        parents = [root, *receivers[:-1]]
    prev = parents[receivers.index(me)] if me in receivers else None
    return receivers, prev, [b for a, b in zip(parents, receivers) if a == me]


def broadcast_neighbours(me: int, root: int, group: Sequence[int],
                         chain: Sequence[int] | None, parents: Sequence[int] | None,
                         addends: Sequence[int], addend_parents: Sequence[int] | None
                         ) -> tuple[list[int], list[int]]:
    """Whom member ``me`` receives from and passes bytes on to in a broadcast
    (:func:`broadcast_route`) that sums ``addends`` on the way: their running sums go
    first into the root (their chain, or the tree of ``addend_parents``)."""
    if chain is None:
        chain = [d for d in group if d != root and d not in addends]
    _, prev, nxts = broadcast_route(me, root, group, chain, parents)
    sums = list(zip(addends, sum_targets(root, addends, addend_parents)))
    return ([a for a, b in sums if b == me] + ([] if prev is None else [prev]),
            [b for a, b in sums if a == me] + nxts)


def reduce_route(me: int, root: int, group: Sequence[int]) -> tuple[int | None, int | None]:
    """A reduction's chain (the members in group order, the root last) as member ``me``
    sees it: the member it receives the running result from (None: it starts the
    chain) and the one it passes it to (None: the root)."""
    chain = [d for d in group if d != root] + [root]
    at = chain.index(me)
    return (chain[at - 1] if at else None,
            chain[at + 1] if at + 1 < len(chain) else None)


class Grouped:
    """What tcp and nixl share: a world of ranks, pieces of the plan's size, and
    groups whose operations only post until the group ends, the group's end
    (``_progress``) moving everything. Outside a group an operation is a group of its
    own; a channel that failed once refuses every later operation, naming its first
    failure (the state of its transfers is unknown)."""

    name: str
    device: int
    _world: tuple[int, ...]
    _open: bool = False
    _failed: ExecutionError | None = None
    relay_piece = 0
    """The running program's piece (:meth:`use_piece`; 0: the default piece)."""
    capabilities = Capabilities(moves=None, sums=None, groups_need_world=False, device="cpu",
                                lands_pieces=True, sized_pieces=True, batch_scheduled=True,
                                gathers=True)
    """Point to point in pieces on host memory: every move (relays and gathers built
    from sends), no reduction of their own."""

    def _join(self, device: int, world: tuple[int, ...], timeout: float) -> None:
        """This rank: ``device`` of ``world`` (in the plane's rank order), whose
        operations may go ``timeout`` seconds without progress."""
        self.device = int(device)
        self._world = world
        if self.device not in world:
            raise ExecutionError(f"device {device} is not in the world {list(world)}")
        self.timeout = float(timeout)

    @property
    def world(self) -> tuple[int, ...]:
        """Every device of the runtime, in rank order."""
        return self._world

    def use_piece(self, nbytes: int) -> None:
        """Pipeline the operations that follow in pieces of the plan's
        ``Cluster.relay_piece`` ``nbytes`` (:func:`wire_piece`)."""
        self.relay_piece = max(0, int(nbytes))

    def peers_of(self, plan: Any) -> list[int]:
        """Check that ``plan``'s groups (a ReshardPlan's or a WorkerProgram's) are
        within the world; the devices of the world this rank shares a task with, in
        ascending order."""
        for group in plan.communicator_groups():
            unknown = [d for d in group if d not in self._world]
            if unknown:
                raise ExecutionError(
                    f"device {self.device}: group {list(group)} has devices {unknown} "
                    f"outside the world {list(self._world)}")
        peers: set[int] = set()
        for task in getattr(plan, "tasks", ()):
            t = task[1] if isinstance(task, tuple) else task
            if self.device in t.devices:
                peers.update(t.devices)
        return sorted(p for p in peers - {self.device} if p in self._world)

    def _progress(self) -> None:
        """Move every operation of the open group to completion."""
        raise NotImplementedError

    def _send_whole(self, peer: int, tag: int, stream: Stream) -> None:
        """Post all of ``stream`` to ``peer`` (the group's end moves it)."""
        raise NotImplementedError

    def _reduce_part(self, buf: np.ndarray, root: int, group: Sequence[int], tag: int
                     ) -> tuple[Stream, int, int | None] | None:
        """This member's part in a reduction's chain (:func:`reduce_route`): its buffer
        as a stream, the member it receives the running result from and the one it
        passes it to (None: it is the root); None where its part is done: no byte
        moves, it is not a member, or it starts the chain (its buffer sent on whole)."""
        me = self.device
        if not buf.size or me not in group:
            return None
        prev, nxt = reduce_route(me, root, group)
        mine = Stream(buf)
        if prev is None:
            if nxt is not None:
                self._send_whole(nxt, tag, mine)
            self._run()
            return None
        return mine, prev, nxt

    def _broadcast_part(self, buf: Any, root: int, group: Devices, chain: Devices | None,
                        parents: Devices | None, addends: Devices, tag: int
                        ) -> tuple[Stream, str, int, list[int]] | None:
        """A receiver's part in a broadcast: its buffer as a stream, the name of its
        receive ("chain broadcast" past one receiver), the member it receives from and
        those it passes the bytes on to (:func:`broadcast_route`). None where this
        member's part is done: no byte moves, it is not a receiver, or it is the root
        (its buffer sent whole to each member it feeds). Refuses addends."""
        refuse_unsupported(self.name, self.capabilities, addends)
        stream = Stream(buf)
        if not stream.total:
            return None
        receivers, prev, nxts = broadcast_route(self.device, root, group, chain, parents)
        if prev is None:
            if self.device == root:
                for nxt in nxts:
                    self._send_whole(nxt, tag, stream)
            self._run()
            return None
        return stream, "chain broadcast" if len(receivers) > 1 else "broadcast", prev, nxts

    def _gather_rows(self, out: np.ndarray, inp: np.ndarray, group: Sequence[int]
                     ) -> np.ndarray | None:
        """An all-gather's ``out`` as one row per member of ``group``, this member's
        ``inp`` already in its row; None where it takes no part or no byte moves."""
        me = self.device
        if not inp.size or me not in group:
            return None
        rows = out.reshape(len(group), -1)
        rows[list(group).index(me)] = inp.reshape(-1)
        return rows

    def _run(self) -> None:
        """Outside a group an operation is a group of its own."""
        if self._failed is not None:
            raise self._failed
        if not self._open:
            self._open = True
            self.group_end()

    def group_start(self) -> None:
        """Open a group: operations only post until :meth:`group_end`."""
        if self._failed is not None:
            raise self._failed
        if self._open:
            raise ExecutionError(f"device {self.device}: group_start inside an open group")
        self._open = True

    def group_end(self) -> None:
        """Complete every operation of the group (the plane's ``_progress``)."""
        if not self._open:
            raise ExecutionError(f"device {self.device}: group_end without group_start")
        self._open = False
        try:
            self._progress()
        except ExecutionError as e:
            raise self._fail(e) from e.__cause__

    def _fail(self, e: ExecutionError) -> ExecutionError:
        """Record this channel's first failure and return ``e``."""
        if self._failed is None:
            self._failed = ExecutionError(f"device {self.device}: this {self.name} channel "
                                          f"failed earlier ({e}); make a new backend")
        return e


class HostMemory:
    """Mixin for backends whose buffers are numpy arrays and whose operations are
    complete when they return. Needs ``send`` / ``recv`` for :meth:`barrier`."""

    @property
    def xp(self) -> Any:
        """numpy."""
        return np

    def empty(self, n: int, dtype: Any) -> np.ndarray:
        """A new 1-d buffer."""
        return np.empty(n, dtype=dtype)

    def asarray(self, array: Any) -> np.ndarray:
        """numpy array (no copy when already one, or a CPU torch tensor: its memory, in
        ml_dtypes' type for torch's bfloat16 and float8)."""
        if is_torch(array):
            return numpy_of_torch(array.detach().cpu())
        return np.asarray(array)

    def to_host(self, array: Any) -> np.ndarray:
        """Identity."""
        return np.asarray(array)

    def synchronize(self) -> None:
        """Nothing outstanding on CPU."""

    def activate(self) -> None:
        """Nothing to make current on CPU."""

    def barrier(self, group: Sequence[int]) -> None:
        """Everyone reports to the first member, which releases everyone."""
        token = np.zeros(1, dtype=np.uint8)
        lead = group[0]
        if self.device == lead:  # type: ignore[attr-defined]
            for d in group[1:]:
                self.recv(token, d)  # type: ignore[attr-defined]
            for d in group[1:]:
                self.send(token, d)  # type: ignore[attr-defined]
        else:
            self.send(token, lead)  # type: ignore[attr-defined]
            self.recv(token, lead)  # type: ignore[attr-defined]
