"""Worker scheduling policy, A/B: gloo workers under ``SCHED_BATCH`` (what the launchers
do for gloo, :mod:`reshard.comm.launchers.scheduling`) against the default policy.

Each case starts its gloo workers (process launcher) once per policy and round, the
policies alternated, and times ``-n`` executes of one plan after warm-ups. Printed per
case and policy: milliseconds per execute (median over rounds), the workers' CPU time
per execute, the part of it in gloo's TCP progress threads (``gloo_tcp_loop``, where
the lock spin shows), and batch / default. Cases: a 16-byte tensor replicated on 8
workers resharded onto 8 others (16 workers: the per-execute floor of run mode's paper
cases), one worker to another, and the paper's case 4 (64 tasks over 16 workers) at 8
MiB::

    python -m reshard.microbench.scheduling [-n 200] [--rounds 2]
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from reshard import Cluster, DeviceMesh, Layout, Runtime, plan
from reshard.comm.launchers.scheduling import SCHED_ENV
from reshard.microbench import flags
from reshard.microbench.steal import cpu_times, stolen_note

POLICIES = ("other", "batch")
PROGRESS_THREAD = "gloo_tcp_loop"


@dataclass(frozen=True)
class Case:
    """One plan to time: ``shape`` int32 from ``src`` to ``dst`` on ``hosts`` x
    ``per_host`` devices, ``runs`` executes per measurement (None: ``-n``)."""

    name: str
    shape: tuple[int, ...]
    src: Layout
    dst: Layout
    hosts: int
    per_host: int
    runs: int | None = None


def cases() -> list[Case]:
    """The three cases of the module's docstring."""
    a, b = DeviceMesh((2, 4), range(8)), DeviceMesh((2, 4), range(8, 16))
    one, two = DeviceMesh((1, 1), [0]), DeviceMesh((1, 1), [1])
    return [Case("16 B, 16 workers", (4,), Layout(a, "R"), Layout(b, "S0"), 4, 4),  # 8 -> 8
            Case("16 B, 2 workers", (4,), Layout(one, "R"), Layout(two, "R"), 1, 2),
            Case("case 4 8 MiB, 16 workers", (161, 161, 81), Layout(a, "RS01R"),
                 Layout(b, "S01RR"), 4, 4, runs=20)]


def _ticks(pids: Sequence[int]) -> tuple[int, int]:
    """CPU clock ticks of every thread of ``pids``: all, and gloo's progress threads."""
    total = progress = 0
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    raw = f.read()
            except OSError:
                continue
            name = raw[raw.index("(") + 1:raw.rindex(")")]
            fields = raw[raw.rindex(")") + 2:].split()
            used = int(fields[11]) + int(fields[12])  # utime, stime
            total += used
            progress += used if name == PROGRESS_THREAD else 0
    return total, progress


def measure(case: Case, policy: str, runs: int, warmup: int = 10) -> tuple[float, float, float]:
    """Seconds per execute, worker CPU seconds per execute, progress-thread CPU
    seconds per execute, of ``case`` with workers under ``policy``."""
    cluster = Cluster.regular(case.hosts, case.per_host)
    p = plan(case.shape, "int32", case.src, case.dst, cluster=cluster, strategy="broadcast")
    value = np.arange(int(np.prod(case.shape)), dtype=np.int32).reshape(case.shape)
    tick = os.sysconf("SC_CLK_TCK")
    with Runtime("gloo", cluster, "process", timeout=60, env={SCHED_ENV: policy}) as rt:
        x = rt.put(value, case.src)
        y = rt.execute(p, [x])[0]
        if not np.array_equal(rt.get(y), value):
            raise AssertionError(f"{case.name}: wrong bytes under {policy}")
        rt.free(y)
        for _ in range(warmup):
            rt.free(rt.execute(p, [x])[0])
        pids = list(rt.group.pids.values())
        before = _ticks(pids)
        t0 = time.perf_counter()
        for _ in range(runs):
            rt.free(rt.execute(p, [x])[0])
        wall = time.perf_counter() - t0
        after = _ticks(pids)
    return (wall / runs, (after[0] - before[0]) / tick / runs,
            (after[1] - before[1]) / tick / runs)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every case under both policies, alternated, and print a table."""
    ap = flags.parser("python -m reshard.microbench.scheduling", __doc__ or "")
    ap.add_argument("-n", "--iters", type=int, default=200, help="executes per measurement")
    ap.add_argument("--rounds", type=int, default=2, help="alternated rounds per policy")
    args = ap.parse_args(argv)
    before = cpu_times()
    print(f"{'case':26s} {'policy':6s} {'ms/exec':>8s} {'cpu ms':>7s} {'loop ms':>8s}  "
          "batch/other (time, cpu)")
    for case in cases():
        got: dict[str, list[tuple[float, float, float]]] = {p: [] for p in POLICIES}
        for _ in range(args.rounds):
            for policy in POLICIES:
                got[policy].append(measure(case, policy, case.runs or args.iters))
        med = {p: tuple(statistics.median(m[i] for m in got[p]) for i in range(3))
               for p in POLICIES}
        for policy in POLICIES:
            wall, cpu, loop = med[policy]
            extra = (f"  {med['batch'][0] / med['other'][0]:.2f}, "
                     f"{med['batch'][1] / med['other'][1]:.2f}" if policy == "batch" else "")
            print(f"{case.name:26s} {policy:6s} {wall * 1e3:8.2f} {cpu * 1e3:7.2f} "
                  f"{loop * 1e3:8.2f}{extra}", flush=True)
    print(f"# medians of {args.rounds} alternated rounds; cpu: every worker thread; "
          f"loop: gloo's progress threads" + stolen_note(before, cpu_times()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
