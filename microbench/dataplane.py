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
from reshard.microbench.measure import (
    add_case_args,
    measure_strategies,
    measured_row,
    print_rows,
    report,
    sample_value,
    selected_cases,
)
from reshard.microbench.report import scaled
from reshard.microbench.suites.paper import Case


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
    value = sample_value(case.shape, case.dtype)
    rows = []
    # one extra untimed run first, checked: every destination shard
    for m in measure_strategies(rt, value, src, dst, strategies, runs, warmup + 1):
        seconds, moved = m.seconds, m.plan.bytes_moved()
        delivered = delivered_bytes(src, dst, case.shape, np.dtype(case.dtype).itemsize)
        mc = memcpy_seconds(moved, runs)
        rows.append(measured_row(
            case, src, dst, m, bytes_delivered=delivered,
            delivered_bytes_per_s=delivered / seconds, bytes_per_s=moved / seconds,
            memcpy_seconds=mc, memcpy_bytes_per_s=moved / mc,
            vs_memcpy=(moved / seconds) / (moved / mc),
            plan_seconds=m.plan_seconds, load_seconds=m.load_seconds, rtt_seconds=rtt,
            predicted_seconds_paper_cluster=m.plan.estimate()))
    return rows


COLUMNS = [("case", "case"), ("strategy", "strategy"),
           ("tensor_bytes", "tensor MB", scaled(1e-6, ".1f")),
           ("bytes_moved", "moved MB", scaled(1e-6, ".1f")),
           ("seconds", "time ms", scaled(1e3, ".1f")),
           ("bytes_per_s", "GB/s", scaled(1e-9, ".2f")),
           ("delivered_bytes_per_s", "dst GB/s", scaled(1e-9, ".2f")),
           ("memcpy_bytes_per_s", "memcpy GB/s", scaled(1e-9, ".2f")),
           ("vs_memcpy", "vs memcpy", scaled(1, ".3f")),
           ("plan_seconds", "plan ms", scaled(1e3, ".1f")),
           ("load_seconds", "load ms", scaled(1e3, ".1f")),
           ("rtt_seconds", "rtt ms", scaled(1e3, ".2f")), ("wrong", "#wrong")]


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
    add_case_args(ap, runs=5)
    ap.add_argument("--launcher", default="process", choices=["process", "ray"])
    ap.add_argument("--timeout", type=float, default=300.0, help="runtime timeout, seconds")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)

    from reshard.runtime import Runtime

    full, strategies = selected_cases(ap, args)
    cluster = Cluster.regular(args.hosts, args.devices_per_host)
    cases = [c.with_bytes(int(args.size_mb * 2**20)) for c in full]
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
            print_rows(rows[-len(strategies):], COLUMNS)
    note = (f"# workers started in {env['start_seconds']:.2f}s; time = median of {args.runs} "
            f"runs after {args.warmup} warm-up; GB/s = plan.bytes_moved() / time; dst GB/s = "
            f"bytes the destination shards need from other devices / time; vs memcpy = GB/s "
            f"over one in-process numpy.copyto of the moved bytes")
    return report(rows, COLUMNS, note, args, env)


if __name__ == "__main__":
    sys.exit(main())
