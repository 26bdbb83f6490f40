"""Pipeline schedules with real cross-mesh transfers, next to the simulator.

Each stage is a host of the emulated testbed (a network namespace whose NIC is rate
limited with tc) holding a mesh of ``--devices-per-stage`` gloo workers; stages
alternate layouts (``S0R`` / ``RS0``), so every boundary is a real cross-mesh reshard.
Stage compute is :class:`reshard.pipeline.examples.synthetic.TimedStage` (it waits for
its compute time like a GPU stage's host thread). The activation size is chosen so
one transfer takes about ``--transfer-ratio`` forwards on the limited NIC.

For every schedule it reports the measured iteration time (median over ``--iters``
after one warm-up; from the first to the last recorded event) and two predictions of
:func:`reshard.pipeline.simulate`: *model*, with the nominal compute times and the
planner's cost model for the transfer plans on the testbed's cluster, and
*calibrated*, with the mean durations measured in the same run (compute events, and
transfers from the sender's start to the receiver's end). Without a testbed (not root, no iproute2) transfers run over loopback,
unlimited, and the table says so.

``--launcher ray`` runs the stages' workers as Ray actors on a real multi-node Ray
cluster on the testbed (:class:`~reshard.microbench.ray_cluster.RayCluster`: a Ray node
per stage's host namespace, this process the driver on host 0's node) instead of plain
processes in the namespaces (``--launcher process``, the default); it needs a testbed.

    python -m reshard.microbench.pipeline_bench --json pipeline.json --plot /tmp/tl
    python -m reshard.microbench.pipeline_bench --launcher ray
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

import reshard
from reshard.microbench.report import table, write_json
from reshard.pipeline import PipelineCosts, make_schedule, simulate
from reshard.pipeline.runtime import PipelineRuntime
from reshard.pipeline.stage import StageSpec
from reshard.pipeline.timeline import Timeline

MODULE = "reshard.pipeline.examples.synthetic:TimedStage"


def stage_specs(n_stages: int, g: int, shape: tuple[int, int], fwd: float,
                bwd: float) -> list[StageSpec]:
    """One 1-axis mesh of ``g`` devices per stage (host), layouts alternating."""
    out = []
    for s in range(n_stages):
        spec = "S0R" if s % 2 == 0 else "RS0"
        mesh = reshard.DeviceMesh((g,), devices=range(s * g, (s + 1) * g))
        out.append(StageSpec(mesh, MODULE, shape, shape, spec, spec, spec, (),
                             (("backward_s", bwd), ("forward_s", fwd))))
    return out


def _mean(durations: Sequence[float], default: float) -> float:
    return statistics.fmean(durations) if durations else default


def wire_times(tl: Timeline, send: str, recv: str, step: int) -> list[float]:
    """Per transfer, from the sender's start to the receiver's end (the runtime draws
    receives from their sender's start): a sender finishes once its bytes are in
    socket buffers, so its own event undercounts the transfer. ``step`` is +1 for
    activations (stage s -> s+1), -1 for gradients."""
    starts = {(e.stage, e.action[len(send):]): e.start for e in tl.events
              if e.stream.value == "send" and e.action.startswith(send)}
    out = []
    for e in tl.events:
        if e.stream.value == "recv" and e.action.startswith(recv):
            t0 = starts.get((e.stage - step, e.action[len(recv):]))
            if t0 is not None:
                out.append(e.end - t0)
    return out


def calibrated_costs(tl: Timeline, fwd: float, bwd: float, transfer: float) -> PipelineCosts:
    """Compute and transfer times as measured in ``tl`` (means over all stages)."""
    f = [e.duration for e in tl.events if e.stream.value == "compute" and e.action[0] == "F"]
    b = [e.duration for e in tl.events if e.stream.value == "compute" and e.action[0] == "B"]
    return PipelineCosts(forward=_mean(f, fwd), backward=_mean(b, bwd),
                         activation_transfer=_mean(wire_times(tl, "SA", "RA", 1), transfer),
                         gradient_transfer=_mean(wire_times(tl, "SG", "RG", -1), transfer))


def run(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """Measure every schedule; returns table rows and facts about the set-up."""
    from reshard.microbench import testbed

    fwd, bwd = args.forward_ms / 1e3, args.backward_ms / 1e3
    ok = testbed.available()
    rate = args.nic_mbit * 1e6 / 8
    nbytes = int(args.transfer_ratio * fwd * rate)
    rows_n = max(args.devices_per_stage, nbytes // (4 * args.width))
    shape = (int(rows_n), args.width)
    stages = stage_specs(args.stages, args.devices_per_stage, shape, fwd, bwd)
    facts = {"testbed": bool(ok), "why": ok.reason, "nic_mbit": args.nic_mbit,
             "activation_bytes": shape[0] * shape[1] * 4, "shape": shape,
             "forward_s": fwd, "backward_s": bwd}
    rows = []
    with contextlib.ExitStack() as stack:
        where: dict[str, Any] = {}
        if ok:
            tb = stack.enter_context(testbed.Testbed(args.stages, args.nic_mbit / 1e3))
            cluster = tb.cluster(args.devices_per_stage)
            where = {"netns": tb}
            if args.launcher == "ray":
                from reshard.microbench.ray_cluster import RayCluster

                where = {"address": stack.enter_context(RayCluster(tb)).address}
        else:
            cluster = reshard.Cluster.regular(args.stages, args.devices_per_stage,
                                              nic_bandwidth=rate)
        facts["launcher"] = args.launcher
        with reshard.Runtime("gloo", cluster, args.launcher, timeout=120, **where) as rt:
            for name in args.schedules:
                sched = make_schedule(name, args.stages, args.microbatches)
                pipe = PipelineRuntime(rt, stages, sched, dtype="float32", name=name)
                pipe.set_params([{} for _ in stages])
                xs = [np.ones(shape, np.float32) for _ in range(args.microbatches)]
                results = [pipe.step(xs, xs) for _ in range(args.iters + 1)][1:]
                times = [r.timeline.iteration_time for r in results]
                measured = statistics.median_low(times)
                best = results[times.index(measured)].timeline
                transfer = pipe.act_plans[0].estimate()
                model = simulate(sched, PipelineCosts(forward=fwd, backward=bwd,
                                                      activation_transfer=transfer,
                                                      gradient_transfer=pipe.grad_plans[0]
                                                      .estimate()))
                calib = simulate(sched, calibrated_costs(best, fwd, bwd, transfer))
                rows.append({
                    "schedule": name, "measured_s": measured,
                    "model_s": model.iteration_time,
                    "model_err": model.iteration_time / measured - 1,
                    "calib_s": calib.iteration_time,
                    "calib_err": calib.iteration_time / measured - 1,
                    "transfer_ms": transfer * 1e3,
                    "measured_transfer_ms": _mean(wire_times(best, "SA", "RA", 1), 0) * 1e3,
                    "peak_act": " ".join(map(str, best.peak_activations)),
                    "bubble": best.mean_bubble_fraction,
                })
                if args.plot:
                    best.plot(f"{args.plot}/{name}-measured.png", f"{name}: measured")
                    model.plot(f"{args.plot}/{name}-model.png", f"{name}: simulated")
    return rows, facts


COLUMNS = [("schedule", "schedule"), ("measured_s", "measured(s)"), ("model_s", "model(s)"),
           ("model_err", "model err"), ("calib_s", "calibrated(s)"), ("calib_err", "calib err"),
           ("transfer_ms", "plan est(ms)"), ("measured_transfer_ms", "wire(ms)"),
           ("bubble", "bubble"), ("peak_act", "peak activations/stage")]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--devices-per-stage", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--forward-ms", type=float, default=60.0)
    ap.add_argument("--backward-ms", type=float, default=120.0)
    ap.add_argument("--transfer-ratio", type=float, default=1.0,
                    help="activation transfer time / forward time on the NIC")
    ap.add_argument("--nic-mbit", type=float, default=400.0)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--schedules", default="1f1b,eager-1f1b", type=lambda s: s.split(","))
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, help="folder for timeline PNGs")
    ap.add_argument("--launcher", choices=["process", "ray"], default="process",
                    help="stage workers as plain processes in the hosts' namespaces "
                         "(default) or as Ray actors on a Ray node per host namespace")
    args = ap.parse_args(argv)
    if args.launcher == "ray":
        from reshard.microbench.testbed import available

        ok = available()
        if not ok:
            print(f"--launcher ray runs on the emulated testbed, which cannot be built "
                  f"here: {ok.reason}", file=sys.stderr)
            return 2
    # torch's TCPStore warns once per connection that reverse DNS of the testbed's
    # private addresses fails (harmless); the fork server takes the level from here.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    rows, facts = run(args)
    where = (f"testbed: {args.stages} hosts, NIC {args.nic_mbit:g} Mbit/s (tc)"
             if facts["testbed"] else f"loopback, NOT rate limited ({facts['why']})")
    print(f"# {where}; {args.devices_per_stage} gloo workers per stage ({args.launcher} "
          f"launcher); activation "
          f"{facts['shape']} float32 = {facts['activation_bytes'] / 1e6:.2f} MB; forward "
          f"{args.forward_ms:g} ms, backward {args.backward_ms:g} ms; "
          f"{args.microbatches} microbatches")
    print(table(rows, COLUMNS))
    if args.json:
        write_json(args.json, {"facts": facts, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
