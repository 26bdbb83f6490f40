"""The ``local`` backend: every rank a thread of one process, messages through
in-memory FIFO channels.

It moves exactly the bytes a plan says (every message is a copy of the packed
buffer, counted per channel), so it is the reference semantics for every other
backend, and the fabric's byte counters let tests check a plan's traffic.
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from reshard.comm.backend import Capabilities, Devices, Landed, refuse_unsupported
from reshard.comm.backends.host_memory import HostMemory
from reshard.core.dtypes import ReduceOp
from reshard.core.errors import ExecutionError
from reshard.planner.values.tasks import sum_targets


class LocalFabric:
    """In-memory channels between ranks of one process (one FIFO per ordered pair).

    Args:
        timeout: seconds a receive waits before raising :class:`ExecutionError`.
    """

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._channels: dict[tuple[str, int, int], queue.Queue] = {}
        self.bytes_sent: defaultdict[tuple[int, int], int] = defaultdict(int)
        self.messages = 0
        self.closed = threading.Event()

    def fifo(self, src: int, dst: int, context: str = "") -> queue.Queue:
        """The FIFO from ``src`` to ``dst`` in a communication context."""
        with self._lock:
            ch = self._channels.get((context, src, dst))
            if ch is None:
                ch = self._channels[(context, src, dst)] = queue.Queue()
            return ch

    def post(self, src: int, dst: int, payload: np.ndarray, context: str = "") -> None:
        """Deliver a copy of ``payload`` from ``src`` to ``dst``."""
        msg = np.array(payload, copy=True)
        with self._lock:
            self.bytes_sent[(src, dst)] += msg.nbytes
            self.messages += 1
        self.fifo(src, dst, context).put(msg)

    def take(self, src: int, dst: int, context: str = "") -> np.ndarray:
        """The next message from ``src`` to ``dst``; raises after the timeout."""
        ch = self.fifo(src, dst, context)
        waited = 0.0
        while True:
            if self.closed.is_set():
                raise ExecutionError(f"device {dst}: runtime closed while receiving from {src}")
            step = min(0.2, self.timeout - waited)
            try:
                return ch.get(timeout=max(step, 0.0))
            except queue.Empty:
                waited += step
                if waited >= self.timeout:
                    raise ExecutionError(
                        f"device {dst}: no message from device {src} within "
                        f"{self.timeout:g}s (peer dead or stuck)"
                    ) from None

    def total_bytes(self) -> int:
        """Bytes posted on every channel so far."""
        with self._lock:
            return sum(self.bytes_sent.values())

    def reset_counters(self) -> None:
        """Zero the byte counters."""
        with self._lock:
            self.bytes_sent.clear()
            self.messages = 0


_COMBINE = {ReduceOp.SUM: np.add, ReduceOp.MAX: np.maximum}
"""How the root combines addends, per reduce op."""


class LocalBackend(HostMemory):
    """One rank of the in-process reference backend.

    Args:
        device: the device this rank serves.
        fabric: the shared :class:`LocalFabric`.
        context: the communication channel (separate FIFOs per channel).
    """

    name = "local"
    capabilities = Capabilities(moves=None, sums=None, groups_need_world=False, device="cpu",
                                fuses_sums=True, all_reduces=True)
    world: tuple[int, ...] | None = None  # any device of the fabric

    def __init__(self, device: int, fabric: LocalFabric, context: str = "") -> None:
        self.device = device
        self.fabric = fabric
        self.context = context

    def channel(self, name: str) -> LocalBackend:
        """This rank on a separate communication channel."""
        return LocalBackend(self.device, self.fabric, f"{self.context}/{name}")

    def prepare(self, plan: object) -> None:
        """FIFOs are made on first use; nothing to prepare."""

    def send(self, buf: np.ndarray, peer: int, *, tag: int = 0) -> None:
        """Post a copy of ``buf`` to ``peer`` (``tag`` unused: FIFO order, see
        :meth:`group_start`)."""
        self.fabric.post(self.device, peer, buf, self.context)

    def recv(self, buf: np.ndarray, peer: int, *, tag: int = 0,
             landed: Landed | None = None) -> None:
        """Receive the next message from ``peer`` into ``buf`` (``tag`` unused; no
        ``landed``)."""
        refuse_unsupported("local", self.capabilities, landed=landed)
        msg = self.fabric.take(peer, self.device, self.context)
        if msg.size != buf.size:
            raise ExecutionError(
                f"device {self.device}: message from {peer} has {msg.size} elements, "
                f"expected {buf.size} (ranks disagree on the plan)"
            )
        buf[...] = msg.reshape(buf.shape)

    def broadcast(self, buf: np.ndarray, root: int, group: Devices, chain: Devices | None = None,
                  *, tag: int = 0, parents: Devices | None = None, addends: Devices = (),
                  addend_parents: Devices | None = None, landed: Landed | None = None) -> None:
        """Root posts to every member; members receive (the chain or tree is a
        performance hint; the result is the same). With ``addends``, the running sums
        go up their chain (or ``addend_parents``' tree) to the root first, each member
        adding what its children pass it to its ``buf`` in the children's order (no
        ``landed``)."""
        refuse_unsupported("local", self.capabilities, landed=landed)
        if addends:
            into = dict(zip(addends, sum_targets(root, addends, addend_parents)))
            if self.device in into or self.device == root:
                children = [a for a in addends if into[a] == self.device]
                if children:
                    tmp = np.empty_like(buf)
                    for child in children:
                        self.recv(tmp, child)
                        buf += tmp
                if self.device != root:
                    self.send(buf, into[self.device])
                    return
        if self.device == root:
            for d in group:
                if d != root and d not in addends:
                    self.send(buf, d)
        else:
            self.recv(buf, root)

    def all_gather(self, out: np.ndarray, inp: np.ndarray, group: Sequence[int]) -> None:
        """Every member posts its input to every other; rows in group order."""
        for d in group:
            if d != self.device:
                self.send(inp, d)
        for row, d in enumerate(group):
            if d == self.device:
                out[row] = inp
            else:
                self.recv(out[row], d)

    def reduce(self, buf: np.ndarray, root: int, group: Sequence[int], *,
               op: ReduceOp = ReduceOp.SUM) -> None:
        """Members post to the root, which combines in group order."""
        if self.device != root:
            self.send(buf, root)
            return
        combine = _COMBINE[op]
        tmp = np.empty_like(buf)
        for d in group:
            if d != root:
                self.recv(tmp, d)
                combine(buf, tmp, out=buf)

    def all_reduce(self, buf: np.ndarray, group: Sequence[int], *,
                   op: ReduceOp = ReduceOp.SUM) -> None:
        """Every member posts to every other and combines all in group order (so every
        member ends with the same bits)."""
        for d in group:
            if d != self.device:
                self.send(buf, d)
        combine = _COMBINE[op]
        parts = []
        for d in group:
            if d == self.device:
                parts.append(buf.copy())
            else:
                part = np.empty_like(buf)
                self.recv(part, d)
                parts.append(part)
        buf[...] = parts[0]
        for part in parts[1:]:
            combine(buf, part, out=buf)

    def group_start(self) -> None:
        """No batching: operations run at once, one after the other, even inside a
        group. That cannot deadlock: posts never block, and every rank runs its
        operations in the plan's one global order, so the sender of the earliest
        receive still waiting has nothing earlier left to wait for and posts. The
        messages between a pair are matched in that order (FIFO), so tags are not
        needed."""

    def group_end(self) -> None:
        """See :meth:`group_start`."""

    def close(self) -> None:
        """Nothing to release."""
