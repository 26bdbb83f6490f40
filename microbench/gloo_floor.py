"""The backend's own floor under run mode's rows: each row's plan replayed with bare
torch.distributed gloo operations, and over plain sockets, no reshard runtime in the way.

``reshard-bench --mode run --backend gloo --cluster local`` reports time / bound, the
bound of this machine's calibrated links. Where a row stays far above its bound, is it
reshard's runtime or the backend on this machine? Here every broadcast plan of the
chosen paper cases is planned on the same calibrated cluster, and its messages are
sent by plain ``torch.distributed`` gloo processes (one per device, under the
scheduling policy the launchers give gloo workers): per step, every edge of every task
one ``isend`` / ``irecv`` of the task's whole box, all of a step's edges at once (a
relay does not wait for what it forwards), steps back to back, rounds back to back as
nccl-tests times its operations; no packing, no commands, no replies. That is
optimistic for gloo: this plan runs no faster on it here. The same messages then go
over plain TCP loopback sockets (one connection per ordered pair, non-blocking, a
selector per process, the same processes' layout): what these cores do without gloo.
Printed per row: the bound, each floor and floor / bound. A row whose gloo floor alone
is over 3x its bound is out of the 3x goal's reach with the gloo backend::

    python -m reshard.microbench.gloo_floor [--cases 1,4,9] [-b 1M -e 8M] [-n 40]
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reshard.comm.bootstrap.sockets import listen_on, recv_exact
from reshard.comm.launchers.netns import NetnsHost
from reshard.comm.launchers.scheduling import apply
from reshard.microbench import calibrate, flags
from reshard.microbench.infra.procs import reap
from reshard.microbench.steal import cpu_times, stolen_note
from reshard.microbench.suites.paper import all_cases
from reshard.microbench.sweep import links_for
from reshard.planner.plan import plan_many
from reshard.planner.schedule.coalesce import followers, messages
from reshard.planner.schedule.staging import step_runs
from reshard.planner.values.tasks import Buffer, Task, TaskKind

Edge = tuple[int, int, int]
"""(sender, receiver, bytes): one message."""

SIZES = (1 << 20, 8 << 20)
"""Run mode's default sizes (``reshard-bench --mode run``)."""


@dataclass(frozen=True)
class Row:
    """One case at one size: its plan's messages by step, and its bound."""

    case: str
    nbytes: int
    devices: int
    steps: tuple[tuple[Edge, ...], ...]
    bound: float
    copies: tuple[tuple[tuple[int, int], ...], ...] = ()
    """Per step and edge (aligned with ``steps``; empty: none): the bytes its sender
    must copy in before sending and its receiver copy out after (see
    :func:`strided_copies`); only ``sockets+sg`` replays them."""

    @property
    def messages(self) -> int:
        return sum(len(s) for s in self.steps)


_COLLECTIVE = {TaskKind.ALLGATHER: "all-gather", TaskKind.ALLREDUCE: "all-reduce"}
"""Kinds that run as one collective call, which this replay has none of."""


def task_edges(task: Task) -> list[Edge]:
    """The messages a task's bytes take: every edge of its chain or tree (a fused
    sum's addend edges first), or a reduction's chain into its root."""
    if task.kind is TaskKind.COPY:
        return []
    if task.kind is TaskKind.REDUCE:
        chain = [*task.receivers, task.root]
        return [(a, b, task.nbytes) for a, b in itertools.pairwise(chain)]
    if task.kind in _COLLECTIVE:
        raise ValueError(f"an {_COLLECTIVE[task.kind]} task has no point-to-point replay "
                         f"here")
    return [(a, b, task.nbytes) for a, b in (*task.sum_edges(), *task.edges())]


def plan_steps(tasks: Sequence[Task]) -> tuple[tuple[Edge, ...], ...]:
    """A plan's messages grouped by step, steps in order."""
    by_step: dict[int, list[Edge]] = {}
    for t in tasks:
        by_step.setdefault(t.step, []).extend(task_edges(t))
    return tuple(tuple(by_step[s]) for s in sorted(by_step) if by_step[s])


