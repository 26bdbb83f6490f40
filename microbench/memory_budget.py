"""A byte budget on staging memory, measured on real gloo workers.

A ``--mib`` MiB float32 tensor (256 by default) moves from ``S0R`` on 4 workers to
``RS0`` on 4 others (an all-to-all transpose: every worker's shard is cut into pieces
for every peer) without a budget (16 MiB of staging: one 1/16 piece per step) and under
``--budget-mib`` (4), alternated
``--rounds`` times, each run on a fresh Runtime (peak RSS is per process). Printed per
way: the wall time of the reshard (best of ``--repeat`` after a first run), bytes
exact, the staging the plan holds (the planner's count, what the executor allocates),
and each worker's peak RSS growth during the reshards beyond the destination shard it
must hold anyway (after a small reshard on the same meshes: a worker's first reshard
costs about 5 MiB once, imports, communicators and thread pools, whatever its size);
then the ratios. ``--testbed GBIT``: on the emulated multi-host testbed instead (4 hosts,
each a network namespace with 2 workers and a NIC of GBIT Gbit/s; the same meshes, now
on hosts 0-1 and 2-3: unbounded, a worker stages 64 MiB)::

    python -m reshard.microbench.memory_budget [--mib 256] [--budget-mib 4] [--testbed 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from reshard import Cluster, DeviceMesh, Layout, Runtime
from reshard.microbench import flags
from reshard.microbench.procmem import memory_mib, reset_peak
from reshard.microbench.steal import cpu_times, stolen_note
from reshard.planner.schedule.staging import staging_by_device

MIB = 1 << 20


def one(mib: int, budget: int | None, repeat: int, cluster: Cluster | None = None,
        netns: object = None) -> dict:
    """One way: a fresh Runtime, the reshard ``repeat + 1`` times (module docstring);
    ``cluster`` and ``netns``: the testbed's (default: 2 hosts of 4 local workers)."""
    rows = int(mib * MIB // 4 // 2048)
    value = np.random.default_rng(0).random((rows, 2048), dtype=np.float32)
    src = Layout(DeviceMesh((4,), range(4)), "S0R")
    dst = Layout(DeviceMesh((4,), range(4, 8)), "RS0")
    with Runtime("gloo", cluster or Cluster.regular(2, 4), "process", memory_budget=budget,
                 timeout=300, netns=netns) as rt:
        # a small reshard on the same meshes first: what a worker's first one costs once
        # (imports, communicators, thread pools) is not staging
        rt.free(rt.reshard(rt.put(value[:64], src), dst))
        x = rt.put(value, src)
        plan = rt.plan(x, dst)
        pids = rt.group.pids
        for p in pids.values():  # the put's transient copies set the peak: reset it
            reset_peak(p)
        before = {d: memory_mib(p)["VmRSS"] for d, p in pids.items()}
        times = []
        y = None
        for _ in range(repeat + 1):
            if y is not None:
                rt.free(y)
            t0 = time.perf_counter()
            y = rt.reshard(x, dst)
            times.append(time.perf_counter() - t0)
        assert y is not None
        peak = {d: memory_mib(p)["VmHWM"] for d, p in pids.items()}  # before get's copies
        exact = bool(np.array_equal(rt.get(y), value))
        shard_mib = {d: float(np.prod(dst.shard_shape(value.shape, d))) * 4 / MIB
                     for d in dst.devices}
        growth = {d: peak[d] - before[d] - shard_mib.get(d, 0.0) for d in pids}
        staged = staging_by_device(plan.tasks, plan.tensors)
    return {"seconds": min(times[1:]), "exact": exact, "tasks": len(plan.tasks),
            "steps": len({t.step for t in plan.tasks}),
            "staging_mib": max(staged.values()) / MIB,
            "growth_mib": max(growth.values())}


def main(argv: Sequence[str] | None = None) -> int:
    """Run both ways alternated; print each and the ratios."""
    ap = flags.parser("python -m reshard.microbench.memory_budget", __doc__ or "")
    ap.add_argument("--mib", type=int, default=256, help="the tensor's size, MiB")
    ap.add_argument("--budget-mib", type=float, default=4.0, help="the budget, MiB")
    ap.add_argument("--rounds", type=int, default=2, help="alternated rounds")
    ap.add_argument("--repeat", type=int, default=2, help="timed reshards per Runtime")
    ap.add_argument("--testbed", type=float, default=None, metavar="GBIT",
                    help="on the emulated testbed, NICs of GBIT Gbit/s (needs root)")
    args = ap.parse_args(argv)
    if args.testbed is None:
        return _compare(args, None)
    from reshard.testbed import Testbed

    with Testbed(4, args.testbed) as tb:
        return _compare(args, tb)


def _compare(args: argparse.Namespace, testbed: Any) -> int:
    """Both ways alternated (on ``testbed`` if given); print each and the ratios."""
    budget = int(args.budget_mib * MIB)
    got: dict[str, list[dict]] = {"unbounded": [], "budget": []}
    before = cpu_times()
    for r in range(args.rounds):
        for way in (("unbounded", "budget") if r % 2 == 0 else ("budget", "unbounded")):
            row = one(args.mib, None if way == "unbounded" else budget, args.repeat,
                      testbed and testbed.cluster(2), testbed)
            got[way].append(row)
            print(f"round {r} {way}: {row['seconds']:.2f} s, exact {row['exact']}, "
                  f"{row['tasks']} tasks in {row['steps']} steps, staging "
                  f"{row['staging_mib']:.1f} MiB, worker peak RSS growth beyond its shard "
                  f"{row['growth_mib']:.1f} MiB", flush=True)
    after = cpu_times()
    free_s = statistics.median(r["seconds"] for r in got["unbounded"])
    budget_s = statistics.median(r["seconds"] for r in got["budget"])
    growth = max(r["growth_mib"] for r in got["budget"])
    where = ("8 gloo workers" if testbed is None else
             f"the testbed (4 hosts x 2 gloo workers, {args.testbed:g} Gbit/s NICs)")
    print(f"{where}: {args.mib} MiB under a {args.budget_mib:g} MiB budget: time {budget_s:.2f} s vs "
          f"{free_s:.2f} s unbounded ({budget_s / free_s:.2f}x); worker peak RSS growth "
          f"{growth:.1f} MiB ({growth / args.budget_mib:.2f}x the budget) vs "
          f"{max(r['growth_mib'] for r in got['unbounded']):.1f} MiB unbounded; "
          f"exact: {all(r['exact'] for rows in got.values() for r in rows)}"
          + stolen_note(before, after))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
