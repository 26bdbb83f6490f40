"""Many small tensors in one plan, with and without coalescing, on real gloo workers.

``--tensors`` tensors (400) of 1 to 64 KiB (float32, bfloat16, int8, mixed layouts:
``S0R`` / ``RS0`` / ``RR`` / ``S0S1`` on a 2 x 2 mesh of 4 workers to others on 4 more
workers, the kind of norms and biases a weight sync carries) are planned together
(one ``plan_many``), loaded twice on the same workers, once with coalescing (small
transfers of a step that share their route travel as one message,
:mod:`reshard.planner.schedule.coalesce`) and once without, and run ``-n`` times each,
alternated, after a warm-up. Printed: tasks, the messages each way sends, the median
seconds and the ratio; every destination shard is checked against the expected slice.

``--testbed GBIT``: on the emulated multi-host testbed instead (4 hosts, each a network
namespace whose NIC tc limits to GBIT Gbit/s, 2 workers per host: the source mesh on
hosts 0-1, the destination on hosts 2-3), with ``--tensors`` (then 1,000 by default) of
4 KiB to 1 MiB (``--kib``), log-uniform; also printed: the plan's lower bound and model time on the
testbed's cluster, and measured / bound, model / measured. ``--floor`` then replays both
ways' messages with no runtime at all (:mod:`reshard.microbench.gloo_floor`: one process
per device in its host's namespace; bare gloo, plain sockets, gloo with each message
copied in before it is sent and out after it arrived, and sockets copying only the boxes
strided in their shards, as a scatter / gather data plane would). ``--message-cost``
(with ``--testbed``) also models the plan, per backend, with what a message costs that
backend on this machine (:func:`reshard.microbench.calibrate.message_cost`, timed with the
testbed's transports: UCX on TCP) and what each box riding in a coalesced message costs
its runtime on the testbed (:func:`reshard.microbench.calibrate.runtime_part_cost`),
charged on the machine's cores (the shared bandwidth, which all emulated hosts share:
the bytes the backend's runtime moves across the testbed's links per busy second of the
machine, :func:`reshard.microbench.calibrate.runtime_shared`, 64 MiB from each source
device at once); these calibrations move other tensors than the measured ones::

    python -m reshard.microbench.small_tensors [--tensors 400] [-n 5]
    python -m reshard.microbench.small_tensors --testbed 0.3 [-n 3] [--kib 4-1024] [--floor]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from reshard import Cluster, DeviceMesh, Layout, Runtime
from reshard.comm.calls import Drop, Execute, Get, LoadPlan
from reshard.comm.program import programs
from reshard.dtypes import parse_dtype
from reshard.microbench import flags
from reshard.microbench.steal import cpu_times, stolen_note
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import plan_many
from reshard.planner.schedule.coalesce import followers

SPECS = (("S0R", "RS0"), ("RS0", "S0R"), ("RR", "S0S1"), ("S0S1", "RR"), ("S01R", "RS01"))
DTYPES = ("float32", "bfloat16", "int8")


def requests(count: int, seed: int = 0, low: int = 1 << 10, high: int = 64 << 10,
             log: bool = False) -> list[tuple]:
    """``count`` small tensors of ``low`` to ``high`` bytes (uniform, or log-uniform with
    ``log``) with mixed dtypes and layouts."""
    rng = np.random.default_rng(seed)
    src_mesh = DeviceMesh((2, 2), range(4))
    dst_mesh = DeviceMesh((2, 2), range(4, 8))
    out = []
    for i in range(count):
        dtype = DTYPES[i % len(DTYPES)]
        nbytes = (int(np.exp(rng.uniform(np.log(low), np.log(high)))) if log
                  else int(rng.integers(low // 1024, high // 1024 + 1)) * 1024)
        cols = 64
        rows = max(2, nbytes // (cols * parse_dtype(dtype).itemsize))
        s, d = SPECS[i % len(SPECS)]
        out.append(((rows, cols), dtype, Layout(src_mesh, s), Layout(dst_mesh, d)))
    return out


def measure(count: int, iters: int, testbed_gbit: float | None = None,
            kib: tuple[int, int] | None = None, floor: bool = False,
            backends: Sequence[str] = ("gloo",), message_cost: bool = False) -> dict:
    """Both ways on one set of workers per backend (module docstring); ``kib``: the
    sizes' range; ``floor`` (testbed only): also both ways' messages on bare gloo and
    plain sockets (:func:`floors`); ``backends``: the CPU data planes to run it on
    (several: alternated within each round); ``message_cost`` (testbed only): also the
    model with each backend's measured message cost (:func:`with_message_cost`)."""
    if testbed_gbit is None:
        low, high = kib or (1, 64)
        reqs = requests(count, low=low << 10, high=high << 10)
        return _measure(reqs, plan_many(reqs, cluster=Cluster.regular(2, 4)), iters, None,
                        backends)
    from reshard.testbed import Testbed

    low, high = kib or (4, 1024)
    with Testbed(4, testbed_gbit) as tb:
        reqs = requests(count, low=low << 10, high=high << 10, log=True)
        plan = plan_many(reqs, cluster=tb.cluster(2))
        got = _measure(reqs, plan, iters, tb, backends, rates=message_cost)
        if floor:
            got["floors"] = floors(plan, tb)
        if message_cost:
            rates = {b: (r["shared_bandwidth"], r["part_cost_s"])
                     for b, r in got["backends"].items()}
            for b, (cost, model) in with_message_cost(plan, backends, rates).items():
                got["backends"][b].update(message_cost_s=cost, model_mc_s=model)
        return got


