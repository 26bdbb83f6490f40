"""Stage and layout search: reshard's choice against Megatron's and Alpa's (modelled).

Models: GPT configurations of Alpa's benchmark suite
(:data:`reshard.search.transformer.ALPA_SUITE`; layers' candidates from the analytical
model there: FLOPs over peak, each layout's collectives priced by reshard), a
U-Transformer of the same layers with skip connections (:mod:`reshard.search.unet`,
the case in Alpa's paper where cross-mesh resharding mattered most) and a MoE model
(:mod:`reshard.search.moe`: dense and expert layers in turn, expert parallelism's
all-to-alls priced by reshard), on the paper's cluster (aws-p3.8xlarge: 4 V100 a host,
10 Gbit/s between hosts) and on DGX H100 hosts. Three choices, each priced by the same
objective with every move costed by reshard (:mod:`reshard.search.chain`; on the
U-Transformer every skip connection too, :mod:`reshard.search.graph`):

* ``megatron``: equal stages on equal submeshes, one candidate on every layer of a
  kind, the best stage count and candidates (:func:`reshard.search.baselines.uniform`);
* ``alpa``: the stage DP with moves free while choosing (Alpa's stage DP prices
  none), its choice then priced;
* ``reshard``: the stage DP with every move priced (on a graph: the chain DP's best
  few stage choices and the moves-free one, layouts by coordinate descent).

Every choice holds within the device's memory (:data:`MEMORY`: weights, gradients and
Adam state of its layers, and the activations of the microbatches in flight).

Prints each choice's iteration time by the objective and by the pipeline simulator
(``sim``), the ratios of simulated times (> 1: reshard faster), and the CPU seconds to
build the candidates and to search; exits 1 if reshard's choice simulates slower than
either baseline anywhere (its answer is the simulator's pick among the DP's best few
and both baselines' choices, so it never should). The last row is the speed case: a
96-layer GPT on 64 H100s.

Run: ``python -m reshard.microbench.search_bench`` (about two minutes here); also
``reshard-bench --suite search``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from typing import Any

from reshard.cluster import Cluster
from reshard.errors import SearchError
from reshard.microbench import flags
from reshard.microbench.report import Column, table, write_rows
from reshard.planner.estimates import CostCache
from reshard.search import (
    Choice,
    Graph,
    Layer,
    evaluate_graph,
    search_chain,
    search_graph,
    search_replicated,
    simulated,
)
from reshard.search.baselines import uniform
from reshard.search.kinds import SEARCH_SCHEDULES
from reshard.search.moe import MoE, moe_layers
from reshard.search.replicas import replica_cluster, replicated_layers
from reshard.search.transformer import ALPA_SUITE, GPT, gpt_layers, submesh_shapes
from reshard.search.unet import u_transformer

PEAK = {"aws-p3.8xlarge": 125e12, "dgx-h100": 989e12}
"""Dense fp16 / bf16 peak FLOP/s of one device of each preset (V100, H100)."""

MEMORY = {"aws-p3.8xlarge": 16 << 30, "dgx-h100": 80 << 30}
"""Each preset's device memory (V100 16 GB, H100 80 GB): every choice holds within it."""

MODELS: dict[str, GPT] = {**{m.name: m for m in ALPA_SUITE},
                          "gpt-96l": GPT("gpt-96l", 96, 4096, 32),
                          "gpt3-175b": GPT("gpt3-175b", 96, 12288, 96, seq=2048,
                                           microbatch=1, batch=1536)}
"""The GPTs by name (the suite's, a 96-layer one for the speed case, and GPT-3 175B as
Megatron trains it: sequence 2048, microbatch 1, batch 1536)."""

CONFIGS = (  # (kind, model, preset, hosts, devices per host)
    ("gpt", "gpt-350m", "aws-p3.8xlarge", 2, 4),
    ("gpt", "gpt-1.3b", "aws-p3.8xlarge", 2, 4),
    ("gpt", "gpt-1.3b", "aws-p3.8xlarge", 4, 4),
    ("gpt", "gpt-2.6b", "aws-p3.8xlarge", 4, 4),
    ("gpt", "gpt-1.3b", "dgx-h100", 1, 8),
    ("gpt", "gpt-2.6b", "dgx-h100", 2, 8),
    ("u", "gpt-1.3b", "aws-p3.8xlarge", 4, 4),
    ("u", "gpt-1.3b", "dgx-h100", 2, 8),
    ("moe32", "gpt-350m", "aws-p3.8xlarge", 4, 4),
    ("moe64", "gpt-1.3b", "dgx-h100", 2, 8),
    ("gpt", "gpt-96l", "dgx-h100", 8, 8),
    ("gpt-dp", "gpt3-175b", "dgx-h100", 32, 8),
    ("gpt-dp", "gpt3-175b", "dgx-h100", 128, 8),
)
"""``gpt``: the chain; ``u``: the U-Transformer of its layers; ``moeE``: its layers with
every other one's feed-forward block ``E`` experts, top 2 (sized to fit the devices:
a 1.3B with 32 experts fits no split of 16 V100s); ``gpt-dp``: the chain with
data-parallel replicas, the degree searched among :data:`DEGREES` (candidates on Alpa's
submeshes with power-of-two hosts)."""

