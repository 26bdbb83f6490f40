"""Cold costs: the CPU time of each distinct estimate, as a compiler's first pass meets it.

A compiler's first pass asks mostly questions it has not asked before. This benchmark
asks :func:`reshard.estimate_many` a mixed set of distinct layout pairs, each with a new
:class:`~reshard.planner.estimates.CostCache` (nothing it answered before helps), and
times each with this process's CPU time (``time.process_time``: the machine is shared):

* ``32``: 4x8 -> 4x8 dgx-h100 x8 (two disjoint sets of 4 hosts), every pair of a plain
  or partial-sum source (:data:`SOURCES`: 11 plain, 7 partial) and a plain destination
  (:data:`DESTINATIONS`) at three bf16 shapes (:data:`SHAPES_32`): 594 requests; goals
  median <= 10 ms, max <= 100 ms;
* ``256``: 32x8 -> 32x8, bf16 [16384, 8192], the pairs of :data:`PAIRS_LARGE`;
* ``1024``: 128x8 -> 128x8 (128 hosts x 8), bf16 [65536, 8192], the same pairs; goal
  every pair <= 1 s.

Each scale prints the distribution (median, 90th percentile, max, total) and its
slowest pairs; a line with a goal says whether it is met, one without says nothing.
A progress bar (tqdm, where stdout and stderr are terminals; ``--no-progress`` hides it)
names each request as it is answered; ``-J PATH`` writes every request's time.

Example::

    python -m reshard.microbench.cold_estimates [--scales 32,256,1024] [--slowest 10]
    python -m reshard.microbench.estimate_rate --cold   # the same
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from reshard.cluster import Cluster
from reshard.layout import Layout
from reshard.mesh import DeviceMesh
from reshard.microbench import flags
from reshard.microbench.report import Progress, write_json
from reshard.microbench.steal import cpu_times, stolen_note
from reshard.planner.estimates import CostCache, estimate_many

PLAIN = ("RR", "S0R", "S1R", "S01R", "S10R", "RS0", "RS1", "RS01", "RS10", "S0S1", "S1S0")
"""Every plain layout of a 2-d tensor on a 2-d mesh."""

PARTIAL = ("RR+P0", "RR+P1", "RR+P01", "S0R+P1", "S1R+P0", "RS0+P1", "RS1+P0")
"""Partial-sum sources: replicated or split over one axis, summed over the others."""

SOURCES = PLAIN + PARTIAL
DESTINATIONS = PLAIN

SHAPES_32 = ((8192, 8192), (16384, 4096), (2048, 2048))
"""The 4x8 set's shapes (bf16)."""

PAIRS_LARGE = (("S01R", "RS10"), ("S0R", "RS1"), ("S0R", "RS0"), ("S10R", "RR"),
               ("RS0", "S1R"), ("S0S1", "S1S0"), ("RR", "S01R"), ("S0R+P1", "RS0"),
               ("RR+P0", "RS0"), ("RS1+P0", "S0S1"), ("RR+P01", "RS0"))
"""The 256- and 1,024-device sets' pairs: the all-to-all, the slowest kinds of the 4x8
set, and partial sums."""


@dataclass(frozen=True)
class Scale:
    """One set of requests: ``hosts`` x 8 -> ``hosts`` x 8 on disjoint dgx-h100 hosts.

    Attributes:
        devices: devices per mesh (its name).
        hosts: hosts per mesh.
        shapes: the bf16 tensor shapes asked.
        pairs: the (source, destination) specs asked at each shape.
        median_goal_ms: the goal of the median (None: none).
        max_goal_ms: the goal of the slowest request (None: none).
    """

    devices: int
    hosts: int
    shapes: tuple[tuple[int, int], ...]
    pairs: tuple[tuple[str, str], ...]
    median_goal_ms: float | None
    max_goal_ms: float | None


SCALES = {
    32: Scale(32, 4, SHAPES_32, tuple((s, d) for s in SOURCES for d in DESTINATIONS),
              10.0, 100.0),
    256: Scale(256, 32, ((16384, 8192),), PAIRS_LARGE, None, None),
    1024: Scale(1024, 128, ((65536, 8192),), PAIRS_LARGE, None, 1000.0),
}
"""The scales by devices per mesh (module docstring)."""


