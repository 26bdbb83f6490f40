"""This machine's links, measured: the cluster ``reshard-bench --cluster local`` models.

Run mode times worker processes on one machine, which talk over loopback TCP (gloo) and
share its cores; the presets' figures (NICs of 10-400 Gbit/s) say nothing about that,
so against a preset ``time/bound`` is 10-70 here. :func:`measure` streams ``nbytes``
over loopback TCP with one sender / receiver process pair alone (what one device's link
gives), then with ``pairs`` pairs at once (their sum: what the machine's cores move in
all, every link together), and takes the one-way latency of a small message (half a
ping-pong's round trip, with ``pairs`` pairs ping-ponging at once: on shared cores a
message waits for its process to be scheduled, and a row of 16 processes on 2 cores
paid 55-150 us one way where one pair alone paid 16) and one process's memory-copy
bandwidth. With a backend named, :func:`measure_many` also times that backend's own
messages (:func:`message_cost`): the CPU each end of a small message takes in the
backend's worker code, which a row of many small pieces or an all-gather among 4-8
workers pays many times over on shared cores.
:meth:`Links.overrides` turns them into cluster figures: every device its own link of
the one-pair bandwidth, within a host and between hosts (loopback is both here), and
the sum as the bandwidth every transfer shares (``Cluster.shared_bandwidth``): on 2
cores, 8 pairs streaming at once get a quarter of one pair alone each, the same bytes
per second in all.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from reshard.microbench.infra.procs import reap

CHUNK = 1 << 20
"""Bytes per ``sendall`` / ``recv_into``."""

LOCAL_PIECE = 1 << 20
"""Bytes a relay passes on at a time on this machine's loopback links (the cluster's
``relay_piece``, which the model charges each relay for and the gloo backend follows).
gloo's own 256 KiB suits a slow network, where a relay's fill costs most; here each
piece costs a worker's Python a forward of tens of microseconds on shared cores, and
at 8 MiB (``reshard-bench --mode run --backend gloo --cluster local``, two alternated
rounds) 1 MiB pieces ran a 1 -> 8 chain in 28.0 / 23.3 ms against 37.9 / 32.5 with
256 KiB, paper cases 3 and 9 10-25% faster, 2 MiB no better than 1 MiB. A box under
4 MiB is cut into quarters instead (at least 256 KiB: :func:`reshard.cluster.
pipeline_piece`), so it still pipelines through its relays."""


@dataclass(frozen=True)
class Links:
    """Measured figures of this machine.

    Attributes:
        bandwidth: bytes/s one pair streams alone.
        latency: seconds, one way, of a 1-byte message while ``pairs`` pairs exchange
            them at once (the slowest pair's, in the best round).
        alone_latency: the same of one pair alone.
        copy_bandwidth: bytes/s of one process's memory copy.
        pairs: how many pairs streamed at once for :attr:`shared`.
        shared: bytes/s of all ``pairs`` pairs together, streaming at once.
        message_cost: seconds of the whole machine (CPU seconds over its cores) one end
            of one message takes in the run's backend (:func:`message_cost`; 0: not
            measured).
    """

    bandwidth: float
    latency: float
    copy_bandwidth: float
    pairs: int
    shared: float
    alone_latency: float = 0.0
    message_cost: float = 0.0

    def overrides(self, devices_per_host: int) -> dict[str, Any]:
        """Cluster figures (``Cluster.regular(..., **overrides)``): each device its own
        link of :attr:`bandwidth`, inside a host and to other hosts alike, all of them
        sharing :attr:`shared`; relays pass on :data:`LOCAL_PIECE` bytes at a time."""
        return {"intra_bandwidth": self.bandwidth, "shared_bandwidth": self.shared,
                "nic_bandwidth": self.bandwidth * devices_per_host,
                "nics_per_host": devices_per_host, "latency": self.latency,
                "intra_latency": self.latency, "copy_bandwidth": self.copy_bandwidth,
                "name": "local", "relay_piece": LOCAL_PIECE, "message_cost": self.message_cost}

    def describe(self) -> str:
        """One line for a report's header."""
        return (f"local (measured here: {self.bandwidth / 1e9:.2f} GB/s per link, "
                f"{self.shared / 1e9:.2f} GB/s shared by all ({self.pairs} pairs streaming "
                f"at once), {self.latency * 1e6:.0f} us latency with as many exchanging "
                f"({self.alone_latency * 1e6:.0f} alone), "
                f"copies {self.copy_bandwidth / 1e9:.1f} GB/s"
                + (f", {self.message_cost * 1e6:.1f} us of the machine per message end"
                   if self.message_cost else "") + ")")


