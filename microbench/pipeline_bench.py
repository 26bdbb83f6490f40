"""Pipeline schedules with real cross-mesh transfers, next to the simulator.

Each stage is a host of the emulated testbed (a network namespace whose NIC is rate
limited with tc) holding a mesh of ``--devices-per-host`` gloo workers; stages
alternate layouts (``S0R`` / ``RS0``), so every boundary is a real cross-mesh reshard.
Stage compute is :class:`reshard.pipeline.examples.synthetic.TimedStage` (it waits for
its compute time like a GPU stage's host thread). The activation size is chosen so
one transfer takes about ``--transfer-ratio`` forwards on the limited NIC. Schedules
with several chunks per stage (interleaved 1F1B, ZB-V, DualPipeV) run one stage spec
per virtual stage on its stage's mesh, each chunk its share of the stage's compute;
*model* lets a stage's sends share its host's NIC (``PipelineCosts(shared_nic=True)``).

For every schedule it reports the measured iteration time (median over ``-n`` steps
after ``-w`` warm-up steps; from the first to the last recorded event) and two predictions of
:func:`reshard.pipeline.simulate`: *model*, with the nominal compute times and the
planner's cost model for the transfer plans on the testbed's cluster, and
*calibrated*, with the mean durations measured in the same run (compute events, and
transfers from the sender's start to the receiver's end). Without a testbed (not root, no iproute2) transfers run over loopback,
unlimited, and the table says so.

``--launcher ray`` runs the stages' workers as Ray actors on a real multi-node Ray
cluster on the testbed (:class:`~reshard.microbench.infra.ray_cluster.RayCluster`: a Ray node
per stage's host namespace, this process the driver on host 0's node) instead of plain
processes in the namespaces (``--launcher process``, the default); it needs a testbed.

Flags are every benchmark's where they apply (:mod:`reshard.microbench.flags`:
``-n/-w``, ``--devices-per-host``, ``--backend``, ``--launcher``, ``--timeout``, ``-J``,
``--no-progress``) plus the pipeline's own; earlier spellings of a few flags still
work and say what replaced them.

    python -m reshard.microbench.pipeline_bench -J pipeline.json --timeline-dir /tmp/tl
    python -m reshard.microbench.pipeline_bench --launcher ray
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

import reshard
from reshard.errors import ExecutionError, ReshardBaseError, ReshardError
from reshard.microbench import flags
from reshard.microbench.report import Column, Progress, Shape, Stream, machine, write_json
from reshard.pipeline import SCHEDULES, Action, PipelineCosts, Schedule, make_schedule, simulate
from reshard.pipeline.generators import TRANSFER_AWARE
from reshard.pipeline.runtime import PipelineRuntime
from reshard.pipeline.stage import StageSpec
from reshard.pipeline.timeline import Timeline

PROG = "python -m reshard.microbench.pipeline_bench"
MODULE = "reshard.pipeline.examples.synthetic:TimedStage"


def stage_specs(n_stages: int, g: int, shape: tuple[int, int], fwd: float,
                bwd: float, schedule: Any = None) -> list[StageSpec]:
    """One 1-axis mesh of ``g`` devices per stage (host), layouts alternating along the
    virtual stages; with a ``schedule`` of several chunks per stage, one spec per
    virtual stage on its physical stage's mesh, each chunk ``1 / chunks`` of the
    stage's compute."""
    out = []
    chunks = 1 if schedule is None else schedule.num_chunks
    fwd, bwd = fwd / chunks, bwd / chunks
    for v in range(n_stages * chunks):
        s = v if schedule is None else schedule.locate(v)[0]
        spec = "S0R" if v % 2 == 0 else "RS0"
        mesh = reshard.DeviceMesh((g,), devices=range(s * g, (s + 1) * g))
        out.append(StageSpec(mesh, MODULE, shape, shape, spec, spec, spec, (),
                             (("backward_s", bwd), ("forward_s", fwd))))
    return out


def _mean(durations: Sequence[float], default: float) -> float:
    return statistics.fmean(durations) if durations else default


