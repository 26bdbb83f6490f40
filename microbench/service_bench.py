"""Requests per second through the gRPC service, and the latency it adds.

Starts ``reshard serve --backend none`` as its own process on loopback (a free port),
then, for two cases,

* ``paper-1``: the paper's case 1, (2, 4) S0RR -> (2, 4) S0RR on four p3.8xlarge hosts;
* ``a2a-128``: an all-to-all of 128 devices, S01R (8, 8) -> RS10 (8, 8) on 16 dgx-h100
  hosts (4,096 tasks),

measures Estimate (seconds and lower bound) and Plan (the whole plan, decoded and
verified by the Client) through :class:`reshard.service.Client`:

* ``cold``: every request new to the server (the tensor's first dim grows by one each
  time), so the server plans each one: what a compiler exploring layouts pays;
* ``cached``: the same request again and again (the server answers from its cache);
* ``cached xK``: the cached Estimate from K client processes at once (total rate);

and the same call in this process (``reshard.plan`` + ``estimate`` / ``lower_bound``,
new request each time). ``added ms`` = service median - in-process median. Each
measurement runs for ``--requests`` requests or ``--seconds`` seconds, whichever ends
first (at least 3 requests).

Run ``python -m reshard.microbench.service_bench [--json out.json]``.

``--search`` measures the Search rpc at a cluster's scale instead: GPT-3 175B on 1,024
H100s (128 dgx-h100 hosts) with data-parallel degrees 8 and 16, the layers built in this
process (``gpt_layers`` for one degree-8 replica), searched by the server
(``Client.search_replicated``, the server's own cold caches, the baselines included),
then asked again (its cache), then searched in this process: the seconds of each and
whether the answers are equal.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.cliargs import add_version
from reshard.helptext import for_terminal
from reshard.microbench.report import table, write_json


@dataclass(frozen=True)
class Case:
    """One request shape of the benchmark.

    Attributes:
        name: label.
        shape: global shape (dim 0 grows for cold requests).
        dtype: element type.
        src: source layout.
        dst: destination layout.
        cluster: the cluster planned for.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    src: Layout
    dst: Layout
    cluster: Cluster

    def args(self, i: int = 0) -> tuple[tuple[int, ...], str, Layout, Layout]:
        """The request ``(shape, dtype, src, dst)``; ``i`` > 0 makes a new one."""
        return (self.shape[0] + i, *self.shape[1:]), self.dtype, self.src, self.dst

    @property
    def devices(self) -> int:
        """Devices of the two meshes."""
        return len(set(self.src.devices) | set(self.dst.devices))


def cases() -> tuple[Case, ...]:
    """The paper case and the 128-device case."""
    paper = Cluster.preset("paper", 4)
    h100 = Cluster.preset("dgx-h100", 16)
    return (
        Case("paper-1", (1024, 1024, 512), "int32", Layout(DeviceMesh((2, 4)), "S0RR"),
             Layout(DeviceMesh((2, 4), devices=range(8, 16)), "S0RR"), paper),
        Case("a2a-128", (16384, 4096), "bfloat16", Layout(DeviceMesh((8, 8)), "S01R"),
             Layout(DeviceMesh((8, 8), devices=range(64, 128)), "RS10"), h100),
    )


def timed(fn: Callable[[int], Any], requests: int, seconds: float) -> list[float]:
    """Wall seconds of ``fn(1)``, ``fn(2)``, ... until ``requests`` calls or ``seconds``
    (at least 3 calls)."""
    out: list[float] = []
    end = time.perf_counter() + seconds
    for i in range(1, requests + 1):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
        if i >= 3 and time.perf_counter() > end:
            break
    return out


def _cached_estimates(address: str, case_index: int, seconds: float) -> int:
    """A client process: cached Estimate calls for ``seconds``; returns the count."""
    from reshard.service import Client

    case = cases()[case_index]
    n = 0
    with Client(address) as c:
        c.estimate(*case.args(), cluster=case.cluster)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            c.estimate(*case.args(), cluster=case.cluster)
            n += 1
    return n