def _receiver(port_out: Connection, nbytes: int, ping: bool, rounds: int) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port_out.send(server.getsockname()[1])
        conn, _ = server.accept()
        with conn:
            if ping:
                one = bytearray(1)
                for _ in range(nbytes * rounds):
                    conn.recv_into(one)
                    conn.sendall(one)
                return
            buf = bytearray(CHUNK)
            for _ in range(rounds):
                got = 0
                while got < nbytes:
                    n = conn.recv_into(buf, min(CHUNK, nbytes - got))
                    if not n:
                        return
                    got += n
                conn.sendall(b"k")


def _sender(port: int, go: Connection, nbytes: int, ping: bool, out: Connection,
            rounds: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        chunk = bytes(CHUNK)
        one = bytearray(1)
        for _ in range(rounds):
            go.recv()
            t0 = time.perf_counter()
            if ping:
                for _ in range(nbytes):
                    conn.sendall(b"p")
                    conn.recv_into(one)
            else:
                left = nbytes
                while left > 0:
                    conn.sendall(chunk[:min(left, CHUNK)])
                    left -= CHUNK
                conn.recv(1)
            out.send(time.perf_counter() - t0)


def _streams(pairs: int, nbytes: int, ping: bool, rounds: int = 1) -> list[list[float]]:
    """Per round, the seconds each of ``pairs`` concurrent pairs took (ping: ``nbytes``
    round trips); the pairs start each round together, in the same processes."""
    ctx = mp.get_context("forkserver")  # not fork: the caller may hold threads (JAX)
    procs = []
    gos = []
    outs = []
    try:
        for _ in range(pairs):
            port_r, port_w = ctx.Pipe(duplex=False)
            go_r, go_w = ctx.Pipe(duplex=False)
            out_r, out_w = ctx.Pipe(duplex=False)
            recv = ctx.Process(target=_receiver, args=(port_w, nbytes, ping, rounds),
                               daemon=True)
            recv.start()
            port = port_r.recv()
            send = ctx.Process(target=_sender, args=(port, go_r, nbytes, ping, out_w, rounds),
                               daemon=True)
            send.start()
            procs += [recv, send]
            gos.append(go_w)
            outs.append(out_r)
        times = []
        for _ in range(rounds):
            for g in gos:
                g.send(True)
            times.append([o.recv() for o in outs])
        return times
    finally:
        reap(procs)


def _copy_bandwidth(nbytes: int = 64 << 20) -> float:
    a = np.ones(nbytes, np.uint8)
    b = np.empty_like(a)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t0)
    return nbytes / min(times)


def _message_end(device: int, backend: str, address: Any, count: int, rounds: int,
                 out: Connection, env: dict[str, str] | None = None) -> None:
    """One of two ranks of ``backend``: ``rounds`` times, ``count`` small messages to
    (device 0) or from (device 1) the other in one group, as a plan's step issues them;
    sends the least CPU seconds (every thread of the process) a round took. ``env``: set
    before the rank is made (a transport's choice, e.g. UCX's)."""
    from reshard.comm.backend import builtin_backends

    os.environ.update(env or {})
    rank = builtin_backends().create(backend, device, (0, 1), address.connect(60.0), 60.0)
    try:
        bufs = [np.zeros(64, np.uint8) for _ in range(count)]
        best = float("inf")
        for r in range(rounds + 1):  # the first round warms up
            c0 = time.process_time()
            rank.group_start()
            for tag, buf in enumerate(bufs):
                if device == 0:
                    rank.send(buf, 1, tag=tag)
                else:
                    rank.recv(buf, 0, tag=tag)
            rank.group_end()
            if r:
                best = min(best, time.process_time() - c0)
        out.send(best)
    finally:
        rank.close()


