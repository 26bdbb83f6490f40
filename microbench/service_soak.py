"""A service under hostile load: clients repeating huge requests next to a good client.

``--hostile`` threads each repeat an n -> n all-to-all Estimate (``--devices``, by
default 1024 -> 1024: about 10^6 tasks, seconds of planning) with a ``--deadline``,
while one good client asks new small Estimates as fast as it can; after ``--seconds``
it prints the good client's latency (p50 / p99), how the huge requests ended (refused
while the workers were busy, stopped at their deadline, answered), and the server's
peak RSS (it runs in this process; its planning workers are processes of their own)::

    python -m reshard.microbench.service_soak [--seconds 8] [--hostile 8]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import threading
import time
from collections.abc import Sequence

from reshard import Cluster, DeviceMesh, Layout
from reshard.service import Client, ServeOptions, Server, ServiceError


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


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print one line of numbers."""
    ap = argparse.ArgumentParser(prog="python -m reshard.microbench.service_soak",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="how long the load lasts")
    ap.add_argument("--hostile", type=int, default=8, help="threads repeating huge requests")
    ap.add_argument("--devices", type=int, default=1024, help="n of their n -> n all-to-all")
    ap.add_argument("--deadline", type=float, default=5.0, help="their deadline, seconds")
    args = ap.parse_args(argv)
    r = soak(args.seconds, args.hostile, args.devices, args.deadline)
    print(f"good client: {r['good_requests']} new Estimates, p50 {r['good_p50_ms']:.1f} ms, "
          f"p99 {r['good_p99_ms']:.1f} ms; huge requests: {r['hostile']}; server peak RSS "
          f"{r['server_peak_rss_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
