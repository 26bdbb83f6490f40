"""Costs at a compiler's rate: how fast reshard answers "what does this move cost".

Measures, on this machine, against the goals of issue 41:

* ``repeated``: estimates per second of :func:`reshard.estimate_many` for requests it
  has seen (a compiler's inner loop re-asks): 1,000 distinct requests (a 4x8 -> 4x8 move
  between the stages of a 16-host dgx-h100 pipeline, of several shapes, layouts and
  strategies) asked 20 times; goal >= 20,000/s;
* ``service``: the same through ``reshard serve``'s EstimateMany on loopback (one
  streamed call per 1,000, the server's caches warm); goal >= 5,000/s;
* ``cold``: one estimate of a 4x8 -> 4x8 all-to-all (realistic suite's a2a-flat-4x8,
  S01R -> RS10, bf16 16384 x 4096) with nothing cached, median of 5 (each a new
  cluster figure, so no cache answers), first in the process (a compiler's first
  questions); goal < 50 ms; ``cold later``: the same after the other phases (a heap of
  40,000 cached answers and a server's), for reference;
* ``similar``: the same move between another pair of stages answered from the normal
  form (no planning);
* with ``--cold``: nothing of the above, but every distinct request of a mixed set
  (plain and partial-sum sources; 32, 256 and 1,024 devices a mesh) timed cold in CPU,
  its distribution and slowest pairs (:mod:`reshard.microbench.cold_estimates`);
* with ``--production``: the DeepSeek-V3 GB200 sync planned and modelled, and Kimi-K2
  planned under a 1 GiB staging budget (goals < 10 s each), each in a fresh
  interpreter of its own; Kimi-K2 three times, its worst against the goal (reliably
  under it, on a machine whose speed swings).

Each line prints the measured value and, where it has a goal, the goal and whether it
is met; the last line the CPU steal of the run.

Example::

    python -m reshard.microbench.estimate_rate [--production]
    python -m reshard.microbench.estimate_rate --cold [--scales 32,256]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from reshard.cluster import Cluster
from reshard.layout import Layout
from reshard.mesh import DeviceMesh
from reshard.microbench import flags
from reshard.microbench.steal import cpu_times, stolen_note
from reshard.planner.estimates import CostCache, estimate_many

SHAPES = ((16384, 4096), (8192, 8192), (4096, 14336), (32768, 1024), (2048, 2048))
SPECS = (("S01R", "RS10"), ("S0R", "RS0"), ("RS01", "S01R"), ("S0S1", "S1S0"),
         ("S01R", "S01R"), ("RR", "S0R"), ("S0R", "RR"), ("RS0", "S1R"))
STRATEGIES = ("broadcast", "send_recv", "allgather")


def stage_requests(cluster: Cluster, first: int = 0) -> list[tuple]:
    """Distinct 4x8 -> 4x8 moves between the stages starting at device ``first`` and
    ``first + 32``: shapes x layouts x strategies, and bf16 / fp32."""
    a = DeviceMesh((4, 8), range(first, first + 32))
    b = DeviceMesh((4, 8), range(first + 32, first + 64))
    out = []
    for shape in SHAPES:
        for src, dst in SPECS:
            for strategy in STRATEGIES:
                for dtype in ("bfloat16", "float32"):
                    out.append((shape, dtype, Layout(a, src), Layout(b, dst), cluster,
                                strategy))
    return out


def _line(name: str, value: float, unit: str, goal: str = "", met: bool | None = None) -> None:
    """One measurement; with a goal, the goal and whether it is met (a line without
    one says neither)."""
    verdict = "" if met is None else f"goal {goal:<12} {'met' if met else 'MISSED'}"
    print(f"{name:>10}: {value:>12,.1f} {unit:<12} {verdict}".rstrip(), flush=True)


def repeated_rate(reqs: list[tuple], rounds: int = 20) -> float:
    """Estimates per second of requests already cached."""
    cache = CostCache()
    estimate_many(reqs, cache=cache)
    t0 = time.perf_counter()
    for _ in range(rounds):
        estimate_many(reqs, cache=cache)
    return rounds * len(reqs) / (time.perf_counter() - t0)


def service_rate(reqs: list[tuple], rounds: int = 10) -> float:
    """Estimates per second through EstimateMany on loopback, caches warm."""
    from reshard.service import Client, ServeOptions, Server

    with Server(ServeOptions(port=0, backend=None, workers=4)).start() as server, \
            Client(server.address, timeout=120) as client:
        client.estimate_many(reqs)
        t0 = time.perf_counter()
        for _ in range(rounds):
            client.estimate_many(reqs)
        return rounds * len(reqs) / (time.perf_counter() - t0)


def cold_ms(runs: int = 5) -> tuple[float, float]:
    """Median milliseconds of one uncached a2a-flat-4x8 estimate, and of the same move
    between two other stages (the normal form's answer)."""
    cold, similar = [], []
    for i in range(runs):
        # another latency each run: no cache, not even this process's, knows it
        cluster = Cluster.regular(16, 8, preset="dgx-h100", latency=5e-6 + i * 1e-9)
        cache = CostCache()
        a, b = DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(32, 64))
        req = ((16384, 4096), "bfloat16", Layout(a, "S01R"), Layout(b, "RS10"), cluster)
        t0 = time.perf_counter()
        estimate_many([req], cache=cache)
        cold.append(time.perf_counter() - t0)
        c, d = DeviceMesh((4, 8), range(64, 96)), DeviceMesh((4, 8), range(96, 128))
        t0 = time.perf_counter()
        estimate_many([(req[0], req[1], Layout(c, "S01R"), Layout(d, "RS10"), cluster)],
                      cache=cache)
        similar.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(cold), 1e3 * statistics.median(similar)