def _two_ends(backend: str, count: int, rounds: int,
              env: dict[str, str] | None) -> list[float]:
    """:func:`_message_end` on two ranks of ``backend`` in processes of their own: each
    end's least CPU seconds."""
    from reshard.comm.bootstrap.rendezvous import TcpRendezvousServer

    ctx = mp.get_context("forkserver")
    server = TcpRendezvousServer()
    procs, outs = [], []
    try:
        for device in (0, 1):
            out_r, out_w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_message_end, daemon=True,
                            args=(device, backend, server.address, count, rounds, out_w,
                                  env))
            p.start()
            procs.append(p)
            outs.append(out_r)
        ends = []
        for o in outs:
            if not o.poll(120):
                raise TimeoutError(f"measuring {backend}'s messages took over 120 s")
            ends.append(o.recv())
        return ends
    finally:
        reap(procs)
        server.close()


def measurable(backend: str) -> bool:
    """Whether :func:`message_cost` can time ``backend`` here: a built-in backend on
    host memory whose ranks run in processes of their own (a thread launcher's ranks
    share one process, a GPU backend needs a GPU per rank)."""
    from reshard.comm.backend import builtin_backends

    entry = builtin_backends().entry(backend)
    return entry.capabilities.device == "cpu" and "process" in entry.launchers


