"""The ``torch`` backend: ranks of a torch.distributed process group the caller made.

A process that initialised torch.distributed itself (a training or inference rank)
runs reshard programs over that world through this backend, with no world of
reshard's own. Device ids are global torch ranks (what DTensor's device meshes hold).
The group must contain every rank of the default group: it is the default group, or
one made over all ranks to keep reshard's traffic apart from the caller's.

Two kinds of rank, chosen by :func:`torch_backend` from the group's backend:

* :class:`TorchDistBackend` (gloo, CPU): numpy buffers (zero-copy views of CPU
  tensors), and exactly the operations of the ``gloo`` backend: chain broadcasts
  pipelined in pieces over tagged ``isend``/``irecv`` (gloo matches point-to-point
  messages by peer and tag), collectives on sub-groups, a step's operations in
  flight together.
* :class:`TorchTensorBackend` (NCCL, CUDA; also runs on gloo, CPU): torch tensors on
  the group's device. Broadcasts, reductions and all-gathers on sub-groups (NCCL's
  own pipelined ring), ``isend``/``irecv`` for point-to-point (NCCL ignores tags; the
  plan's one global issue order matches them). On CUDA every operation is issued
  on the current stream's order: the next operation's stream waits for the previous
  one (``Work.wait`` is a stream wait, the host does not block), so a step's
  operations run one after another in the plan's global order, which cannot
  deadlock whatever communicators they use; :meth:`TorchTensorBackend.synchronize`
  waits for the device.

Sub-groups, one per collective member set, come from ``dist.new_group``, which every
rank of the default group must call in the same order, members or not
(``Capabilities.groups_need_world``): every rank loads every program, in one order,
even one it has no task in, and ``prepare`` walks the plan's member sets in
first-use order. Closing a rank never destroys the caller's process group.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import enum
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from reshard.comm.backend import Backend, Capabilities, Devices, Landed, refuse_unsupported
from reshard.comm.backends.gloo import GlooBackend, torch_op
from reshard.core.choice import parse_choice
from reshard.core.dtypes import ReduceOp, numpy_of_torch, reduce_as, torch_of_numpy
from reshard.core.errors import ExecutionError


class BufferKind(enum.Enum):
    """Which rank :func:`torch_backend` builds."""

    AUTO = "auto"  # numpy on a gloo group, torch tensors on an NCCL one
    NUMPY = "numpy"  # TorchDistBackend (gloo only)
    TENSOR = "tensor"  # TorchTensorBackend

    @classmethod
    def parse(cls, value: str | BufferKind) -> BufferKind:
        """Accept a BufferKind or its name; raise listing the valid names."""
        return parse_choice(cls, value, "buffer kind")


def _world_group(group: Any, what: str) -> tuple[Any, Any, tuple[int, ...]]:
    """(torch.distributed, the group, its global ranks), checking the rules above."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ExecutionError(
            f"the {what} backend runs on a torch.distributed process group, but this process "
            f"has none; call torch.distributed.init_process_group(...) first, or let a "
            f"Runtime start its own workers (backend='gloo')")
    pg = dist.group.WORLD if group is None else group
    ranks = tuple(dist.get_process_group_ranks(pg))
    world = dist.get_world_size()
    if sorted(ranks) != list(range(world)):
        raise ExecutionError(
            f"the {what} backend needs a group holding every rank of the default group "
            f"(sub-groups are made with dist.new_group, which all {world} ranks call), but "
            f"group has ranks {list(ranks)}; pass None (the default group) or a group made "
            f"with dist.new_group(list(range({world})))")
    return dist, pg, tuple(range(world))


class TorchDistBackend(GlooBackend):
    """A rank of a gloo process group the caller made (numpy buffers).

    Args:
        group: the process group (default: the default group); it must hold every
            rank of the default group.
        timeout: seconds any operation may wait (bounds sub-group creation and every
            wait; the caller's group keeps its own timeout).
    """

    name = "torch"
    capabilities = dataclasses.replace(GlooBackend.capabilities, fuses_sums=False,
                                       batch_scheduled=False)  # the caller's processes

    def __init__(self, group: Any = None, *, timeout: float = 60.0) -> None:
        import torch

        dist, pg, world = _world_group(group, "torch")
        kind = str(dist.get_backend(pg))
        if "gloo" not in kind:
            raise ExecutionError(
                f"TorchDistBackend moves numpy buffers over gloo, but the group's backend is "
                f"{kind!r}; use torch_backend(group) (TorchTensorBackend for NCCL)")
        self._torch, self._dist = torch, dist
        self.device = int(dist.get_rank())
        self.world = world
        self.rank_of = {d: d for d in world}  # device ids are global ranks
        self.timeout = float(timeout)
        self._td = datetime.timedelta(seconds=self.timeout)
        self._store = None
        self._groups: dict[tuple[int, ...], Any] = {world: pg}
        self._p2p = None if pg is dist.group.WORLD else pg
        self._channel = ""
        self._open = None
        self._closed = False

    def close(self) -> None:
        """Forget the sub-groups; the caller's process group stays."""
        self._closed = True
        self._groups.clear()


