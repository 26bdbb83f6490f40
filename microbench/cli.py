"""``reshard-bench``: resharding microbenchmarks, nccl-tests style.

Suites: ``paper`` (the paper's n-to-m and 1-to-m cases; also ``n-to-m``, ``1-to-m``),
``realistic`` (layout pairs of real training runs at real sizes) and ``weight-sync``
(a 7B model's parameters FSDP -> tensor parallel, all tensors in one plan, one row).

Modes:
  sim  (default) the cost model on a modelled cluster (each case's own preset, the
       paper's p3.8xlarge hosts for the paper's cases; ``--cluster`` overrides it), so
       suites larger than this machine run; with ``-c 1`` every case is also executed
       at a small size on the local reference backend and checked (every tensor).
  run  executes the cases on real workers (``--backend gloo|nccl|local``) and times
       them; cases needing more than ``--max-devices`` workers, or more host memory
       than there is, are refused with a note.

Examples:
  reshard-bench                              # paper suite, model + check
  reshard-bench --suite realistic -c 0
  reshard-bench --suite weight-sync
  reshard-bench --suite 1-to-m -J out.json
  reshard-bench --mode run --backend gloo -b 1M -e 64M -f 4 -n 5 -w 1 --devices-per-host 2
  reshard-bench --planner-time
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import reshard
from reshard.cluster import GBIT, preset_names
from reshard.layout import box_size
from reshard.microbench import planner_time
from reshard.microbench.measure import (
    Measured,
    count_wrong,
    measured_row,
    partial_addends,
    sample_value,
    time_execute,
)
from reshard.microbench.report import table, write_json
from reshard.microbench.suites import SUITES
from reshard.microbench.suites.paper import Case, Request, preset_key
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


def check_bound(dtype: str) -> int:
    """Magnitude of the sample values: integers below it are exact in ``dtype``, also
    summed over a few partial addends (floats: 2**(mantissa bits - 3))."""
    dt = np.dtype(dtype)
    return 2 ** (np.finfo(dt).nmant - 3) if dt.kind in "fc" else 2 ** 30


def put_value(rt: Any, value: np.ndarray, layout: reshard.Layout,
              rng: np.random.Generator) -> Any:
    """Put ``value`` on ``layout``; a partial layout gets random addends that sum to it."""
    if not layout.spec.is_partial:
        return rt.put(value, layout)
    b = check_bound(value.dtype.name)
    shards = partial_addends(
        value, layout, lambda s: rng.integers(-b, b, size=s).astype(value.dtype))
    return rt.put_shards(shards, layout, value.shape, value.dtype)


def check_case(case: Case, strategy: str, elements: int, preset: str | None = None,
               **overrides: float) -> int:
    """Run ``case`` at a small size (:meth:`Case.small`: about ``elements`` elements per
    tensor) on the local backend, all its tensors in one plan; #wrong elements."""
    reqs, cluster = case.small(elements).build_many(preset=preset, **overrides)
    rng = np.random.default_rng(1)
    values = [sample_value(shape, dtype, bound=check_bound(dtype))
              for shape, dtype, _, _ in reqs]
    with reshard.Runtime(backend="local", cluster=cluster) as rt:
        xs = [put_value(rt, v, r[2], rng) for v, r in zip(values, reqs)]
        ys = rt.reshard_many(xs, [r[3] for r in reqs], strategy=strategy)
        return sum(count_wrong(rt, y, v) for y, v in zip(ys, values))


def _case_keys(c: Case, preset: str | None) -> dict:
    """The row keys that describe a (sized) case."""
    tensors = c.tensors
    return {
        "case": c.name,
        "shape": "x".join(map(str, c.shape)) if len(tensors) == 1 else f"{len(tensors)}-tensors",
        "bytes": c.nbytes, "tensors": len(tensors),
        "dtype": "/".join(sorted({t.dtype for t in tensors})),
        "preset": preset_key(preset or c.preset), "layouts": c.layout_text(),
    }


def sim_rows(args: argparse.Namespace, cases: Sequence[Case]) -> list[dict]:
    """Model every case and strategy, all of a case's tensors in one plan (and check
    on the local backend with -c 1)."""
    rows = []
    for case in cases:
        for target in sizes(args):
            c = case if target is None else case.with_bytes(target)
            reqs, cluster = c.build_many(preset=args.cluster, **_overrides(args))
            for strategy in args.strategies:
                p = reshard.plan_many(reqs, cluster=cluster, strategy=strategy)
                est, lb = p.estimate(), p.lower_bound()
                rows.append({
                    **_case_keys(c, args.cluster),
                    "strategy": strategy, "tasks": len(p.tasks),
                    "time_us": est * 1e6, "lb_us": lb * 1e6, "ratio": est / lb if lb else 1.0,
                    "algbw": c.nbytes / est / 1e9 if est else float("nan"),
                    "wrong": check_case(c, strategy, args.check_elements, args.cluster,
                                        **_overrides(args))
                    if args.check else "n/a",
                })
    return rows


