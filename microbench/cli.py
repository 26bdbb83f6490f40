"""reshard-bench: resharding microbenchmarks in the manner of nccl-tests.

Suites: paper (the paper's n-to-m cases 1-7 and 9, and its 1-to-m; also n-to-m,
1-to-m: the published case 8 repeats case 7, so it is left out and the published
numbering kept), realistic (layout pairs of real training runs at real sizes),
weight-sync (a 7B model's parameters FSDP -> tensor parallel, all tensors in
one plan, one row), search (not moves but choices: the stage and layout search against
Megatron's and Alpa's, modelled; its own flags, listed below under "search suite").

Modes:
  sim  the cost model on a modelled cluster (each case's own preset; the paper's
       p3.8xlarge hosts for the paper's cases), so suites larger than this machine
       run; with -c 1 every case is also executed on the local reference backend and
       checked, at about --check-elements elements per tensor (column check(B)).
  run  executes the cases on real workers (--backend) and times them; cases needing
       more than --max-devices workers, or more host memory than there is, are
       refused with a note. Any of --backend, --launcher, -n, -w, --timeout,
       --max-devices selects run mode when --mode is not given.

Columns: time(us) measured (median of -n runs after -w warm-ups) and model(us) the
cost model's prediction; bound(us) the lower bound (no plan can be faster: the bytes
each host's NIC and each device must receive over its bandwidth, plus one latency);
algbw = size / time, in GB/s (1e9 bytes/s). nccl-tests' busbw is not reported: its
factor is per collective, and for a reshard the bound plays that role (bound/time =
algbw / (size / bound) is the fraction of the best possible). #wrong counts
destination elements that differ from the source's expected slice.

Exit codes: 0 done, 1 a wrong element or a failed execution, 2 a usage error, a
backend this machine lacks, or every case refused.

Examples:
  reshard-bench                              # paper suite, model + check
  reshard-bench --suite realistic -c 0
  reshard-bench --suite 1-to-m -J out.json --plot out.png
  reshard-bench --backend gloo --cases 1,7 -b 1M -e 64M -f 4 -n 5 -w 1 --devices-per-host 2
  reshard-bench --planner-time
  reshard-bench --suite search --quick       # stage and layout search vs Megatron, Alpa
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

import reshard
from reshard.errors import ExecutionError, ReshardError
from reshard.microbench import calibrate, flags, planner_time
from reshard.microbench import plot as plotting
from reshard.microbench.report import Column, Progress, Shape, Stream, machine, write_json
from reshard.microbench.suites import SUITES
from reshard.microbench.suites.paper import Case
from reshard.microbench.sweep import CaseError, Mode, Options, measure, place, simulate, sized

SCHEMA_VERSION = 1
GOAL_RATIO = 1.10
RUN_ONLY = ("backend", "launcher", "iters", "warmup", "timeout", "max_devices", "full_size")
RUN_SIZES = (1 << 20, 8 << 20)
"""Run mode's sizes without -b/-e/--full-size: a sweep one machine runs in about a
minute (nccl-tests also defaults to small sizes; the paper's cases are up to 2 GiB)."""
CASE_COLUMNS = (Column("case", "case", align="<"), Column("layouts", "src->dst", align="<"),
                Column("shape_text", "shape", align="<"), Column("bytes", "size(B)", "d"),
                Column("dtype", "dtype", align="<"), Column("hosts", "hosts", "d"),
                Column("strategy", "strategy", align="<"), Column("tasks", "tasks", "d", 5))
SIM_COLUMNS = (
    *CASE_COLUMNS,
    Column("model_us", "model(us)", ".1f", 11), Column("lb_us", "bound(us)", ".1f", 11),
    Column("model_over_bound", "model/bound", ".3f"),
    Column("model_algbw_gbps", "algbw(GB/s)", ".3f"),
    Column("checked_bytes", "check(B)", "d", 8), Column("wrong", "#wrong", "d"))
RUN_COLUMNS = (
    *CASE_COLUMNS,
    Column("measured_us", "time(us)", ".1f", 11), Column("model_us", "model(us)", ".1f", 11),
    Column("lb_us", "bound(us)", ".1f", 11), Column("measured_over_bound", "time/bound", ".3f"),
    Column("measured_algbw_gbps", "algbw(GB/s)", ".3f"), Column("wrong", "#wrong", "d"))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (the shared benchmark flags of :mod:`flags`, and this tool's
    own: ``--mode``, ``--check-elements``, ``--max-devices``, ``--planner-time``)."""
    ap = flags.parser("reshard-bench", __doc__ or "")
    ap.add_argument("--mode", choices=[m.value for m in Mode], default=None,
                    help="sim: model (default); run: execute on workers (default when a "
                         "run-mode flag is given)")
    flags.add_cases(ap, sorted([*SUITES, SEARCH]), suite="paper")
    flags.add_sizes(ap)
    flags.add_iterations(ap, iters=5, warmup=1)
    check = flags.add_check(ap)
    check.add_argument("--check-elements", type=flags.positive_int, default=1 << 14,
                       action=flags.Given, metavar="N",
                       help="sim mode: elements per tensor of the correctness run on the "
                            "local backend")
    flags.add_cluster(ap, local=True)
    workers = flags.add_runtime(ap)
    workers.add_argument("--full-size", action=flags.GivenTrue,
                         help="run mode at each case's own size (the paper's: up to 2 GiB "
                              "a case) instead of the sweep sized for one machine, "
                              f"{' and '.join(flags.human_bytes(b) for b in RUN_SIZES)}")
    workers.add_argument("--max-devices", type=flags.positive_int, default=64, metavar="N",
                         action=flags.Given,
                         help="run mode refuses cases needing more workers than this")
    output = flags.add_output(ap, plot=True)
    output.add_argument("--planner-time", action="store_true",
                        help="also time the planner (python -m "
                             "reshard.microbench.planner_time)")
    search = ap.add_argument_group(
        "search suite (--suite search only; reshard.microbench.search_bench runs it and "
        "also takes -J and --no-progress)")
    search.add_argument("--quick", action=flags.GivenTrue,
                        help="leave out the speed case (96 layers on 64 devices)")
    search.add_argument("--schedule", choices=("1f1b", "eager-1f1b"), default="1f1b",
                        action=flags.Given, help="the schedule the search's objective models")
    return ap


def _mode(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Mode:
    """``--mode``, or run when a run-mode flag is given; usage errors for flags that the
    mode would ignore."""
    run_flags = [d for d in RUN_ONLY if d in flags.given(args)]
    mode = (Mode.RUN if run_flags else Mode.SIM) if args.mode is None else Mode(args.mode)
    if mode is Mode.SIM:
        flags.refuse(ap, args, RUN_ONLY, "these apply to --mode run only (sim mode models "
                     "the plans and executes nothing but the small check); drop them or add "
                     "--mode run")
    else:
        flags.refuse(ap, args, ["check_elements"], "sim mode only: run mode checks the "
                     "measured run itself, at the size shown; drop it")
    if not args.check:
        flags.refuse(ap, args, ["check_elements"], "sizes the correctness check, and -c 0 "
                     "turns it off; drop one of them")
    return mode


def resolve(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Options, list[Case]]:
    """The sweep's options and cases from the parsed flags; a usage error (exit 2) for
    any flag that would do nothing or cannot work."""
    flags.check_sizes(ap, args)
    flags.refuse(ap, args, ["quick", "schedule"], f"these apply to --suite {SEARCH} only "
                 f"(the stage and layout search); add --suite {SEARCH} or drop them")
    mode = _mode(ap, args)
    cases = flags.pick_cases(ap, SUITES[args.suite](), args.cases, args.suite, args)
    sizes = tuple(flags.sizes(args))
    if mode is Mode.RUN and sizes == (None,) and not args.full_size:
        sizes = RUN_SIZES
    if args.full_size and sizes != (None,):
        ap.error("--full-size runs each case at its own size, and -b/-e set the sizes; "
                 "drop one of them")
    links = None
    if args.cluster == "local":
        if args.nic_gbps:
            ap.error("--nic-gbps overrides a preset's NIC, and --cluster local measures this "
                     "machine's links; drop one of them")
        counts = sorted({c.devices_needed for c in cases})
        measured = calibrate.measure_many(
            (max(1, n // 2) for n in counts),
            backend=args.backend if mode is Mode.RUN else None)
        links = tuple((n, measured[max(1, n // 2)]) for n in counts)
    opts = Options(
        mode=mode, strategies=args.strategies, sizes=sizes, links=links,
        preset=None if args.cluster == "local" else args.cluster, nic_gbps=args.nic_gbps,
        hosts=args.hosts,
        devices_per_host=args.devices_per_host, check=bool(args.check),
        check_elements=args.check_elements, iters=args.iters, warmup=args.warmup,
        backend=args.backend, launcher=args.launcher, timeout=args.timeout,
        max_devices=args.max_devices)
    for case in cases:
        try:
            place(case, opts)
        except CaseError as e:
            ap.error(str(e))
    flags.check_output_paths(ap, [args.json, args.plot])
    return opts, cases


def _environment_problem(opts: Options, plot: str | None) -> str | None:
    """What this machine lacks for the run (a backend's package or GPU, matplotlib)."""
    if plot:
        try:
            plotting.require(plot)
        except ReshardError as e:
            return str(e)
    return flags.backend_problem(opts.backend) if opts.mode is Mode.RUN else None


def _view(row: dict) -> dict:
    """A row as the table shows it (the shape of one tensor, or how many there are)."""
    shape = ("x".join(map(str, row["shape"])) if row["tensors"] == 1
             else f"{row['tensors']} tensors")
    return {**row, "shape_text": shape}


def _layout(opts: Options, cases: Sequence[Case]) -> tuple[Shape, int, set[str]]:
    """The table's shape (widths from every case's own keys), the progress total and
    the presets of the cases (a preset column only when they differ)."""
    known, steps, presets = [], 0, set()
    per_row = 1 if opts.mode is Mode.SIM else opts.runs
    for case in cases:
        for c in sized(case, opts):
            p = place(c, opts)
            presets.add(p.preset)
            known += [_view({"case": c.name, "layouts": c.layout_text(), "shape": list(c.shape),
                             "tensors": len(c.tensors), "bytes": c.nbytes,
                             "dtype": c.dtype_text,
                             "preset": p.preset, "hosts": p.cluster.num_hosts, "strategy": s})
                      for s in opts.strategies]
            steps += per_row * len(opts.strategies)
    columns: tuple[Column, ...] = SIM_COLUMNS if opts.mode is Mode.SIM else RUN_COLUMNS
    if not opts.check:
        columns = tuple(c for c in columns if c.key not in ("wrong", "checked_bytes"))
    if len(presets) > 1:
        at = [c.key for c in columns].index("hosts")
        columns = (*columns[:at], Column("preset", "preset", align="<"), *columns[at:])
    return Shape.fit(columns, known), steps, presets


def summary(rows: Sequence[dict], suite: str, mode: Mode, checked: bool) -> list[str]:
    """The verdict lines: the broadcast goal (model/bound), in how many cases broadcast
    is slower than a baseline (model; and measured in run mode), and correctness."""
    lines = []
    bcast = [r for r in rows if r["strategy"] == "broadcast" and r["model_over_bound"]]
    if bcast:
        worst = max(bcast, key=lambda r: r["model_over_bound"])
        over = list(dict.fromkeys(r["case"] for r in bcast
                                  if r["model_over_bound"] > GOAL_RATIO))
        verdict = (f"MISSED in {len(over)} of {len(bcast)} rows, case {', '.join(over)}" if over
                   else f"met in all {len(bcast)} rows")
        lines.append(f"# goal broadcast model/bound <= {GOAL_RATIO:.2f}: {verdict}; worst "
                     f"{worst['model_over_bound']:.3f} (case {worst['case']}, "
                     f"{worst['bytes']} B)")
    keys = [("model", "model_us")] + ([("measured", "measured_us")] if mode is Mode.RUN else [])
    for what, key in keys:
        line = _slower_line(rows, key)
        if line:
            lines.append(f"# {what}: {line}")
    if checked and rows:
        wrong = sum(r["wrong"] or 0 for r in rows)
        lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    elif rows:
        lines.append("# correctness not checked (-c 0)")
    return lines


def _slower_line(rows: Sequence[dict], key: str) -> str | None:
    """In how many cases broadcast's ``key`` (model or measured time) exceeds the best
    baseline's; a measured row whose plan is that baseline's own (the same tasks: the
    default chose it) is marked, its difference being the runs' spread."""
    by_case: dict[tuple, dict[str, float]] = {}
    plans: dict[tuple, dict[str, str]] = {}
    for r in rows:
        if r[key] is not None:
            by_case.setdefault((r["case"], r["bytes"]), {})[r["strategy"]] = r[key]
            plans.setdefault((r["case"], r["bytes"]), {})[r["strategy"]] = \
                r.get("tasks_digest") or ""
    baselines = [s for s in ("send_recv", "allgather") if any(s in t for t in by_case.values())]
    if not baselines or not any("broadcast" in t for t in by_case.values()):
        return None
    worse = []
    same = 0
    for (case, nbytes), t in by_case.items():
        best = min((b for b in baselines if b in t), key=lambda b: t[b], default=None)
        if "broadcast" in t and best and t["broadcast"] > t[best] * (1 + 1e-9):
            size = f" @ {nbytes} B" if sum(k[0] == case for k in by_case) > 1 else ""
            digests = plans[(case, nbytes)]
            twin = key == "measured_us" and digests["broadcast"] and \
                digests["broadcast"] == digests[best]
            same += bool(twin)
            worse.append(f"{case}{size} (+{100 * (t['broadcast'] / t[best] - 1):.1f}%"
                         f"{', same plan' if twin else ''})")
    spread = (f"; {same} of them the baseline's own plan (the runs' spread)"
              if same else "")
    return (f"broadcast slower than the best of {'/'.join(baselines)} in {len(worse)} of "
            f"{len(by_case)} cases" + (f": {', '.join(worse)}" if worse else "") + spread)


def payload(args: argparse.Namespace, opts: Options, launcher: str | None, rows: list[dict],
            refused: list[dict], lines: list[str], argv: Sequence[str], seconds: float) -> dict:
    """The JSON document (``schema_version`` 1; rows: see :mod:`sweep`)."""
    run = opts.mode is Mode.RUN
    return {
        "schema_version": SCHEMA_VERSION, "tool": "reshard-bench", "argv": list(argv),
        "suite": args.suite, "mode": opts.mode.value,
        "backend": opts.backend if run else None, "launcher": (launcher or opts.launcher) if run else None,
        "iterations": opts.iters if run else None, "warmup": opts.warmup if run else None,
        "timeout_s": opts.timeout if run else None,
        "check": opts.check, "check_backend": (opts.backend if run else "local")
        if opts.check else None,
        "check_elements": opts.check_elements if opts.check and not run else None,
        "cluster": opts.preset or "per case", "nic_gbps": opts.nic_gbps, "hosts": opts.hosts,
        "devices_per_host": opts.devices_per_host, "strategies": list(opts.strategies),
        "sizes": [s for s in opts.sizes if s is not None] or None,
        "machine": machine(), "seconds": seconds, "summary": lines,
        "rows": rows, "refused": refused,
    }


def _fail(code: int, message: str) -> int:
    print(f"reshard-bench: error: {message}", file=sys.stderr)
    return code


def _policy(backend: str) -> str:
    """``", SCHED_BATCH"`` where the backend's worker processes run under it
    (:mod:`reshard.comm.launchers.scheduling`), else nothing."""
    from reshard.comm.launchers.scheduling import for_backend

    try:
        return ", SCHED_BATCH" if for_backend(backend, os.environ) == "batch" else ""
    except (ReshardError, ValueError):
        return ""


def _header(args: argparse.Namespace, opts: Options, presets: set[str]) -> list[str]:
    """The run's header lines: what runs, on which cluster, what the columns mean."""
    where = (f"cluster {presets.pop() if len(presets) == 1 else 'per case (column preset)'}"
             + (f", {opts.hosts} hosts" if opts.hosts else "")
             + (f", {opts.devices_per_host} devices per host" if opts.devices_per_host else ""))
    how = ("the cost model" if opts.mode is Mode.SIM else
           f"{opts.backend} workers ({opts.launcher or 'default'} launcher"
           f"{_policy(opts.backend)}), median of {opts.iters} runs after {opts.warmup} "
           f"warm-up")
    first = (f"# reshard-bench {reshard.__version__}: suite {args.suite}, mode "
             f"{opts.mode.value} ({how}), {where}, strategies {','.join(opts.strategies)}")
    out = [first]
    if opts.links is not None:
        out += [f"# cluster for {n} devices: {lk.describe()}" for n, lk in opts.links]
        out.append("# each case keeps its hosts; its bound and model are of the links "
                   "measured with as many devices")
    elif opts.mode is Mode.RUN:
        out.append("# bound and model are of the modelled cluster, not of this machine "
                   "(--cluster local measures this machine's links)")
    if opts.mode is Mode.SIM and opts.check:
        out.append(f"# #wrong: every case also moved on the local backend at about "
                   f"{opts.check_elements} elements per tensor (--check-elements), or its own "
                   f"size if smaller: check(B) is the size checked")
    return out


SEARCH = "search"
"""The suite that runs :mod:`reshard.microbench.search_bench` (its own flags)."""


def _search_argv(argv: Sequence[str]) -> list[str] | None:
    """The search bench's arguments where ``--suite search`` is asked, else None."""
    for i, a in enumerate(argv):
        if a == "--suite" and i + 1 < len(argv) and argv[i + 1] == SEARCH:
            return [*argv[:i], *argv[i + 2:]]
        if a == f"--suite={SEARCH}":
            return [*argv[:i], *argv[i + 1:]]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (see the module's docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    search = _search_argv(argv)
    if search is not None:
        from reshard.microbench import search_bench

        return search_bench.main(search)
    ap = build_parser()
    args = ap.parse_args(argv)
    opts, cases = resolve(ap, args)
    problem = _environment_problem(opts, args.plot)
    if problem:
        return _fail(2, problem)
    shape, steps, presets = _layout(opts, cases)
    for line in _header(args, opts, presets):
        print(line, flush=True)
    refused: list[dict] = []
    launcher = None
    t0 = time.perf_counter()
    with Progress(steps, not args.no_progress, "reshard-bench") as progress:
        out = Stream(shape, progress, _view)
        out.start()
        try:
            if opts.mode is Mode.SIM:
                simulate(cases, opts, out)
            else:
                launcher = measure(cases, opts, out, refused)
        except ExecutionError as e:
            progress.close()
            return _fail(1, str(e))
        except ReshardError as e:
            progress.close()
            return _fail(2, str(e))
    rows = out.rows
    lines = summary(rows, args.suite, opts.mode, opts.check)
    for line in lines:
        print(line)
    doc = payload(args, opts, launcher, rows, refused, lines, argv, time.perf_counter() - t0)
    if args.planner_time:
        prow = planner_time.run()
        print(planner_time.render(prow))
        doc["planner"] = prow
    if args.json:
        write_json(args.json, doc)
    if args.plot and rows:
        plotting.plot(rows, args.plot, f"reshard-bench --suite {args.suite} "
                                       f"({opts.mode.value})")
    if any(r["wrong"] for r in rows):
        return 1
    if refused and not rows:
        return _fail(2, "every case was refused (see the notes above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
