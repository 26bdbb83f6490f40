"""The paper's n-to-m cases on the emulated multi-host testbed, measured against the model.

Builds a :class:`~reshard.testbed.Testbed` (hosts = network namespaces,
NICs = tc-limited veths), runs gloo workers inside it (``--backend tcp``: reshard's own
sockets data plane; process launcher), and for
every case and strategy reports:

* ``meas s``: median wall time of ``Runtime.execute`` over ``-n`` runs after
  ``-w`` warm-up runs, measured in the driver;
* ``model s``: the planner's prediction, ``plan.estimate()``, on the testbed's
  cluster (NIC = the tc rate; intra-host bandwidth = the measured loopback TCP rate
  inside a namespace unless ``--intra preset``);
* ``meas/model``, and the lower bound ``bound s`` (``plan.lower_bound()``, the same
  for every strategy) with ``meas/bound``;
* ``#wrong``: destination elements that differ from the source value (checked on
  the first run of each strategy; ``-c 0``: not checked).

Meshes ``(n, 4)`` become ``(n, g)`` (``Case.narrowed(g)``, ``g = --devices-per-host``)
and are placed as ``Case.meshes_on`` says: the source on the first hosts, the
destination on the next ones, or on the last hosts when ``--hosts`` is too small for
both (then the meshes share hosts). Without ``--hosts`` each case gets just the hosts
it needs. Each case's tensor is sized so that its broadcast plan takes about
``--seconds`` on the model.

``--backend tcp,nixl,gloo`` runs several CPU data planes side by side: a runtime of each
on the same testbed, every case measured on each in turn (the order reversed from one
case to the next), each row naming its backend, and a summary of each one's seconds
over the first's and its model / measured.

``--launcher ray`` runs the same workers as Ray actors on a real multi-node Ray cluster
built on the testbed (:class:`~reshard.microbench.infra.ray_cluster.RayCluster`: a Ray node
per host namespace, the head on host 0, this process its driver), instead of plain
processes (``--launcher process``, the default).

``--suite realistic`` runs instead the testbed-size members of the realistic families
(:func:`realistic_cases`): all-to-all transposes, a broadcast to four hosts, a weight sync
(a narrowed Llama-2 slice, FSDP -> 2 x TP=2, every tensor in one plan) and a partial sum
reduced on its way, with the paper cases' defaults.

Flags are every benchmark's (:mod:`reshard.microbench.flags`: ``-n/-w``, ``--suite``,
``--cases``, ``--strategies``, ``-c``, ``--hosts``, ``--devices-per-host``,
``--launcher``, ``--timeout``, ``-J``, ``--no-progress``) plus the testbed's own
(``--gbit``, ``--latency-ms``, ``--seconds``, ``--intra``).

Example (about 3 minutes on 2 cores)::

    python -m reshard.microbench.testbed_bench --gbit 0.3 -J testbed.json
    python -m reshard.microbench.testbed_bench --suite realistic -J realistic.json
    python -m reshard.microbench.testbed_bench --launcher ray -J testbed-ray.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from reshard.cluster import Cluster
from reshard.errors import ExecutionError, ReshardError
from reshard.layout import Layout
from reshard.microbench import calibrate, flags
from reshard.microbench.infra.ray_cluster import RayCluster
from reshard.microbench.measure import (
    Measured,
    count_wrong_all,
    measure_strategies,
    measured_row,
    sample_value,
    time_execute,
)
from reshard.microbench.report import Column, Progress, Shape, Stream, machine, scaled, write_json
from reshard.microbench.steal import NOISY, cpu_times, stolen
from reshard.microbench.suites.paper import Case, n_to_m_cases
from reshard.microbench.suites.weight_sync import FP8_BLOCK, LLAMA2_7B, weight_sync_tensors
from reshard.planner.plan import plan_many
from reshard.testbed import Testbed, available

PROG = "python -m reshard.microbench.testbed_bench"
INTRA = ("measured", "preset")


def realistic_cases() -> list[Case]:
    """Testbed-size cases of the realistic families (meshes (n, 2); see
    :mod:`reshard.microbench.suites.realistic` for the full-size ones)."""
    slice_ = LLAMA2_7B.sliced(1).narrowed(8)
    return [
        Case("a2a-3x2", (4096, 4096), "float32", (3, 2), "S0R", (3, 2), "RS0"),
        Case("a2a-flat-2x2", (4096, 4096), "float32", (2, 2), "S01R", (2, 2), "RS10"),
        Case("rep-to-shard", (4096, 4096), "float32", (1, 2), "RR", (3, 2), "RS0"),
        # one device to four hosts (bandwidth-bound here: a chain; see planner TREE_GAIN)
        Case("1-to-4x2", (4096, 4096), "float32", (1, 1), "RR", (4, 2), "RR"),
        Case.many("weight-sync-slice", weight_sync_tensors(slice_, "bfloat16"), (2, 2), (2, 2)),
        # the same weights to a block-fp8 engine: linear layers cast at the source
        Case.many("weight-sync-slice-fp8", weight_sync_tensors(slice_, "bfloat16", FP8_BLOCK),
                  (2, 2), (2, 2)),
        # row-parallel partial sums -> the next stage split by columns: each reduction
        # fused with its delivery (gloo sums piece by piece on the way)
        Case("partial-2x2", (4096, 4096), "float32", (2, 2), "S0R+P1", (2, 2), "RS0"),
    ]


SUITES: dict[str, Callable[[], Sequence[Case]]] = {"paper": n_to_m_cases,
                                                   "realistic": realistic_cases}


def sized(case: Case, hosts: int, cluster: Callable[[int], Cluster], seconds: float) -> Case:
    """``case`` scaled so its broadcast plan takes about ``seconds`` on the model of
    ``cluster(hosts)`` (two rounds: the model is affine in the bytes, up to the
    rounding of the shape)."""
    for _ in range(2):
        built = cluster(hosts)
        plan = plan_many(case.requests_on(built), cluster=built, strategy="broadcast")
        case = case.with_bytes(int(case.nbytes * seconds / plan.estimate()))
    return case


def bench_many(rt: Any, case: Case, requests: Sequence[tuple], strategies: Sequence[str],
               runs: int, warmup: int, check: bool = True,
               on_run: Callable[[], Any] | None = None,
               model: Cluster | None = None) -> list[dict]:
    """Measure every strategy of a case of several tensors (one plan) on a running
    runtime; every destination shard of every tensor checked on the first run (unless
    not ``check``); ``on_run`` is called after every run; ``model``: the cluster the
    plans are made for and priced on (the runtime's where None: with figures measured
    since it started, such as a cast rate, the planner weighs them)."""
    values = [sample_value(shape, dtype) for shape, dtype, *_ in requests]
    xs = [rt.put(v, r[2]) for v, r in zip(values, requests)]
    casts = [r[4] if len(r) > 4 else None for r in requests]
    src0, dst0 = requests[0][2], requests[0][3]

    def wrong(ys: list) -> int:
        return count_wrong_all(rt, ys, values, casts)

    rows = []
    try:
        for strategy in strategies:
            plan = plan_many(requests, cluster=model or rt.cluster, strategy=strategy)
            rt.load(plan)
            seconds, times, bad = time_execute(rt, plan, xs, runs, warmup,
                                               check=wrong if check else None, on_run=on_run)
            m = Measured(strategy, plan, seconds, times, bad, 0.0, None)
            rows.append(_row(case, src0, dst0, m, model, tensors=len(requests)))
    finally:
        rt.free(*xs)
    return rows


def bench_case(rt: Any, case: Case, src: Layout, dst: Layout, strategies: Sequence[str],
               runs: int, warmup: int, check: bool = True,
               on_run: Callable[[], Any] | None = None,
               model: Cluster | None = None) -> list[dict]:
    """Measure every strategy of one case on a running runtime (``model``: as
    :func:`bench_many`'s)."""
    value = sample_value(case.shape, case.dtype)
    return [_row(case, src, dst, m, model)
            for m in measure_strategies(rt, value, src, dst, strategies, runs, warmup,
                                        check=check, cast=case.cast, on_run=on_run)]


def _row(case: Case, src: Layout, dst: Layout, m: Measured, model: Cluster | None = None,
         **extra: Any) -> dict:
    """:func:`measured_row` with the model's prediction (on ``model`` where given: the
    runtime's cluster with figures measured since it started) and the bound beside it."""
    costed = m.plan if model is None else m.plan.priced_on(model)
    seconds, predicted, bound = m.seconds, costed.estimate(), costed.lower_bound()
    if model is not None and model.cast_bandwidth:
        extra["cast_bandwidth"] = model.cast_bandwidth
    return measured_row(
        case, src, dst, m, **extra, layouts=case.layout_text(), model_seconds=predicted,
        lower_bound_seconds=bound, measured_over_model=seconds / predicted,
        measured_over_bound=seconds / bound, busiest_resource=list(costed.simulate().busiest))


COLUMNS = (Column("case", "case", align="<"), Column("layouts", "src->dst", align="<"),
           Column("strategy", "strategy", align="<"), Column("backend", "backend", align="<"),
           Column("tensor_bytes", "tensor MB", scaled(1e-6, ".1f")),
           Column("bytes_moved", "moved MB", scaled(1e-6, ".1f")),
           Column("seconds", "meas s", scaled(1, ".3f"), 6),
           Column("model_seconds", "model s", scaled(1, ".3f")),
           Column("measured_over_model", "meas/model", scaled(1, ".2f")),
           Column("lower_bound_seconds", "bound s", scaled(1, ".3f")),
           Column("measured_over_bound", "meas/bound", scaled(1, ".2f")),
           Column("wrong", "#wrong"),
           Column("cpu_steal", "steal%", scaled(100, ".0f")))


def build_parser() -> argparse.ArgumentParser:
    """The shared benchmark flags (:mod:`reshard.microbench.flags`) with this tool's
    defaults, then the testbed's own."""
    ap = flags.parser(PROG, __doc__ or "")
    flags.add_cases(ap, tuple(SUITES), suite="paper")
    flags.add_iterations(ap, iters=3, warmup=1)
    flags.add_check(ap)
    flags.add_cluster(ap, devices_per_host=2, presets=False)
    flags.add_runtime(ap, timeout=120.0, launchers=("process", "ray"), several=True)
    flags.add_output(ap)
    g = ap.add_argument_group("testbed")
    g.add_argument("--gbit", type=flags.positive_float, default=0.3, action=flags.Given,
                   metavar="GBIT", help="every host's NIC rate each way, Gbit/s (tc tbf)")
    g.add_argument("--latency-ms", type=flags.natural_float, default=0.0, action=flags.Given,
                   metavar="MS", help="netem delay added on every NIC, milliseconds")
    g.add_argument("--seconds", type=flags.positive_float, default=1.0, action=flags.Given,
                   metavar="S",
                   help="size each case so its broadcast plan takes this long on the model")
    g.add_argument("--intra", choices=INTRA, default="measured", action=flags.Given,
                   help="the model's intra-host bandwidth: loopback TCP measured inside a "
                        "namespace, or the paper preset's NVLink figure")
    return ap


def _placed(ap: argparse.ArgumentParser, cases: Sequence[Case], hosts: int | None,
            g: int) -> list[int]:
    """Each case's host count (``hosts``, else just enough); a usage error for a case
    whose meshes do not fit ``hosts``."""
    counts = [hosts or c.hosts_needed for c in cases]
    for c, n in zip(cases, counts):
        try:
            c.meshes_on(Cluster.regular(n, g))
        except ValueError as e:
            ap.error(f"--hosts {n}: {e}; raise --hosts or leave it out (each case then "
                     f"gets the hosts it needs)")
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark: rows as they are measured, then a note; optionally JSON.
    Exit 1 on wrong results, 2 on a usage error or when no testbed can be built here."""
    ap = build_parser()
    args = ap.parse_args(argv)
    flags.check_output_paths(ap, [args.json])
    full = flags.pick_cases(ap, SUITES[args.suite](), args.cases, args.suite, args)
    g = args.devices_per_host
    narrowed = [c.narrowed(g) for c in full]
    counts = _placed(ap, narrowed, args.hosts, g)
    ok = available(latency=args.latency_ms > 0)
    if not ok:
        print(f"{ap.prog}: error: testbed unavailable: {ok.reason}", file=sys.stderr)
        return 2
    launcher = args.launcher or "process"
    # Workers' TCPStore logs a warning per connection when reverse DNS of the testbed's
    # private addresses fails (harmless). Their torch is imported by the fork server,
    # which takes the log level from this process's environment when it starts.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        rows, env = _run(args, launcher, narrowed, counts)
    except ExecutionError as e:
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 1
    except ReshardError as e:
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 2
    print(f"# NIC {args.gbit:g} Gbit/s (tc tbf, each way), {g} {'/'.join(args.backend)} "
          f"workers per host ({launcher} launcher); meas = median of {args.iters} runs after "
          f"{args.warmup} warm-up; model = plan.estimate() on the testbed cluster; bound = "
          f"plan.lower_bound()" + ("" if args.check else "; -c 0: results not checked"))
    for line in side_by_side(rows, args.backend):
        print(line)
    shares = [r["cpu_steal"] for r in rows if r.get("cpu_steal") is not None]
    if shares and max(shares) > NOISY:
        print(f"# steal% = CPU time the hypervisor gave to other guests during the case "
              f"(/proc/stat); up to {100 * max(shares):.0f}% here: above "
              f"{100 * NOISY:.0f}% this machine's timings are not to be trusted")
    order = {c.name: i for i, c in enumerate(full)}
    rows.sort(key=lambda r: (order[r["case"]], args.strategies.index(r["strategy"]),
                             args.backend.index(r["backend"])))
    if args.json:
        write_json(args.json, {"schema_version": 1, "tool": "testbed_bench",
                               "machine": machine(), "environment": env,
                               "args": flags.as_dict(args), "rows": rows})
    return 1 if any(r["wrong"] for r in rows) else 0


def _run(args: argparse.Namespace, launcher: str, narrowed: Sequence[Case],
         counts: Sequence[int]) -> tuple[list[dict], dict[str, Any]]:
    """Build the testbed (and Ray cluster), measure every case; the rows and facts."""
    from reshard.runtime import Runtime

    g, hosts = args.devices_per_host, max(counts)
    env: dict[str, Any] = {"nic_gbit_per_s": args.gbit, "latency_ms": args.latency_ms,
                           "devices_per_host": g, "hosts": hosts, "launcher": launcher}
    known = [{"case": c.name, "layouts": c.layout_text(), "strategy": s, "backend": b}
             for c in narrowed for s in args.strategies for b in args.backend]
    steps = len(known) * (args.warmup + args.iters)
    with contextlib.ExitStack() as stack:
        progress = stack.enter_context(Progress(steps, not args.no_progress, "testbed"))
        out = Stream(Shape.fit(COLUMNS, known), progress)
        progress.describe(f"building the testbed ({hosts} hosts)")
        tb = stack.enter_context(Testbed(hosts, args.gbit, args.latency_ms))
        where: dict[str, Any] = {"netns": tb}
        if launcher == "ray":
            t0 = time.perf_counter()
            rc = stack.enter_context(RayCluster(tb))
            where = {"address": rc.address}
            out.note(f"# {rc!r} started in {time.perf_counter() - t0:.1f}s")
        intra: float | None = None
        if args.intra == "measured":
            nbytes = 64 << 20
            intra = nbytes / min(tb.measure(0, 0, nbytes) for _ in range(3))
        env["intra_bandwidth"] = intra
        env["testbed"] = repr(tb)

        def cluster(n: int) -> Cluster:
            if intra is None:
                return tb.cluster(g, num_hosts=n)
            return tb.cluster(g, num_hosts=n, intra_bandwidth=intra)

        cases = [sized(c, n, cluster, args.seconds) for c, n in zip(narrowed, counts)]
        out.note(f"# testbed: {tb!r}; NIC {tb.nic_bandwidth / 1e6:.1f} MB/s each way; model "
                 f"{cluster(hosts)}")
        by_hosts: dict[int, list[Case]] = {}
        for c, n in zip(cases, counts):
            by_hosts.setdefault(n, []).append(c)
        out.start()
        for n, group in sorted(by_hosts.items()):
            t0 = time.perf_counter()
            progress.describe(f"starting {n * g} workers per backend")
            with contextlib.ExitStack() as running:
                rts = {b: running.enter_context(Runtime(b, cluster(n), launcher,
                                                        timeout=args.timeout, **where))
                       for b in args.backend}
                out.note(f"# {n} hosts x {g} workers ({'/'.join(rts)}) started in "
                         f"{time.perf_counter() - t0:.1f}s")
                for k, c in enumerate(group):
                    progress.describe(f"case {c.name}")
                    # every case on each backend in turn, the order reversed each case
                    for b in (args.backend if k % 2 == 0 else args.backend[::-1]):
                        for r in _measure_case(rts[b], c, cluster(n), args, progress.advance):
                            out.row({**r, "backend": b})
    return out.rows, env


def side_by_side(rows: Sequence[dict], backends: Sequence[str]) -> list[str]:
    """With several backends: per case and strategy, each backend's seconds over the
    first's, and the range of model / measured for each backend."""
    if len(backends) < 2:
        return []
    first = backends[0]
    base = {(r["case"], r["strategy"]): r["seconds"] for r in rows if r["backend"] == first}
    lines = []
    for b in backends[1:]:
        ratios = [f"{r['case']} {r['seconds'] / base[(r['case'], r['strategy'])]:.2f}"
                  for r in rows if r["backend"] == b and (r["case"], r["strategy"]) in base]
        lines.append(f"# {b} / {first}: " + ", ".join(ratios))
    for b in backends:
        fits = [r["model_seconds"] / r["seconds"] for r in rows if r["backend"] == b]
        if fits:
            lines.append(f"# model / measured, {b}: {min(fits):.2f}-{max(fits):.2f}")
    return lines


def _measure_case(rt: Any, c: Case, cluster: Cluster, args: argparse.Namespace,
                  advance: Any) -> list[dict]:
    """One case's rows on a running ``rt``, each with the CPU steal of its run."""
    before = cpu_times()
    requests = c.requests_on(cluster)
    model = calibrate.with_cast_rate(rt, cluster, requests, c.cast)
    if len(requests) == 1:
        src, dst = requests[0][2], requests[0][3]
        new = bench_case(rt, c, src, dst, args.strategies, args.iters, args.warmup,
                         bool(args.check), advance, model)
    else:
        new = bench_many(rt, c, requests, args.strategies, args.iters, args.warmup,
                         bool(args.check), advance, model)
    share = stolen(before, cpu_times())
    for r in new:
        r["cpu_steal"] = share
    return list(new)


if __name__ == "__main__":
    sys.exit(main())
