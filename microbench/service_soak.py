"""A service under hostile load: clients repeating huge requests next to a good client.

``--hostile`` threads each repeat an n -> n all-to-all Estimate (``--devices``, by
default 1024 -> 1024: about 10^6 tasks, seconds of planning) with a ``--deadline``,
while one good client asks new small Estimates as fast as it can; after ``--seconds``
it prints the good client's latency (p50 / p99), how the huge requests ended (refused
while the workers were busy, stopped at their deadline, answered), and the server's
peak RSS (it runs in this process; its planning workers are processes of their own)::

    python -m reshard.microbench.service_soak [--seconds 8] [--hostile 8]

``--flood N`` instead sends N distinct valid Plan requests of ``--request-mb`` MiB each
(a new 64 -> 64 all-to-all shape each, 4,096 tasks, padded to the size with an unknown
field, which the server must parse and ignore) from ``--clients`` threads (retrying
after a refusal for the bytes in flight) to a ``reshard
serve`` process of its own, and prints that process's peak and final RSS next to what
its options allow it to keep (plan caches, reply cache, request bytes in flight) above
its RSS before the flood::

    python -m reshard.microbench.service_soak --flood 1000 [--request-mb 30]
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import grpc

from reshard import Cluster, DeviceMesh, Layout
from reshard.microbench import flags
from reshard.microbench.procmem import memory_mib
from reshard.service import Client, ServeOptions, Server, ServiceError
from reshard.service.convert import request_to_pb
from reshard.service.options import MIB


def all_to_all(n: int) -> tuple[tuple, Cluster]:
    """An n -> n all-to-all (S01R -> RS10 over n / 8 DGX H100 hosts)."""
    cluster = Cluster.preset("dgx-h100", max(1, n // 8))
    mesh = DeviceMesh((max(1, n // 8), 8))
    return ((8 * n, 4096), "bfloat16", Layout(mesh, "S01R"), Layout(mesh, "RS10")), cluster


def soak(seconds: float, hostile: int, devices: int, deadline: float) -> dict:
    """Run the load (module docstring); the numbers."""
    outcomes: dict[str, int] = {}
    lock = threading.Lock()
    latencies: list[float] = []
    with Server(ServeOptions(port=0, backend=None)).start() as server:
        stop = time.monotonic() + seconds

        def attack() -> None:
            args, cluster = all_to_all(devices)
            with Client(server.address) as c:
                while time.monotonic() < stop:
                    try:
                        c.estimate(*args, cluster=cluster, timeout=deadline)
                        name = "OK"
                    except ServiceError as e:
                        name = e.code.name if e.code is not None else "ERROR"
                    with lock:
                        outcomes[name] = outcomes.get(name, 0) + 1

        threads = [threading.Thread(target=attack, daemon=True) for _ in range(hostile)]
        for t in threads:
            t.start()
        time.sleep(min(0.5, seconds / 4))
        src = Layout(DeviceMesh((2, 2)), "S0R")
        dst = Layout(DeviceMesh((4,), devices=range(4, 8)), "RS0")
        with Client(server.address) as good:
            k = 0
            while time.monotonic() < stop:
                t0 = time.monotonic()
                good.estimate((64 + k, 32), "float32", src, dst, timeout=10)  # new each time
                latencies.append(time.monotonic() - t0)
                k += 1
        for t in threads:
            t.join(deadline + 10)
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    return {"good_requests": len(latencies), "good_p50_ms": q[49] * 1e3,
            "good_p99_ms": q[98] * 1e3, "hostile": outcomes,
            "server_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def varint(n: int) -> bytes:
    """``n`` as a protobuf varint."""
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def padded_request(k: int, size: int) -> bytes:
    """The bytes of a valid Plan request, distinct for each ``k`` (a 64 -> 64 all-to-all
    of 512 + k rows), padded to ``size`` bytes with an unknown field (number 1000)."""
    (_, dtype, src, dst), cluster = all_to_all(64)
    raw = request_to_pb([((512 + k, 256), dtype, src, dst, None)], cluster,
                        "broadcast").SerializeToString()
    pad = max(0, size - len(raw) - 8)
    return raw + varint((1000 << 3) | 2) + varint(pad) + bytes(pad)


def flood(requests: int, request_mb: float, clients: int = 4,
          serve_flags: Sequence[str] = ()) -> dict:
    """Send ``requests`` distinct padded Plan requests (module docstring) to a ``reshard
    serve`` process; its memory before, at peak and after, and what its budgets allow."""
    plan_mb, reply_mb, inflight_mb = 128.0, 64.0, 256.0
    flags = ["--backend", "none", "--max-message-mb", "64", "--plan-cache-mb", str(plan_mb),
             "--max-inflight-mb", str(inflight_mb), *serve_flags]
    proc = subprocess.Popen([sys.executable, "-m", "reshard.cli", "serve", "--port", "0",
                             *flags], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if "listening on" not in line:
            raise RuntimeError(f"reshard serve did not start: {line!r}")
        address = line.split("listening on ", 1)[1].split()[0]
        size = int(request_mb * MIB)
        opts = [("grpc.max_send_message_length", 64 * MIB),
                ("grpc.max_receive_message_length", 64 * MIB)]
        with grpc.insecure_channel(address, options=opts) as ch:
            call = ch.unary_unary("/reshard.v1.Reshard/Plan")
            call(padded_request(-1, 1024), timeout=60)  # warm: imports, first plan
            before = memory_mib(proc.pid)["VmRSS"]
            outcomes: dict[str, int] = {}
            lock = threading.Lock()
            counter = iter(range(requests))
            start = time.monotonic()

            def send() -> None:  # refused for the bytes in flight: back off, retry
                for k in counter:
                    request = padded_request(k, size)
                    for attempt in range(100):
                        try:
                            call(request, timeout=60)
                            name = "OK"
                        except grpc.RpcError as e:
                            name = e.code().name
                        with lock:
                            outcomes[name] = outcomes.get(name, 0) + 1
                        if name != "RESOURCE_EXHAUSTED":
                            break
                        time.sleep(0.05 * (attempt + 1))

            threads = [threading.Thread(target=send) for _ in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds = time.monotonic() - start
        mem = memory_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
    budget_mb = 2 * plan_mb + reply_mb + inflight_mb
    return {"requests": requests, "request_mb": request_mb, "seconds": seconds,
            "outcomes": outcomes, "rss_before_mb": before,
            "rss_peak_mb": mem["VmHWM"], "rss_after_mb": mem["VmRSS"],
            "budget_mb": budget_mb}


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print one line of numbers."""
    ap = flags.parser("python -m reshard.microbench.service_soak", __doc__ or "")
    ap.add_argument("--seconds", type=float, default=8.0, help="how long the load lasts")
    ap.add_argument("--hostile", type=int, default=8, help="threads repeating huge requests")
    ap.add_argument("--devices", type=int, default=1024, help="n of their n -> n all-to-all")
    ap.add_argument("--deadline", type=float, default=5.0, help="their deadline, seconds")
    ap.add_argument("--flood", type=int, default=0, metavar="N",
                    help="instead: N distinct padded Plan requests to a reshard serve process")
    ap.add_argument("--request-mb", type=float, default=30.0, help="--flood: each request's size")
    ap.add_argument("--clients", type=int, default=4, help="--flood: client threads")
    args = ap.parse_args(argv)
    if args.flood:
        f = flood(args.flood, args.request_mb, args.clients)
        grown = f["rss_peak_mb"] - f["rss_before_mb"]
        print(f"{f['requests']} distinct {f['request_mb']:.0f} MiB Plan requests in "
              f"{f['seconds']:.1f} s: {f['outcomes']}; server RSS {f['rss_before_mb']:.0f} MB "
              f"before, peak {f['rss_peak_mb']:.0f} MB (+{grown:.0f}), after "
              f"{f['rss_after_mb']:.0f} MB; budgets allow +{f['budget_mb']:.0f} MB "
              f"(peak growth / budget = {grown / f['budget_mb']:.2f})")
        return 0
    r = soak(args.seconds, args.hostile, args.devices, args.deadline)
    print(f"good client: {r['good_requests']} new Estimates, p50 {r['good_p50_ms']:.1f} ms, "
          f"p99 {r['good_p99_ms']:.1f} ms; huge requests: {r['hostile']}; server peak RSS "
          f"{r['server_peak_rss_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
