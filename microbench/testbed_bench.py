"""The paper's n-to-m cases on the emulated multi-host testbed, measured against the model.

Builds a :class:`~reshard.microbench.testbed.Testbed` (hosts = network namespaces,
NICs = tc-limited veths), runs gloo workers inside it (process launcher), and for
every case and strategy reports:

* ``meas s``: median wall time of ``Runtime.execute`` over ``--runs`` runs after
  ``--warmup`` runs, measured in the driver;
* ``model s``: the planner's prediction, ``plan.estimate()``, on the testbed's
  cluster (NIC = the tc rate; intra-host bandwidth = the measured loopback TCP rate
  inside a namespace unless ``--intra preset``);
* ``meas/model``, and the lower bound ``bound s`` (``plan.lower_bound()``, the same
  for every strategy) with ``meas/bound``;
* ``#wrong``: destination elements that differ from the source value (checked on
  the first run of each strategy).

Meshes ``(n, 4)`` become ``(n, g)`` (``Case.narrowed(g)``, ``g = --devices-per-host``)
and are placed by ``Case.build``: the source on the first hosts, the destination on
the next ones. Each case's tensor is sized so that its broadcast plan takes about
``--seconds`` on the model.

``--launcher ray`` runs the same workers as Ray actors on a real multi-node Ray cluster
built on the testbed (:class:`~reshard.microbench.ray_cluster.RayCluster`: a Ray node
per host namespace, the head on host 0, this process its driver), instead of plain
processes (``--launcher process``, the default).

``--suite realistic`` runs instead the testbed-size members of the realistic families
(:data:`REALISTIC`): all-to-all transposes and a weight sync (a narrowed Llama-2 slice,
FSDP -> 2 x TP=2, every tensor in one plan), with the paper cases' defaults.

Example (about 3 minutes on 2 cores)::

    python -m reshard.microbench.testbed_bench --gbit 0.3 --json testbed.json
    python -m reshard.microbench.testbed_bench --suite realistic --json realistic.json
    python -m reshard.microbench.testbed_bench --launcher ray --json testbed-ray.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from reshard.cluster import Cluster
from reshard.layout import Layout
from reshard.microbench.measure import (
    Measured,
    add_case_args,
    count_wrong,
    measure_strategies,
    measured_row,
    print_rows,
    report,
    sample_value,
    selected_cases,
    time_execute,
)
from reshard.microbench.ray_cluster import RayCluster
from reshard.microbench.report import scaled
from reshard.microbench.suites.paper import Case
from reshard.microbench.suites.weight_sync import LLAMA2_7B, weight_sync_tensors
from reshard.microbench.testbed import Testbed, available
from reshard.planner.plan import plan_many
from reshard.planner.strategy import Strategy


def realistic_cases() -> list[Case]:
    """Testbed-size cases of the realistic families (meshes (n, 2); see
    :mod:`reshard.microbench.suites.realistic` for the full-size ones)."""
    slice_ = LLAMA2_7B.sliced(1).narrowed(8)
    return [
        Case("a2a-3x2", (4096, 4096), "float32", (3, 2), "S0R", (3, 2), "RS0"),
        Case("a2a-flat-2x2", (4096, 4096), "float32", (2, 2), "S01R", (2, 2), "RS10"),
        Case("rep-to-shard", (4096, 4096), "float32", (1, 2), "RR", (3, 2), "RS0"),
        Case.many("weight-sync-slice", weight_sync_tensors(slice_, "uint16"), (2, 2), (2, 2)),
    ]


REALISTIC = {c.name: c for c in realistic_cases()}


def sized(case: Case, devices_per_host: int, cluster: Callable[[int], Cluster],
          seconds: float) -> Case:
    """``case`` scaled so its broadcast plan takes about ``seconds`` on the model of
    ``cluster(num_hosts)`` (two rounds: the model is affine in the bytes, up to the
    rounding of the shape)."""
    for _ in range(2):
        built = case.cluster(devices_per_host)
        plan = plan_many(case.requests_on(built), cluster=cluster(built.num_hosts),
                         strategy="broadcast")
        case = case.with_bytes(int(case.nbytes * seconds / plan.estimate()))
    return case


def bench_many(rt: Any, case: Case, requests: Sequence[tuple], strategies: Sequence[str],
               runs: int, warmup: int) -> list[dict]:
    """Measure every strategy of a case of several tensors (one plan) on a running
    runtime; every destination shard of every tensor checked on the first run."""
    values = [sample_value(shape, dtype) for shape, dtype, _, _ in requests]
    xs = [rt.put(v, src) for v, (_, _, src, _) in zip(values, requests)]
    dsts = [dst for _, _, _, dst in requests]
    _, _, src0, dst0 = requests[0]
    rows = []
    try:
        for strategy in strategies:
            plan = rt.plan(xs, dsts, strategy)
            rt.load(plan)
            seconds, times, wrong = time_execute(
                rt, plan, xs, runs, warmup,
                check=lambda ys: sum(count_wrong(rt, y, v) for y, v in zip(ys, values)))
            m = Measured(strategy, plan, seconds, times, wrong, 0.0, None)
            rows.append(_row(case, src0, dst0, m, tensors=len(requests)))
    finally:
        rt.free(*xs)
    return rows


def bench_case(rt: Any, case: Case, src: Layout, dst: Layout, strategies: Sequence[str],
               runs: int, warmup: int) -> list[dict]:
    """Measure every strategy of one case on a running runtime."""
    value = sample_value(case.shape, case.dtype)
    return [_row(case, src, dst, m)
            for m in measure_strategies(rt, value, src, dst, strategies, runs, warmup)]


def _row(case: Case, src: Layout, dst: Layout, m: Measured, **extra: Any) -> dict:
    """:func:`measured_row` with the model's prediction and the bound beside it."""
    seconds, model, bound = m.seconds, m.plan.estimate(), m.plan.lower_bound()
    return measured_row(
        case, src, dst, m, **extra, model_seconds=model, lower_bound_seconds=bound,
        measured_over_model=seconds / model, measured_over_bound=seconds / bound,
        busiest_resource=list(m.plan.simulate().busiest))