def host_bytes(reqs: Sequence[Request]) -> int:
    """Bytes the local and gloo backends hold in host memory for ``reqs``: the driver's
    values, every source and destination shard."""
    total = 0
    for shape, dtype, src, dst in reqs:
        item = np.dtype(dtype).itemsize
        total += 2 * math.prod(shape) * item
        for lay in (src, dst):
            total += sum(box_size(b) for b in lay.boxes(shape).values()) * item
    return total


def run_refusal(c: Case, reqs: Sequence[Request], args: argparse.Namespace) -> str | None:
    """Why ``c`` cannot run here (too many devices, too little memory), or None."""
    devices = len({d for r in reqs for lay in r[2:] for d in lay.devices})
    if devices > args.max_devices:
        return (f"needs {devices} devices ({c.layout_text()}), more than --max-devices "
                f"{args.max_devices}; model it with --mode sim, or raise --max-devices")
    if args.backend in ("local", "gloo"):
        need, have = host_bytes(reqs), _available_memory()
        if have and need > 0.8 * have:
            return (f"needs about {need / 2**30:.1f} GiB of host memory for its values and "
                    f"shards, {have / 2**30:.1f} GiB available; size it with -b/-e")
    return None


def _available_memory() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def run_rows(args: argparse.Namespace, cases: Sequence[Case]) -> list[dict]:
    """Execute every case and strategy on real workers and time them (all of a case's
    tensors in one plan); cases this machine cannot hold are refused with a note."""
    rows = []
    for case in cases:
        case = case.narrowed(args.devices_per_host)
        for target in sizes(args):
            c = case if target is None else case.with_bytes(target)
            reqs, cluster = c.build_many(devices_per_host=args.devices_per_host,
                                         preset=args.cluster, **_overrides(args))
            why = run_refusal(c, reqs, args)
            if why:
                print(f"# refused {c.name} ({c.nbytes} B): {why}", flush=True)
                args.refused.append({"case": c.name, "bytes": c.nbytes, "why": why})
                continue
            rng = np.random.default_rng(1)
            values = [sample_value(shape, dtype, bound=check_bound(dtype))
                      for shape, dtype, _, _ in reqs]
            dsts = [r[3] for r in reqs]
            with reshard.Runtime(backend=args.backend, cluster=cluster, launcher=args.launcher,
                                 timeout=args.timeout) as rt:
                xs = [put_value(rt, v, r[2], rng) for v, r in zip(values, reqs)]
                for strategy in args.strategies:
                    t0 = time.perf_counter()
                    plan = rt.plan(xs, dsts, strategy)
                    t_plan = time.perf_counter() - t0
                    # the first run loads the plan; the last run's result is checked
                    secs, times, wrong = time_execute(
                        rt, plan, xs, args.iters, args.warmup, check_run=-1,
                        check=(lambda ys, vs=values: sum(count_wrong(rt, y, v) for y, v in
                                                         zip(ys, vs))) if args.check else None)
                    m = Measured(strategy, plan, secs, times, wrong, t_plan, None)
                    keys = _case_keys(c, args.cluster)
                    del keys["case"]  # measured_row's own
                    rows.append(measured_row(
                        c, reqs[0][2], reqs[0][3], m, **keys,
                        time_us=secs * 1e6, model_us=plan.estimate() * 1e6,
                        algbw=c.nbytes / secs / 1e9, busbw=plan.bytes_moved() / secs / 1e9,
                        wrong=wrong if args.check else "n/a"))
                rt.free(*xs)
    return rows


def _overrides(args: argparse.Namespace) -> dict:
    return {"nic_bandwidth": args.nic_gbps * GBIT} if args.nic_gbps else {}


