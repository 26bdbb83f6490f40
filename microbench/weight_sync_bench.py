"""RL weight sync through ``redistribute_many`` vs what users write today.

The model of ``examples/rl_weight_sync.py`` (a small transformer; ``--dim``,
``--layers``, ``--vocab`` size it) is sharded FSDP-style, ``[Shard(0)]``, on 4 training
ranks and must reach Megatron's tensor-parallel layout on 4 inference ranks. 8 gloo
processes (torch.distributed, CPU) time each method, ``-n`` syncs after ``-w`` warm-up
ones, every sync between barriers, the slowest rank's time:

* ``reshard``: one ``redistribute_many`` of the whole state dict (one plan). Its
  first sync (``first``) plans, loads (communicators, scratch) and moves; the later
  ones reuse the loaded plan, so they cost only the transfer.
* ``full_bcast``: per tensor, ``full_tensor()`` on the training ranks, then training
  rank 0 broadcasts the full tensor to the inference ranks, which keep their slice.
* ``full_scatter``: per tensor, ``full_tensor()``, then rank 0 scatters each inference
  rank its own slice (replicated tensors broadcast).

``-c 1`` checks every inference shard against the full weights (DTensor's own
placement) after each method (``#wrong``: tensors that differ). ``--testbed GBIT`` runs
the 8 ranks on the emulated testbed instead (4 network namespaces, 2 ranks each,
NICs limited to GBIT Gbit/s with tc; root only; see ``reshard.testbed``).

Run: ``python -m reshard.microbench.weight_sync_bench`` (from a checkout: the model
comes from ``examples/rl_weight_sync.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import statistics
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from reshard.microbench import flags
from reshard.microbench.gloo_ranks import gloo_group, report_rows, slowest_rank, spawn_ranks
from reshard.microbench.report import Column, print_rows

WORLD = 8
TRAIN = (0, 1, 2, 3)
INFER = (4, 5, 6, 7)
METHODS = ("reshard", "full_bcast", "full_scatter")
EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "rl_weight_sync.py"


def load_example() -> ModuleType:
    """``examples/rl_weight_sync.py`` as a module (the model and its TP placements)."""
    if not EXAMPLE.is_file():
        raise SystemExit(f"weight_sync_bench: {EXAMPLE} not found; run it from a reshard "
                         f"checkout (pip install -e .), where examples/ sits next to microbench/")
    spec = importlib.util.spec_from_file_location("reshard_rl_weight_sync_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----- the methods (every rank calls each; collectives inside) -----------------------
class Sync:
    """One rank's view of the problem: meshes, the FSDP state dict, TP placements, the
    point-to-point group of training rank 0 and the inference ranks."""

    def __init__(self, ex: ModuleType, args: argparse.Namespace, rank: int) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import Shard, distribute_tensor

        self.rank = rank
        self.train = DeviceMesh("cpu", torch.tensor(TRAIN))
        self.infer = DeviceMesh("cpu", torch.tensor(INFER))
        self.full = ex.full_weights(args.vocab, args.dim, args.layers, 0)
        self.state = {n: distribute_tensor(t, self.train, [Shard(0)], src_data_rank=None)
                      for n, t in self.full.items()}
        self.placements = {n: ex.tp_placements(n) for n in self.state}
        self.fanout = dist.new_group([TRAIN[0], *INFER])
        self.nbytes = sum(t.numel() * t.element_size() for t in self.full.values())

    def reshard(self, strategy: str, rd: Any) -> dict[str, Any]:
        """One redistribute_many of the whole state dict."""
        from reshard.adapters.dtensor import redistribute_many

        out = redistribute_many(self.state, self.infer, self.placements, strategy=strategy,
                                redistributor=rd)
        return {n: dt.to_local() for n, dt in out.items()} if self.rank in INFER else {}

    def _slice(self, name: str, full: Any) -> Any:
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full, self.infer, self.placements[name],
                                 src_data_rank=None).to_local().clone()

    def full_bcast(self) -> dict[str, Any]:
        """full_tensor() on the training ranks, rank 0 broadcasts, inference slices."""
        import torch
        import torch.distributed as dist

        out = {}
        for n, dt in self.state.items():
            full = dt.full_tensor() if self.rank in TRAIN else torch.empty(dt.shape, dtype=dt.dtype)
            if self.rank == TRAIN[0] or self.rank in INFER:
                dist.broadcast(full, src=TRAIN[0], group=self.fanout)
            if self.rank in INFER:
                out[n] = self._slice(n, full)
        return out

    def full_scatter(self) -> dict[str, Any]:
        """full_tensor() on the training ranks, rank 0 scatters the slices."""
        import torch
        import torch.distributed as dist

        out = {}
        for n, dt in self.state.items():
            full = dt.full_tensor() if self.rank in TRAIN else None
            if not (self.rank == TRAIN[0] or self.rank in INFER):
                continue
            pl = self.placements[n]
            if not pl[0].is_shard():  # replicated: everyone needs all of it
                buf = full if full is not None else torch.empty(dt.shape, dtype=dt.dtype)
                dist.broadcast(buf, src=TRAIN[0], group=self.fanout)
                if self.rank in INFER:
                    out[n] = buf
                continue
            d, size = pl[0].dim, dt.shape[pl[0].dim]
            c = -(-size // len(INFER))  # torch.chunk's piece; trailing ones shorter
            lens = [max(0, min(c, size - k * c)) for k in range(len(INFER))]
            shape = list(dt.shape)
            shape[d] = c
            buf = torch.empty(shape, dtype=dt.dtype)
            pieces = None
            if self.rank == TRAIN[0]:
                assert full is not None
                pieces = [buf]  # its own slot: nothing for rank 0
                for k, n_k in enumerate(lens):  # padded to one size (gloo's scatter)
                    pad = torch.zeros(shape, dtype=dt.dtype)
                    pad.narrow(d, 0, n_k).copy_(full.narrow(d, min(k * c, size), n_k))
                    pieces.append(pad)
            dist.scatter(buf, pieces, src=TRAIN[0], group=self.fanout)
            if self.rank in INFER:
                out[n] = buf.narrow(d, 0, lens[INFER.index(self.rank)]).clone()
        return out

    def wrong(self, got: dict[str, Any]) -> int:
        """Inference shards that differ from the full weights' (0 elsewhere)."""
        import torch

        if self.rank not in INFER:
            return 0
        return sum(not torch.equal(got.get(n), self._slice(n, t))  # type: ignore[arg-type]
                   for n, t in self.full.items())