def _grouped(tasks: Sequence[Task], tensors: Sequence[Any],
             coalesced: bool = True) -> tuple[dict[int, list[Task]], set[int]]:
    """The executor's coalesced messages (:mod:`reshard.planner.schedule.coalesce`): each
    message's tasks by the index of its first, and the indices of the others (which
    travel in it). ``coalesced=False``: none."""
    if not coalesced:
        return {}, set()
    members: dict[int, list[Task]] = {}
    for run in step_runs(tasks):
        for m in messages(run, lambda r: r[1], lambda t: tensors[t.tensor]):
            members[m[0][0]] = [t for _, t in m]
    return members, followers(tasks, tensors)


def coalesced_steps(tasks: Sequence[Task],
                    tensors: Sequence[Any]) -> tuple[tuple[Edge, ...], ...]:
    """:func:`plan_steps` as the executor coalesces them: each coalesced message once,
    along its first task's edges, carrying its tasks' bytes."""
    members, skip = _grouped(tasks, tensors)
    by_step: dict[int, list[Edge]] = {}
    for i, t in enumerate(tasks):
        if i in skip:
            continue
        n = sum(u.nbytes for u in members.get(i, [t]))
        by_step.setdefault(t.step, []).extend((a, b, n) for a, b, _ in task_edges(t))
    return tuple(tuple(by_step[s]) for s in sorted(by_step) if by_step[s])


def contiguous(box: Sequence[tuple[int, int]], shard: Sequence[tuple[int, int]]) -> bool:
    """Whether global ``box`` is one C-contiguous run of a shard holding ``shard``: every
    dimension after some one spans the shard, every dimension before it is one wide."""
    extents = [hi - lo for lo, hi in box]
    full = [hi - lo for lo, hi in shard]
    if 0 in extents:
        return True
    j = len(extents) - 1
    while j >= 0 and extents[j] == full[j]:
        j -= 1
    return all(e == 1 for e in extents[:max(j, 0)])


def strided_copies(tasks: Sequence[Task], tensors: Sequence[Any], coalesced: bool = True,
                   ) -> tuple[tuple[tuple[int, int], ...], ...]:
    """For each edge of :func:`coalesced_steps` (``coalesced=False``: of
    :func:`plan_steps`), the copies a data plane with scatter / gather I/O could not
    avoid: (bytes of the message's boxes strided in the sender's source shard, which
    its root packs; bytes of them strided in the receiver's destination shard, which a
    receiver that keeps the box unpacks). A relay forwards what it received as it is."""
    known: dict[tuple[int, str], dict[int, Any]] = {}

    def boxes(i: int, which: str) -> dict[int, Any]:
        got = known.get((i, which))
        if got is None:
            spec = tensors[i]
            got = known[(i, which)] = getattr(spec, which).boxes(spec.shape)
        return got

    members, skip = _grouped(tasks, tensors, coalesced)
    by_step: dict[int, list[tuple[int, int]]] = {}
    for i, t in enumerate(tasks):
        if i in skip:
            continue
        group = members.get(i, [t])
        for a, b, _ in task_edges(t):
            pack = unpack = 0
            for u in group:
                src = boxes(u.tensor, "src" if u.source is Buffer.SRC else "dst")
                dst = boxes(u.tensor, "dst")
                if a == u.root and not contiguous(u.box, src[a]):
                    pack += u.nbytes
                if b not in u.through and b in dst and not contiguous(u.box, dst[b]):
                    unpack += u.nbytes
            by_step.setdefault(t.step, []).append((pack, unpack))
    return tuple(tuple(by_step[s]) for s in sorted(by_step) if by_step[s])


