"""Data-plane benchmark: the paper's n-to-m cases executed on real worker processes.

Runs every case and strategy on local gloo workers (process launcher by default)
and reports, per (case, strategy), each row as soon as it is measured:

* ``time``: median wall time of ``Runtime.execute`` over ``-n`` runs after
  ``-w`` warm-up runs (and one more, checked, first), measured in the driver (dispatch to every worker, all tasks,
  replies);
* ``GB/s``: the bytes the plan moves (``plan.bytes_moved()``: each non-copy task's
  box once, so a broadcast counts once however many receive it) over that time;
* ``dst GB/s``: the bytes the destination shards need from other devices (the same
  for every strategy, so comparable across them) over that time;
* ``vs memcpy``: that rate over the rate of one ``numpy.copyto`` of the same bytes
  in one process (a ceiling: the data plane copies at least that much, and loopback
  TCP copies it several times);
* plan-to-first-byte: ``plan`` (``Runtime.plan``, driver only), ``load`` (first
  ``Runtime.load``: the plan's JSON to every worker, parsing, gloo sub-group
  creation; cached afterwards) and ``rtt`` (median round trip of a no-op call to
  every worker at once). A first ``reshard`` of a layout pair waits about
  plan + load + rtt/2 before the workers start their first task; a repeated one
  plan + rtt/2. These are upper bounds measured from the driver, not timestamps
  taken inside the workers.

Meshes ``(n, 4)`` of the paper become ``(n, g)`` with ``g = --devices-per-host``;
the source mesh starts on host 0 and the destination on the next free host, or on
the last hosts when the cluster is too small (then the meshes overlap: case 6).

Flags are every benchmark's (:mod:`reshard.microbench.flags`): ``-b/-e/-f`` sizes
(default 256 MiB per case), ``-n/-w`` runs, ``--cases``, ``--strategies``, ``-c``,
``--hosts``, ``--devices-per-host``, ``--cluster`` (the model's link figures),
``--backend``, ``--launcher``, ``--timeout``, ``-J``.

Example::

    python -m reshard.microbench.dataplane -b 256M -J dataplane.json
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import wait
from typing import Any

import numpy as np

from reshard.cluster import Cluster
from reshard.comm.calls import Ping
from reshard.dtypes import itemsize
from reshard.errors import ExecutionError, ReshardBaseError
from reshard.layout import Layout
from reshard.microbench import flags
from reshard.microbench.measure import measure_strategies, measured_row, sample_value
from reshard.microbench.report import Column, Progress, Shape, Stream, machine, scaled, write_json
from reshard.microbench.suites.paper import Case, n_to_m_cases, preset_key
from reshard.presets import GBIT


def delivered_bytes(src: Layout, dst: Layout, shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes destination devices must receive: each destination shard minus what the
    same device already holds in the source (the same for every strategy)."""
    sboxes, total = src.boxes(shape), 0
    for d, box in dst.boxes(shape).items():
        n = math.prod(b - a for a, b in box)
        if d in sboxes:
            n -= math.prod(max(0, min(b, sb) - max(a, sa))
                           for (a, b), (sa, sb) in zip(box, sboxes[d]))
        total += n
    return total * itemsize