def rank_main(rank: int, store: str, report: str, args: argparse.Namespace,
              netns: Sequence[tuple[str, str]] | None, cluster: Any) -> None:
    """One of the 8 ranks: every method, ``-w`` + ``-n`` syncs each (``netns``: each
    host's namespace and NIC on the testbed; ``cluster``: its hosts and links, which
    reshard plans for, as ``Cluster.to_dict()``, else None: the ranks' host names)."""
    if netns is not None:  # the testbed: this rank's host namespace, before any thread
        from reshard.comm.launchers.netns import enter_netns

        name, ifname = netns[rank // 2]
        enter_netns(name)
        os.environ["GLOO_SOCKET_IFNAME"] = ifname
    import torch
    import torch.distributed as dist

    from reshard.adapters.dtensor_redistribute import Redistributor
    from reshard.cluster import Cluster

    cluster = None if cluster is None else Cluster.from_dict(cluster)

    torch.set_num_threads(1)
    with gloo_group(rank, store, WORLD):
        sync = Sync(load_example(), args, rank)
        rows = []
        for method in args.methods:
            for strategy in (args.strategies if method == "reshard" else ("-",)):
                rd = Redistributor(cluster=cluster) if method == "reshard" else None
                run = (lambda s=strategy, r=rd: sync.reshard(s, r)) if method == "reshard" \
                    else getattr(sync, method)
                first, got = slowest_rank(run)
                for _ in range(max(args.warmup - 1, 0)):
                    slowest_rank(run)
                times = []
                for _ in range(args.iters):
                    t, got = slowest_rank(run)
                    times.append(t)
                wrong = torch.tensor([sync.wrong(got) if args.check else 0])
                dist.all_reduce(wrong)
                if rd is not None:
                    rd.close()
                rows.append({"method": method, "strategy": strategy,
                             "tensors": len(sync.full), "MB": sync.nbytes / 1e6,
                             "first_ms": first * 1e3,
                             "time_ms": statistics.median(times) * 1e3,
                             "GBps": sync.nbytes / statistics.median(times) / 1e9,
                             "wrong": int(wrong) if args.check else None})
        report_rows(rank, report, rows)


COLUMNS = (Column("method", "method", align="<"), Column("strategy", "strategy", align="<"),
           Column("tensors", "tensors"), Column("MB", "size(MB)", ".2f"),
           Column("first_ms", "first(ms)", ".1f"), Column("time_ms", "time(ms)", ".1f"),
           Column("GBps", "algbw(GB/s)", ".3f"), Column("speedup", "vs full_bcast", ".2f"),
           Column("wrong", "#wrong"))


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (shared flags from :mod:`reshard.microbench.flags`)."""
    ap = flags.parser("python -m reshard.microbench.weight_sync_bench", __doc__ or "")
    flags.add_iterations(ap, iters=5, warmup=1,
                         iters_help="timed syncs per method; the median is reported",
                         warmup_help="untimed syncs before them, the first one reported "
                                     "as 'first' (reshard plans and loads there)")
    g = ap.add_argument_group("model and methods")
    g.add_argument("--dim", type=flags.positive_int, default=256, help="model width")
    g.add_argument("--layers", type=flags.positive_int, default=4, help="blocks")
    g.add_argument("--vocab", type=flags.positive_int, default=4096, help="vocabulary")
    g.add_argument("--methods", type=flags.name_list, default=",".join(METHODS),
                   metavar="A,B", help=f"comma-separated, from {', '.join(METHODS)}")
    g.add_argument(*flags.FLAGS["strategies"], type=flags.strategy_list,
                   default="broadcast", metavar="A,B",
                   help="reshard's strategies, from " + ", ".join(flags.STRATEGIES))
    g.add_argument("--testbed", type=flags.positive_float, default=None, metavar="GBIT",
                   help="run on the emulated testbed with NICs of GBIT Gbit/s (root)")
    flags.add_check(ap)
    flags.add_output(ap)
    args = ap.parse_args(argv)
    flags.check_names(ap, args, "methods", METHODS)
    flags.check_output_paths(ap, [args.json])
    args.warmup = max(args.warmup, 1)  # the first sync is always the 'first' column
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run every method on 8 spawned gloo processes and print the table."""
    args = parse(argv)
    load_example()  # fail early outside a checkout
    if args.testbed is None:
        rows = spawn_ranks(rank_main, WORLD, args, None, None)
    else:
        from reshard.testbed import Testbed

        with Testbed(4, args.testbed) as tb:
            hosts = [(h.netns, h.ifname) for h in tb.netns_placement().hosts]
            rows = spawn_ranks(rank_main, WORLD, args, hosts, tb.cluster(2).to_dict())
    base = {r["method"]: r["time_ms"] for r in rows}.get("full_bcast")
    for r in rows:
        r["speedup"] = base / r["time_ms"] if base else None
    where = (f"emulated testbed, 4 hosts x 2 ranks, {args.testbed:g} Gbit/s NICs"
             if args.testbed else "8 gloo processes on this machine")
    print(f"# weight sync: FSDP [Shard(0)] on ranks {list(TRAIN)} -> Megatron TP on ranks "
          f"{list(INFER)}; {where}; median of {args.iters}")
    return print_rows(args, rows, COLUMNS)


if __name__ == "__main__":
    sys.exit(main())