def start_server(*flags: str) -> tuple[subprocess.Popen, str]:
    """``reshard serve --backend none --port 0`` (and ``flags``) and its address."""
    proc = subprocess.Popen([sys.executable, "-m", "reshard.cli", "serve", "--port", "0",
                             "--backend", "none", *flags], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"reshard serve did not start: {line!r}")
    return proc, line.split("listening on ", 1)[1].split()[0]


def search_at_scale(job_timeout: float = 900.0) -> dict[str, Any]:
    """The ``--search`` measurement (module docstring)."""
    from reshard.microbench.search_bench import MEMORY, MODELS, PEAK
    from reshard.planner.estimates import CostCache
    from reshard.search import search_replicated
    from reshard.search.replicas import replica_cluster
    from reshard.search.transformer import gpt_layers, submesh_shapes
    from reshard.service import Client

    model, cluster = MODELS["gpt3-175b"], Cluster.regular(128, 8, preset="dgx-h100")
    sub = replica_cluster(cluster, 8)
    t0 = time.process_time()
    layers = gpt_layers(model, sub, PEAK["dgx-h100"], cache=CostCache(),
                        shapes=submesh_shapes(sub, powers_of_two=True))
    built = time.process_time() - t0
    kw: dict[str, Any] = {"replicas": (8, 16), "memory_limit": MEMORY["dgx-h100"]}
    proc, address = start_server("--job-timeout", str(job_timeout))
    try:
        with Client(address, timeout=None) as c:
            t0 = time.perf_counter()
            got = c.search_replicated(layers, cluster, model.microbatches,
                                      timeout=job_timeout, **kw)
            remote = time.perf_counter() - t0
            t0 = time.perf_counter()
            again = c.search_replicated(layers, cluster, model.microbatches,
                                        timeout=job_timeout, **kw)
            cached = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(30)
    t0 = time.process_time()
    want = search_replicated(layers, cluster, model.microbatches, **kw)
    local = time.process_time() - t0
    return {"candidates_cpu_s": built, "remote_wall_s": remote, "cached_wall_s": cached,
            "in_process_cpu_s": local, "equal": got.replicated == want and again == got,
            "replicas": want.replicas, "simulated_s": got.choice.simulated,
            "beats": got.beats, "baselines_sim_s": {k: v.simulated
                                                    for k, v in got.baselines.items()}}


def _row(case: Case, tasks: int, rpc: str, mode: str, times: Sequence[float],
         inproc: float | None, clients: int = 1, total: float | None = None) -> dict:
    med = statistics.median(times) if times else None
    rate = total if total is not None else len(times) / sum(times)
    return {"case": case.name, "devices": case.devices, "tasks": tasks, "rpc": rpc,
            "mode": mode, "clients": clients, "requests": len(times),
            "per_s": rate, "p50_ms": med * 1e3 if med is not None else None,
            "p99_ms": (sorted(times)[int(0.99 * (len(times) - 1))] * 1e3) if times else None,
            "inproc_ms": inproc * 1e3 if inproc is not None else None,
            "added_ms": (med - inproc) * 1e3 if inproc is not None and med is not None
            else None}


def _rpc_rows(client: Any, case: Case, tasks: int, rpc: str, local: float, offset: int,
              requests: int, seconds: float) -> list[dict]:
    """Cold and cached rows of one RPC (``rpc``: ``"Estimate"`` or ``"Plan"``)."""
    call = client.estimate if rpc == "Estimate" else client.plan
    cold = timed(lambda i: call(*case.args(offset + i), cluster=case.cluster), requests,
                 seconds)
    call(*case.args(), cluster=case.cluster)  # now cached
    warm = timed(lambda i: call(*case.args(), cluster=case.cluster), requests, seconds)
    return [_row(case, tasks, rpc, "cold", cold, local),
            _row(case, tasks, rpc, "cached", warm, local)]