# ----- torch tensors (NCCL on CUDA; gloo on CPU) -----------------------------------------
class _Issued:
    """An operation of an open group: its Work, and what follows it on this rank."""

    def __init__(self, work: Any, what: str, peers: Sequence[int],
                 after: Callable[[], None] | None = None) -> None:
        self.work, self.what, self.peers, self.after = work, what, tuple(peers), after


class TorchTensorBackend:
    """A rank of a process group the caller made, on torch tensors of its device.

    Args:
        group: the process group (default: the default group); it must hold every
            rank of the default group.
        timeout: seconds any operation may wait (sub-group creation; the caller's
            group keeps its own timeout for the operations).
        device: ``"cuda"`` (the current CUDA device; NCCL) or ``"cpu"`` (gloo); default
            from the group's backend.
    """

    name = "torch"

    def __init__(self, group: Any = None, *, timeout: float = 60.0,
                 device: str | None = None) -> None:
        import torch

        dist, pg, world = _world_group(group, "torch")
        kind = str(dist.get_backend(pg))
        if device is None:
            device = "cuda" if "nccl" in kind and torch.cuda.is_available() else "cpu"
        if device not in ("cpu", "cuda"):
            raise ExecutionError(f"device must be 'cpu' or 'cuda', got {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise ExecutionError("device='cuda' but torch sees no CUDA device")
        self._torch, self._dist = torch, dist
        self._dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" \
            else torch.device("cpu")
        self._cuda = device == "cuda"
        # bytes move (any dtype), every accumulator sums, torch converts every dtype
        self.capabilities = Capabilities(moves=None, sums=None, groups_need_world=True,
                                         device=device, all_reduces=True)
        self.device = int(dist.get_rank())
        self.world = world
        self.timeout = float(timeout)
        self._td = datetime.timedelta(seconds=self.timeout)
        self._groups: dict[tuple[int, ...], Any] = {world: pg}
        self._p2p = None if pg is dist.group.WORLD else pg
        self._channel = ""
        self._open: list[_Issued] | None = None

    # ----- memory ----------------------------------------------------------------------
    @property
    def xp(self) -> Any:
        """torch."""
        return self._torch

    def _dtype(self, dtype: Any) -> Any:
        return getattr(self._torch, np.dtype(dtype).name)

    def empty(self, n: int, dtype: Any) -> Any:
        """A new 1-d tensor on this rank's device."""
        return self._torch.empty(int(n), dtype=self._dtype(dtype), device=self._dev)

    def asarray(self, array: Any) -> Any:
        """``array`` as a tensor on this rank's device (no copy when already there; numpy
        arrays of ml_dtypes' types become torch's own bfloat16 / float8)."""
        t = array if isinstance(array, self._torch.Tensor) else \
            torch_of_numpy(np.ascontiguousarray(array))
        return t.detach().to(self._dev)

    def to_host(self, array: Any) -> np.ndarray:
        """``array`` as a numpy array (ml_dtypes' types for bfloat16 and float8)."""
        return numpy_of_torch(array.detach().cpu())

    def activate(self) -> None:
        """Make this rank's GPU current in the calling thread (no-op on CPU)."""
        if self._cuda:
            self._torch.cuda.set_device(self._dev)

    def synchronize(self) -> None:
        """Wait for this rank's outstanding GPU work (no-op on CPU)."""
        if self._cuda:
            self._torch.cuda.synchronize(self._dev)

    # ----- communicators ---------------------------------------------------------------
    def channel(self, name: str) -> TorchTensorBackend:
        """This rank on an independent channel: its own sub-groups and its own group of
        every rank for point-to-point, made (like every group) in :meth:`prepare`."""
        child = copy.copy(self)
        child._groups, child._p2p, child._open = {}, None, None
        child._channel = f"{self._channel}/{name}"
        return child

    def prepare(self, plan: Any) -> None:
        """Create the plan's missing sub-groups (every rank of the world, same order)."""
        if self._channel and self.world not in self._groups:
            self._groups[self.world] = self._p2p = self._new_group(self.world)
        for group in plan.communicator_groups():
            key = tuple(group)
            if key not in self._groups:
                unknown = [d for d in key if d not in self.world]
                if unknown:
                    raise ExecutionError(
                        f"device {self.device}: group {list(key)} has devices {unknown} "
                        f"outside the world of {len(self.world)} torch ranks")
                self._groups[key] = self._new_group(key)

    def _new_group(self, ranks: Sequence[int]) -> Any:
        return self._dist.new_group(list(ranks), timeout=self._td)

    def _group(self, group: Sequence[int]) -> Any:
        pg = self._groups.get(tuple(group))
        if pg is None:
            raise ExecutionError(
                f"device {self.device}: no process group for members {list(group)}; "
                f"sub-groups are created when every rank loads the program (Executor.load)")
        return pg

    def _bytes(self, buf: Any) -> Any:
        if not buf.is_contiguous():
            raise ExecutionError(f"device {self.device}: backend buffers must be contiguous, "
                                 f"got strides {buf.stride()} for shape {tuple(buf.shape)}")
        return buf.reshape(-1).view(self._torch.uint8)

    # ----- operations ------------------------------------------------------------------
    def _issue(self, what: str, peers: Sequence[int], fn: Any, *args: Any,
               after: Callable[[], None] | None = None, **kwargs: Any) -> None:
        """Start an operation (asynchronously) in the open group, or run it alone."""
        try:
            work = fn(*args, **kwargs)
        except RuntimeError as e:
            raise ExecutionError(f"torch {what} with device(s) {list(peers)} failed: "
                                 f"{' '.join(str(e).split())[:300]}") from e
        op = _Issued(work, what, peers, after)
        if self._open is None:
            self._finish(op)
        elif self._cuda:  # one at a time on the stream, in the global order
            self._wait(op)
            self._open.append(_Issued(None, what, peers, after))
        else:
            self._open.append(op)

    def _wait(self, op: _Issued) -> None:
        if op.work is None:
            return
        try:
            op.work.wait()
        except RuntimeError as e:
            raise ExecutionError(f"torch {op.what} with device(s) {list(op.peers)} failed: "
                                 f"{' '.join(str(e).split())[:300]}") from e
        op.work = None

    def _finish(self, op: _Issued) -> None:
        self._wait(op)
        if op.after is not None:
            op.after()

    def broadcast(self, buf: Any, root: int, group: Devices, chain: Devices | None = None,
                  *, tag: int = 0, parents: Devices | None = None, addends: Devices = (),
                  addend_parents: Devices | None = None, landed: Landed | None = None) -> None:
        """``dist.broadcast`` on the member set's sub-group (the chain or tree is left
        to the library: NCCL pipelines its own ring; no ``addends`` or ``landed``)."""
        refuse_unsupported("torch", self.capabilities, addends, landed)
        if buf.numel():
            self._issue("broadcast", group, self._dist.broadcast, self._bytes(buf), src=root,
                        group=self._group(group), async_op=True)

    def send(self, buf: Any, peer: int, *, tag: int = 0) -> None:
        """``dist.isend`` to ``peer``."""
        if buf.numel():
            self._issue("send", (peer,), self._dist.isend, self._bytes(buf), dst=peer,
                        group=self._p2p, tag=tag)

    def recv(self, buf: Any, peer: int, *, tag: int = 0, landed: Landed | None = None) -> None:
        """``dist.irecv`` from ``peer`` into ``buf`` (no ``landed``)."""
        refuse_unsupported("torch", self.capabilities, landed=landed)
        if buf.numel():
            self._issue("recv", (peer,), self._dist.irecv, self._bytes(buf), src=peer,
                        group=self._p2p, tag=tag)

    def all_gather(self, out: Any, inp: Any, group: Sequence[int]) -> None:
        """``all_gather_single`` into the flattened rows (rows in group order;
        ``all_gather_into_tensor``, its name before torch 2.13, where it is missing)."""
        if inp.numel():
            gather = getattr(self._dist, "all_gather_single", None) or \
                self._dist.all_gather_into_tensor
            self._issue("all-gather", group, gather,
                        self._bytes(out), self._bytes(inp), group=self._group(group),
                        async_op=True)

    def reduce(self, buf: Any, root: int, group: Sequence[int], *,
               op: ReduceOp = ReduceOp.SUM) -> None:
        """``dist.reduce`` (SUM or MAX) into ``root``'s ``buf`` (16-bit integers widened
        to int32 and wrapped back, unsigned 32/64-bit as their signed twins)."""
        self._summed("reduce", self._dist.reduce, buf, group, op, self.device == root,
                     dst=root)

    def all_reduce(self, buf: Any, group: Sequence[int], *,
                   op: ReduceOp = ReduceOp.SUM) -> None:
        """``dist.all_reduce`` (SUM or MAX) into every member's ``buf`` (16-bit integers
        widened as for :meth:`reduce`)."""
        self._summed("all-reduce", self._dist.all_reduce, buf, group, op, True)

    def _summed(self, what: str, call: Any, buf: Any, group: Sequence[int], op: ReduceOp,
                keeps: bool, **where: Any) -> None:
        """Issue ``call`` (a reduction) of ``buf`` over ``group`` in a dtype torch sums;
        where this member ``keeps`` the result and it was widened, it is wrapped back
        into ``buf`` once done."""
        if not buf.numel():
            return
        as_name, widen = reduce_as(str(buf.dtype).removeprefix("torch."))
        as_dt = getattr(self._torch, as_name)
        work = buf.to(as_dt) if widen else buf.view(as_dt)
        after = None
        if widen and keeps:
            def after() -> None:
                buf.copy_(work.to(buf.dtype))  # wraps like the narrow sum would
        self._issue(what, group, call, work, op=torch_op(self._dist, op),
                    group=self._group(group), async_op=True, after=after, **where)

    def group_start(self) -> None:
        """Open a group: operations until :meth:`group_end` are all started (on CUDA, one
        after another on the stream)."""
        if self._open is not None:
            raise ExecutionError(f"device {self.device}: group_start inside an open group")
        self._open = []

    def group_end(self) -> None:
        """Wait for every operation of the group, in issue order (on CUDA a stream wait:
        later work on the current stream follows them)."""
        ops, self._open = self._open, None
        if ops is None:
            raise ExecutionError(f"device {self.device}: group_end without group_start")
        for op in ops:
            self._finish(op)

    def barrier(self, group: Sequence[int]) -> None:
        """Every member reports to the first, which releases everyone."""
        token = self._torch.zeros(1, dtype=self._torch.uint8, device=self._dev)
        lead = group[0]
        peers = list(group[1:]) if self.device == lead else [lead]
        for d in peers:
            (self.recv if self.device == lead else self.send)(token, d)
        for d in peers:
            (self.send if self.device == lead else self.recv)(token, d)
        self.synchronize()

    def close(self) -> None:
        """Forget the sub-groups; the caller's process group stays."""
        self._groups.clear()


def torch_backend(group: Any = None, *, timeout: float = 60.0,
                  buffers: str | BufferKind = BufferKind.AUTO) -> Backend:
    """The ``torch`` backend's factory: a rank of ``group`` (default: the default
    process group, which the caller initialised).

    Args:
        group: the process group; it must hold every rank of the default group.
        timeout: seconds sub-group creation and waits may take.
        buffers: ``"auto"`` (numpy on gloo, torch tensors on NCCL), ``"numpy"`` or
            ``"tensor"`` (torch tensors, on CUDA with NCCL or on CPU with gloo).

    Returns:
        A :class:`TorchDistBackend` or a :class:`TorchTensorBackend`.
    """
    kind = BufferKind.parse(buffers)
    if kind is BufferKind.AUTO:
        dist, pg, _ = _world_group(group, "torch")
        name = str(dist.get_backend(pg))  # "gloo", "nccl" or e.g. "cpu:gloo,cuda:nccl"
        kind = BufferKind.NUMPY if "gloo" in name else BufferKind.TENSOR
    if kind is BufferKind.NUMPY:
        return TorchDistBackend(group, timeout=timeout)
    return TorchTensorBackend(group, timeout=timeout)


__all__ = ["BufferKind", "TorchDistBackend", "TorchTensorBackend", "torch_backend"]