@dataclass(frozen=True)
class Timed:
    """One request's cold CPU time."""

    shape: tuple[int, int]
    src: str
    dst: str
    cpu_ms: float
    seconds: float


def requests(scale: Scale) -> Iterator[tuple[tuple[int, int], str, str, tuple]]:
    """Each request of ``scale``: its shape, specs and the request itself."""
    n = scale.hosts * 8
    cluster = Cluster.preset("dgx-h100", 2 * scale.hosts)
    a, b = DeviceMesh((scale.hosts, 8), range(n)), DeviceMesh((scale.hosts, 8), range(n, 2 * n))
    for shape in scale.shapes:
        for src, dst in scale.pairs:
            yield shape, src, dst, (shape, "bfloat16", Layout(a, src), Layout(b, dst), cluster)


def run(scale: Scale, progress: Callable[[Timed], None] | None = None) -> list[Timed]:
    """Every request of ``scale`` estimated cold (a new cache each), timed in CPU."""
    out = []
    for shape, src, dst, req in requests(scale):
        t0 = time.process_time()
        (seconds,) = estimate_many([req], cache=CostCache())
        timed = Timed(shape, src, dst, 1e3 * (time.process_time() - t0), seconds)
        out.append(timed)
        if progress is not None:
            progress(timed)
    return out


def _verdict(value: float, goal: float | None) -> str:
    return "" if goal is None else f"goal <= {goal:g} ms  {'met' if value <= goal else 'MISSED'}"


def render(scale: Scale, rows: Sequence[Timed], slowest: int) -> str:
    """The distribution of ``rows`` and its slowest requests."""
    ms = sorted(r.cpu_ms for r in rows)
    med, p90, top = statistics.median(ms), ms[min(len(ms) - 1, int(0.9 * len(ms)))], ms[-1]
    head = (f"{scale.devices} -> {scale.devices} devices ({scale.hosts} x 8 dgx-h100), "
            f"{len(rows)} distinct requests, CPU ms each (a new cache each):")
    lines = [head,
             f"  median {med:9.1f}  {_verdict(med, scale.median_goal_ms)}".rstrip(),
             f"  p90    {p90:9.1f}",
             f"  max    {top:9.1f}  {_verdict(top, scale.max_goal_ms)}".rstrip(),
             f"  total  {sum(ms) / 1e3:9.1f} s",
             f"  slowest {min(slowest, len(rows))}:"]
    for r in sorted(rows, key=lambda r: -r.cpu_ms)[:slowest]:
        lines.append(f"    {r.src:>7} -> {r.dst:<5} {'x'.join(map(str, r.shape)):>11}  "
                     f"{r.cpu_ms:9.1f} ms  (model {r.seconds * 1e3:.3f} ms)")
    return "\n".join(lines)


def scale_list(text: str) -> tuple[int, ...]:
    """``"32,1024"`` -> (32, 1024), each a key of :data:`SCALES`."""
    out = []
    for name in flags.name_list(text):
        if not name.isdigit() or int(name) not in SCALES:
            raise argparse.ArgumentTypeError(
                f"unknown scale {name!r}: choose among {', '.join(map(str, SCALES))}")
        out.append(int(name))
    return tuple(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Print each scale's distribution (exit 0)."""
    ap = flags.parser("python -m reshard.microbench.cold_estimates", __doc__ or "")
    ap.add_argument("--scales", type=scale_list, default="32,256,1024",
                    help="devices per mesh of the sets to run (32, 256, 1024)")
    ap.add_argument("--slowest", type=int, default=10, help="slowest requests listed")
    flags.add_output(ap)
    args = ap.parse_args(argv)
    flags.check_output_paths(ap, [args.json])
    before = cpu_times()
    results: dict[str, list[dict]] = {}
    for devices in args.scales:
        scale = SCALES[devices]
        total = len(scale.shapes) * len(scale.pairs)
        with Progress(total, enabled=not args.no_progress,
                      desc=f"{devices} -> {devices} cold") as bar:
            def done(timed: Timed) -> None:
                bar.describe(f"{timed.src} -> {timed.dst} {timed.cpu_ms:.0f} ms")
                bar.advance()

            rows = run(scale, progress=done)
        print(render(scale, rows, args.slowest), flush=True)
        results[str(devices)] = [dataclasses.asdict(r) for r in rows]
    print(f"this run{stolen_note(before, cpu_times())}")
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
