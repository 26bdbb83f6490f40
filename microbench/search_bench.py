"""Stage and layout search: reshard's choice against Megatron's and Alpa's (modelled).

For GPT configurations of Alpa's benchmark suite (:data:`reshard.search.transformer.ALPA_SUITE`;
layers' candidates from the analytical model there: FLOPs over peak, each layout's
collectives priced by reshard) on the paper's cluster (aws-p3.8xlarge: 4 V100 a host,
10 Gbit/s between hosts) and on DGX H100 hosts, three choices, each priced by the
same objective with every move costed by reshard (:mod:`reshard.search.chain`):

* ``megatron``: equal stages on equal submeshes, one candidate on every layer, the
  best stage count and candidate (:func:`reshard.search.baselines.uniform`);
* ``alpa``: the stage DP with moves free while choosing (Alpa's stage DP prices
  none), its choice then priced;
* ``reshard``: the stage DP with every move priced.

Every choice holds within the device's memory (:data:`MEMORY`: weights, gradients and
Adam state of its layers, and the activations of the microbatches in flight).

Prints the iteration times (seconds), the ratios (> 1: reshard faster) and the search
time; exits 1 if reshard's choice is slower than either baseline anywhere (the DP is
exact for the objective over block boundaries, so it never should be).

Run: ``python -m reshard.microbench.search_bench`` (about a minute here).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from reshard.cluster import Cluster
from reshard.microbench import flags
from reshard.microbench.report import Column, machine, table, write_json
from reshard.planner.estimates import CostCache
from reshard.search import search_chain
from reshard.search.baselines import uniform
from reshard.search.transformer import ALPA_SUITE, gpt_layers

PEAK = {"aws-p3.8xlarge": 125e12, "dgx-h100": 989e12}
"""Dense fp16 / bf16 peak FLOP/s of one device of each preset (V100, H100)."""

MEMORY = {"aws-p3.8xlarge": 16 << 30, "dgx-h100": 80 << 30}
"""Each preset's device memory (V100 16 GB, H100 80 GB): every choice holds within it."""

CONFIGS = (  # (model, preset, hosts, devices per host)
    ("gpt-350m", "aws-p3.8xlarge", 2, 4),
    ("gpt-1.3b", "aws-p3.8xlarge", 2, 4),
    ("gpt-1.3b", "aws-p3.8xlarge", 4, 4),
    ("gpt-2.6b", "aws-p3.8xlarge", 4, 4),
    ("gpt-1.3b", "dgx-h100", 1, 8),
    ("gpt-2.6b", "dgx-h100", 2, 8),
)


def _stages(choice: Any) -> str:
    return " | ".join(f"{s.first}-{s.last} {s.placement.shape[0]}x{s.placement.shape[1]} "
                      f"{s.choices[0]}" for s in choice.stages)


def run(config: tuple[str, str, int, int], schedule: str) -> dict[str, Any]:
    """One row: the three choices of one configuration."""
    name, preset, hosts, per = config
    model = {m.name: m for m in ALPA_SUITE}[name]
    cluster = Cluster.regular(hosts, per, preset=preset)
    cache = CostCache()
    t0 = time.perf_counter()
    layers = gpt_layers(model, cluster, PEAK[preset], cache=cache)
    t1 = time.perf_counter()
    limit = MEMORY[preset]
    mine = search_chain(layers, cluster, model.microbatches, schedule=schedule, cache=cache,
                        memory_limit=limit)
    t2 = time.perf_counter()
    alpa = search_chain(layers, cluster, model.microbatches, schedule=schedule, cache=cache,
                        moves="free", memory_limit=limit)
    mega = uniform(layers, cluster, model.microbatches, schedule, cache=cache,
                   memory_limit=limit)
    return {"model": name, "preset": preset, "devices": f"{hosts}x{per}",
            "microbatches": model.microbatches, "megatron_s": mega.time,
            "alpa_s": alpa.time, "reshard_s": mine.time,
            "vs_megatron": mega.time / mine.time, "vs_alpa": alpa.time / mine.time,
            "candidates_s": t1 - t0, "search_s": t2 - t1, "reshard": _stages(mine),
            "alpa": _stages(alpa), "megatron": _stages(mega)}


COLUMNS = (Column("model", "model", align="<"), Column("preset", "cluster", align="<"),
           Column("devices", "hosts x gpus", align="<"), Column("microbatches", "B"),
           Column("megatron_s", "megatron(s)", ".3f"), Column("alpa_s", "alpa(s)", ".3f"),
           Column("reshard_s", "reshard(s)", ".3f"),
           Column("vs_megatron", "megatron/reshard", ".3f"),
           Column("vs_alpa", "alpa/reshard", ".3f"), Column("search_s", "search(s)", ".1f"))


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (shared flags from :mod:`reshard.microbench.flags`)."""
    ap = flags.parser("python -m reshard.microbench.search_bench", __doc__ or "")
    ap.add_argument("--schedule", default="1f1b", choices=("1f1b", "eager-1f1b"),
                    help="the schedule the objective models")
    flags.add_output(ap)
    args = ap.parse_args(argv)
    flags.check_output_paths(ap, [args.json])
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Every configuration, the table, and the choices."""
    args = parse(argv)
    rows = [run(c, args.schedule) for c in CONFIGS]
    print(f"# stage search, GPT (Alpa's suite), schedule {args.schedule}: modelled "
          f"iteration time of each choice, every move priced by reshard")
    print(table(rows, COLUMNS))
    for r in rows:
        print(f"# {r['model']} {r['preset']} {r['devices']}: reshard [{r['reshard']}]; "
              f"alpa [{r['alpa']}]; megatron [{r['megatron']}]")
    worse = [r for r in rows if r["vs_megatron"] < 1 - 1e-9 or r["vs_alpa"] < 1 - 1e-9]
    print(f"# reshard's choice slower than a baseline in {len(worse)} of {len(rows)} rows")
    if args.json:
        write_json(args.json, {"args": flags.as_dict(args), "machine": machine(),
                               "rows": rows})
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