def busy_seconds() -> float:
    """CPU seconds this machine's cores have been busy since boot (user, nice, system,
    interrupts; not idle, I/O wait or time stolen by the hypervisor): every process's
    and the kernel's, the network stack's work for the testbed's links included."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _pair_layouts(src: Sequence[int], dst: Sequence[int]) -> tuple[Any, Any]:
    """Layouts that send a row from each device of ``src`` to the device of ``dst`` at
    the same place (``S0R`` on a 1-d mesh each)."""
    from reshard import DeviceMesh, Layout

    k = len(src)
    if k != len(dst) or not k:
        raise ValueError(f"src and dst must pair devices one to one, got {src} and {dst}")
    return (Layout(DeviceMesh((k,), devices=list(src)), "S0R"),
            Layout(DeviceMesh((k,), devices=list(dst)), "S0R"))


def _least_busy(rt: Any, plan: Any, xs: list[Any], rounds: int,
                clock: Callable[[], float] = busy_seconds) -> float:
    """The fewest busy CPU seconds of the machine (:func:`busy_seconds`; or another
    ``clock``'s seconds) that one run of ``plan`` on ``rt`` took, over ``rounds`` runs
    after one that warms up; the inputs ``xs`` are freed after."""
    best = float("inf")
    try:
        for r in range(rounds + 1):
            before = clock()
            ys = rt.execute(plan, xs)
            took = clock() - before
            rt.free(*ys)
            if r:
                best = min(best, took)
    finally:
        rt.free(*xs)
    return best


def runtime_shared(rt: Any, src: Sequence[int], dst: Sequence[int], nbytes: int = 64 << 20,
                   rounds: int = 3) -> float:
    """Bytes/s the machine's cores move through ``rt``'s backend and links, as
    ``Cluster.shared_bandwidth`` charges them: ``nbytes`` from each device of ``src`` to
    the device of ``dst`` at the same place, at once, in one plan on ``rt`` (its
    workers, its launcher: on the testbed, across the emulated hosts, through veth and
    the shaped queues), the bytes over the busy CPU seconds of the whole machine (over
    its cores) in the round that took the fewest (the first warms up). The machine's
    rate whether or not its cores limit the round; what loopback streaming
    (:func:`measure`) leaves out: the kernel's per-packet work on 1,500-byte links and
    the backend's own work per byte. A round faster than the busy clock's tick (1 /
    ``SC_CLK_TCK`` s; a fast machine moving a small ``nbytes``) counts as one tick: the
    rate it reads is then a floor, not a division by nothing."""
    import reshard

    here, there = _pair_layouts(src, dst)
    shape = (len(src), nbytes)
    plan = reshard.plan(shape, "uint8", here, there, cluster=rt.cluster)
    best = _least_busy(rt, plan, [rt.put(np.ones(shape, np.uint8), here)], rounds)
    cores = len(os.sched_getaffinity(0))
    tick = 1.0 / os.sysconf("SC_CLK_TCK")  # the busy clock's resolution: a round read
    return len(src) * nbytes / (max(best, tick) / cores)  # as 0 took up to a tick


def runtime_part_cost(rt: Any, src: Sequence[int], dst: Sequence[int], count: int = 1024,
                      nbytes: int = 256, rounds: int = 3) -> float:
    """Seconds of the whole machine (busy CPU seconds over its cores, the kernel's
    included) each end of a coalesced message spends on each task riding in it, through
    ``rt`` (its workers, backend and links): ``count`` tensors of ``nbytes`` from each
    device of ``src`` to the device of ``dst`` at the same place, planned together
    (their tasks coalesced into a message per pair), against one such tensor, in the
    rounds that took the fewest (the first warms up). The worker's work per box
    (laying it out, moving it, checking it in) and the backend's (a descriptor, an
    iovec), which is what a plan of many small tensors pays."""
    import reshard
    from reshard.planner.schedule.coalesce import followers

    here, there = _pair_layouts(src, dst)
    shape = (len(src), nbytes)
    busy, riders = [], []
    for n in (1, count):
        plan = reshard.plan_many([(shape, "uint8", here, there)] * n, cluster=rt.cluster)
        xs = [rt.put(np.ones(shape, np.uint8), here) for _ in range(n)]
        busy.append(_least_busy(rt, plan, xs, rounds))
        riders.append(len(followers(plan.tasks, plan.tensors)))
    if riders[1] <= riders[0]:
        raise ValueError(f"{count} tensors of {nbytes} B were not coalesced here")
    cores = len(os.sched_getaffinity(0))
    return max(0.0, (busy[1] - busy[0]) / cores / (2 * (riders[1] - riders[0])))


def runtime_cast_bandwidth(rt: Any, devices: Sequence[int], cast: Any,
                           dtype: str = "bfloat16", nbytes: int = 8 << 20,
                           rounds: int = 3) -> float:
    """Bytes/s of ``dtype`` source data each of ``devices`` converts as ``cast`` says
    (a :class:`~reshard.dtypes.Cast` or a dtype name) while all of them convert at once,
    through ``rt`` (its workers): a plan that casts a tensor in place on a 1-d mesh of
    ``devices`` (``S0R`` both sides: each device converts its ``nbytes`` of rows, block
    scales derived where the cast has them, in a local copy; no byte crosses a link),
    the bytes per device over the wall seconds of the fastest of ``rounds`` runs (the
    first warms up). What ``Cluster.cast_bandwidth`` charges. On the testbed the
    devices share the machine's cores, so the figure holds for that many devices
    converting at once: give the devices that convert in the plan it prices (a
    broadcast's roots, a source mesh)."""
    import reshard
    from reshard.dtypes import itemsize, parse_dtype
    from reshard.planner.costing.casts import converts

    if not devices:
        raise ValueError("devices must name at least one device")
    cols = 4096
    rows = max(128, nbytes // (cols * itemsize(dtype)) // 128 * 128)
    here, _ = _pair_layouts(devices, devices)  # the same rows on both sides
    shape = (len(devices) * rows, cols)
    plan = reshard.plan(shape, dtype, here, here, cluster=rt.cluster, cast=cast)
    if not any(map(converts, plan.tensors)):
        raise ValueError(f"a cast to {cast!r} converts nothing from {dtype}")
    x = rt.put(np.ones(shape, dtype=parse_dtype(dtype)), here)
    best = _least_busy(rt, plan, [x], rounds, clock=time.perf_counter)
    return rows * cols * itemsize(dtype) / max(best, 1e-9)


def with_cast_rate(rt: Any, cluster: Any, requests: Sequence[tuple],
                   cast: Any = None) -> Any:
    """``cluster`` with the rate the converting devices of ``requests`` cast at
    (``Cluster.cast_bandwidth``, :func:`runtime_cast_bandwidth` on ``rt``, those
    devices converting at once); ``cluster`` itself where nothing casts. A request's
    fifth item is its cast, else ``cast``."""
    casting = [(r[1], r[2], r[4] if len(r) > 4 else cast) for r in requests]
    casting = [(dtype, src, how) for dtype, src, how in casting if how is not None]
    if not casting:
        return cluster
    devices = sorted({d for _, src, _ in casting for d in src.mesh.devices})
    dtype, _, how = casting[0]
    return dataclasses.replace(
        cluster, cast_bandwidth=runtime_cast_bandwidth(rt, devices, how, dtype))


def gpu_cast_bandwidth(cast: Any = None, dtype: str = "bfloat16",
                       shape: Sequence[int] = (7168, 18432), runs: int = 10,
                       warmup: int = 2) -> float:
    """Bytes/s of ``dtype`` source data the current GPU converts as ``cast`` says (default:
    fp8 e4m3 with 128 x 128 block scales, the RL weight sync's) on the kernels the nccl
    backend's casts run (:func:`reshard.microbench.gpu_cast.run_cast`: amax, scales,
    quantize of a ``shape`` tensor, issued from Python back to back as a step issues
    them; median of ``runs`` after ``warmup``, CUDA events). What
    ``Cluster.cast_bandwidth`` charges a GPU cluster (the presets' ``cast_bandwidth``).
    Needs cupy and a GPU."""
    import cupy

    from reshard.dtypes import Cast, ScaleMode, itemsize
    from reshard.microbench.gpu_cast import run_cast, sample
    from reshard.microbench.gpu_pack import GpuTimer

    how = cast if cast is not None else Cast("float8_e4m3fn", ScaleMode.BLOCK128)
    x = sample(cupy, tuple(shape), dtype)

    def go() -> None:
        run_cast(x, dtype, how)

    ms = GpuTimer(cupy, runs, warmup).ms(go)
    return float(np.prod(shape)) * itemsize(dtype) / (ms * 1e-3)


def message_cost(backend: str, count: int = 256, rounds: int = 5,
                 env: dict[str, str] | None = None) -> float:
    """Seconds of the whole machine one end of one small message takes in ``backend``
    (two of its ranks in processes of their own: the least CPU seconds a round of
    ``count`` messages took, each end's, averaged over the two ends, per message, over
    this machine's cores). It is what the cluster's ``message_cost`` charges: the
    worker's and the backend's work per message, posting, matching and completing it,
    that the streaming figures (one large message per pair) leave out; gloo measured
    about 30 us of CPU per end here, reshard's issue path included more. ``env``: the
    ranks' environment beyond this process's (the testbed's transports:
    :data:`reshard.comm.launchers.netns.WIRE_ENV`)."""
    ends = _two_ends(backend, count, rounds, env)
    cores = len(os.sched_getaffinity(0))
    return sum(ends) / len(ends) / count / cores


def measure_many(pair_counts: Iterable[int], nbytes: int = 64 << 20, round_trips: int = 200,
                 repeats: int = 5, backend: str | None = None) -> dict[int, Links]:
    """This machine's :class:`Links` for each count of pairs streaming at once: one pair
    alone, the latency, the copy, each count's pairs together (the best of ``repeats``
    rounds each, in the same processes), and with ``backend`` its
    :func:`message_cost`.

    The best round, not a typical one: these figures make a lower bound, which must not
    exceed what the machine can do, and on a shared machine a round is only ever slowed
    (one pair alone measured 2.1-4.8 GB/s between runs with medians of three: a slow
    calibration put measured times under their bound)."""
    alone = min(r[0] for r in _streams(1, nbytes, ping=False, rounds=repeats))
    rtt = min(r[0] for r in _streams(1, round_trips, ping=True, rounds=3)) / round_trips
    copy = _copy_bandwidth()
    per_message = message_cost(backend) if backend and measurable(backend) else 0.0
    out = {}
    for pairs in sorted({max(1, p) for p in pair_counts}):
        # every pair's bytes over the time of the slowest (the pairs start together)
        together = min(
            max(r) for r in _streams(pairs, nbytes, ping=False, rounds=repeats)
        ) if pairs > 1 else alone
        busy_rtt = min(max(r) for r in _streams(pairs, round_trips, ping=True, rounds=3)
                       ) / round_trips if pairs > 1 else rtt
        out[pairs] = Links(nbytes / alone, max(rtt, busy_rtt) / 2, copy, pairs,
                           max(nbytes / alone, pairs * nbytes / together), rtt / 2,
                           per_message)
    return out


def measure(pairs: int, nbytes: int = 64 << 20, round_trips: int = 200,
            repeats: int = 5, backend: str | None = None) -> Links:
    """Measure this machine's :class:`Links` with ``pairs`` pairs (see
    :func:`measure_many`)."""
    return measure_many([pairs], nbytes, round_trips, repeats, backend)[max(1, pairs)]


__all__ = ["LOCAL_PIECE", "Links", "busy_seconds", "gpu_cast_bandwidth", "measurable", "measure",
           "measure_many", "message_cost", "runtime_cast_bandwidth", "runtime_part_cost",
           "runtime_shared", "with_cast_rate"]
