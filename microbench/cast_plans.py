"""Plans made knowing what a cast on the wire costs, against plans made blind to it, on
this machine's workers.

A cast on the wire (bfloat16 to float8 with 128x128 block scales, the format
DeepSeek-V3-style engines load) is converted by each device that sends a box, before
its step's transfers go. On CPUs converting is slower than the links, so how often an
element is converted decides the time: once, by a transfer that carries it to all its
receivers, or once per transfer that carries it. The cost model charges conversions
once the rate is known (``Cluster.cast_bandwidth``) and the lower bound counts them, so
the planner weighs them; blind to it, it picks transfers for the links alone.

The benchmark measures this machine's links (as ``reshard-bench --cluster local``), then
per case starts one runtime, measures the rate its converting devices cast at, all at
once (:func:`reshard.microbench.calibrate.runtime_cast_bandwidth`), and plans the case
twice with the broadcast strategy: on the measured cluster without the rate (blind) and
with it (aware). Both run ``-n`` times, alternated, after a warm-up each; every
destination shard is checked against the cast of the source. Printed: the medians,
aware / blind, each plan's model / measured (both modelled with the rate) and
measured / bound (the bound with the rate)::

    python -m reshard.microbench.cast_plans [--cases 5,7] [-b 16M] [-n 3] [--backend tcp]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import reshard
from reshard.dtypes import Cast
from reshard.microbench import calibrate, flags, sweep
from reshard.microbench.measure import count_wrong_all
from reshard.microbench.report import Column, print_rows, scaled
from reshard.microbench.steal import cpu_times, stolen, stolen_note
from reshard.microbench.suites.paper import n_to_m_cases

CAST = Cast.parse("float8_e4m3fn", "block128")

COLUMNS = (Column("case", "case", align="<"), Column("layouts", "src->dst", align="<"),
           Column("cast_bandwidth", "cast MB/s", scaled(1e-6, ".1f")),
           Column("blind_s", "blind ms", scaled(1e3, ".1f")),
           Column("aware_s", "aware ms", scaled(1e3, ".1f")),
           Column("aware_over_blind", "aware/blind", ".2f"),
           Column("blind_model_over_measured", "model/meas blind", ".2f"),
           Column("aware_model_over_measured", "model/meas aware", ".2f"),
           Column("aware_over_bound", "aware/bound", ".2f"), Column("wrong", "#wrong"))


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (shared flags from :mod:`reshard.microbench.flags`)."""
    ap = flags.parser("python -m reshard.microbench.cast_plans", __doc__ or "")
    flags.add_iterations(ap, iters=3, warmup=1,
                         iters_help="timed runs of each plan, alternated; the median is "
                                    "reported")
    g = ap.add_argument_group("cases")
    g.add_argument("--cases", type=flags.name_list, default="5,7", metavar="A,B",
                   help="paper cases (reshard-bench --suite n-to-m), each moved in "
                        "bfloat16 and delivered as float8_e4m3fn with 128x128 block scales")
    g.add_argument("-b", "--bytes", type=flags.parse_size, default="16M",
                   help="bytes of each case's bfloat16 tensor")
    flags.add_runtime(ap, backend="tcp", backends=flags.CPU_PLANES)
    flags.add_output(ap)
    args = ap.parse_args(argv)
    flags.check_names(ap, args, "cases", [c.name for c in n_to_m_cases()])
    flags.check_output_paths(ap, [args.json])
    return args


def _timed(rt: Any, plan: Any, xs: list[Any]) -> float:
    t0 = time.perf_counter()
    ys = rt.execute(plan, xs)
    seconds = time.perf_counter() - t0
    rt.free(*ys)
    return seconds


def measure_case(case: Any, opts: sweep.Options, iters: int, warmup: int) -> dict:
    """One case's row: both plans on one runtime, alternated."""
    p = sweep.place(sweep.sized(case, opts)[0], opts)
    before = cpu_times()
    with reshard.Runtime(backend=opts.backend, cluster=p.cluster, launcher=opts.launcher,
                         timeout=opts.timeout) as rt:
        aware_cluster = calibrate.with_cast_rate(rt, p.cluster, p.requests)
        plans = {"blind": reshard.plan_many(p.requests, cluster=p.cluster,
                                            strategy="broadcast"),
                 "aware": reshard.plan_many(p.requests, cluster=aware_cluster,
                                            strategy="broadcast")}
        values = sweep.values_of(p.requests)
        xs = [rt.put(v, r[2]) for v, r in zip(values, p.requests)]
        wrong = 0
        for plan in plans.values():  # warm-ups: the plans load; the first is checked
            ys = rt.execute(plan, xs)
            wrong += count_wrong_all(rt, ys, values, [r[4] for r in p.requests])
            rt.free(*ys)
            for _ in range(warmup - 1):
                _timed(rt, plan, xs)
        times: dict[str, list[float]] = {name: [] for name in plans}
        for i in range(iters):
            for name in (("blind", "aware") if i % 2 == 0 else ("aware", "blind")):
                times[name].append(_timed(rt, plans[name], xs))
        rt.free(*xs)
    blind, aware = (statistics.median(times[k]) for k in ("blind", "aware"))
    priced = plans["blind"].priced_on(aware_cluster)
    return {"case": p.case.name, "layouts": p.case.layout_text(),
            "cast_bandwidth": aware_cluster.cast_bandwidth,
            "blind_s": blind, "aware_s": aware, "aware_over_blind": aware / blind,
            "blind_model_over_measured": priced.estimate() / blind,
            "aware_model_over_measured": plans["aware"].estimate() / aware,
            "aware_over_bound": aware / plans["aware"].lower_bound(),
            "bound_s": plans["aware"].lower_bound(), "blind_all_s": times["blind"],
            "aware_all_s": times["aware"], "wrong": wrong,
            "cpu_steal": stolen(before, cpu_times())}


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the links, then each case, and print the table."""
    args = parse(argv)
    cases = [c.converted("bfloat16", CAST) for c in n_to_m_cases() if c.name in args.cases]
    counts = sorted({c.devices_needed for c in cases})
    measured = calibrate.measure_many((max(1, n // 2) for n in counts), backend=args.backend)
    opts = sweep.Options(mode=sweep.Mode.RUN, strategies=("broadcast",), sizes=(args.bytes,),
                         links=tuple((n, measured[max(1, n // 2)]) for n in counts),
                         backend=args.backend, launcher=args.launcher, timeout=args.timeout)
    before = cpu_times()
    rows = [measure_case(c, opts, args.iters, args.warmup) for c in cases]
    return print_rows(args, rows, COLUMNS, title=(
        f"# broadcast plans of bfloat16 -> {CAST} on this machine's {args.backend} workers "
        f"(links measured here), blind to the cast rate and aware of it; median of "
        f"{args.iters}, alternated{stolen_note(before, cpu_times())}"))


if __name__ == "__main__":
    sys.exit(main())