def rows(case_names: Sequence[str] | None, sizes: Sequence[int]) -> list[Row]:
    """Run mode's paper cases (those named, else all: the nine and the 1-to-m) at
    ``sizes``, planned (broadcast) on this machine's links, measured first
    (:mod:`reshard.microbench.calibrate`)."""
    cases = [c for c in all_cases() if case_names is None or c.name in case_names]
    if not cases:
        raise ValueError(f"no paper case named {', '.join(case_names or ())}")
    counts = sorted({c.devices_needed for c in cases})
    measured = calibrate.measure_many((max(1, n // 2) for n in counts), backend="gloo")
    links = [(n, measured[max(1, n // 2)]) for n in counts]
    out = []
    for case in cases:
        for size in sizes:
            c = case.with_bytes(size)
            probe = c.cluster()
            over = links_for(links, c.devices_needed).overrides(len(probe.hosts[0]))
            requests, cluster = c.build_many(**over)
            plan = plan_many(requests, cluster, "broadcast")
            out.append(Row(c.name, c.nbytes, len(cluster.devices), plan_steps(plan.tasks),
                           plan.lower_bound()))
    return out


class _Gloo:
    """Bare torch.distributed gloo: one ``isend`` / ``irecv`` per edge."""

    def __init__(self, rank: int, world: int, tmp: str, rows: Sequence[Row],
                 address: str) -> None:
        import torch
        import torch.distributed as dist

        self.rank, self.dist, self.torch = rank, dist, torch
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}",
                                rank=rank, world_size=world)

    def buffer(self, n: int) -> Any:
        return self.torch.empty(n, dtype=self.torch.uint8)

    def round(self, steps: Sequence[Sequence[tuple[Any, ...]]]) -> None:
        """Every step: its messages posted at once, then waited for."""
        dist, rank = self.dist, self.rank
        for step in steps:
            works = [dist.isend(buf, b) if a == rank else dist.irecv(buf, a)
                     for a, b, buf, *_ in step]
            for w in works:
                w.wait()

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        self.dist.destroy_process_group()


class _Sockets:
    """The same messages over plain TCP sockets (loopback, or the testbed's
    namespaces), one connection per ordered pair, non-blocking, driven by a selector:
    what the machine does without gloo."""

    def __init__(self, rank: int, world: int, tmp: str, rows: Sequence[Row],
                 address: str) -> None:
        import selectors
        import socket
        import struct

        self.rank, self.world = rank, world
        self.selector = selectors.DefaultSelector()
        listener = listen_on(address, backlog=4 * world)
        _publish(os.path.join(tmp, f"port.{rank}"), f"{address}:{listener.getsockname()[1]}")
        ports = [_lookup(os.path.join(tmp, f"port.{r}")) for r in range(world)]
        senders = {a for row in rows for step in row.steps for a, b, _ in step if b == rank}
        receivers = sorted({b for row in rows for step in row.steps for a, b, _ in step
                            if a == rank})
        hello = struct.Struct("<ci")
        self.out = {}
        for b in receivers:
            self.out[b] = socket.create_connection(ports[b])
            self.out[b].sendall(hello.pack(b"d", rank))
        self.control = [] if rank == 0 else [socket.create_connection(ports[0])]
        for c in self.control:
            c.sendall(hello.pack(b"c", rank))
        self.into: dict[int, Any] = {}
        controls = world - 1 if rank == 0 else 0
        while len(self.into) < len(senders) or len(self.control) < controls:
            conn, _ = listener.accept()
            kind, peer = hello.unpack(recv_exact(conn, hello.size, "a peer's connection"))
            if kind == b"d":
                self.into[peer] = conn
            else:
                self.control.append(conn)
        listener.close()
        for conn in (*self.out.values(), *self.into.values()):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setblocking(False)

    def buffer(self, n: int) -> Any:
        import numpy as np

        return memoryview(bytearray(np.ones(n, np.uint8).tobytes()))

    def round(self, steps: Sequence[Sequence[tuple[Any, ...]]]) -> None:
        """Every step: each connection's messages in the step's order, all
        connections at once."""
        import selectors

        sel = self.selector
        conn: Any
        for step in steps:
            work: dict[Any, list[Any]] = {}
            for a, b, buf, *copies in step:
                if not len(buf):  # an empty message moves nothing (and reads as a close)
                    continue
                if a == self.rank:
                    self.packed(buf, copies)
                    conn, events = self.out[b], selectors.EVENT_WRITE
                else:
                    conn, events = self.into[a], selectors.EVENT_READ
                if conn not in work:
                    work[conn] = []
                    sel.register(conn, events)
                work[conn].append([buf, buf, copies])
            while work:
                for key, _ in sel.select():
                    conn = key.fileobj
                    items = work[conn]
                    left = items[0][1]
                    reading = not key.events & selectors.EVENT_WRITE
                    try:
                        n = conn.recv_into(left) if reading else conn.send(left)
                    except BlockingIOError:
                        continue
                    if n == 0 and reading:
                        raise ConnectionError("a peer closed its connection")
                    items[0][1] = left[n:]
                    if not len(items[0][1]):
                        whole, _, copies = items.pop(0)
                        if reading:
                            self.landed(whole, copies)
                    if not items:
                        del work[conn]
                        sel.unregister(conn)

    def packed(self, buf: Any, copies: Sequence[int]) -> None:
        """Before a message goes (plain sockets: nothing to do)."""

    def landed(self, buf: Any, copies: Sequence[int]) -> None:
        """Once a message arrived (plain sockets: nothing to do)."""

    def barrier(self) -> None:
        """Every rank tells rank 0 it is here; rank 0 answers all once all are."""
        if self.rank:
            self.control[0].sendall(b"b")
            recv_exact(self.control[0], 1, "rank 0's connection")
            return
        for c in self.control:
            recv_exact(c, 1, "a peer's connection")
        for c in self.control:
            c.sendall(b"g")

    def close(self) -> None:
        for conn in (*self.out.values(), *self.into.values(), *self.control):
            conn.close()


def _publish(path: str, where: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(where)
    os.replace(path + ".tmp", path)


def _lookup(path: str, timeout: float = 60.0) -> tuple[str, int]:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no address in {path} after {timeout:.0f} s")
        time.sleep(0.01)
    with open(path) as f:
        host, _, port = f.read().rpartition(":")
    return host, int(port)


class _GlooCopies(_Gloo):
    """Bare gloo plus what a staged message costs a runtime: each send's bytes copied
    into its buffer just before the send (a root's pack), each receive's copied out
    just after it completes (a receiver's unpack), contiguous copies of the whole
    message, overlapped with nothing but the other operations in flight."""

    def buffer(self, n: int) -> Any:
        t = self.torch.empty(n, dtype=self.torch.uint8)
        t.staged = self.torch.ones(n, dtype=self.torch.uint8)  # the shard's side
        return t

    def round(self, steps: Sequence[Sequence[tuple[Any, ...]]]) -> None:
        dist, rank = self.dist, self.rank
        for step in steps:
            works = []
            for a, b, buf, *_ in step:
                if a == rank:
                    buf.copy_(buf.staged)
                    works.append((None, dist.isend(buf, b)))
                else:
                    works.append((buf, dist.irecv(buf, a)))
            for buf, w in works:
                w.wait()
                if buf is not None:
                    buf.staged.copy_(buf)


class _SocketsGather(_Sockets):
    """Plain sockets plus the copies a data plane with scatter / gather I/O could not
    avoid (:attr:`Row.copies`): a root's boxes strided in its source shard packed just
    before the message goes, a receiver's strided in its destination unpacked as soon
    as the message arrived; contiguous boxes would go from and land in the shards' own
    memory."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.staged: Any = None

    def _staged(self, n: int) -> Any:
        import numpy as np

        if self.staged is None or len(self.staged) < n:
            self.staged = np.ones(max(n, 1 << 20), np.uint8)
        return self.staged

    def packed(self, buf: Any, copies: Sequence[int]) -> None:
        import numpy as np

        n = copies[0] if copies else 0
        if n:
            np.frombuffer(buf, np.uint8)[:n] = self._staged(n)[:n]

    def landed(self, buf: Any, copies: Sequence[int]) -> None:
        import numpy as np

        n = copies[1] if copies else 0
        if n:
            self._staged(n)[:n] = np.frombuffer(buf, np.uint8)[:n]


TRANSPORTS: dict[str, type[_Gloo | _Sockets]] = {
    "gloo": _Gloo, "sockets": _Sockets, "gloo+copies": _GlooCopies,
    "sockets+sg": _SocketsGather}
"""How the replay moves a plan's messages."""


def _replay(rank: int, world: int, tmp: str, transport: str, rows: Sequence[Row],
            rounds: int, repeats: int, policy: str, results: mp.SimpleQueue,
            place: NetnsHost | None) -> None:
    """One device's process (in its testbed host's namespace with ``place``): every
    row's messages ``repeats`` times ``rounds`` rounds; puts (rank, the best seconds per
    round of each row), or (rank, what failed) and exits at once (its peers may be
    stuck waiting on it: closing would hang)."""
    try:
        address = "127.0.0.1"
        if place is not None:
            from reshard.comm.launchers.netns import enter_netns

            enter_netns(place.netns)  # before any thread: all of them live there
            address = place.address
            os.environ["GLOO_SOCKET_IFNAME"] = place.ifname
        apply(policy)
        link: _Gloo | _Sockets = TRANSPORTS[transport](rank, world, tmp, rows, address)
        best: list[float] = []
        for row in rows:
            copies = row.copies or tuple(((0, 0),) * len(step) for step in row.steps)
            steps = [[(a, b, link.buffer(n), *c) for (a, b, n), c in zip(step, cs)
                      if rank in (a, b)] for step, cs in zip(row.steps, copies)]
            link.round(steps)  # warm-up: connections made, buffers touched
            times = []
            for _ in range(repeats):
                link.barrier()
                t0 = time.perf_counter()
                for _ in range(rounds):
                    link.round(steps)
                link.barrier()
                times.append((time.perf_counter() - t0) / rounds)
            best.append(min(times))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        results.put((rank, f"rank {rank}: {type(e).__name__}: {e}"))
        os._exit(1)
    link.close()
    results.put((rank, best))


def floors(rows: Sequence[Row], rounds: int, repeats: int = 3, policy: str = "batch",
           transport: str = "gloo", timeout: float = 600.0,
           places: Sequence[NetnsHost] | None = None) -> list[float]:
    """Seconds per round of each row over ``transport`` (the slowest rank's best
    repeat), one process per device, started once for every row; ``places``: each
    rank's testbed host (else loopback). A process that fails, or all of them past
    ``timeout`` seconds (gloo waits for ever on a message to a rank that never takes
    it), fail the call."""
    world = max(r.devices for r in rows)
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="reshard-floor-") as tmp:
        procs = [ctx.Process(target=_replay, args=(
            r, world, tmp, transport, rows, rounds, repeats, policy, results,
            None if places is None else places[r]), daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        got: list[list[float]] = []
        failed: list[str] = []
        try:
            # one failure is enough: its peers may wait on it for ever
            while len(got) < world and not failed:
                # who is dead is looked at before the queue: a failing process puts its
                # error, then exits, and may do both between this loop's two looks
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if not results.empty():
                    _, best = results.get()
                    (failed.append if isinstance(best, str) else got.append)(best)
                elif dead:
                    failed.append(f"rank {dead[0]} died without a word "
                                  f"(exit code {procs[dead[0]].exitcode})")
                elif time.monotonic() > deadline:
                    failed.append(f"{world - len(got)} not done after {timeout:g} s")
                else:
                    time.sleep(0.05)
        finally:
            reap(procs, 5 if not failed else 0)
    if failed:
        raise RuntimeError(f"{transport} processes failed: {failed[0]}")
    return [max(best[i] for best in got) for i in range(len(rows))]


def _sizes(text: str) -> list[int]:
    """``-b``: comma-separated sizes (:func:`reshard.microbench.flags.parse_size` each)."""
    return [flags.parse_size(s) for s in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    """Plan, replay over bare gloo and plain sockets, print one line per row."""
    ap = flags.parser("python -m reshard.microbench.gloo_floor", __doc__ or "")
    ap.add_argument("--cases", default=None, help="paper cases, comma-separated (default: all)")
    ap.add_argument("-b", "--sizes", type=_sizes, default=list(SIZES),
                    help="tensor sizes, comma-separated (e.g. 1M,8M; default: run mode's)")
    ap.add_argument("-n", "--rounds", type=flags.positive_int, default=40,
                    help="rounds per timing")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.cases.split(",")] if args.cases else None
    try:
        todo = rows(names, args.sizes)
    except ValueError as e:
        ap.error(str(e))
    before = cpu_times()
    got = {t: floors(todo, args.rounds, transport=t) for t in ("gloo", "sockets")}
    print(f"{'case':11s} {'size':>5s} {'msgs':>5s} {'bound ms':>9s} {'gloo ms':>8s} "
          f"{'/bound':>7s} {'sockets ms':>10s} {'/bound':>7s}")
    for i, row in enumerate(todo):
        g, k = got["gloo"][i], got["sockets"][i]
        print(f"{row.case:11s} {row.nbytes / (1 << 20):4.0f}M {row.messages:5d} "
              f"{row.bound * 1e3:9.3f} {g * 1e3:8.3f} {g / row.bound:7.2f} {k * 1e3:10.3f} "
              f"{k / row.bound:7.2f}{'  (gloo alone over 3x)' if g > 3 * row.bound else ''}",
              flush=True)
    print("# one process per device, best of 3 timings of "
          f"{args.rounds} back-to-back rounds; gloo: bare torch.distributed, sockets: plain "
          "TCP loopback" + stolen_note(before, cpu_times()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