def wire_times(tl: Timeline, schedule: Schedule, recv: str) -> list[float]:
    """Per transfer whose receives start with ``recv`` (``"RA"``, ``"RG"``), from the
    sender's start to the receiver's end (the runtime draws receives from their
    sender's start): a sender finishes once its bytes are in socket buffers, so its own
    event undercounts the transfer. The sender is the receive's peer in the schedule
    (on a V, chunk 1's activations go up the stages)."""
    starts = {(e.stage, e.action): e.start for e in tl.events if e.stream.value == "send"}
    out = []
    for e in tl.events:
        if e.stream.value == "recv" and e.action.startswith(recv):
            peer = schedule.peer(e.stage, Action.parse(e.action))
            t0 = None if peer is None else starts.get((peer[0], str(peer[1])))
            if t0 is not None:
                out.append(e.end - t0)
    return out


def calibrated_costs(tl: Timeline, schedule: Schedule, fwd: float, bwd: float,
                     transfer: float) -> PipelineCosts:
    """Compute and transfer times as measured in ``tl`` (means over all stages)."""
    f = [e.duration for e in tl.events if e.stream.value == "compute" and e.action[0] == "F"]
    b = [e.duration for e in tl.events if e.stream.value == "compute" and e.action[0] == "B"]
    return PipelineCosts(forward=_mean(f, fwd), backward=_mean(b, bwd),
                         activation_transfer=_mean(wire_times(tl, schedule, "RA"), transfer),
                         gradient_transfer=_mean(wire_times(tl, schedule, "RG"), transfer))


