"""The search's choice and Alpa's with real bytes: both run by the pipeline runtime on
the emulated testbed, measured against the simulator.

A model scaled to this machine: ``--layers`` layers, each ``--layer-ms`` of compute
per microbatch on one device (forward a third, backward the rest), ``n`` devices
taking it in ``1 / n`` of that time plus ``--overhead`` per extra device (a data
parallel layer's collectives, as the compiler prices them); every layer takes and
gives its activation (``--rows`` x 256 float32) with its rows split over the stage's
devices (``S01R``). The cluster is the testbed's: 4 hosts (network namespaces, NICs
limited with tc to ``--nic-mbit``) of 2 gloo workers. Two choices of stages and
submeshes, by :func:`reshard.search.search_chain`: with every move priced by reshard
(``reshard``) and with moves free (``alpa``, priced after). Each stage runs
:class:`reshard.pipeline.examples.synthetic.TimedStage` (it waits its compute time and
passes its input on, so the activations and gradients of the chosen size really cross
the meshes), under 1F1B; the two alternate step by step.

Prints, for each choice, its stages, the objective, the simulator's time
(:func:`reshard.search.simulated`), the measured iteration time (median of ``-n``
steps after ``-w`` warm-up) and the simulator's error; then the measured and
simulated ratio alpa / reshard. Exit 1 if the testbed cannot be built (root and
iproute2 are needed).

Run: ``python -m reshard.microbench.search_testbed`` (about a minute here).
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
from reshard.microbench import flags
from reshard.microbench.report import Column, table, write_rows
from reshard.pipeline.generators import make_schedule
from reshard.pipeline.runtime import PipelineRuntime
from reshard.pipeline.stage import StageSpec
from reshard.search import Candidate, Choice, Layer, search_chain, simulated
from reshard.search.simulated import FORWARD_SHARE
from reshard.search.transformer import submesh_shapes

MODULE = "reshard.pipeline.examples.synthetic:TimedStage"
WIDTH = 256
SPEC = "S01R"
HOSTS, PER_HOST = 4, 2


def model(cluster: reshard.Cluster, layers: int, layer_s: float, overhead: float,
          rows: int) -> list[Layer]:
    """The scaled model (module docstring) on ``cluster``'s submesh shapes."""
    cands = {}
    for shape in submesh_shapes(cluster):
        n = shape[0] * shape[1]
        cands[shape] = (Candidate("dp", layer_s / n * (1 + overhead * (n - 1)), SPEC, SPEC),)
    return [Layer(f"l{k}", (rows, WIDTH), "float32", cands) for k in range(layers)]


def stage_specs(choice: Choice, shape: tuple[int, int]) -> list[StageSpec]:
    """One TimedStage per stage on its submesh, waiting its share of the stage's time."""
    out = []
    for st in choice.stages:
        per = st.compute + st.inner
        out.append(StageSpec(st.placement.mesh(), MODULE, shape, shape, SPEC, SPEC, SPEC, (),
                             (("backward_s", per * (1 - FORWARD_SHARE)),
                              ("forward_s", per * FORWARD_SHARE))))
    return out


def _stages(choice: Choice) -> str:
    return " | ".join(f"{s.first}-{s.last} {s.placement.shape[0]}x{s.placement.shape[1]}"
                      for s in choice.stages)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Both choices on the testbed, alternated; their rows."""
    from reshard import testbed

    with contextlib.ExitStack() as stack:
        tb = stack.enter_context(testbed.Testbed(HOSTS, args.nic_mbit / 1e3))
        cluster = tb.cluster(PER_HOST)
        layers = model(cluster, args.layers, args.layer_ms / 1e3, args.overhead, args.rows)
        choices = {"reshard": search_chain(layers, cluster, args.microbatches),
                   "alpa": search_chain(layers, cluster, args.microbatches, moves="free")}
        shape = (args.rows, WIDTH)
        rt = stack.enter_context(reshard.Runtime("gloo", cluster, "process",
                                                 timeout=args.timeout, netns=tb))
        pipes = {}
        for name, c in choices.items():
            sched = make_schedule("1f1b", len(c.stages), args.microbatches)
            pipe = PipelineRuntime(rt, stage_specs(c, shape), sched, dtype="float32",
                                   name=name)
            pipe.set_params([{} for _ in c.stages])
            pipes[name] = pipe
        xs = [np.ones(shape, np.float32) for _ in range(args.microbatches)]
        times: dict[str, list[float]] = {name: [] for name in choices}
        for k in range(args.warmup + args.iters):
            for name, pipe in pipes.items():  # alternated, step by step
                got = pipe.step(xs, xs).timeline.iteration_time
                if k >= args.warmup:
                    times[name].append(got)
        rows = []
        for name, c in choices.items():
            sim = simulated(layers, c, cluster)
            measured = statistics.median(times[name])
            rows.append({"choice": name, "stages": _stages(c), "objective_s": c.time,
                         "simulated_s": sim, "measured_s": measured,
                         "sim_err": sim / measured - 1, "steps_s": times[name]})
        return rows


COLUMNS = (Column("choice", "choice", align="<"), Column("stages", "stages", align="<"),
           Column("objective_s", "objective(s)", ".3f"),
           Column("simulated_s", "simulated(s)", ".3f"),
           Column("measured_s", "measured(s)", ".3f"), Column("sim_err", "sim err", "+.1%"))


def main(argv: Sequence[str] | None = None) -> int:
    """The table and the ratios."""
    ap = flags.parser("python -m reshard.microbench.search_testbed", __doc__ or "")
    flags.add_iterations(ap, iters=3, warmup=1)
    own = ap.add_argument_group("model and testbed")
    own.add_argument("--layers", type=flags.positive_int, default=8, metavar="L")
    own.add_argument("--layer-ms", type=flags.positive_float, default=120.0, metavar="MS",
                     help="one layer's compute per microbatch on one device")
    own.add_argument("--overhead", type=flags.positive_float, default=0.25, metavar="F",
                     help="extra compute per extra device of a stage, as a fraction")
    own.add_argument("--rows", type=flags.positive_int, default=2048, metavar="N",
                     help=f"activation rows (x {WIDTH} float32)")
    own.add_argument("--microbatches", type=flags.positive_int, default=8, metavar="B")
    own.add_argument("--nic-mbit", type=flags.positive_float, default=200.0, metavar="MBIT",
                     help="every host's NIC rate each way, Mbit/s (tc)")
    own.add_argument("--timeout", type=flags.positive_float, default=120.0, metavar="S")
    flags.add_output(ap)
    args = ap.parse_args(argv)
    flags.check_output_paths(ap, [args.json])
    from reshard.testbed import available

    ok = available()
    if not ok:
        print(f"{ap.prog}: the testbed cannot be built here: {ok.reason}", file=sys.stderr)
        return 1
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    rows = run(args)
    by = {r["choice"]: r for r in rows}
    print(f"# testbed {HOSTS} hosts x {PER_HOST} gloo workers, NIC {args.nic_mbit:g} Mbit/s; "
          f"{args.layers} layers of {args.layer_ms:g} ms, activation {args.rows}x{WIDTH} "
          f"float32 ({args.rows * WIDTH * 4 / 1e6:.2f} MB); 1F1B, {args.microbatches} "
          f"microbatches; measured = median of {args.iters} steps after {args.warmup}")
    print(table(rows, COLUMNS))
    print(f"# alpa / reshard: measured {by['alpa']['measured_s'] / by['reshard']['measured_s']:.3f}"
          f", simulated {by['alpa']['simulated_s'] / by['reshard']['simulated_s']:.3f}")
    write_rows(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