_GB200 = """
import time
from reshard.microbench.suites.production import production_cases, requests
from reshard.planner.plan import plan_many
reqs, cluster = requests({s.name: s for s in production_cases()}["deepseek-v3-gb200"])
t0 = time.perf_counter()
p = plan_many(reqs, cluster=cluster)
t1 = time.perf_counter()
p.estimate()
print(t1 - t0, time.perf_counter() - t1)
"""

_KIMI = """
import time
from reshard.microbench.suites.production import production_cases, requests
from reshard.planner.plan import plan_many
reqs, cluster = requests({s.name: s for s in production_cases()}["kimi-k2"])
t0 = time.perf_counter()
plan_many(reqs, cluster=cluster, memory_budget=1 << 30)
print(time.perf_counter() - t0)
"""


def _alone(code: str) -> list[float]:
    """The seconds ``code`` prints, run in a fresh interpreter (each measurement as a
    compiler's process would meet it, not after this one's other work)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=900)
    return [float(x) for x in out.stdout.split()]


KIMI_RUNS = 3
"""Fresh processes Kimi-K2's budgeted plan is timed in."""


def production_seconds() -> tuple[float, float, list[float]]:
    """Seconds to plan and to model the DeepSeek-V3 GB200 sync, and to plan Kimi-K2
    under a 1 GiB staging budget (:data:`KIMI_RUNS` times), each in a process of its
    own."""
    plan_s, model_s = _alone(_GB200)
    kimi = [_alone(_KIMI)[0] for _ in range(KIMI_RUNS)]
    return plan_s, model_s, kimi


def main(argv: Sequence[str] | None = None) -> int:
    """Print each measurement against its goal."""
    ap = flags.parser("python -m reshard.microbench.estimate_rate", __doc__ or "")
    ap.add_argument("--production", action="store_true",
                    help="also the production syncs (about a minute)")
    ap.add_argument("--no-service", action="store_true", help="skip the gRPC service")
    ap.add_argument("--cold", action="store_true",
                    help="instead: every distinct request's cold CPU time over the mixed "
                         "sets of reshard.microbench.cold_estimates (its own flags after "
                         "--cold pass on to it)")
    args, rest = ap.parse_known_args(argv)
    if args.cold:
        from reshard.microbench import cold_estimates

        return cold_estimates.main(rest)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    before = cpu_times()
    # cold first: a compiler's first questions in its process
    cold, similar = cold_ms()
    _line("cold", cold, "ms", "< 50", cold < 50)
    _line("similar", similar, "ms (answered from the normal form)")
    cluster = Cluster.preset("dgx-h100", 16)
    reqs = stage_requests(cluster)
    rate = repeated_rate(reqs)
    _line("repeated", rate, "estimates/s", ">= 20,000", rate >= 20_000)
    if not args.no_service:
        rate = service_rate(reqs)
        _line("service", rate, "estimates/s", ">= 5,000", rate >= 5_000)
    later, _ = cold_ms()  # the same after 40,000 cached answers and the service's heap
    _line("cold later", later, "ms (after the phases above)")
    if args.production:
        plan_s, model_s, kimi = production_seconds()
        _line("ds3-gb200", plan_s, "s to plan")
        _line("ds3-gb200", model_s, "s to model", "< 10", model_s < 10)
        _line("kimi-1GiB", max(kimi), f"s to plan, worst of {len(kimi)} "
              f"({', '.join(f'{k:.1f}' for k in kimi)})", "< 10", max(kimi) < 10)
    print(f"this run{stolen_note(before, cpu_times())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