DEGREES = {32: (2, 4, 8), 128: (8, 16)}
"""The data-parallel degrees a ``gpt-dp`` row searches, by host count (fewer replicas
put more weights on each device than an H100 holds, or whole-cluster all-reduces whose
cold estimates take minutes)."""

SPEED = ("gpt-96l", "gpt3-175b")
"""The speed cases ``--quick`` leaves out."""

FEW = 4
"""How many of the DP's best choices the simulator re-ranks."""


def _stages(choice: Choice) -> str:
    return " | ".join(f"{s.first}-{s.last} {s.placement.shape[0]}x{s.placement.shape[1]} "
                      f"{'/'.join(sorted(set(s.choices)))}" for s in choice.stages)


def run_replicated(config: tuple[str, str, str, int, int], schedule: str) -> dict[str, Any]:
    """One ``gpt-dp`` row: reshard's degree and choice (:func:`search_replicated`); the
    baselines at each degree (Megatron's uniform choice, Alpa's moves-free one, on the
    same replicated layers), each at its degree that simulates fastest."""
    _, name, preset, hosts, per = config
    model = MODELS[name]
    cluster = Cluster.regular(hosts, per, preset=preset)
    cache = CostCache()
    limit = MEMORY[preset]
    built = [0.0]

    def layers_for(sub: Cluster) -> list[Layer]:
        t = time.process_time()
        out = gpt_layers(model, sub, PEAK[preset], cache=cache,
                         shapes=submesh_shapes(sub, powers_of_two=True))
        built[0] += time.process_time() - t
        return out

    t0 = time.process_time()
    mine = search_replicated(layers_for, cluster, model.microbatches, schedule=schedule,
                             replicas=DEGREES[hosts], memory_limit=limit, cache=cache)
    t1, cands_cpu = time.process_time(), built[0]
    best: dict[str, tuple[float, int, Choice]] = {}
    for r in DEGREES[hosts]:
        sub, mb = replica_cluster(cluster, r), -(-model.microbatches // r)
        layers = replicated_layers(layers_for(sub), cluster, r, mb, cache)
        for label in ("megatron", "alpa"):
            try:
                c = (uniform(layers, sub, mb, schedule, cache=cache, memory_limit=limit)
                     if label == "megatron" else
                     search_chain(layers, sub, mb, schedule=schedule, cache=cache,
                                  moves="free", memory_limit=limit))
            except SearchError:
                continue
            sim = simulated(layers, c, sub)
            if label not in best or sim < best[label][0]:
                best[label] = (sim, r, dataclasses.replace(c, simulated=sim))
    mega, alpa = best["megatron"], best["alpa"]
    return {"kind": "gpt-dp", "model": f"{name} dp{mine.replicas}", "preset": preset,
            "devices": f"{hosts}x{per}", "microbatches": mine.choice.microbatches,
            "megatron_s": mega[2].time, "alpa_s": alpa[2].time, "reshard_s": mine.choice.time,
            "megatron_sim_s": mega[0], "alpa_sim_s": alpa[0], "reshard_sim_s": mine.time,
            "vs_megatron": mega[0] / mine.time, "vs_alpa": alpa[0] / mine.time,
            "objective_best_s": None, "objective_best_sim_s": None,
            "candidates_cpu_s": cands_cpu, "search_cpu_s": t1 - t0 - cands_cpu,
            "replicas": mine.replicas, "tried": [list(t) for t in mine.tried],
            "reshard": f"dp{mine.replicas} x " + _stages(mine.choice),
            "alpa": f"dp{alpa[1]} x " + _stages(alpa[2]),
            "megatron": f"dp{mega[1]} x " + _stages(mega[2])}


def run(config: tuple[str, str, str, int, int], schedule: str) -> dict[str, Any]:
    """One row: the three choices of one configuration, each priced by the objective and
    simulated."""
    kind, name, preset, hosts, per = config
    if kind == "gpt-dp":
        return run_replicated(config, schedule)
    model = MODELS[name]
    cluster = Cluster.regular(hosts, per, preset=preset)
    cache = CostCache()
    limit = MEMORY[preset]
    b = model.microbatches
    t0 = time.process_time()
    if kind == "u":
        label = f"u-{name}"
        graph = u_transformer(model, cluster, PEAK[preset], cache=cache)
    elif kind.startswith("moe"):
        moe = MoE(model, experts=int(kind[3:]))
        label = moe.name
        graph = Graph.chain(moe_layers(moe, cluster, PEAK[preset], cache=cache))
    else:
        label = name
        graph = Graph.chain(gpt_layers(model, cluster, PEAK[preset], cache=cache))
    layers = list(graph.layers)
    t1 = time.process_time()
    if kind == "u":
        mine = search_graph(graph, cluster, b, schedule=schedule, cache=cache,
                            memory_limit=limit)
    else:
        mine = search_chain(layers, cluster, b, schedule=schedule, cache=cache,
                            memory_limit=limit)
    t2 = time.process_time()
    alpa = search_chain(layers, cluster, b, schedule=schedule, cache=cache, moves="free",
                        memory_limit=limit)
    mega = uniform(layers, cluster, b, schedule, cache=cache, memory_limit=limit)
    if kind == "u":  # the baselines' choices with the skip connections priced
        alpa, mega = (evaluate_graph(graph, c.stages, cluster, b, schedule) for c in (alpa, mega))
    edges = graph.edges
    sim = {k: simulated(layers, c, cluster, edges=edges)
           for k, c in (("megatron", mega), ("alpa", alpa), ("reshard", mine))}
    exact = None
    if kind != "u" and name != "gpt-96l":  # the objective's own best, for comparison
        exact = search_chain(layers, cluster, b, schedule=schedule, cache=cache,
                             memory_limit=limit, rerank=0)
    return {"kind": kind, "model": label, "preset": preset, "devices": f"{hosts}x{per}",
            "microbatches": b, "megatron_s": mega.time, "alpa_s": alpa.time,
            "reshard_s": mine.time, "megatron_sim_s": sim["megatron"],
            "alpa_sim_s": sim["alpa"], "reshard_sim_s": sim["reshard"],
            "vs_megatron": sim["megatron"] / sim["reshard"],
            "vs_alpa": sim["alpa"] / sim["reshard"],
            "objective_best_s": None if exact is None else exact.time,
            "objective_best_sim_s": None if exact is None else simulated(layers, exact,
                                                                           cluster),
            "candidates_cpu_s": t1 - t0, "search_cpu_s": t2 - t1, "reshard": _stages(mine),
            "alpa": _stages(alpa), "megatron": _stages(mega)}


COLUMNS = (Column("model", "model", align="<"), Column("preset", "cluster", align="<"),
           Column("devices", "hosts x gpus", align="<"), Column("microbatches", "B"),
           Column("megatron_s", "megatron(s)", ".3f"), Column("alpa_s", "alpa(s)", ".3f"),
           Column("reshard_s", "reshard(s)", ".3f"),
           Column("megatron_sim_s", "sim megatron", ".3f"),
           Column("alpa_sim_s", "sim alpa", ".3f"),
           Column("reshard_sim_s", "sim reshard", ".3f"),
           Column("vs_megatron", "megatron/reshard", ".3f"),
           Column("vs_alpa", "alpa/reshard", ".3f"),
           Column("candidates_cpu_s", "cands cpu(s)", ".1f"),
           Column("search_cpu_s", "search cpu(s)", ".1f"))


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (shared flags from :mod:`reshard.microbench.flags`)."""
    ap = flags.parser("python -m reshard.microbench.search_bench", __doc__ or "")
    ap.add_argument("--schedule", default="1f1b", choices=SEARCH_SCHEDULES,
                    help="the schedule the objective models (interleaved-1f1b, zb-v, "
                         "dualpipe-v: virtual stages, two pieces per submesh)")
    ap.add_argument("--models", default=None,
                    help="only the rows of these models, comma-separated (e.g. gpt-96l)")
    ap.add_argument("--quick", action="store_true",
                    help="leave out the speed cases (96 layers on 64 devices; GPT-3 175B with data-parallel replicas on 256 and 1,024 devices)")
    flags.add_output(ap)
    args = ap.parse_args(argv)
    flags.check_output_paths(ap, [args.json])
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Every configuration, the table, and the choices."""
    args = parse(argv)
    only = None if args.models is None else set(args.models.split(","))
    configs = [c for c in CONFIGS if not (args.quick and c[1] in SPEED)
               and (only is None or c[1] in only)]
    print(f"# stage search, schedule {args.schedule}: each choice's iteration time by the "
          f"objective (every move priced by reshard) and by the pipeline simulator (sim); "
          f"reshard's choice is the simulator's pick among the DP's best {FEW} and both "
          f"baselines'; ratios of simulated times (> 1: reshard faster); CPU seconds",
          flush=True)
    rows = []
    for c in configs:
        rows.append(run(c, args.schedule))
    print(table(rows, COLUMNS))
    for r in rows:
        print(f"# {r['model']} {r['preset']} {r['devices']}: reshard [{r['reshard']}]; "
              f"alpa [{r['alpa']}]; megatron [{r['megatron']}]")
        if r["objective_best_s"] is not None and r["objective_best_s"] < r["reshard_s"]:
            print(f"#   the objective's own best: {r['objective_best_s']:.3f} s, simulated "
                  f"{r['objective_best_sim_s']:.3f} s")
    worse = [r for r in rows if r["vs_megatron"] < 1 - 1e-9 or r["vs_alpa"] < 1 - 1e-9]
    print(f"# reshard's choice simulates slower than a baseline in {len(worse)} of "
          f"{len(rows)} rows")
    write_rows(args, rows)
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
