"""``reshard-bench``: the paper's resharding microbenchmarks, nccl-tests style.

Modes:
  sim  (default) the cost model on a modelled cluster (the paper's p3.8xlarge hosts by
       default), so suites larger than this machine run; with ``-c 1`` every case is
       also executed at a small size on the local reference backend and checked.
  run  executes the cases on real workers (``--backend gloo|nccl|local``) and times them.

Examples:
  reshard-bench                              # paper suite, model + check
  reshard-bench --suite 1-to-m -J out.json
  reshard-bench --mode run --backend gloo -b 1M -e 64M -f 4 -n 5 -w 1 --devices-per-host 2
  reshard-bench --planner-time
"""

from __future__ import annotations

import argparse
import platform
import sys
from typing import Sequence

import numpy as np

import reshard
from reshard.cluster import GBIT, preset_names
from reshard.microbench import planner_time
from reshard.microbench.measure import count_wrong, measure_strategies, measured_row, sample_value
from reshard.microbench.report import table, write_json
from reshard.microbench.suites.paper import SUITES, Case
from reshard.planner.strategy import Strategy

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``"64M"`` -> 67108864 (nccl-tests style suffixes K, M, G)."""
    t = text.strip().upper().rstrip("B")
    unit = t[-1] if t and t[-1] in UNITS else ""
    try:
        return int(float(t[: len(t) - len(unit)]) * UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; use e.g. 1024, 64K, 32M, 1G")


def sizes(args: argparse.Namespace) -> list[int | None]:
    """Target sizes from -b/-e/-f; ``[None]`` means each case's own (full) size."""
    if args.minbytes is None and args.maxbytes is None:
        return [None]
    lo = args.minbytes or args.maxbytes
    hi = args.maxbytes or lo
    out = []
    s = lo
    while s <= hi:
        out.append(s)
        s = s * args.stepfactor if args.stepfactor > 1 else hi + 1
    return out


def check_case(case: Case, strategy: str, elements: int, preset: str) -> int:
    """Run ``case`` at about ``elements`` elements on the local backend; #wrong."""
    small = case.with_bytes(elements * np.dtype(case.dtype).itemsize)
    src, dst, cluster = small.build(preset=preset)
    value = sample_value(small.shape, case.dtype, bound=2**30)
    with reshard.Runtime(backend="local", cluster=cluster) as rt:
        y = rt.reshard(rt.put(value, src), dst, strategy=strategy)
        return count_wrong(rt, y, value)


def sim_rows(args: argparse.Namespace, cases: Sequence[Case]) -> list[dict]:
    """Model every case and strategy (and check on the local backend with -c 1)."""
    rows = []
    for case in cases:
        for target in sizes(args):
            c = case if target is None else case.with_bytes(target)
            src, dst, cluster = c.build(preset=args.cluster, **_overrides(args))
            for strategy in args.strategies:
                p = reshard.plan(c.shape, c.dtype, src, dst, cluster=cluster, strategy=strategy)
                est, lb = p.estimate(), p.lower_bound()
                rows.append({
                    "case": c.name, "shape": "x".join(map(str, c.shape)), "bytes": c.nbytes,
                    "strategy": strategy, "tasks": len(p.tasks),
                    "time_us": est * 1e6, "lb_us": lb * 1e6, "ratio": est / lb if lb else 1.0,
                    "algbw": c.nbytes / est / 1e9 if est else float("nan"),
                    "wrong": check_case(c, strategy, args.check_elements, args.cluster)
                    if args.check else "n/a",
                })
    return rows


def run_rows(args: argparse.Namespace, cases: Sequence[Case]) -> list[dict]:
    """Execute every case and strategy on real workers and time them."""
    rows = []
    for case in cases:
        case = case.narrowed(args.devices_per_host)
        for target in sizes(args):
            c = case if target is None else case.with_bytes(target)
            src, dst, cluster = c.build(devices_per_host=args.devices_per_host,
                                        preset=args.cluster, **_overrides(args))
            value = sample_value(c.shape, c.dtype, bound=2**30)
            with reshard.Runtime(backend=args.backend, cluster=cluster, launcher=args.launcher,
                                 timeout=args.timeout) as rt:
                # the first run loads the plan; the last run's result is checked
                for m in measure_strategies(rt, value, src, dst, args.strategies, args.iters,
                                            args.warmup, load=False, check=bool(args.check),
                                            check_run=-1):
                    secs = m.seconds
                    rows.append(measured_row(
                        c, src, dst, m, shape="x".join(map(str, c.shape)), bytes=c.nbytes,
                        time_us=secs * 1e6, model_us=m.plan.estimate() * 1e6,
                        algbw=c.nbytes / secs / 1e9, busbw=m.plan.bytes_moved() / secs / 1e9,
                        wrong=m.wrong if args.check else "n/a"))
    return rows