def with_message_cost(plan: ReshardPlan, backends: Sequence[str],
                      rates: dict[str, tuple[float, float]]
                      ) -> dict[str, tuple[float, float]]:
    """Per backend, its measured seconds of the machine per message end (timed with the
    testbed's transports, :data:`~reshard.comm.launchers.netns.WIRE_ENV`: UCX on TCP)
    and the model time of ``plan``'s own tasks on its cluster with that cost and its
    runtime's bytes/s and seconds per coalesced part (``rates``, per backend:
    :func:`~reshard.microbench.calibrate.runtime_shared` and
    :func:`~reshard.microbench.calibrate.runtime_part_cost` on the testbed; the costs
    charged on that shared bandwidth)."""
    from reshard.comm.launchers.netns import WIRE_ENV
    from reshard.microbench import calibrate

    out = {}
    for b in backends:
        cost = calibrate.message_cost(b, env=WIRE_ENV)
        shared, part = rates[b]
        cluster = dataclasses.replace(plan.cluster, message_cost=cost, part_cost=part,
                                      shared_bandwidth=shared)
        out[b] = cost, plan.priced_on(cluster).estimate()
    return out


def floors(plan: ReshardPlan, tb: Any) -> dict[str, tuple[float, float]]:
    """The plan's messages, coalesced and one per task, replayed with no runtime over
    bare gloo, plain sockets, gloo with a pack and an unpack copy of each message, and
    sockets with only the copies of strided boxes (what scatter / gather I/O leaves), by
    one process per device in its testbed host (:mod:`reshard.microbench.gloo_floor`):
    per transport, seconds (best of 2 timings of 2 rounds) coalesced and one message per
    task."""
    from reshard.microbench import gloo_floor

    per_host = len(plan.cluster.hosts[0])
    hosts = tb.netns_placement().hosts
    places = [hosts[d // per_host] for d in range(len(plan.devices))]
    bound = plan.lower_bound()
    rows = [gloo_floor.Row("coalesced", 0, len(places),
                           gloo_floor.coalesced_steps(plan.tasks, plan.tensors), bound,
                           gloo_floor.strided_copies(plan.tasks, plan.tensors)),
            gloo_floor.Row("per task", 0, len(places), gloo_floor.plan_steps(plan.tasks),
                           bound, gloo_floor.strided_copies(plan.tasks, plan.tensors,
                                                            coalesced=False))]
    out = {}
    for transport in gloo_floor.TRANSPORTS:
        on, off = gloo_floor.floors(rows, rounds=2, repeats=2, transport=transport,
                                    places=places)
        out[transport] = (on, off)
    return out


def _measure(reqs: list[tuple], plan: ReshardPlan, iters: int, netns: object,
             backends: Sequence[str], rates: bool = False) -> dict:
    """Time the plan coalesced and one message per task on each backend, alternated,
    every shard checked; ``rates``: then also what each backend's runtime moves per
    second of the machine's cores (:func:`~reshard.microbench.calibrate.runtime_shared`:
    64 MiB from each source host's device to a destination host's at once) and spends
    per box riding in a coalesced message
    (:func:`~reshard.microbench.calibrate.runtime_part_cost`)."""
    rng = np.random.default_rng(1)
    values = [rng.random(shape).astype(np.float32).astype(parse_dtype(dt))
              for shape, dt, _, _ in reqs]
    times: dict[tuple[str, bool], list[float]] = {
        (b, way): [] for b in backends for way in (True, False)}
    with contextlib.ExitStack() as stack:
        rts = {b: stack.enter_context(Runtime(b, plan.cluster, "process", timeout=300,
                                              netns=netns)) for b in backends}
        keys = {}
        for b, rt in rts.items():
            keys[b] = [rt.put(v, src).key for v, (_, _, src, _) in zip(values, reqs)]
            rt._check_plan(plan)
            progs = {d: p.to_json() for d, p in programs(plan, rt.group.devices).items()}
            for way, pid in ((True, 9001), (False, 9002)):
                rt.call({d: LoadPlan(pid, progs[d], coalesce=way) for d in progs}, "load")
        runs = [(b, way) for b in backends for way in (True, False)]
        for k in range(iters + 1):
            for b, way in (runs if k % 2 == 0 else runs[::-1]):  # alternated
                rt, pid = rts[b], 9001 if way else 9002
                out_keys = [f"small-{way}-{k}-{i}" for i in range(len(reqs))]
                t0 = time.perf_counter()
                rt.call({d: Execute(pid, keys[b], out_keys) for d in plan.devices}, "run")
                if k:  # the first round warms every way up
                    times[(b, way)].append(time.perf_counter() - t0)
                wrong = 0
                for i, (v, (_, _, _, dst)) in enumerate(zip(values, reqs)):
                    got = rt.call({d: Get(out_keys[i]) for d in dst.devices}, "get")
                    for d, sl in dst.index_map(v.shape).items():
                        wrong += int(got[d].tobytes() != np.ascontiguousarray(v[sl]).tobytes())
                rt.call({d: Drop(out_keys) for d in plan.devices}, "drop")
                if wrong:
                    raise AssertionError(f"{wrong} destination shards differ ({b}, "
                                         f"coalesce={way})")
        shared = {}
        if rates:
            from reshard.microbench import calibrate

            hosts = plan.cluster.hosts
            src = [d for h in hosts[:len(hosts) // 2] for d in h]
            dst = [d for h in hosts[len(hosts) // 2:] for d in h]
            shared = {b: {"shared_bandwidth": calibrate.runtime_shared(rt, src, dst),
                          "part_cost_s": calibrate.runtime_part_cost(rt, src, dst)}
                      for b, rt in rts.items()}
    merged = len(followers(plan.tasks, plan.tensors))
    per = {b: {"on_s": statistics.median(times[(b, True)]),
               "off_s": statistics.median(times[(b, False)]),
               **shared.get(b, {})} for b in backends}
    return {"tensors": len(reqs), "tasks": len(plan.tasks), "messages_coalesced":
            len(plan.tasks) - merged, **per[backends[0]], "backends": per,
            "bound_s": plan.lower_bound(), "model_s": plan.estimate(),
            "mib": sum(v.nbytes for v in values) / (1 << 20)}


def _kib_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW-HIGH in KiB, got {text!r}") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"expected 1 <= LOW <= HIGH, got {text!r}")
    return lo, hi


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print one line."""
    ap = flags.parser("python -m reshard.microbench.small_tensors", __doc__ or "")
    ap.add_argument("--tensors", type=int, default=None,
                    help="how many small tensors (default: 400; 1,000 with --testbed)")
    ap.add_argument("-n", "--iters", type=int, default=5, help="timed runs of each way")
    ap.add_argument("--testbed", type=float, default=None, metavar="GBIT",
                    help="on the emulated testbed, NICs of GBIT Gbit/s (needs root)")
    ap.add_argument("--kib", type=_kib_range, default=None, metavar="LOW-HIGH",
                    help="tensor sizes in KiB (default: 1-64; 4-1024 with --testbed)")
    ap.add_argument("--floor", action="store_true",
                    help="with --testbed: also replay both ways' messages with no runtime, "
                         "on bare gloo and plain sockets")
    ap.add_argument("--message-cost", action="store_true",
                    help="with --testbed: also model the plan with each backend's "
                         "measured cost per message (calibrate.message_cost)")
    ap.add_argument("--backend", default="gloo", type=flags.cpu_planes, metavar="NAME[,NAME]",
                    help="the CPU data plane(s): gloo, tcp, or both as 'gloo,tcp' "
                         "(alternated within each round)")
    args = ap.parse_args(argv)
    if (args.floor or args.message_cost) and args.testbed is None:
        ap.error("--floor and --message-cost are of the testbed: give --testbed GBIT too")
    count = args.tensors or (1000 if args.testbed else 400)
    before = cpu_times()
    r = measure(count, args.iters, args.testbed, args.kib, args.floor, args.backend,
                args.message_cost)
    after = cpu_times()
    low, high = args.kib or ((4, 1024) if args.testbed else (1, 64))
    sizes = f"{low}-{high} KiB"
    for b, got in r["backends"].items():
        where = (f"the testbed (4 hosts x 2 {b} workers, {args.testbed:g} Gbit/s NICs)"
                 if args.testbed else f"8 {b} workers")
        print(f"{r['tensors']} tensors of {sizes} ({r['mib']:.1f} MiB), {r['tasks']} tasks "
              f"on {where}: coalesced into {r['messages_coalesced']} messages "
              f"{got['on_s'] * 1e3:.1f} ms, one message per task {got['off_s'] * 1e3:.1f} ms "
              f"({got['off_s'] / got['on_s']:.2f}x faster coalesced; medians of "
              f"{args.iters}, alternated); all exact" + stolen_note(before, after))
        if args.testbed:
            print(f"  {b}: lower bound {r['bound_s'] * 1e3:.1f} ms, model "
                  f"{r['model_s'] * 1e3:.1f} ms: coalesced {got['on_s'] / r['bound_s']:.2f}x "
                  f"the bound, uncoalesced {got['off_s'] / r['bound_s']:.2f}x; model / "
                  f"measured (coalesced) {r['model_s'] / got['on_s']:.2f}")
            if "model_mc_s" in got:
                print(f"  {b}: {got['message_cost_s'] * 1e6:.1f} us of the machine per "
                      f"message end, {got.get('part_cost_s', 0.0) * 1e6:.2f} per part, "
                      f"{got.get('shared_bandwidth', 0.0) / 1e9:.2f} GB/s streamed by all: "
                      f"model {got['model_mc_s'] * 1e3:.1f} ms, model / "
                      f"measured (coalesced) {got['model_mc_s'] / got['on_s']:.2f}")
    for transport, (on, off) in r.get("floors", {}).items():
        print(f"no runtime, {transport}: coalesced {on * 1e3:.1f} ms "
              f"({on / r['bound_s']:.2f}x the bound), one message per task {off * 1e3:.1f} ms "
              f"({off / on:.2f}x the coalesced)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
