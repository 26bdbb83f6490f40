"""Every benchmark, as nccl-tests lists its binaries: a name, the module that runs it
(``python -m <module> --help`` says its flags) and one line of what it measures.

``python -m reshard.microbench.index`` prints the list; ``tests/unit/test_bench_index.py``
holds it to name every module of ``microbench/`` with a ``main(argv)``, and only those.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from reshard.tables import Column, table


@dataclass(frozen=True)
class Benchmark:
    """One benchmark entry point.

    Attributes:
        name: what it is called (the module's last name; ``reshard-bench`` for the CLI).
        module: the module with its ``main(argv)``: ``python -m <module>`` runs it.
        summary: what it measures, in one line.
    """

    name: str
    module: str
    summary: str


_AT = "reshard.microbench."

BENCHMARKS: tuple[Benchmark, ...] = (
    # ----- the planner and the cost model, modelled or timed on this machine ----------
    Benchmark(name="reshard-bench", module=_AT + "cli",
              summary="the paper's suites, every strategy, modelled (sim) or run on workers"),
    Benchmark(name="planner_time", module=_AT + "planner_time",
              summary="the planner's own wall time on large inputs"),
    Benchmark(name="estimate_rate", module=_AT + "estimate_rate",
              summary="costs at a compiler's rate: estimates per second, cached and not"),
    Benchmark(name="cold_estimates", module=_AT + "cold_estimates",
              summary="cold costs: each distinct estimate's CPU time, 32 to 1,024 devices"),
    Benchmark(name="production", module=_AT + "production",
              summary="production-scale weight syncs, modelled: time against the bound"),
    Benchmark(name="scaleout", module=_AT + "scaleout",
              summary="cutting per-device programs and SPMD planning at thousands of devices"),
    Benchmark(name="search_bench", module=_AT + "search_bench",
              summary="the stage and layout search against Megatron's and Alpa's choices"),
    # ----- the data plane on real workers --------------------------------------------
    Benchmark(name="dataplane", module=_AT + "dataplane",
              summary="the paper's n-to-m cases on real worker processes"),
    Benchmark(name="small_tensors", module=_AT + "small_tensors",
              summary="many small tensors in one plan, with and without coalescing"),
    Benchmark(name="memory_budget", module=_AT + "memory_budget",
              summary="a byte budget on staging memory: time and peak memory against it"),
    Benchmark(name="cast_plans", module=_AT + "cast_plans",
              summary="plans that price a cast on the wire against plans blind to it"),
    Benchmark(name="gloo_floor", module=_AT + "gloo_floor",
              summary="run mode's plans replayed on bare gloo and plain sockets"),
    Benchmark(name="scheduling", module=_AT + "scheduling",
              summary="gloo workers under SCHED_BATCH against the default policy"),
    Benchmark(name="soak", module=_AT + "soak",
              summary="threads sharing one Runtime while workers are killed"),
    # ----- the emulated multi-host testbed --------------------------------------------
    Benchmark(name="testbed_bench", module=_AT + "testbed_bench",
              summary="the n-to-m cases on the emulated testbed against the model"),
    Benchmark(name="pipeline_bench", module=_AT + "pipeline_bench",
              summary="pipeline schedules with real cross-mesh transfers, next to the simulator"),
    Benchmark(name="search_testbed", module=_AT + "search_testbed",
              summary="the search's choice and Alpa's run on the testbed"),
    # ----- GPU kernels ----------------------------------------------------------------
    Benchmark(name="gpu_pack", module=_AT + "gpu_pack",
              summary="packing strided boxes on a GPU against a plain copy"),
    Benchmark(name="gpu_cast", module=_AT + "gpu_cast",
              summary="the weight-sync cast on a GPU against the memory's floor"),
    # ----- beside other systems -------------------------------------------------------
    Benchmark(name="dtensor_side", module=_AT + "dtensor_side",
              summary="reshard against torch DTensor's redistribute on one gloo group"),
    Benchmark(name="jax_side", module=_AT + "jax_side",
              summary="reshard_array against jax.device_put in one process"),
    Benchmark(name="jax_processes", module=_AT + "jax_processes",
              summary="multi-controller JAX: ProcessMove against JAX's cross-process path"),
    Benchmark(name="weight_sync_bench", module=_AT + "weight_sync_bench",
              summary="RL weight sync through redistribute_many against per-tensor code"),
    # ----- weight syncs and the service -----------------------------------------------
    Benchmark(name="model_sync_bench", module=_AT + "model_sync_bench",
              summary="a planned model-level sync against the bare transfer"),
    Benchmark(name="model_sync_soak", module=_AT + "model_sync_soak",
              summary="ModelSync's versions soaked, a trainer rank killed mid-sync"),
    Benchmark(name="service_bench", module=_AT + "service_bench",
              summary="requests per second through the gRPC service, and its latency"),
    Benchmark(name="service_soak", module=_AT + "service_soak",
              summary="the service under hostile load next to a good client"),
    Benchmark(name="service_many", module=_AT + "service_many",
              summary="EstimateMany under hostile batches next to a good client's Estimates"),
)
"""Every benchmark, grouped by what it measures."""


def main(argv: Sequence[str] | None = None) -> int:
    """Print :data:`BENCHMARKS` as a table."""
    import argparse

    from reshard.cliargs import add_version

    ap = argparse.ArgumentParser(prog="python -m reshard.microbench.index",
                                 description=(__doc__ or "").split("\n\n")[0])
    add_version(ap)
    ap.parse_args(argv)
    rows = [{"name": b.name, "module": f"python -m {b.module}", "summary": b.summary}
            for b in BENCHMARKS]
    print(table(rows, [Column("name", "benchmark"), Column("module", "run"),
                       Column("summary", "measures")], align="<"))
    return 0


__all__ = ["BENCHMARKS", "Benchmark", "main"]

if __name__ == "__main__":
    sys.exit(main())
