"""The ``nccl`` backend: ``cupy.cuda.nccl``, one process per GPU.

cupy is imported only when a rank is constructed, so this module imports on
machines without cupy or a GPU (:func:`available` tells whether it can run).

Communicators: one world communicator, made when the rank starts (every worker
starts together), carries send/recv. Collectives use one communicator per member
set (the sorted device tuple), made once and cached, in :meth:`NcclBackend.prepare`,
which the worker host runs before ``load_plan``: each member walks
``plan.communicator_groups()`` (first-use order, the same on every worker) and
initialises the sets it belongs to. Because every member follows that one order,
the earliest pending set always has all its members arriving, so no initialisation
can deadlock. The set's first member makes the unique id and publishes it through
the driver's rendezvous; both forms cupy has used for it are accepted (a tuple of
128 signed chars, or bytes).

Streams: transfers run on a dedicated non-blocking stream. Before each operation
that stream waits for the current stream (where packing happened); after
``group_end`` the host polls the transfer stream until done, checking the
communicators' asynchronous errors, for at most the timeout; on expiry the used
communicators are aborted and an :class:`~reshard.ExecutionError` names the peers.
Data movement goes as bytes (``NCCL_UINT8``), so any dtype moves; cupy has no
bfloat16 or float8, so buffers of those hold their bits (``Capabilities.bits``), and
casts into and out of them (bf16 -> fp8 with block scales, a bf16 partial sum into its
float32 accumulator and back) convert the bits through float32 on the GPU with integer
arithmetic (:mod:`reshard.core.bits`, bit-exact with ml_dtypes). Reduce (SUM, or MAX for a
scaled cast's amax) works in the real type: complex as two floats, 16-bit integers
widened to int32 and wrapped back. NCCL has ``ncclBfloat16`` (cupy's
``NCCL_BFLOAT16``) and, since 2.24, float8 types (not in cupy's constants); reshard
never asks it to sum them (a bf16 partial sum is summed in float32).

GPU for a rank: ``gpu=`` if given, else ``RESHARD_GPU`` from the worker's
environment, else the rank's position among its host's devices modulo the number
of visible GPUs (after ``CUDA_VISIBLE_DEVICES``). Several ranks may share one GPU
for correctness tests if each sets a distinct ``NCCL_HOSTID`` (e.g.
``env={"NCCL_HOSTID": "reshard-{device}"}``).
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from reshard.comm.backend import Capabilities, Devices, Landed, refuse_unsupported
from reshard.core.dtypes import CAST_TARGETS, NARROW, ReduceOp, parse_dtype, storage
from reshard.core.errors import ExecutionError

_CONVERTS = frozenset(CAST_TARGETS)
"""The floating dtypes this backend converts between (casts on the wire, a partial
sum's accumulator): cupy's own (float16/32/64) by its assignment, bfloat16 and float8,
which cupy lacks, as their bits through float32 on the GPU (:mod:`reshard.core.bits`); both
round to nearest even."""


def available() -> bool:
    """True if cupy imports and sees a GPU with NCCL."""
    try:
        import cupy
        from cupy.cuda import nccl
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return False
    try:
        return bool(cupy.is_available()) and bool(getattr(nccl, "available", True))
    except Exception:  # noqa: BLE001 - a broken driver or runtime: not available
        return False


def encode_unique_id(uid: Any) -> bytes:
    """A unique id (bytes, or cupy's older tuple of signed chars) as bytes to publish."""
    if isinstance(uid, (bytes, bytearray)):
        return b"b" + bytes(uid)
    return b"t" + bytes(int(c) & 0xFF for c in uid)


def decode_unique_id(raw: bytes) -> Any:
    """Inverse of :func:`encode_unique_id`: the form the publishing cupy produced."""
    kind, body = raw[:1], raw[1:]
    if kind == b"b":
        return bytes(body)
    if kind == b"t":
        return tuple(c - 256 if c > 127 else c for c in body)
    raise ExecutionError(f"malformed NCCL unique id (kind {kind!r})")


class NcclBackend:
    """One rank of the NCCL backend.

    Args:
        device: the global device id served.
        world: every device of the runtime, sorted.
        rendezvous: a connected rendezvous client (``set`` / ``get``).
        timeout: seconds any operation (and communicator set-up) may wait.
        host: the device's cluster host (names only).
        local_index: the device's position among the world's devices on its host.
        gpu: the local GPU index to use (overrides the rule above).
    """

    name = "nccl"
    # Every dtype moves as bytes; cupy has no bfloat16 or float8, so buffers hold those
    # as their bits (uint16 / uint8), converted through float32 (reshard.core.bits); every
    # accumulator sums through _dtype_table.
    capabilities = Capabilities(moves=None, sums=None, groups_need_world=False,
                                device="cuda", converts=_CONVERTS,
                                bits=frozenset(NARROW), all_reduces=True)

    def __init__(self, device: int, world: Sequence[int], rendezvous: Any, timeout: float,
                 *, host: int = 0, local_index: int = 0, gpu: int | None = None) -> None:
        try:
            import cupy
            from cupy.cuda import nccl
        except Exception as e:
            raise ExecutionError(
                f"the nccl backend needs cupy with NCCL (pip install 'reshard[cuda12]'): "
                f"{type(e).__name__}: {e}") from e
        if not cupy.is_available():
            raise ExecutionError("the nccl backend needs a CUDA GPU; cupy sees none")
        self._cp, self._nccl = cupy, nccl
        self.device = int(device)
        self.world = tuple(int(d) for d in world)
        self.timeout = float(timeout)
        self._rdv = rendezvous
        count = cupy.cuda.runtime.getDeviceCount()
        if gpu is None:
            env_gpu = os.environ.get("RESHARD_GPU", "").strip()
            gpu = int(env_gpu) if env_gpu else local_index % count
        if not 0 <= gpu < count:
            raise ExecutionError(f"device {device}: GPU {gpu} does not exist ({count} visible)")
        self.gpu = gpu
        self._dev = cupy.cuda.Device(gpu)
        self._dev.use()
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self._comms: dict[tuple[int, ...], Any] = {}
        self._used: dict[tuple[int, ...], Any] = {}  # communicators of the open batch
        self._after: list[Any] = []  # host-side steps once the batch is done
        self._types = self._dtype_table()
        self._closed = False
        self._channel = ""  # "" for the main backend, else the channel's name
        self._world_comm = self._make_comm(self.world)

    def _dtype_table(self) -> dict[np.dtype, tuple[int, np.dtype | None]]:
        """dtype -> (NCCL type to sum in, numpy dtype of that type if not the same).

        A sum dtype smaller than the item (complex as two floats, bool as uint8) is a
        view; a larger one (16-bit integers as int32) a widened copy."""
        n = self._nccl
        f32, f64, i32 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32)
        return {
            np.dtype(np.int8): (n.NCCL_INT8, None),
            np.dtype(np.uint8): (n.NCCL_UINT8, None),
            np.dtype(np.bool_): (n.NCCL_UINT8, np.dtype(np.uint8)),
            np.dtype(np.int32): (n.NCCL_INT32, None),
            np.dtype(np.uint32): (n.NCCL_UINT32, None),
            np.dtype(np.int64): (n.NCCL_INT64, None),
            np.dtype(np.uint64): (n.NCCL_UINT64, None),
            np.dtype(np.float16): (n.NCCL_FLOAT16, None),
            np.dtype(np.float32): (n.NCCL_FLOAT32, None),
            np.dtype(np.float64): (n.NCCL_FLOAT64, None),
            np.dtype(np.complex64): (n.NCCL_FLOAT32, f32),
            np.dtype(np.complex128): (n.NCCL_FLOAT64, f64),
            np.dtype(np.int16): (n.NCCL_INT32, i32),
            np.dtype(np.uint16): (n.NCCL_INT32, i32),
        }

    # ----- communicators -------------------------------------------------------------
    def _make_comm(self, group: tuple[int, ...]) -> Any:
        """Initialise the communicator of ``group`` (collective over its members)."""
        key = f"nccl{self._channel}/" + "-".join(map(str, group))
        try:
            if self.device == group[0]:
                uid = self._nccl.get_unique_id()
                self._rdv.set(key, encode_unique_id(uid))
            else:
                uid = decode_unique_id(self._rdv.get(key, self.timeout))
        except ExecutionError:
            raise
        except Exception as e:
            raise ExecutionError(
                f"device {self.device}: NCCL unique id for {list(group)} unavailable: "
                f"{type(e).__name__}: {e}") from e
        box: dict[str, Any] = {}

        def init() -> None:  # ncclCommInitRank blocks until every member arrives
            try:
                with self._dev:
                    box["comm"] = self._nccl.NcclCommunicator(
                        len(group), uid, group.index(self.device))
            except BaseException as e:  # noqa: BLE001 - reported below
                box["error"] = e

        th = threading.Thread(target=init, name=f"reshard-nccl-init-{key}", daemon=True)
        th.start()
        th.join(self.timeout)
        if th.is_alive():
            raise ExecutionError(
                f"device {self.device}: NCCL communicator for devices {list(group)} not "
                f"formed within {self.timeout:g}s (a member is dead or stuck)")
        if "error" in box:
            raise ExecutionError(
                f"device {self.device}: NCCL communicator for devices {list(group)} "
                f"failed: {box['error']}") from box["error"]
        self._comms[group] = box["comm"]
        return box["comm"]

    def channel(self, name: str) -> NcclBackend:
        """This rank on an independent channel: its own communicators (the world one
        for send/recv included, made in :meth:`prepare`) and its own stream."""
        child = copy.copy(self)
        child._comms = {}
        child._used, child._after = {}, []
        child._channel = f"{self._channel}/{name}"
        with self._dev:
            child._stream = self._cp.cuda.Stream(non_blocking=True)
        child._world_comm = None
        return child

    def prepare(self, plan: Any) -> None:
        """Create the plan's missing communicators this device belongs to (in the
        plan's first-use order)."""
        if self._world_comm is None:
            self._world_comm = self._make_comm(self.world)
        for group in plan.communicator_groups():
            g = tuple(group)
            if self.device in g and g not in self._comms:
                self._make_comm(g)

    def _comm(self, group: Sequence[int]) -> tuple[tuple[int, ...], Any]:
        g = tuple(group)
        comm = self._comms.get(g)
        if comm is None:
            raise ExecutionError(
                f"device {self.device}: no NCCL communicator for devices {list(g)}; they "
                f"are created when a plan is loaded (a LoadPlan call, reshard.comm.calls)")
        self._used[g] = comm
        return g, comm

    def activate(self) -> None:
        """Make this rank's GPU current in the calling thread."""
        self._dev.use()

    # ----- arrays --------------------------------------------------------------------
    @property
    def xp(self) -> Any:
        """cupy."""
        return self._cp

    def empty(self, n: int, dtype: Any) -> Any:
        """A new 1-d buffer on this rank's GPU (bfloat16 / float8: of their bits)."""
        with self._dev:
            return self._cp.empty(n, dtype=storage(parse_dtype(dtype).name))

    def asarray(self, array: Any) -> Any:
        """``array`` on this rank's GPU (an ml_dtypes array: its bits, see
        :func:`reshard.core.dtypes.storage`)."""
        if isinstance(array, np.ndarray) and array.dtype.name in NARROW:
            array = array.view(storage(array.dtype.name))
        with self._dev:
            return self._cp.asarray(array)

    def to_host(self, array: Any) -> np.ndarray:
        """``array`` as numpy (bits of bfloat16 / float8 stay unsigned integers; a
        Runtime views them as the array's dtype)."""
        return self._cp.asnumpy(array)

    # ----- operations ----------------------------------------------------------------
    def _ready(self, buf: Any) -> int:
        """Order the transfer stream after the current stream; ``buf``'s address."""
        if not buf.flags.c_contiguous:
            raise ExecutionError(
                f"device {self.device}: backend buffers must be C-contiguous")
        self._stream.wait_event(self._cp.cuda.get_current_stream().record())
        return buf.data.ptr

    def _raw(self, buf: Any) -> tuple[int, int]:
        """(pointer, byte count) for data movement as NCCL_UINT8."""
        return self._ready(buf), buf.size * buf.itemsize

    def broadcast(self, buf: Any, root: int, group: Devices, chain: Devices | None = None,
                  *, tag: int = 0, parents: Devices | None = None, addends: Devices = (),
                  addend_parents: Devices | None = None, landed: Landed | None = None) -> None:
        """``ncclBroadcast`` in place on the member set's communicator (NCCL pipelines
        its own ring, so the chain or tree hint is not used; ``tag``: see :meth:`send`;
        no ``addends`` or ``landed``: see :attr:`capabilities`)."""
        refuse_unsupported("nccl", self.capabilities, addends, landed)
        if not buf.size:  # every member skips it alike (sizes come from the plan)
            return
        g, comm = self._comm(group)
        ptr, n = self._raw(buf)
        comm.broadcast(ptr, ptr, n, self._nccl.NCCL_UINT8, g.index(root), self._stream.ptr)

    def _point_to_point(self, buf: Any) -> tuple[int, int] | None:
        """``buf``'s (pointer, bytes) for a send or receive on the world communicator,
        which the group then ends; None for an empty one, which both ranks skip alike
        (sizes come from the plan)."""
        if not buf.size:
            return None
        self._used[self.world] = self._world_comm
        return self._raw(buf)

    def send(self, buf: Any, peer: int, *, tag: int = 0) -> None:
        """``ncclSend`` on the world communicator. NCCL has no tags: the sends and
        receives of a group between one pair are matched in issue order, which is the
        plan's global order on both ranks (``tag`` is ignored)."""
        if (raw := self._point_to_point(buf)) is not None:
            ptr, n = raw
            self._world_comm.send(ptr, n, self._nccl.NCCL_UINT8, self.world.index(peer),
                                  self._stream.ptr)

    def recv(self, buf: Any, peer: int, *, tag: int = 0, landed: Landed | None = None) -> None:
        """``ncclRecv`` on the world communicator (``tag``: see :meth:`send`; no
        ``landed``). Written out as :meth:`send` is: the contract tests read each call
        the backend makes (tests/contract/test_nccl_contract.py)."""
        refuse_unsupported("nccl", self.capabilities, landed=landed)
        if (raw := self._point_to_point(buf)) is not None:
            ptr, n = raw
            self._world_comm.recv(ptr, n, self._nccl.NCCL_UINT8, self.world.index(peer),
                                  self._stream.ptr)

    def all_gather(self, out: Any, inp: Any, group: Sequence[int]) -> None:
        """``ncclAllGather``: row ``i`` of ``out`` from member ``group[i]``."""
        if not inp.size:
            return
        _, comm = self._comm(group)
        src, n = self._raw(inp)
        dst = self._ready(out)
        comm.allGather(src, dst, n, self._nccl.NCCL_UINT8, self._stream.ptr)

    def _summed(self, buf: Any, group: Sequence[int], keeps: bool,
                op: ReduceOp) -> tuple[Any, Any, Any, int, Any, Any]:
        """What a reduction of ``buf`` over ``group`` passes NCCL: the member order, the
        communicator, the buffer it sums (16-bit integers widened, wrapped back into
        ``buf`` after the group where this member ``keeps`` the result), its pointer,
        the NCCL type and op."""
        g, comm = self._comm(group)
        try:
            nccl_type, as_dt = self._types[np.dtype(buf.dtype)]
        except KeyError:
            raise ExecutionError(
                f"device {self.device}: NCCL cannot sum dtype {buf.dtype}") from None
        work = buf
        if as_dt is not None and as_dt.itemsize > buf.itemsize:  # widen, wrap back after
            with self._dev:
                work = buf.astype(as_dt)
            if keeps:
                self._after.append(lambda: buf.__setitem__(Ellipsis, work.astype(buf.dtype)))
        elif as_dt is not None:
            work = buf.view(as_dt)
        ptr = self._ready(work)
        nccl_op = {ReduceOp.SUM: self._nccl.NCCL_SUM, ReduceOp.MAX: self._nccl.NCCL_MAX}[op]
        return g, comm, ptr, work.size, nccl_type, nccl_op

    def reduce(self, buf: Any, root: int, group: Sequence[int], *,
               op: ReduceOp = ReduceOp.SUM) -> None:
        """``ncclReduce`` (SUM or MAX) in place into ``root``'s ``buf``."""
        if not buf.size:
            return
        g, comm, ptr, n, nccl_type, nccl_op = self._summed(buf, group, self.device == root, op)
        comm.reduce(ptr, ptr, n, nccl_type, nccl_op, g.index(root), self._stream.ptr)

    def all_reduce(self, buf: Any, group: Sequence[int], *,
                   op: ReduceOp = ReduceOp.SUM) -> None:
        """``ncclAllReduce`` (SUM or MAX) in place into every member's ``buf``."""
        if not buf.size:
            return
        _, comm, ptr, n, nccl_type, nccl_op = self._summed(buf, group, True, op)
        comm.allReduce(ptr, ptr, n, nccl_type, nccl_op, self._stream.ptr)

    def group_start(self) -> None:
        """``ncclGroupStart``: the operations until :meth:`group_end` are launched
        together (NCCL fuses them; they may run concurrently)."""
        self._used, self._after = {}, []
        self._nccl.groupStart()

    def group_end(self) -> None:
        """``ncclGroupEnd``, then wait (bounded) for the batch to complete and run the
        host-side steps its operations queued (widened reduces wrap back)."""
        self._nccl.groupEnd()
        self._wait(self._stream)
        for step in self._after:
            step()
        self._used, self._after = {}, []

    def _wait(self, stream: Any) -> None:
        """Poll ``stream`` until done; check async errors; abort on timeout."""
        event = stream.record()
        deadline = time.monotonic() + self.timeout
        pause = 1e-5
        while not event.done:
            for group, comm in self._used.items():
                try:
                    comm.check_async_error()
                except Exception as e:
                    self._abort()
                    raise ExecutionError(
                        f"NCCL error on communicator {list(group)}: {e}") from e
            if time.monotonic() > deadline:
                peers = sorted({d for g in self._used for d in g} - {self.device})
                self._abort()
                raise ExecutionError(
                    f"NCCL operation with device(s) {peers} did not complete within "
                    f"{self.timeout:g}s (peer dead or stuck); communicators aborted")
            time.sleep(pause)
            pause = min(pause * 2, 2e-3)

    def _abort(self) -> None:
        """Abort the communicators of the open batch (they may hold stuck kernels)."""
        for group, comm in self._used.items():  # each once, however many operations
            with contextlib.suppress(Exception):  # best effort: the error is raised
                comm.abort()
            self._comms.pop(group, None)
        self._used = {}

    def barrier(self, group: Sequence[int]) -> None:
        """Everyone reports to the first member, which releases everyone."""
        token = self.empty(1, np.uint8)
        lead = group[0]
        others = [d for d in group if d != lead]
        if self.device == lead:
            for d in others:
                self.group_start()
                self.recv(token, d)
                self.group_end()
            for d in others:
                self.group_start()
                self.send(token, d)
                self.group_end()
        else:
            self.group_start()
            self.send(token, lead)
            self.group_end()
            self.group_start()
            self.recv(token, lead)
            self.group_end()

    def synchronize(self) -> None:
        """Wait (bounded) for this rank's current and transfer streams."""
        self._wait(self._cp.cuda.get_current_stream())
        self._wait(self._stream)

    def close(self) -> None:
        """Destroy every communicator (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for comm in self._comms.values():
            with contextlib.suppress(Exception):  # best effort on close
                comm.destroy()
        self._comms.clear()
