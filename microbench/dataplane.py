"""Data-plane benchmark: the paper's n-to-m cases executed on real worker processes.

Runs every case and strategy on local gloo workers (process launcher by default)
and reports, per (case, strategy):

* ``time``: median wall time of ``Runtime.execute`` over ``--runs`` runs after
  ``--warmup`` runs, measured in the driver (dispatch to every worker, all tasks,
  replies);
* ``GB/s``: the bytes the plan moves (``plan.bytes_moved()``: each non-copy task's
  box once, so a broadcast counts once however many receive it) over that time;
* ``dst GB/s``: the bytes the destination shards need from other devices (the same
  for every strategy, so comparable across them) over that time;
* ``vs memcpy``: that rate over the rate of one ``numpy.copyto`` of the same bytes
  in one process (a ceiling: the data plane copies at least that much, and loopback
  TCP copies it several times);
* plan-to-first-byte: ``plan`` (``Runtime.plan``, driver only), ``load`` (first
  ``Runtime.load``: the plan's JSON to every worker, parsing, gloo sub-group
  creation; cached afterwards) and ``rtt`` (median round trip of a no-op call to
  every worker at once). A first ``reshard`` of a layout pair waits about
  plan + load + rtt/2 before the workers start their first task; a repeated one
  plan + rtt/2. These are upper bounds measured from the driver, not timestamps
  taken inside the workers.

Meshes ``(n, 4)`` of the paper become ``(n, g)`` with ``g = --devices-per-host``;
the source mesh starts on host 0 and the destination on the next free host, or on
the last hosts when the cluster is too small (then the meshes overlap: case 6).

Example::

    python -m reshard.microbench.dataplane --size-mb 256 --json dataplane.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from concurrent.futures import wait
from typing import Any, Sequence

import numpy as np

from reshard.cluster import Cluster
from reshard.layout import Layout
from reshard.microbench.suites.paper import Case, n_to_m_cases
from reshard.planner.strategy import Strategy

STRATEGIES = tuple(s.value for s in Strategy)


def delivered_bytes(src: Layout, dst: Layout, shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes destination devices must receive: each destination shard minus what the
    same device already holds in the source (the same for every strategy)."""
    sboxes, total = src.boxes(shape), 0
    for d, box in dst.boxes(shape).items():
        n = math.prod(b - a for a, b in box)
        if d in sboxes:
            n -= math.prod(max(0, min(b, sb) - max(a, sa))
                           for (a, b), (sa, sb) in zip(box, sboxes[d]))
        total += n
    return total * itemsize


