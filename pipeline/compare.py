"""Side-by-side simulation of the shipped schedules on one uniform pipeline.

Run ``python -m reshard.pipeline`` for the paper's setting (4 stages, 8
microbatches, forward 1, backward 2) across transfer times: with free transfers
eager 1F1B and 1F1B take the same time; once a transfer is comparable to a forward,
1F1B stalls on it and eager 1F1B hides it, for more activations in flight on the
early stages.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from reshard.core.cliargs import add_version
from reshard.core.helptext import for_terminal
from reshard.core.tables import table
from reshard.pipeline.costs import PipelineCosts
from reshard.pipeline.generators import SCHEDULES, TRANSFER_AWARE, make_schedule
from reshard.pipeline.simulator import simulate

DEFAULT_SCHEDULES = tuple(SCHEDULES)
"""Every shipped schedule, in the registry's order (one list: generators.SCHEDULES)."""


def compare_schedules(
    n_stages: int,
    n_mb: int,
    fwd: float,
    bwd: float,
    transfer: float,
    names: Sequence[str] = DEFAULT_SCHEDULES,
    n_chunks: int = 2,
) -> list[dict[str, Any]]:
    """Simulates several schedules with the same per-stage costs.

    Every stage takes ``fwd`` per forward and ``bwd`` per backward (ZB-H1, ZB-V and
    DualPipeV split it into equal I and W halves), and every activation or gradient
    transfer between stages takes ``transfer``. The interleaved schedule runs
    ``n_chunks`` chunks per stage, the V schedules two, each chunk its share of the
    stage's compute, with a full ``transfer`` per chunk boundary (an activation has
    the same size at every layer; the turn of a V, inside its last stage, is free).

    Args:
        n_stages: Number of stages.
        n_mb: Number of microbatches.
        fwd: Forward time of a stage for one microbatch.
        bwd: Backward time of a stage for one microbatch.
        transfer: Time of one activation or gradient transfer between stages.
        names: Schedules to compare (keys of :data:`~reshard.pipeline.SCHEDULES`).
        n_chunks: Chunks per stage for ``interleaved-1f1b``.

    Returns:
        One dict per schedule, in ``names`` order, with keys ``schedule``,
        ``iteration_time``, ``bubble_fraction`` (mean over stages) and
        ``peak_activations`` (per stage, in whole-stage microbatch activations, so an
        interleaved chunk counts ``1 / n_chunks``).
    """
    rows = []
    for name in names:
        options: dict[str, Any] = {"n_chunks": n_chunks} if name == "interleaved-1f1b" else {}
        if name in TRANSFER_AWARE and fwd > 0:  # built for the transfer, in chunk forwards
            options["transfer"] = transfer / (fwd / 2)
        schedule = make_schedule(name, n_stages, n_mb, **options)
        chunks = schedule.num_chunks
        costs = PipelineCosts(
            forward=fwd / chunks, backward=bwd / chunks, activation_transfer=transfer
        )
        timeline = simulate(schedule, costs)
        peaks = timeline.peak_activations
        rows.append(
            {
                "schedule": name,
                "iteration_time": timeline.iteration_time,
                "bubble_fraction": timeline.mean_bubble_fraction,
                "peak_activations": peaks if chunks == 1 else tuple(p / chunks for p in peaks),
            }
        )
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows of :func:`compare_schedules` (or any dicts with the same keys) as aligned text
    (the one renderer, :func:`reshard.core.tables.table`)."""
    if not rows:
        return ""
    return table(rows, [(k, k, _cell) for k in rows[0]], align="<", rule=False)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, tuple):
        return " ".join(_cell(v) for v in value)
    return str(value)


def paper_transfer(activation_mb: float, src_spec: str = "RRR", dst_spec: str = "RRR",
                   mesh: tuple[int, int] = (1, 4), preset: str = "paper") -> float:
    """Seconds the planner's cost model gives for moving one fp16 activation of
    ``activation_mb`` MB between two consecutive stages of the paper's setting: each
    stage one host of 4 GPUs (p3.8xlarge, 10 Gbit/s network), activations laid out
    ``src_spec`` -> ``dst_spec`` on (1, 4) meshes, broadcast strategy."""
    import math

    from reshard.core.cluster import Cluster
    from reshard.core.layout import Layout
    from reshard.core.mesh import DeviceMesh
    from reshard.planner.plan import plan

    per_host = mesh[1]
    elems = int(activation_mb * 1e6 / 2)
    rows = max(1, int(math.sqrt(elems / 8)))
    shape = (8, rows, max(1, elems // (8 * rows)))
    cluster = Cluster.regular(2 * mesh[0], per_host, preset=preset)
    n = mesh[0] * per_host
    a = Layout(DeviceMesh(mesh, devices=range(n)), src_spec)
    b = Layout(DeviceMesh(mesh, devices=range(n, 2 * n)), dst_spec)
    return plan(shape, "float16", a, b, cluster=cluster).estimate()


def paper_setting(forward_s: float, backward_s: float, activations_mb: Sequence[float],
                  n_stages: int = 4, n_mb: int = 8,
                  names: Sequence[str] = ("1f1b", "eager-1f1b")) -> list[dict[str, Any]]:
    """1F1B vs eager 1F1B on the paper's cluster, with each boundary's transfer time
    taken from the planner's cost model for the activation size.

    Returns:
        One row per (activation size, schedule): the modelled transfer, iteration time,
        bubble fraction and peak activations per stage.
    """
    out = []
    for mb in activations_mb:
        transfer = paper_transfer(mb)
        for row in compare_schedules(n_stages, n_mb, forward_s, backward_s, transfer, names):
            out.append({"activation_MB": mb, "transfer_s": transfer, **row})
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Prints the comparison for each transfer time given on the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m reshard.pipeline", description=for_terminal(__doc__).splitlines()[0]
    )
    add_version(parser)
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--forward", type=float, default=1.0)
    parser.add_argument("--backward", type=float, default=2.0)
    parser.add_argument("--transfer", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0])
    parser.add_argument("--schedules", nargs="+", default=list(DEFAULT_SCHEDULES))
    parser.add_argument("--paper", action="store_true",
                        help="the paper's cluster: transfer times from the planner's cost "
                             "model for fp16 activations of --activation-mb MB; --forward / "
                             "--backward in seconds")
    parser.add_argument("--activation-mb", type=float, nargs="+", default=[4, 16, 32, 64])
    parser.add_argument("--torch", action="store_true",
                        help="reshard's zb-v and dualpipe-v next to torch.distributed."
                             "pipelining's own (ScheduleZBVZeroBubble, ScheduleDualPipeV) "
                             "converted into reshard's IR, simulated on the same costs "
                             "(zb-v built transfer-aware for each --transfer)")
    args = parser.parse_args(argv)
    if args.torch:
        from reshard.pipeline.torch_orders import compare_with_torch

        print(f"reshard vs torch: stages={args.stages} microbatches={args.microbatches} "
              f"forward={args.forward} backward={args.backward}")
        print(format_table(compare_with_torch(args.stages, args.microbatches, args.forward,
                                              args.backward, args.transfer)))
        return
    if args.paper:
        print(f"paper's cluster (p3.8xlarge, 10 Gbit/s): stages={args.stages} "
              f"microbatches={args.microbatches} forward={args.forward}s "
              f"backward={args.backward}s")
        print(format_table(paper_setting(args.forward, args.backward, args.activation_mb,
                                         args.stages, args.microbatches)))
        return
    for transfer in args.transfer:
        print(
            f"stages={args.stages} microbatches={args.microbatches} forward={args.forward} "
            f"backward={args.backward} transfer={transfer}"
        )
        rows = compare_schedules(
            args.stages, args.microbatches, args.forward, args.backward, transfer,
            names=args.schedules,
        )
        print(format_table(rows), end="\n\n")