def _overrides(args: argparse.Namespace) -> dict:
    return {"nic_bandwidth": args.nic_gbps * GBIT} if args.nic_gbps else {}


SIM_COLUMNS = [("case", "case"), ("shape", "shape"), ("bytes", "size(B)"),
               ("strategy", "strategy"), ("tasks", "tasks"), ("time_us", "model(us)"),
               ("lb_us", "bound(us)"), ("ratio", "model/bound"), ("algbw", "algbw(GB/s)"),
               ("wrong", "#wrong")]
RUN_COLUMNS = [("case", "case"), ("shape", "shape"), ("bytes", "size(B)"),
               ("strategy", "strategy"), ("tasks", "tasks"), ("time_us", "time(us)"),
               ("model_us", "model(us)"), ("algbw", "algbw(GB/s)"), ("busbw", "moved(GB/s)"),
               ("wrong", "#wrong")]
PLANNER_COLUMNS = [("name", "measurement"), ("tasks", "tasks"), ("plan_s", "plan(s)"),
                   ("goal_s", "goal(s)"), ("ratio", "model/bound")]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (flags in the manner of nccl-tests)."""
    ap = argparse.ArgumentParser(
        prog="reshard-bench", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=sorted(SUITES), default="paper")
    ap.add_argument("--cases", default=None, help="comma-separated case names to keep")
    ap.add_argument("--mode", choices=("sim", "run"), default="sim")
    ap.add_argument("--strategies", default=",".join(s.value for s in Strategy),
                    type=lambda s: [Strategy.parse(x).value for x in s.split(",") if x])
    ap.add_argument("--cluster", default="paper", choices=preset_names(),
                    help="link figures of the modelled hosts")
    ap.add_argument("--nic-gbps", type=float, default=None, help="override NIC Gbit/s")
    ap.add_argument("-b", "--minbytes", type=parse_size, default=None)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=None)
    ap.add_argument("-f", "--stepfactor", type=int, default=2)
    ap.add_argument("-n", "--iters", type=int, default=5)
    ap.add_argument("-w", "--warmup", type=int, default=1)
    ap.add_argument("-c", "--check", type=int, choices=(0, 1), default=1)
    ap.add_argument("--check-elements", type=int, default=1 << 14,
                    help="tensor elements of the sim-mode correctness run")
    ap.add_argument("-J", "--json", default=None, help="write the results as JSON")
    ap.add_argument("--backend", default="gloo", choices=("local", "gloo", "nccl"))
    ap.add_argument("--launcher", default=None, choices=("thread", "process", "ray"))
    ap.add_argument("--devices-per-host", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--planner-time", action="store_true",
                    help="also time the planner on (a) 128->128 all-to-all, (b) 1000 tensors")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code (1 if any element was wrong)."""
    args = build_parser().parse_args(argv)
    cases = SUITES[args.suite]()
    if args.cases:
        keep = set(args.cases.split(","))
        cases = tuple(c for c in cases if c.name in keep)
    if args.mode == "run" and args.backend == "local" and args.launcher is None:
        args.launcher = "thread"
    print(f"# reshard-bench {reshard.__version__}: suite {args.suite}, mode {args.mode}, "
          f"cluster {args.cluster}, strategies {','.join(args.strategies)}, "
          f"python {platform.python_version()}")
    rows = sim_rows(args, cases) if args.mode == "sim" else run_rows(args, cases)
    print(table(rows, SIM_COLUMNS if args.mode == "sim" else RUN_COLUMNS))
    wrong = sum(r["wrong"] for r in rows if isinstance(r["wrong"], int))
    bcast = [r["ratio"] for r in rows if r["strategy"] == "broadcast" and "ratio" in r]
    if bcast:
        print(f"# broadcast model/bound: worst {max(bcast):.3f} (goal <= 1.10)")
    print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    payload = {"suite": args.suite, "mode": args.mode, "cluster": args.cluster, "rows": rows}
    if args.planner_time:
        prow = planner_time.run()
        print(table(prow, PLANNER_COLUMNS))
        payload["planner"] = prow
    if args.json:
        write_json(args.json, payload)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
