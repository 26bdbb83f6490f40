"""gloo's own floor under run mode's rows: each row's plan replayed with bare
torch.distributed operations, no reshard runtime in the way.

``reshard-bench --mode run --backend gloo --cluster local`` reports time / bound, the
bound of this machine's calibrated links. Where a row stays far above its bound, is it
reshard's runtime or the backend on this machine? Here every broadcast plan of the
chosen paper cases is planned on the same calibrated cluster, and its messages are
sent by plain ``torch.distributed`` gloo processes (one per device, under the
scheduling policy the launchers give gloo workers): per step, every edge of every task
one ``isend`` / ``irecv`` of the task's whole box, all of a step's edges at once (a
relay does not wait for what it forwards), steps back to back, rounds back to back as
nccl-tests times its operations; no packing, no commands, no replies. That is
optimistic for gloo: no plan runs faster on it here. Printed per row: the bound, gloo's
floor, and floor / bound: a row whose floor alone is over 3x its bound is out of the
3x goal's reach on this machine whatever reshard does::

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

from reshard.comm.launchers.scheduling import apply
from reshard.microbench import calibrate, flags
from reshard.microbench.steal import cpu_times, stolen_note
from reshard.microbench.suites.paper import all_cases
from reshard.microbench.sweep import links_for
from reshard.planner.plan import plan_many
from reshard.planner.tasks import Task, TaskKind

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

    @property
    def messages(self) -> int:
        return sum(len(s) for s in self.steps)


def task_edges(task: Task) -> list[Edge]:
    """The messages a task's bytes take: every edge of its chain or tree (a fused
    sum's addend edges first), or a reduction's chain into its root."""
    if task.kind is TaskKind.COPY:
        return []
    if task.kind is TaskKind.REDUCE:
        chain = [*task.receivers, task.root]
        return [(a, b, task.nbytes) for a, b in itertools.pairwise(chain)]
    if task.kind is TaskKind.ALLGATHER:
        raise ValueError("an all-gather task has no point-to-point replay here")
    return [(a, b, task.nbytes) for a, b in (*task.sum_edges(), *task.edges())]


def plan_steps(tasks: Sequence[Task]) -> tuple[tuple[Edge, ...], ...]:
    """A plan's messages grouped by step, steps in order."""
    by_step: dict[int, list[Edge]] = {}
    for t in tasks:
        by_step.setdefault(t.step, []).extend(task_edges(t))
    return tuple(tuple(by_step[s]) for s in sorted(by_step) if by_step[s])


def rows(case_names: Sequence[str] | None, sizes: Sequence[int]) -> list[Row]:
    """Run mode's paper cases (those named, else all: the nine and the 1-to-m) at ``sizes``, planned (broadcast)
    on this machine's links, measured first (:mod:`reshard.microbench.calibrate`)."""
    cases = [c for c in all_cases() if case_names is None or c.name in case_names]
    if not cases:
        raise ValueError(f"no paper case named {', '.join(case_names or ())}")
    counts = sorted({c.devices_needed for c in cases})
    measured = calibrate.measure_many(max(1, n // 2) for n in counts)
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


def _one_round(dist: Any, rank: int, steps: Sequence[Sequence[tuple[int, int, Any]]]) -> None:
    """Every step of one round: its messages posted at once, then waited for."""
    for step in steps:
        works = [dist.isend(buf, b) if a == rank else dist.irecv(buf, a) for a, b, buf in step]
        for w in works:
            w.wait()


def _replay(rank: int, world: int, store: str, rows: Sequence[Row], rounds: int,
            repeats: int, policy: str, results: mp.SimpleQueue) -> None:
    """One device's process: every row's messages ``repeats`` times ``rounds`` rounds;
    puts (rank, the best seconds per round of each row)."""
    import torch
    import torch.distributed as dist

    apply(policy)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    best: list[float] = []
    try:
        for row in rows:
            steps = [[(a, b, torch.empty(n, dtype=torch.uint8)) for a, b, n in step
                      if rank in (a, b)] for step in row.steps]

            _one_round(dist, rank, steps)  # warm-up: connections made, buffers touched
            times = []
            for _ in range(repeats):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(rounds):
                    _one_round(dist, rank, steps)
                dist.barrier()
                times.append((time.perf_counter() - t0) / rounds)
            best.append(min(times))
    finally:
        dist.destroy_process_group()
    results.put((rank, best))


def floors(rows: Sequence[Row], rounds: int, repeats: int = 3,
           policy: str = "batch") -> list[float]:
    """Seconds per round of each row on bare gloo (the slowest rank's best repeat),
    one process per device, started once for every row."""
    world = max(r.devices for r in rows)
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="reshard-gloo-floor-") as tmp:
        procs = [ctx.Process(target=_replay, args=(r, world, os.path.join(tmp, "store"),
                                                   rows, rounds, repeats, policy, results),
                             daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        got = [results.get() for _ in procs]
        for p in procs:
            p.join(30)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise RuntimeError(f"{len(bad)} gloo processes failed (exit codes {bad})")
    return [max(best[i] for _, best in got) for i in range(len(rows))]


def main(argv: Sequence[str] | None = None) -> int:
    """Plan, replay on bare gloo, print one line per row."""
    ap = flags.parser("python -m reshard.microbench.gloo_floor", __doc__ or "")
    ap.add_argument("--cases", default=None, help="paper cases, comma-separated (default: all)")
    ap.add_argument("-b", "--sizes", default=None,
                    help="tensor sizes, comma-separated (e.g. 1M,8M; default: run mode's)")
    ap.add_argument("-n", "--rounds", type=int, default=40, help="rounds per timing")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.cases.split(",")] if args.cases else None
    try:
        sizes = ([flags.parse_size(s) for s in args.sizes.split(",")] if args.sizes
                 else list(SIZES))
        todo = rows(names, sizes)
    except ValueError as e:
        ap.error(str(e))
    before = cpu_times()
    got = floors(todo, args.rounds)
    print(f"{'case':5s} {'size':>6s} {'msgs':>5s} {'bound ms':>9s} {'gloo ms':>8s} "
          f"{'gloo/bound':>10s}")
    for row, floor in zip(todo, got):
        ratio = floor / row.bound
        print(f"{row.case:5s} {row.nbytes / (1 << 20):5.0f}M {row.messages:5d} "
              f"{row.bound * 1e3:9.3f} {floor * 1e3:8.3f} {ratio:10.2f}"
              f"{'  (over 3x: out of reach)' if ratio > 3 else ''}", flush=True)
    print("# bare torch.distributed gloo, one process per device, best of 3 timings of "
          f"{args.rounds} back-to-back rounds" + stolen_note(before, cpu_times()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