def memcpy_seconds(nbytes: int, runs: int) -> float:
    """Median seconds of one in-process ``numpy.copyto`` of ``nbytes``."""
    src = np.ones(max(nbytes, 1), dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(max(runs, 5)):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def round_trip_seconds(rt: Any, runs: int = 7) -> float:
    """Median round trip of a no-op call sent to every worker at once."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        futures = [rt.group.submit(d, "ping") for d in rt.group.devices]
        wait(futures)
        for f in futures:
            f.result()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_case(rt: Any, case: Case, src: Layout, dst: Layout, strategies: Sequence[str],
               runs: int, warmup: int, rtt: float) -> list[dict]:
    """Measure every strategy on one case."""
    rng = np.random.default_rng(0)
    value = rng.integers(-2**20, 2**20, size=case.shape).astype(case.dtype)
    x = rt.put(value, src)
    rows = []
    for strategy in strategies:
        t0 = time.perf_counter()
        plan = rt.plan(x, dst, strategy)
        t_plan = time.perf_counter() - t0
        t0 = time.perf_counter()
        rt.load(plan)
        t_load = time.perf_counter() - t0
        wrong = -1
        for i in range(warmup + 1):
            (y,) = rt.execute(plan, [x])
            if i == 0:  # check once: every destination shard
                shards = rt.shards(y)
                wrong = 0
                for d, sl in dst.index_map(value.shape).items():
                    wrong += int(np.count_nonzero(shards[d] != value[sl]))
            rt.free(y)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            (y,) = rt.execute(plan, [x])
            times.append(time.perf_counter() - t0)
            rt.free(y)
        seconds = statistics.median(times)
        moved = plan.bytes_moved()
        delivered = delivered_bytes(src, dst, case.shape, np.dtype(case.dtype).itemsize)
        mc = memcpy_seconds(moved, runs)
        rows.append({
            "case": case.name, "strategy": strategy, "shape": list(case.shape),
            "dtype": case.dtype, "src": str(src), "dst": str(dst),
            "tensor_bytes": case.nbytes, "bytes_moved": moved, "bytes_delivered": delivered,
            "tasks": len(plan.tasks), "delivered_bytes_per_s": delivered / seconds,
            "seconds": seconds, "seconds_all": times, "bytes_per_s": moved / seconds,
            "memcpy_seconds": mc, "memcpy_bytes_per_s": moved / mc,
            "vs_memcpy": (moved / seconds) / (moved / mc),
            "plan_seconds": t_plan, "load_seconds": t_load, "rtt_seconds": rtt,
            "predicted_seconds_paper_cluster": plan.estimate(), "wrong": wrong,
        })
    rt.free(x)
    return rows


def table(rows: list[dict]) -> str:
    """The rows as a fixed-width text table."""
    head = (f"{'case':>4} {'strategy':>9} {'tensor MB':>9} {'moved MB':>8} {'time ms':>8} "
            f"{'GB/s':>6} {'dst GB/s':>8} {'memcpy GB/s':>11} {'vs memcpy':>9} {'plan ms':>7} "
            f"{'load ms':>7} {'rtt ms':>6} {'#wrong':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['case']:>4} {r['strategy']:>9} {r['tensor_bytes'] / 1e6:>9.1f} "
            f"{r['bytes_moved'] / 1e6:>8.1f} {r['seconds'] * 1e3:>8.1f} "
            f"{r['bytes_per_s'] / 1e9:>6.2f} {r['delivered_bytes_per_s'] / 1e9:>8.2f} "
            f"{r['memcpy_bytes_per_s'] / 1e9:>11.2f} "
            f"{r['vs_memcpy']:>9.3f} {r['plan_seconds'] * 1e3:>7.1f} "
            f"{r['load_seconds'] * 1e3:>7.1f} {r['rtt_seconds'] * 1e3:>6.2f} {r['wrong']:>6}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; prints a table, optionally writes JSON."""
    ap = argparse.ArgumentParser(
        prog="python -m reshard.microbench.dataplane",
        description="Time the paper's n-to-m cases on real gloo worker processes.")
    ap.add_argument("--hosts", type=int, default=4, help="emulated hosts (default 4)")
    ap.add_argument("--devices-per-host", type=int, default=2,
                    help="workers per host; meshes (n, 4) become (n, this) (default 2)")
    ap.add_argument("--size-mb", type=float, default=256.0,
                    help="global tensor size per case in MiB (default 256)")
    ap.add_argument("--cases", default="1,2,3,4,5,6,7,9", help="comma-separated case names")
    ap.add_argument("--strategies", default=",".join(STRATEGIES),
                    help=f"comma-separated, from {list(STRATEGIES)}")
    ap.add_argument("--runs", type=int, default=5, help="timed runs (median reported)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    ap.add_argument("--launcher", default="process", choices=["process", "ray"])
    ap.add_argument("--timeout", type=float, default=300.0, help="runtime timeout, seconds")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)

    from reshard.runtime import Runtime

    by_name = {c.name: c for c in n_to_m_cases()}
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; valid: {sorted(by_name)}")
    strategies = [Strategy.parse(s).value for s in args.strategies.split(",") if s.strip()]
    cluster = Cluster.regular(args.hosts, args.devices_per_host)
    cases = [by_name[n].with_bytes(int(args.size_mb * 2**20)) for n in names]
    layouts = [c.narrowed(args.devices_per_host).layouts_on(cluster) for c in cases]

    env = {"python": platform.python_version(), "cpus": os.cpu_count(),
           "workers": len(cluster.devices), "launcher": args.launcher, "backend": "gloo",
           "start_method": os.environ.get("RESHARD_START_METHOD", "forkserver (default)")}
    try:
        import torch

        env["torch"] = torch.__version__
    except ImportError:
        pass
    print(f"# dataplane: {env}", flush=True)
    t0 = time.perf_counter()
    rows: list[dict] = []
    with Runtime("gloo", cluster, args.launcher, timeout=args.timeout) as rt:
        env["start_seconds"] = time.perf_counter() - t0
        rtt = round_trip_seconds(rt)
        for case, (src, dst) in zip(cases, layouts):
            rows.extend(bench_case(rt, case, src, dst, strategies, args.runs, args.warmup, rtt))
            print(table(rows[-len(strategies):]).split("\n", 2)[-1], flush=True)
    print()
    print(table(rows))
    print(f"# workers started in {env['start_seconds']:.2f}s; time = median of {args.runs} "
          f"runs after {args.warmup} warm-up; GB/s = plan.bytes_moved() / time; dst GB/s = "
          f"bytes the destination shards need from other devices / time; vs memcpy = GB/s "
          f"over one in-process numpy.copyto of the moved bytes")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "args": vars(args), "rows": rows}, f, indent=2)
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