def run(args: argparse.Namespace, out: Stream | None = None) -> tuple[list[dict], dict]:
    """Measure every schedule (each row printed through ``out`` when done, whose
    progress bar advances every step); returns table rows and facts about the set-up."""
    from reshard import testbed

    fwd, bwd = args.forward_ms / 1e3, args.backward_ms / 1e3
    launcher = args.launcher or "process"
    ok = testbed.available()
    rate = args.nic_mbit * 1e6 / 8
    nbytes = int(args.transfer_ratio * fwd * rate)
    rows_n = max(args.devices_per_host, nbytes // (4 * args.width))
    shape = (int(rows_n), args.width)
    facts = {"testbed": bool(ok), "why": ok.reason, "nic_mbit": args.nic_mbit,
             "activation_bytes": shape[0] * shape[1] * 4, "shape": shape,
             "forward_s": fwd, "backward_s": bwd}
    rows = []
    with contextlib.ExitStack() as stack:
        where: dict[str, Any] = {}
        if ok:
            tb = stack.enter_context(testbed.Testbed(args.stages, args.nic_mbit / 1e3))
            cluster = tb.cluster(args.devices_per_host)
            where = {"netns": tb}
            if launcher == "ray":
                from reshard.microbench.infra.ray_cluster import RayCluster

                where = {"address": stack.enter_context(RayCluster(tb)).address}
        else:
            cluster = reshard.Cluster.regular(args.stages, args.devices_per_host,
                                              nic_bandwidth=rate)
        facts["launcher"] = launcher
        with reshard.Runtime("gloo", cluster, launcher, timeout=args.timeout, **where) as rt:
            for name in args.schedules:
                row = _measure_schedule(rt, name, args, shape, fwd, bwd, out)
                rows.append(row)
                if out is not None:
                    out.row(row)
    return rows, facts


def _measure_schedule(rt: Any, name: str, args: argparse.Namespace,
                      shape: tuple[int, int], fwd: float, bwd: float,
                      out: Stream | None) -> dict:
    """One schedule's row: measured, modelled, and modelled with calibrated costs."""
    # a transfer-aware order, for the transfer this run sets up: about --transfer-ratio
    # forwards of a stage, two chunk forwards on a V
    options = {"transfer": 2 * args.transfer_ratio} if name in TRANSFER_AWARE else {}
    sched = make_schedule(name, args.stages, args.microbatches, **options)
    stages = stage_specs(args.stages, args.devices_per_host, shape, fwd, bwd, sched)
    pipe = PipelineRuntime(rt, stages, sched, dtype="float32", name=name)
    pipe.set_params([{} for _ in stages])
    xs = [np.ones(shape, np.float32) for _ in range(args.microbatches)]
    results = [_step(pipe, xs, out) for _ in range(args.warmup + args.iters)]
    results = results[args.warmup:]
    times = [r.timeline.iteration_time for r in results]
    measured = statistics.median_low(times)
    best = results[times.index(measured)].timeline
    transfer = pipe.act_plans[0].estimate()
    chunks = sched.num_chunks
    model = simulate(sched, PipelineCosts(forward=fwd / chunks, backward=bwd / chunks,
                                          shared_nic=True, activation_transfer=transfer,
                                          gradient_transfer=pipe.grad_plans[0].estimate()))
    calib = simulate(sched, calibrated_costs(best, sched, fwd / chunks, bwd / chunks,
                                             transfer))
    if args.timeline_dir:
        best.plot(f"{args.timeline_dir}/{name}-measured.png", f"{name}: measured")
        model.plot(f"{args.timeline_dir}/{name}-model.png", f"{name}: simulated")
    return {
        "schedule": name, "measured_s": measured,
        "model_s": model.iteration_time,
        "model_err": model.iteration_time / measured - 1,
        "calib_s": calib.iteration_time,
        "calib_err": calib.iteration_time / measured - 1,
        "transfer_ms": transfer * 1e3,
        "measured_transfer_ms": _mean(wire_times(best, sched, "RA"), 0) * 1e3,
        "peak_act": " ".join(map(str, best.peak_activations)),
        "bubble": best.mean_bubble_fraction,
    }


def _step(pipe: PipelineRuntime, xs: list, out: Stream | None) -> Any:
    """One pipeline step (a progress bar's unit)."""
    result = pipe.step(xs, xs)
    if out is not None:
        out.progress.advance()
    return result


COLUMNS = (Column("schedule", "schedule", align="<"),
           Column("measured_s", "measured(s)", ".3f", 11), Column("model_s", "model(s)", ".3f"),
           Column("model_err", "model err", "+.1%"), Column("calib_s", "calibrated(s)", ".3f"),
           Column("calib_err", "calib err", "+.1%"),
           Column("transfer_ms", "plan est(ms)", ".1f"),
           Column("measured_transfer_ms", "wire(ms)", ".1f"), Column("bubble", "bubble", ".3f"),
           Column("peak_act", "peak activations/stage", align="<"))


def schedule_list(text: str) -> tuple[str, ...]:
    """``"1f1b,gpipe"`` -> those schedule names (keys of
    :data:`~reshard.pipeline.SCHEDULES`), duplicates dropped, in the order given."""
    names = flags.name_list(text)
    unknown = [n for n in names if n not in SCHEDULES]
    if unknown or not names:
        what = f"unknown schedule {', '.join(map(repr, unknown))}" if unknown else \
            "no schedule given"
        raise argparse.ArgumentTypeError(f"{what}; valid schedules: {', '.join(SCHEDULES)}")
    return tuple(dict.fromkeys(names))


def build_parser() -> argparse.ArgumentParser:
    """The shared benchmark flags (:mod:`reshard.microbench.flags`) that apply to a
    pipeline, then the pipeline's own."""
    ap = flags.parser(PROG, __doc__ or "")
    flags.add_iterations(ap, iters=3, warmup=1, iters_help="timed pipeline steps per "
                         "schedule; the median iteration time is reported",
                         warmup_help="untimed steps before them")
    cluster = ap.add_argument_group("cluster (one testbed host per stage)")
    cluster.add_argument("--stages", type=flags.positive_int, default=4, action=flags.Given,
                         metavar="N", help="pipeline stages, each a host of the testbed")
    cluster.add_argument(*flags.FLAGS["devices_per_host"], type=flags.positive_int, default=2,
                         action=flags.Given, metavar="G",
                         help="gloo workers per stage (its host's devices)")
    cluster.add_argument("--nic-mbit", type=flags.positive_float, default=400.0,
                         action=flags.Given, metavar="MBIT",
                         help="every host's NIC rate each way, Mbit/s (tc)")
    flags.add_runtime(ap, timeout=120.0, backends=("gloo",), launchers=("process", "ray"))
    own = ap.add_argument_group("pipeline")
    own.add_argument("--schedules", type=schedule_list, default="1f1b,eager-1f1b",
                     action=flags.Given, metavar="A,B",
                     help=f"comma-separated, from {', '.join(SCHEDULES)}")
    own.add_argument("--microbatches", type=flags.positive_int, default=8, action=flags.Given,
                     metavar="M", help="microbatches per step")
    own.add_argument("--forward-ms", type=flags.positive_float, default=60.0,
                     action=flags.Given, metavar="MS", help="every stage's forward compute")
    own.add_argument("--backward-ms", type=flags.positive_float, default=120.0,
                     action=flags.Given, metavar="MS", help="every stage's backward compute")
    own.add_argument("--transfer-ratio", type=flags.positive_float, default=1.0,
                     action=flags.Given, metavar="R",
                     help="activation transfer time / forward time on the NIC (sizes the "
                          "activation)")
    own.add_argument("--width", type=flags.positive_int, default=1024, action=flags.Given,
                     metavar="N", help="activation columns (float32)")
    output = flags.add_output(ap)
    output.add_argument("--timeline-dir", default=None, action=flags.Given, metavar="DIR",
                        help="also plot each schedule's measured and simulated timeline "
                             "as PNGs in this folder (needs matplotlib: the 'plot' extra)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: rows as they are measured, then a summary; optionally JSON. Exit 1
    when a step fails, 2 on a usage error or when ``--launcher ray`` has no testbed."""
    ap = build_parser()
    args = ap.parse_args(argv)
    flags.check_output_paths(ap, [args.json])
    if args.timeline_dir and not os.path.isdir(args.timeline_dir):
        ap.error(f"--timeline-dir {args.timeline_dir}: no such folder; create it or pick "
                 f"another")
    if args.timeline_dir and importlib.util.find_spec("matplotlib") is None:
        ap.error("--timeline-dir plots with matplotlib, which is not installed: pip install "
                 "'reshard[plot]', or leave --timeline-dir out")
    for name in args.schedules:
        try:
            make_schedule(name, args.stages, args.microbatches)
        except ReshardError as e:
            ap.error(f"--schedules {name} with --stages {args.stages} --microbatches "
                     f"{args.microbatches}: {e}")
    launcher = args.launcher or "process"
    if launcher == "ray":
        from reshard.testbed import available

        ok = available()
        if not ok:
            print(f"{ap.prog}: error: --launcher ray runs on the emulated testbed, which "
                  f"cannot be built here: {ok.reason}", file=sys.stderr)
            return 2
    # torch's TCPStore warns once per connection that reverse DNS of the testbed's
    # private addresses fails (harmless); the fork server takes the level from here.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    known = [{"schedule": n} for n in args.schedules]
    steps = len(args.schedules) * (args.warmup + args.iters)
    with Progress(steps, not args.no_progress, "pipeline") as progress:
        out = Stream(Shape.fit(COLUMNS, known), progress)
        out.start()
        try:
            rows, facts = run(args, out)
        except ReshardBaseError as e:
            progress.close()
            print(f"{ap.prog}: error: {e}", file=sys.stderr)
            return 1 if isinstance(e, ExecutionError) else 2
    where = (f"testbed: {args.stages} hosts, NIC {args.nic_mbit:g} Mbit/s (tc)"
             if facts["testbed"] else f"loopback, NOT rate limited ({facts['why']})")
    print(f"# {where}; {args.devices_per_host} gloo workers per stage ({launcher} "
          f"launcher); activation "
          f"{facts['shape']} float32 = {facts['activation_bytes'] / 1e6:.2f} MB; forward "
          f"{args.forward_ms:g} ms, backward {args.backward_ms:g} ms; "
          f"{args.microbatches} microbatches; measured = median of {args.iters} steps after "
          f"{args.warmup} warm-up")
    if args.json:
        write_json(args.json, {"schema_version": 1, "tool": "pipeline_bench",
                               "machine": machine(), "facts": facts,
                               "args": flags.as_dict(args), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