def summary(rows: Sequence[dict], suite: str) -> list[str]:
    """The verdict lines: broadcast's worst model/bound (and its case), and in how many
    cases broadcast's model time is worse than a baseline's (send_recv, allgather)."""
    lines = []
    bcast = [r for r in rows if r["strategy"] == "broadcast" and "ratio" in r]
    if bcast:
        worst = max(bcast, key=lambda r: r["ratio"])
        over = sorted({r["case"] for r in bcast if r["ratio"] > GOAL_RATIO})
        lines.append(f"# broadcast model/bound: worst {worst['ratio']:.3f} ({worst['case']}, "
                     f"{worst['bytes']} B) (goal <= {GOAL_RATIO:.2f}); over the goal in "
                     f"{len(over)} cases" + (f": {', '.join(over)}" if over else ""))
    model = "time_us" if rows and "lb_us" in rows[0] else "model_us"
    by_case: dict[tuple, dict[str, float]] = {}
    for r in rows:
        by_case.setdefault((r["case"], r["bytes"]), {})[r["strategy"]] = r[model]
    baselines = [s for s in ("send_recv", "allgather") if any(s in t for t in by_case.values())]
    if any("broadcast" in t for t in by_case.values()) and baselines:
        worse = []
        for (case, nbytes), t in by_case.items():
            base = min((t[b] for b in baselines if b in t), default=None)
            if "broadcast" in t and base and t["broadcast"] > base * (1 + 1e-9):
                size = f"@{nbytes}B" if sum(k[0] == case for k in by_case) > 1 else ""
                worse.append(f"{case}{size} (+{100 * (t['broadcast'] / base - 1):.2f}%)")
        lines.append(f"# {suite}: broadcast worse than {'/'.join(baselines)} in {len(worse)} "
                     f"cases" + (f": {', '.join(worse)}" if worse else ""))
    return lines


GOAL_RATIO = 1.10
CASE_COLUMNS = [("case", "case"), ("shape", "shape"), ("bytes", "size(B)"),
                ("dtype", "dtype"), ("preset", "preset"), ("layouts", "src->dst")]
SIM_COLUMNS = CASE_COLUMNS + [
    ("strategy", "strategy"), ("tasks", "tasks"), ("time_us", "model(us)"),
    ("lb_us", "bound(us)"), ("ratio", "model/bound"), ("algbw", "algbw(GB/s)"),
    ("wrong", "#wrong")]
RUN_COLUMNS = CASE_COLUMNS + [
    ("strategy", "strategy"), ("tasks", "tasks"), ("time_us", "time(us)"),
    ("model_us", "model(us)"), ("algbw", "algbw(GB/s)"), ("busbw", "moved(GB/s)"),
    ("wrong", "#wrong")]


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
    ap.add_argument("--cluster", default=None, choices=preset_names(),
                    help="link figures of the modelled hosts (default: each case's own "
                         "preset; the paper's p3.8xlarge for the paper's cases)")
    ap.add_argument("--nic-gbps", type=float, default=None, help="override NIC Gbit/s")
    ap.add_argument("-b", "--minbytes", type=parse_size, default=None)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=None)
    ap.add_argument("-f", "--stepfactor", type=int, default=2)
    ap.add_argument("-n", "--iters", type=int, default=5)
    ap.add_argument("-w", "--warmup", type=int, default=1)
    ap.add_argument("-c", "--check", type=int, choices=(0, 1), default=1)
    ap.add_argument("--check-elements", type=int, default=1 << 14,
                    help="elements per tensor of the sim-mode correctness run")
    ap.add_argument("-J", "--json", default=None, help="write the results as JSON")
    ap.add_argument("--backend", default="gloo", choices=("local", "gloo", "nccl"))
    ap.add_argument("--launcher", default=None, choices=("thread", "process", "ray"))
    ap.add_argument("--devices-per-host", type=int, default=4)
    ap.add_argument("--max-devices", type=int, default=64,
                    help="run mode refuses cases needing more workers than this")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--planner-time", action="store_true",
                    help="also time the planner (python -m reshard.microbench.planner_time)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code (1 if any element was wrong, 2 if
    run mode refused every case)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    args.refused = []
    cases = SUITES[args.suite]()
    if args.cases:
        keep = [n.strip() for n in args.cases.split(",") if n.strip()]
        unknown = sorted(set(keep) - {c.name for c in cases})
        if unknown:
            ap.error(f"unknown case(s) {unknown} in suite {args.suite}; valid: "
                     f"{[c.name for c in cases]}")
        cases = tuple(c for c in cases if c.name in keep)
    if args.mode == "run" and args.backend == "local" and args.launcher is None:
        args.launcher = "thread"
    print(f"# reshard-bench {reshard.__version__}: suite {args.suite}, mode {args.mode}, "
          f"cluster {args.cluster or 'per case'}, strategies {','.join(args.strategies)}, "
          f"python {platform.python_version()}")
    rows = sim_rows(args, cases) if args.mode == "sim" else run_rows(args, cases)
    print(table(rows, SIM_COLUMNS if args.mode == "sim" else RUN_COLUMNS))
    wrong = sum(r["wrong"] for r in rows if isinstance(r["wrong"], int))
    for line in summary(rows, args.suite):
        print(line)
    print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    payload = {"suite": args.suite, "mode": args.mode, "cluster": args.cluster or "per case",
               "rows": rows, "refused": args.refused}
    if args.planner_time:
        prow = planner_time.run()
        print(planner_time.render(prow))
        payload["planner"] = prow
    if args.json:
        write_json(args.json, payload)
    if wrong:
        return 1
    return 2 if args.refused and not rows else 0


if __name__ == "__main__":
    sys.exit(main())