def _case_rows(client: Any, address: str, index: int, requests: int, seconds: float,
               clients: int) -> list[dict]:
    """Every row of case ``index``."""
    case = cases()[index]
    tasks = len(reshard.plan(*case.args(), cluster=case.cluster).tasks)

    def local_estimate(i: int) -> None:
        q = reshard.plan(*case.args(10_000 + i), cluster=case.cluster)
        q.estimate(), q.lower_bound()

    def local_plan(i: int) -> None:
        reshard.plan(*case.args(20_000 + i), cluster=case.cluster)

    rows = _rpc_rows(client, case, tasks, "Estimate",
                     statistics.median(timed(local_estimate, requests, seconds)), 30_000,
                     requests, seconds)
    rows += _rpc_rows(client, case, tasks, "Plan",
                      statistics.median(timed(local_plan, requests, seconds)), 40_000,
                      requests, seconds)
    if clients > 1:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(clients, mp_context=ctx) as pool:
            counts = list(pool.map(_cached_estimates, [address] * clients, [index] * clients,
                                   [seconds] * clients))
        rows.append(_row(case, tasks, "Estimate", f"cached x{clients}", [], None, clients,
                         sum(counts) / seconds))
    return rows


def measure(address: str, requests: int, seconds: float, clients: int) -> list[dict]:
    """Every row of the benchmark against the server at ``address``."""
    from reshard.service import Client

    with Client(address, timeout=600) as c:
        return [row for index in range(len(cases()))
                for row in _case_rows(c, address, index, requests, seconds, clients)]


COLUMNS = [("case", "case"), ("devices", "devices"), ("tasks", "tasks"), ("rpc", "rpc"),
           ("mode", "requests"), ("per_s", "req/s"), ("p50_ms", "p50(ms)"),
           ("p99_ms", "p99(ms)"), ("inproc_ms", "in-process(ms)"), ("added_ms", "added(ms)")]


def _cells(row: dict) -> dict:
    out = dict(row)
    for key in ("per_s", "p50_ms", "p99_ms", "inproc_ms", "added_ms"):
        v = row.get(key)
        out[key] = "-" if v is None else (f"{v:.0f}" if key == "per_s" else f"{v:.3f}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(prog="python -m reshard.microbench.service_bench",
                                 description=for_terminal(__doc__).split("\n\n")[0])
    add_version(ap)
    ap.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement")
    ap.add_argument("--clients", type=int, default=2,
                    help="client processes of the concurrent cached-Estimate row (1: none)")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--search", action="store_true",
                    help="measure the Search rpc on GPT-3 175B at 1,024 devices instead")
    args = ap.parse_args(argv)
    if args.search:
        r = search_at_scale()
        print(f"GPT-3 175B, 1,024 H100s, degrees 8 and 16: candidates {r['candidates_cpu_s']:.1f} "
              f"s CPU here; the server's Search {r['remote_wall_s']:.1f} s wall (cold, "
              f"baselines included), again {r['cached_wall_s']:.3f} s (cached); in process "
              f"{r['in_process_cpu_s']:.1f} s CPU; equal: {r['equal']}; degree "
              f"{r['replicas']}, simulated {r['simulated_s']:.3f} s, beats {r['beats']}, "
              f"baselines simulated {r['baselines_sim_s']}; load average "
              f"{os.getloadavg()[0]:.2f}")
        return 0
    proc, address = start_server()
    try:
        rows = measure(address, args.requests, args.seconds, args.clients)
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"# reshard serve on {address}, {platform.processor() or platform.machine()}, "
          f"client and server processes on one machine")
    print(table([_cells(r) for r in rows], COLUMNS))
    for r in rows:
        if r["rpc"] == "Estimate" and r["mode"] == "cached":
            print(f"# Estimate goal >= 1000 req/s: {r['case']} cached {r['per_s']:.0f} req/s "
                  f"({'met' if r['per_s'] >= 1000 else 'not met'}); a new request costs "
                  f"planning, {r['inproc_ms']:.2f} ms in process")
    if args.json:
        write_json(args.json, {"rows": rows, "address": address})
    return 0


if __name__ == "__main__":
    sys.exit(main())