COLUMNS = [("case", "case"), ("strategy", "strategy"),
           ("tensor_bytes", "tensor MB", scaled(1e-6, ".1f")),
           ("bytes_moved", "moved MB", scaled(1e-6, ".1f")),
           ("seconds", "meas s", scaled(1, ".3f")),
           ("model_seconds", "model s", scaled(1, ".3f")),
           ("measured_over_model", "meas/model", scaled(1, ".2f")),
           ("lower_bound_seconds", "bound s", scaled(1, ".3f")),
           ("measured_over_bound", "meas/bound", scaled(1, ".2f")), ("wrong", "#wrong")]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; prints a table, optionally writes JSON. Exit 1 on wrong
    results, 2 when no testbed can be built here."""
    ap = argparse.ArgumentParser(
        prog="python -m reshard.microbench.testbed_bench",
        description="The paper's n-to-m cases on gloo workers in network namespaces "
                    "with tc-limited NICs: measured time vs. the planner's model.")
    ap.add_argument("--gbit", type=float, default=0.3, help="NIC rate, Gbit/s (default 0.3)")
    ap.add_argument("--latency-ms", type=float, default=0.0, help="netem delay (default 0)")
    ap.add_argument("--devices-per-host", type=int, default=2,
                    help="workers per host; meshes (n, 4) become (n, this) (default 2)")
    ap.add_argument("--seconds", type=float, default=1.0,
                    help="size each case so its broadcast takes this long on the model")
    add_case_args(ap, runs=3)
    ap.add_argument("--intra", choices=["measured", "preset"], default="measured",
                    help="model's intra-host bandwidth: loopback TCP measured in a "
                         "namespace (default) or the paper preset's NVLink figure")
    ap.add_argument("--timeout", type=float, default=120.0, help="runtime timeout, seconds")
    ap.add_argument("--suite", choices=["paper", "realistic"], default="paper",
                    help="the paper's n-to-m cases (default) or the testbed-size realistic "
                         f"cases {list(REALISTIC)} (--cases then names those)")
    ap.add_argument("--launcher", choices=["process", "ray"], default="process",
                    help="workers as plain processes in the hosts' namespaces (default) or "
                         "as Ray actors on a Ray cluster with a node per host namespace")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)

    ok = available(latency=args.latency_ms > 0)
    if not ok:
        print(f"testbed unavailable: {ok.reason}", file=sys.stderr)
        return 2
    from reshard.runtime import Runtime

    # Workers' TCPStore logs a warning per connection when reverse DNS of the testbed's
    # private addresses fails (harmless). Their torch is imported by the fork server,
    # which takes the log level from this process's environment when it starts.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    if args.suite == "realistic":
        if args.cases == ap.get_default("cases"):
            args.cases = ",".join(REALISTIC)
        unknown = [n for n in args.cases.split(",") if n not in REALISTIC]
        if unknown:
            ap.error(f"unknown realistic case(s) {unknown}; valid: {list(REALISTIC)}")
        full = [REALISTIC[n] for n in args.cases.split(",")]
        strategies = [Strategy.parse(x).value for x in args.strategies.split(",") if x]
    else:
        full, strategies = selected_cases(ap, args)
    names = [c.name for c in full]
    g = args.devices_per_host
    narrowed = [c.narrowed(g) for c in full]
    hosts_needed = max(c.cluster(g).num_hosts for c in narrowed)

    env: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                           "nic_gbit_per_s": args.gbit, "latency_ms": args.latency_ms,
                           "devices_per_host": g, "hosts": hosts_needed,
                           "launcher": args.launcher}
    rows: list[dict] = []
    with contextlib.ExitStack() as stack:
        tb = stack.enter_context(Testbed(hosts_needed, args.gbit, args.latency_ms))
        where: dict[str, Any] = {"netns": tb}
        if args.launcher == "ray":
            t0 = time.perf_counter()
            rc = stack.enter_context(RayCluster(tb))
            where = {"address": rc.address}
            print(f"# {rc!r} started in {time.perf_counter() - t0:.1f}s", flush=True)
        overrides: dict[str, float] = {}
        if args.intra == "measured":
            nbytes = 64 << 20
            overrides["intra_bandwidth"] = nbytes / min(tb.measure(0, 0, nbytes)
                                                        for _ in range(3))
        env["intra_bandwidth"] = overrides.get("intra_bandwidth")
        env["testbed"] = repr(tb)

        def cluster(n: int) -> Cluster:
            intra = overrides.get("intra_bandwidth")
            if intra is None:
                return tb.cluster(g, num_hosts=n)
            return tb.cluster(g, num_hosts=n, intra_bandwidth=intra)

        cases = [sized(c, g, cluster, args.seconds) for c in narrowed]
        print(f"# testbed: {tb!r}; NIC {tb.nic_bandwidth / 1e6:.1f} MB/s each way; model "
              f"{cluster(hosts_needed)}", flush=True)
        by_hosts: dict[int, list[tuple[Case, list]]] = {}
        for c in cases:
            built = c.cluster(g)
            by_hosts.setdefault(built.num_hosts, []).append((c, c.requests_on(built)))
        for n, group in sorted(by_hosts.items()):
            t0 = time.perf_counter()
            with Runtime("gloo", cluster(n), args.launcher, timeout=args.timeout,
                         **where) as rt:
                print(f"# {n} hosts x {g} workers started in "
                      f"{time.perf_counter() - t0:.1f}s", flush=True)
                for c, requests in group:
                    if len(requests) == 1:
                        _, _, src, dst = requests[0]
                        new = bench_case(rt, c, src, dst, strategies, args.runs, args.warmup)
                    else:
                        new = bench_many(rt, c, requests, strategies, args.runs,
                                         args.warmup)
                    rows.extend(new)
                    print_rows(new, COLUMNS)
    order = {n: i for i, n in enumerate(names)}
    rows.sort(key=lambda r: (order[r["case"]], strategies.index(r["strategy"])))
    note = (f"# NIC {args.gbit:g} Gbit/s (tc tbf, each way), {g} gloo workers per host "
            f"({args.launcher} launcher); meas = "
            f"median of {args.runs} runs after {args.warmup} warm-up; model = plan.estimate() "
            f"on the testbed cluster; bound = plan.lower_bound()")
    return report(rows, COLUMNS, note, args, env)


if __name__ == "__main__":
    sys.exit(main())