def memcpy_seconds(nbytes: int, runs: int) -> float:
    """Median seconds of one in-process ``numpy.copyto`` of ``nbytes``."""
    src = np.ones(max(nbytes, 1), dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(max(runs, 5)):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def round_trip_seconds(rt: Any, runs: int = 7) -> float:
    """Median round trip of a no-op call sent to every worker at once."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        futures = [rt.group.submit(d, Ping()) for d in rt.group.devices]
        wait(futures)
        for f in futures:
            f.result()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_case(rt: Any, case: Case, src: Layout, dst: Layout, strategies: Sequence[str],
               runs: int, warmup: int, rtt: float, check: bool = True,
               on_run: Callable[[], Any] | None = None) -> Iterator[dict]:
    """Measure every strategy on one case (its row as soon as it is measured)."""
    value = sample_value(case.shape, case.dtype)
    out_dtype = case.dtype if case.cast is None else case.cast.dtype
    delivered = delivered_bytes(src, dst, case.shape, itemsize(out_dtype))
    # one extra untimed run first, checked: every destination shard
    for m in measure_strategies(rt, value, src, dst, strategies, runs, warmup + 1,
                                check=check, cast=case.cast, on_run=on_run):
        seconds, moved = m.seconds, m.plan.bytes_moved()
        mc = memcpy_seconds(moved, runs)
        yield measured_row(
            case, src, dst, m, layouts=case.layout_text(), bytes_delivered=delivered,
            delivered_bytes_per_s=delivered / seconds, bytes_per_s=moved / seconds,
            memcpy_seconds=mc, memcpy_bytes_per_s=moved / mc,
            vs_memcpy=(moved / seconds) / (moved / mc),
            plan_seconds=m.plan_seconds, load_seconds=m.load_seconds, rtt_seconds=rtt,
            model_seconds=m.plan.estimate(), lower_bound_seconds=m.plan.lower_bound())


COLUMNS = (Column("case", "case", align="<"), Column("layouts", "src->dst", align="<"),
           Column("strategy", "strategy", align="<"),
           Column("tensor_bytes", "tensor MB", scaled(1e-6, ".1f")),
           Column("bytes_moved", "moved MB", scaled(1e-6, ".1f")),
           Column("seconds", "time ms", scaled(1e3, ".1f"), 8),
           Column("bytes_per_s", "GB/s", scaled(1e-9, ".2f"), 6),
           Column("delivered_bytes_per_s", "dst GB/s", scaled(1e-9, ".2f")),
           Column("memcpy_bytes_per_s", "memcpy GB/s", scaled(1e-9, ".2f")),
           Column("vs_memcpy", "vs memcpy", scaled(1, ".3f")),
           Column("plan_seconds", "plan ms", scaled(1e3, ".1f")),
           Column("load_seconds", "load ms", scaled(1e3, ".1f")),
           Column("rtt_seconds", "rtt ms", scaled(1e3, ".2f")), Column("wrong", "#wrong", "d"))


def build_parser() -> argparse.ArgumentParser:
    """The shared benchmark flags (:mod:`reshard.microbench.flags`) with this tool's
    defaults."""
    ap = flags.parser("python -m reshard.microbench.dataplane", __doc__ or "")
    flags.add_cases(ap)
    flags.add_sizes(ap, minbytes="256M")
    flags.add_iterations(ap, iters=5, warmup=1)
    flags.add_check(ap)
    flags.add_cluster(ap, hosts=4, devices_per_host=2)
    flags.add_runtime(ap, backend="gloo", timeout=300.0, backends=flags.PROCESS_PLANES,
                      launchers=("process", "ray"))
    flags.add_output(ap)
    return ap


def _measure(args: argparse.Namespace, cluster: Cluster, cases: list[tuple[Any, tuple]],
             env: dict[str, Any], out: Stream, progress: Progress, t0: float) -> None:
    """Start the workers, then measure every case (its layouts beside it) into ``out``;
    the start time and launcher go into ``env``."""
    from reshard.runtime import Runtime

    with Runtime(args.backend, cluster, args.launcher, timeout=args.timeout) as rt:
        env["start_seconds"] = time.perf_counter() - t0
        env["launcher"] = rt.launcher.value
        rtt = round_trip_seconds(rt)
        for case, (src, dst) in cases:
            progress.describe(f"case {case.name} ({case.nbytes} B)")
            for row in bench_case(rt, case, src, dst, args.strategies, args.iters,
                                  args.warmup, rtt, bool(args.check), progress.advance):
                out.row(row)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark: rows as they are measured, then a note; optionally JSON.
    Exit 1 if any element was wrong, 2 on a usage error or a backend this machine
    lacks."""
    ap = build_parser()
    args = ap.parse_args(argv)
    flags.check_sizes(ap, args)
    flags.check_output_paths(ap, [args.json])
    full = flags.pick_cases(ap, n_to_m_cases(), args.cases, "n-to-m", args)
    problem = flags.backend_problem(args.backend)
    if problem:
        print(f"{ap.prog}: error: {problem}", file=sys.stderr)
        return 2

    over = {"nic_bandwidth": args.nic_gbps * GBIT} if args.nic_gbps else {}
    cluster = Cluster.regular(args.hosts, args.devices_per_host,
                              preset=preset_key(args.cluster), **over)
    cases = [c.narrowed(args.devices_per_host).with_bytes(size)
             for c in full for size in flags.sizes(args) if size is not None]
    try:
        layouts = [c.layouts_on(cluster) for c in cases]
    except ValueError as e:
        ap.error(f"{e}; raise --hosts or --devices-per-host")

    env: dict[str, Any] = {
        "workers": len(cluster.devices), "backend": args.backend, "launcher": args.launcher,
        "cluster": str(cluster),
        "start_method": os.environ.get("RESHARD_START_METHOD", "forkserver (default)")}
    print(f"# dataplane: {env}", flush=True)
    t0 = time.perf_counter()
    shape = Shape.fit(COLUMNS, [{"case": c.name, "layouts": c.layout_text(), "strategy": s}
                                for c in cases for s in args.strategies])
    steps = len(cases) * len(args.strategies) * (args.warmup + 1 + args.iters)
    with Progress(steps, not args.no_progress, "dataplane") as progress:
        out = Stream(shape, progress)
        out.start()
        progress.describe(f"starting {len(cluster.devices)} {args.backend} workers")
        try:
            _measure(args, cluster, list(zip(cases, layouts)), env, out, progress, t0)
        except ReshardBaseError as e:
            progress.close()
            print(f"{ap.prog}: error: {e}", file=sys.stderr)
            return 1 if isinstance(e, ExecutionError) else 2
    print(f"# workers started in {env['start_seconds']:.2f}s; time = median of {args.iters} "
          f"runs after {args.warmup} warm-up; GB/s = plan.bytes_moved() / time; dst GB/s = "
          f"bytes the destination shards need from other devices / time; vs memcpy = GB/s "
          f"over one in-process numpy.copyto of the moved bytes")
    if args.json:
        write_json(args.json, {"schema_version": 1, "tool": "dataplane", "machine": machine(),
                               "environment": env, "args": flags.as_dict(args),
                               "rows": out.rows})
    return 1 if any(r["wrong"] for r in out.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
