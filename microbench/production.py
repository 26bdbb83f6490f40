"""Production-scale weight syncs, modelled (:mod:`reshard.microbench.suites.production`).

For each case: the parameters and bytes, the plan's tasks and planning time, the cost
model's time against the lower bound (both of the case's machines, modelled: nothing
here is measured on that hardware), the largest per-rank program (JSON bytes: what a
driver ships one worker, or what an SPMD rank keeps) and the largest per-device staging
(scratch) memory; then the same plan under memory budgets of 1 GiB and 4 GiB
(``--budgets``): its staging and its model time against the unbounded plan's; where a
peer published a time for the same transfer, it is shown beside (theirs, on their
hardware: not re-measured). The cost
model's fluid simulation is slow on plans with tens of thousands of concurrent tasks:
a case whose simulation passes ``--cost-seconds`` shows n/a for the model::

    python -m reshard.microbench.production [--cases qwen3-32b,deepseek-v3]
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from reshard.comm.program import programs
from reshard.microbench import flags
from reshard.microbench.report import table
from reshard.microbench.suites.production import Sync, production_cases, requests
from reshard.planner.plan import plan_many
from reshard.planner.schedule.staging import staging_by_device

GIB = 1 << 30
COLUMNS = [("case", "case"), ("params_b", "params (1e9)"), ("gb", "GB"), ("tasks", "tasks"),
           ("plan_s", "plan(s)"), ("model_s", "model(s)"), ("bound_s", "bound(s)"),
           ("ratio", "model/bound"), ("program_kb", "max program(kB)"),
           ("staging_mib", "max staging(MiB)"), ("published", "published (theirs)")]


class _TooLong(Exception):
    pass


@contextlib.contextmanager
def _limit(seconds: float) -> Iterator[None]:
    """Raise _TooLong in the body after ``seconds`` (SIGALRM; main thread only)."""
    def ring(signum: int, frame: Any) -> None:
        raise _TooLong

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _timed(fn: Callable[[], float], seconds: float) -> float | None:
    try:
        with _limit(seconds):
            return fn()
    except _TooLong:
        return None


def measure(sync: Sync, budgets: Sequence[float], cost_seconds: float = 120.0) -> dict:
    """One case's numbers (module docstring)."""
    reqs, cluster = requests(sync)
    t0 = time.perf_counter()
    plan = plan_many(reqs, cluster=cluster)
    planned = time.perf_counter() - t0
    bound = plan.lower_bound()
    model = _timed(plan.estimate, cost_seconds)
    progs = programs(plan, all_groups=False)
    row = {"case": sync.name, "params_b": sync.model.num_parameters / 1e9,
           "gb": sum(math.prod(r[0]) * 2 for r in reqs) / 1e9, "tasks": len(plan.tasks),
           "plan_s": planned, "model_s": model if model is not None else "n/a",
           "bound_s": bound, "ratio": model / bound if model is not None else "n/a",
           "program_kb": max(len(p.to_json()) for p in progs.values()) / 1e3,
           "staging_mib": max(staging_by_device(plan.tasks, plan.tensors).values()) / 2**20,
           "published": sync.published or "-"}
    for gib in budgets:
        budgeted = plan_many(reqs, cluster=cluster, memory_budget=int(gib * GIB))
        est = _timed(budgeted.estimate, cost_seconds) if model is not None else None
        row[f"{gib:g}GiB"] = (est / model if est is not None and model else None,
                              max(staging_by_device(budgeted.tasks,
                                                    budgeted.tensors).values()) / 2**20)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table."""
    ap = flags.parser("python -m reshard.microbench.production", __doc__ or "")
    names = [c.name for c in production_cases()]
    ap.add_argument("--cases", default=",".join(names),
                    help=f"comma-separated, of: {', '.join(names)}")
    ap.add_argument("--budgets", default="1,4", help="memory budgets, GiB, comma-separated")
    ap.add_argument("--cost-seconds", type=float, default=120.0,
                    help="longest cost simulation of one plan (beyond: n/a)")
    args = ap.parse_args(argv)
    wanted = [n for n in args.cases.split(",") if n]
    unknown = sorted(set(wanted) - set(names))
    if unknown or not wanted:
        ap.error(f"--cases: {unknown or 'none given'}; valid: {', '.join(names)}")
    budgets = [float(b) for b in args.budgets.split(",") if b]
    rows = []
    for sync in production_cases():
        if sync.name in wanted:
            rows.append(measure(sync, budgets, args.cost_seconds))
            r = rows[-1]

            def ratio(g: float, r: dict = r) -> str:
                x = r[f"{g:g}GiB"][0]
                return "n/a" if x is None else f"x{x:.3f}"
            extra = "; ".join(f"{g:g} GiB budget: model {ratio(g)}, staging "
                              f"{r[f'{g:g}GiB'][1]:.0f} MiB" for g in budgets)
            print(f"{sync.name} ({sync.note}): {extra}", flush=True)
    print()
    print(table(rows, COLUMNS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
