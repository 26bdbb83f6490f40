"""This machine's links, measured: the cluster ``reshard-bench --cluster local`` models.

Run mode times worker processes on one machine, which talk over loopback TCP (gloo) and
share its cores; the presets' figures (NICs of 10-400 Gbit/s) say nothing about that,
so against a preset ``time/bound`` is 10-70 here. :func:`measure` starts ``pairs``
sender / receiver process pairs that stream ``nbytes`` each over loopback TCP at once
and takes the bandwidth one pair gets while all of them run (what one device's link
gives when every device moves bytes, as in a reshard), the one-way latency of a small
message (half a ping-pong's round trip) and one process's memory-copy bandwidth.
:meth:`Links.overrides` turns them into cluster figures: every device its own link of
that bandwidth, within a host and between hosts (loopback is both here).
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import statistics
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

CHUNK = 1 << 20
"""Bytes per ``sendall`` / ``recv_into``."""


@dataclass(frozen=True)
class Links:
    """Measured figures of this machine.

    Attributes:
        bandwidth: bytes/s one pair streams while every pair streams at once.
        latency: seconds, one way, of a 1-byte message.
        copy_bandwidth: bytes/s of one process's memory copy.
        pairs: how many pairs streamed at once.
    """

    bandwidth: float
    latency: float
    copy_bandwidth: float
    pairs: int

    def overrides(self, devices_per_host: int) -> dict[str, Any]:
        """Cluster figures (``Cluster.regular(..., **overrides)``): each device its own
        link of :attr:`bandwidth`, inside a host and to other hosts alike."""
        return {"intra_bandwidth": self.bandwidth,
                "nic_bandwidth": self.bandwidth * devices_per_host,
                "nics_per_host": devices_per_host, "latency": self.latency,
                "intra_latency": self.latency, "copy_bandwidth": self.copy_bandwidth,
                "name": "local"}

    def describe(self) -> str:
        """One line for a report's header."""
        return (f"local (measured here: {self.bandwidth / 1e9:.2f} GB/s per link with "
                f"{self.pairs} pairs streaming at once, {self.latency * 1e6:.0f} us latency, "
                f"copies {self.copy_bandwidth / 1e9:.1f} GB/s)")


def _receiver(port_out: Connection, nbytes: int, ping: bool) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port_out.send(server.getsockname()[1])
        conn, _ = server.accept()
        with conn:
            if ping:
                one = bytearray(1)
                for _ in range(nbytes):
                    conn.recv_into(one)
                    conn.sendall(one)
                return
            buf = bytearray(CHUNK)
            got = 0
            while got < nbytes:
                n = conn.recv_into(buf)
                if not n:
                    break
                got += n
            conn.sendall(b"k")


def _sender(port: int, go: Connection, nbytes: int, ping: bool, out: Connection) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        go.recv()
        t0 = time.perf_counter()
        if ping:
            one = bytearray(1)
            for _ in range(nbytes):
                conn.sendall(b"p")
                conn.recv_into(one)
        else:
            chunk = bytes(CHUNK)
            left = nbytes
            while left > 0:
                conn.sendall(chunk[:min(left, CHUNK)])
                left -= CHUNK
            conn.recv(1)
        out.send(time.perf_counter() - t0)


def _streams(pairs: int, nbytes: int, ping: bool) -> list[float]:
    """Seconds each of ``pairs`` concurrent pairs took (ping: ``nbytes`` round trips)."""
    ctx = mp.get_context("forkserver")  # not fork: the caller may hold threads (JAX)
    procs = []
    gos = []
    outs = []
    try:
        for _ in range(pairs):
            port_r, port_w = ctx.Pipe(duplex=False)
            go_r, go_w = ctx.Pipe(duplex=False)
            out_r, out_w = ctx.Pipe(duplex=False)
            recv = ctx.Process(target=_receiver, args=(port_w, nbytes, ping), daemon=True)
            recv.start()
            port = port_r.recv()
            send = ctx.Process(target=_sender, args=(port, go_r, nbytes, ping, out_w), daemon=True)
            send.start()
            procs += [recv, send]
            gos.append(go_w)
            outs.append(out_r)
        for g in gos:
            g.send(True)
        return [o.recv() for o in outs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def _copy_bandwidth(nbytes: int = 64 << 20) -> float:
    a = np.ones(nbytes, np.uint8)
    b = np.empty_like(a)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t0)
    return nbytes / min(times)


def measure(pairs: int, nbytes: int = 64 << 20, round_trips: int = 200) -> Links:
    """Measure this machine's :class:`Links` with ``pairs`` pairs streaming at once."""
    pairs = max(1, pairs)
    seconds = _streams(pairs, nbytes, ping=False)
    bandwidth = nbytes / statistics.median(seconds)
    rtt = statistics.median(_streams(1, round_trips, ping=True)) / round_trips
    return Links(bandwidth, rtt / 2, _copy_bandwidth(), pairs)


__all__ = ["Links", "measure"]
