"""reshard against torch DTensor's own ``redistribute``, side by side on one gloo group.

DTensor redistributes between placements of one mesh (across meshes it raises); on
those moves reshard must be no slower. 8 gloo processes (torch.distributed, CPU) hold a
``--size`` float32 tensor on one mesh (the 8 ranks as ``(8,)``, or ``(2, 4)`` for the
2-d moves) and run each move both ways, alternated in one run (DTensor first on even
iterations, reshard first on odd ones), every move between barriers, the slowest rank's
time; the median of ``-n`` after ``-w`` warm-up moves each. reshard runs through
:class:`reshard.adapters.dtensor_redistribute.Redistributor` (its plan cached after
the first call, as a training loop would use it); DTensor through
``DTensor.redistribute``. ``-c 1`` compares every rank's result of the two, bit for bit
(``#wrong``: ranks that differ).

The moves: all-gather (S0 -> R), all-to-all (S0 -> S1, S1 -> S0), a local slice
(R -> S0), all-reduce (P -> R), reduce-scatter (P -> S0) and, on the 2-d mesh, a
transpose of both mesh dims ((S0, S1) -> (S1, S0)) and (P, S0) -> (R, S1).

Run: ``python -m reshard.microbench.dtensor_side`` (ratio > 1: reshard faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from reshard.microbench import flags
from reshard.microbench.gloo_ranks import gloo_group, report_rows, slowest_rank, spawn_ranks
from reshard.microbench.report import Column, print_rows
from reshard.microbench.steal import cpu_times, stolen_note

WORLD = 8
MOVES: dict[str, tuple[tuple[int, ...], str, str]] = {
    "S0->R": ((8,), "S0", "R"),
    "S0->S1": ((8,), "S0", "S1"),
    "S1->S0": ((8,), "S1", "S0"),
    "R->S0": ((8,), "R", "S0"),
    "P->R": ((8,), "P", "R"),
    "P->S0": ((8,), "P", "S0"),
    "S0S1->S1S0": ((2, 4), "S0,S1", "S1,S0"),
    "PS0->RS1": ((2, 4), "P,S0", "R,S1"),
}
"""name -> (mesh shape, source placements, destination placements), one per mesh dim."""


def placements(text: str) -> list[Any]:
    """``"P,S0"`` -> ``[Partial(), Shard(0)]``."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    out: list[Any] = []
    for p in text.split(","):
        out.append(Replicate() if p == "R" else Partial() if p == "P" else Shard(int(p[1:])))
    return out


def _source(name: str, side: int, rank: int) -> Any:
    """This rank's mesh and source DTensor of move ``name``, a ``side`` x ``side``
    float32 value of small integers (sums exact in any order). A Partial source's
    addends: coordinate 0 on the partial mesh dim holds the value plus 7 per other
    addend, each other addend -7."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor

    shape, src, _ = MOVES[name]
    mesh = init_device_mesh("cpu", shape)
    gen = torch.Generator().manual_seed(1234)
    value = torch.randint(-1000, 1000, (side, side), generator=gen).to(torch.float32)
    pl = placements(src)
    if not any(p.is_partial() for p in pl):
        return mesh, distribute_tensor(value, mesh, pl, src_data_rank=None)
    # a Partial source: the Shard / Replicate dims placed as DTensor places them, the
    # partial dim's addends: coordinate 0 holds the value plus a shift the others cancel
    plain = [p if not p.is_partial() else placements("R")[0] for p in pl]
    local = distribute_tensor(value, mesh, plain, src_data_rank=None).to_local()
    coord = mesh.get_coordinate()
    assert coord is not None
    pdim = next(i for i, p in enumerate(pl) if p.is_partial())
    k, n = coord[pdim], shape[pdim]
    shift = torch.full_like(local, 7.0)
    local = local + shift * (n - 1) if k == 0 else -shift
    return mesh, DTensor.from_local(local, mesh, pl, run_check=False,
                                    shape=value.shape, stride=value.stride())


def rank_main(rank: int, store: str, report: str, args: argparse.Namespace) -> None:
    """One of the 8 ranks: every move, DTensor and reshard alternated."""
    import torch
    import torch.distributed as dist

    from reshard.adapters.dtensor_redistribute import Redistributor

    torch.set_num_threads(1)
    with gloo_group(rank, store, WORLD):
        rd = Redistributor()
        rows = []
        side = max(int((args.size // 4) ** 0.5) // 8 * 8, 8)
        for name in args.moves:
            mesh, x = _source(name, side, rank)
            dst = placements(MOVES[name][2])
            ways = {"dtensor": lambda m=mesh, x=x, p=dst: x.redistribute(m, p).to_local(),
                    "reshard": lambda m=mesh, x=x, p=dst: rd.redistribute(x, m, p).to_local()}
            times: dict[str, list[float]] = {"dtensor": [], "reshard": []}
            got: dict[str, Any] = {}
            for i in range(args.warmup + args.iters):
                order = ("dtensor", "reshard") if i % 2 == 0 else ("reshard", "dtensor")
                for way in order:
                    t, got[way] = slowest_rank(ways[way])
                    if i >= args.warmup:
                        times[way].append(t)
            wrong = torch.tensor([0 if not args.check or torch.equal(
                got["dtensor"].contiguous(), got["reshard"].contiguous()) else 1])
            dist.all_reduce(wrong)
            d, r = statistics.median(times["dtensor"]), statistics.median(times["reshard"])
            rows.append({"move": name, "mesh": "x".join(map(str, MOVES[name][0])),
                         "MB": side * side * 4 / 1e6, "dtensor_ms": d * 1e3,
                         "reshard_ms": r * 1e3, "ratio": d / r,
                         "wrong": int(wrong) if args.check else None})
        rd.close()
        report_rows(rank, report, rows)


COLUMNS = (Column("move", "move", align="<"), Column("mesh", "mesh", align="<"),
           Column("MB", "size(MB)", ".1f"), Column("dtensor_ms", "dtensor(ms)", ".1f"),
           Column("reshard_ms", "reshard(ms)", ".1f"),
           Column("ratio", "dtensor/reshard", ".2f"), Column("wrong", "#wrong"))


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (shared flags from :mod:`reshard.microbench.flags`)."""
    ap = flags.parser("python -m reshard.microbench.dtensor_side", __doc__ or "")
    flags.add_iterations(ap, iters=5, warmup=2,
                         iters_help="timed moves per way; the median is reported",
                         warmup_help="untimed moves per way first (reshard plans in the "
                                     "first)")
    g = ap.add_argument_group("moves")
    g.add_argument("--size", type=flags.parse_size, default="64M",
                   help="bytes of the float32 tensor (a square)")
    g.add_argument("--moves", type=flags.name_list, default=",".join(MOVES), metavar="A,B",
                   help=f"comma-separated, from {', '.join(MOVES)}")
    flags.add_check(ap)
    flags.add_output(ap)
    args = ap.parse_args(argv)
    flags.check_names(ap, args, "moves", MOVES)
    flags.check_output_paths(ap, [args.json])
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run every move on 8 spawned gloo processes and print the table."""
    args = parse(argv)
    before = cpu_times()
    rows = spawn_ranks(rank_main, WORLD, args)
    print(f"# DTensor.redistribute vs reshard on one mesh of 8 gloo processes on this "
          f"machine; float32; median of {args.iters}, alternated; "
          f"{stolen_note(before, cpu_times())}")
    return print_rows(args, rows, COLUMNS)


if __name__ == "__main__":
    sys.exit(main())
