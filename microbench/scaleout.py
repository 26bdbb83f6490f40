"""Scale-out of the execution path: programs, not plans, and SPMD planning.

(a) Cutting programs: a D -> D all-to-all (``S01R`` on (D/8, 8) to ``RS10`` on another
    (D/8, 8) mesh, 8192 x 8192 fp32, D = ``--devices``, 256 by default: 65,536 tasks):
    the plan's JSON, the time to cut all 2 D programs in one pass (after the one
    verification) and the time the old way took for a sample of devices (one whole-plan
    scan each, extrapolated), the largest program's JSON, and a worker's load of it
    (parse + check).
(b) What ``Runtime.load`` ships: on ``--workers`` gloo workers (8), a plan of 4,096
    tasks (256 tensors, 4 -> 4 all-to-alls) loaded the old way (the whole plan's JSON to
    every worker, each parsing and verifying it, through the same worker call) and the
    new way (each worker its program), alternated ``--rounds`` times in one run:
    bytes per worker (programs travel pickled by the launcher's transport; their JSON
    size is printed beside) and the first load's wall time, and their ratios.
(d) With ``--against REV`` (a git revision, e.g. the commit an issue was filed at): (b)'s
    first load by that revision's code and by this code, each in processes of their own
    (:mod:`reshard.microbench.infra.revision`), alternated ``--rounds`` times.
(c) SPMD: one rank's cost of planning an ``--spmd-devices`` -> ``--spmd-devices``
    all-to-all itself (plan, digest, its own program), in a process of its own: time and
    peak RSS, planning only its share (:mod:`reshard.planner.share`) and, alternated
    with it, building the whole plan and cutting it; the two digests must agree.

The machine's stolen CPU share is printed with the numbers (``reshard.microbench.steal``)::

    python -m reshard.microbench.scaleout [--devices 256] [--workers 8] [--spmd-devices 1024]
        [--against REV]
"""

from __future__ import annotations

import argparse
import json
import pickle
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

from reshard import Cluster, DeviceMesh, Layout
from reshard.comm.calls import LoadPlan, UnloadPlan
from reshard.comm.program import WorkerProgram, programs
from reshard.microbench import flags
from reshard.microbench.steal import cpu_times, stolen
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import plan_many


def all_to_all(n: int, dtype: str = "float32") -> tuple[tuple, Cluster]:
    """An n -> n all-to-all between two disjoint (n/8, 8) meshes, and its cluster."""
    src = Layout(DeviceMesh((n // 8, 8)), "S01R")
    dst = Layout(DeviceMesh((n // 8, 8), devices=range(n, 2 * n)), "RS10")
    return ((8192, 8192), dtype, src, dst), Cluster.preset("dgx-h100", 2 * n // 8)


def _old_cut(plan: ReshardPlan, device: int) -> int:
    """The old cut of one program: a scan of every task and every tensor's boxes."""
    n = sum(1 for t in plan.tasks if device in t.devices)
    for t in plan.tensors:
        t.src.boxes(t.shape).get(device)
        t.dst.boxes(t.shape).get(device)
    return n


def cut_programs(devices: int, sample: int = 8) -> dict:
    """(a) of the module docstring."""
    args, cluster = all_to_all(devices)
    t0 = time.perf_counter()
    plan = plan_many([args], cluster=cluster)
    planned = time.perf_counter() - t0
    text = plan.to_json()
    t0 = time.perf_counter()
    plan.verify()
    verified = time.perf_counter() - t0
    t0 = time.perf_counter()
    every = programs(plan)
    cut = time.perf_counter() - t0
    t0 = time.perf_counter()
    for d in plan.devices[:sample]:
        _old_cut(plan, d)
    old = (time.perf_counter() - t0) / sample * len(plan.devices)
    sizes = {d: len(p.to_json()) for d, p in every.items()}
    largest = max(sizes, key=sizes.__getitem__)
    big = every[largest].to_json()
    loads = []
    for _ in range(5):
        t0 = time.perf_counter()
        WorkerProgram.from_json(big)
        loads.append(time.perf_counter() - t0)
    return {"devices": devices, "tasks": len(plan.tasks), "plan_s": planned,
            "plan_json_mb": len(text) / 1e6, "verify_s": verified, "programs": len(every),
            "cut_all_s": cut, "old_cut_all_s": old, "largest_program_kb": sizes[largest] / 1e3,
            "programs_json_mb": sum(sizes.values()) / 1e6,
            "load_program_ms": statistics.median(loads) * 1e3}


def _load_plan(workers: int) -> ReshardPlan:
    half = workers // 2
    src = Layout(DeviceMesh((half,)), "S0R")
    dst = Layout(DeviceMesh((half,), devices=range(half, workers)), "RS0")
    reqs = [((64 + i % 5, 64), "float32", src, dst) for i in range(256)]
    return plan_many(reqs, cluster=Cluster.regular(2, half))


def runtime_load(workers: int, rounds: int) -> dict:
    """(b) of the module docstring."""
    from reshard.runtime import Runtime

    old_s: list[float] = []
    new_s: list[float] = []
    with Runtime(backend="gloo", cluster=Cluster.regular(2, workers // 2),
                 launcher="process") as rt:
        warm = _load_plan(workers)  # starts the workers and makes the gloo groups
        rt.load(warm)
        rt.unload(warm)
        sent_old = sent_new = json_new = 0
        for r in range(rounds):
            for way in (("old", "new") if r % 2 == 0 else ("new", "old")):
                plan = _load_plan(workers)  # a new plan object: no cache helps
                targets = rt.group.devices
                t0 = time.perf_counter()
                if way == "old":
                    rt._check_plan(plan)
                    text = plan.to_json()
                    pid = 10**6 + r
                    rt.call({d: LoadPlan(pid, text) for d in targets}, "load")
                    old_s.append(time.perf_counter() - t0)
                    sent_old = len(text) * len(targets)
                    rt.call({d: UnloadPlan(pid) for d in targets}, "unload")
                else:
                    rt.load(plan)
                    new_s.append(time.perf_counter() - t0)
                    shipped = rt._programs(plan).values()
                    sent_new = sum(len(pickle.dumps(p, pickle.HIGHEST_PROTOCOL))
                                   for p in shipped)
                    json_new = sum(len(p.to_json()) for p in shipped)
                    rt.unload(plan)
        tasks = len(_load_plan(workers).tasks)
    return {"workers": workers, "tasks": tasks, "old_load_s": statistics.median(old_s),
            "new_load_s": statistics.median(new_s),
            "old_bytes_per_worker": sent_old / workers,
            "new_bytes_per_worker": sent_new / workers, "new_json_per_worker": json_new / workers}


LOAD_IN_PROCESS = r"""
import json, statistics, sys, time
import reshard
from reshard import Cluster, DeviceMesh, Layout, Runtime
from reshard.planner.plan import plan_many
workers, loads = int(sys.argv[1]), int(sys.argv[2])
def load_plan():  # the same plan as _load_plan: a revision's own code plans it
    half = workers // 2
    src = Layout(DeviceMesh((half,)), "S0R")
    dst = Layout(DeviceMesh((half,), devices=range(half, workers)), "RS0")
    return plan_many([((64 + i % 5, 64), "float32", src, dst) for i in range(256)],
                     cluster=Cluster.regular(2, half))
times = []
with Runtime(backend="gloo", cluster=Cluster.regular(2, workers // 2),
             launcher="process") as rt:
    warm = load_plan()
    rt.load(warm)
    rt.unload(warm)
    for _ in range(loads):
        plan = load_plan()
        t0 = time.perf_counter()
        rt.load(plan)
        times.append(time.perf_counter() - t0)
        rt.unload(plan)
print(json.dumps({"file": reshard.__file__, "loads_s": times}))
"""


def against(rev: str, workers: int, rounds: int, loads: int = 6) -> dict:
    """(d) of the module docstring: first loads by ``rev``'s code and by this code, in
    processes of their own, alternated ``rounds`` times, ``loads`` each."""
    from reshard.microbench.infra.revision import revision_path, run_python

    times: dict[str, list[float]] = {"old": [], "new": []}
    with revision_path(rev) as path:
        for r in range(rounds):
            for way in (("old", "new") if r % 2 == 0 else ("new", "old")):
                out = json.loads(run_python(LOAD_IN_PROCESS, [str(workers), str(loads)],
                                            path if way == "old" else None))
                if (way == "old") != out["file"].startswith(path):
                    raise SystemExit(f"the {way} run imported reshard from {out['file']}")
                times[way] += out["loads_s"]
    return {"rev": rev, "old_load_s": statistics.median(times["old"]),
            "new_load_s": statistics.median(times["new"]), "loads": len(times["old"])}


SPMD_RANK = r"""
import json, resource, sys, time
from reshard.comm.spmd import LocalPlan
from reshard.microbench.scaleout import all_to_all
n, whole = int(sys.argv[1]), sys.argv[2] == "whole"
args, cluster = all_to_all(n, "bfloat16")
t0 = time.perf_counter()
if whole:  # the whole plan built, digested and cut (what a rank paid before shares)
    from reshard.planner.share import PlanShare
    from reshard.planner.plan import plan_many
    from reshard.comm.program import share_program
    share = PlanShare.of_plan(plan_many([args], cluster=cluster), 0)
    planned = time.perf_counter()
    program = share_program(share, all_groups=False)
else:
    local = LocalPlan([args], cluster, 0)
    share = local.share
    planned = time.perf_counter()
    program = local.program((0,), local.record[None, :], all_groups=False)
done = time.perf_counter()
print(json.dumps({"devices": n, "tasks": share.size, "plan_and_digest_s":
    planned - t0, "cut_s": done - planned, "total_s": done - t0, "program_kb":
    len(program.to_json()) / 1e3, "digest": share.digest.hex(), "own_tasks": len(share.tasks),
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def spmd_rank(devices: int, whole: bool = False) -> dict:
    """(c) of the module docstring (a process of its own, for its peak RSS); ``whole``:
    the rank builds the whole plan and cuts it instead of planning its share."""
    run = subprocess.run([sys.executable, "-c", SPMD_RANK, str(devices),
                          "whole" if whole else "share"], capture_output=True,
                         text=True, timeout=900, check=True)
    return json.loads(run.stdout)  # type: ignore[no-any-return]


def _parser() -> argparse.ArgumentParser:
    ap = flags.parser("python -m reshard.microbench.scaleout", __doc__ or "")
    ap.add_argument("--devices", type=int, default=256, help="(a): devices per mesh")
    ap.add_argument("--workers", type=int, default=8, help="(b): gloo workers")
    ap.add_argument("--rounds", type=int, default=4, help="(b): alternated A/B rounds")
    ap.add_argument("--against", metavar="REV", default="",
                    help="(d): also time (b)'s first load with this git revision's code")
    ap.add_argument("--spmd-devices", type=int, default=1024, help="(c): devices per mesh")
    ap.add_argument("--spmd-rounds", type=int, default=2,
                    help="(c): alternated runs of each way")
    return ap


def _cut_line(args: argparse.Namespace) -> str:
    a = cut_programs(args.devices)
    return (f"(a) {a['devices']} -> {a['devices']} all-to-all, {a['tasks']} tasks, plan "
            f"{a['plan_s']:.2f} s, JSON {a['plan_json_mb']:.1f} MB, verify "
            f"{a['verify_s']:.2f} s; all {a['programs']} programs cut in {a['cut_all_s']:.2f} s "
            f"(one scan each: {a['old_cut_all_s']:.1f} s, "
            f"{a['old_cut_all_s'] / a['cut_all_s']:.0f}x); largest program "
            f"{a['largest_program_kb']:.1f} kB, loaded (parse + check) in "
            f"{a['load_program_ms']:.1f} ms; all programs {a['programs_json_mb']:.1f} MB vs the "
            f"plan to each worker {a['plan_json_mb'] * a['programs']:.0f} MB")


def _load_line(args: argparse.Namespace) -> str:
    b = runtime_load(args.workers, args.rounds)
    return (f"(b) Runtime.load of a {b['tasks']}-task plan on {b['workers']} gloo workers: "
            f"the plan to every worker {b['old_bytes_per_worker'] / 1e3:.0f} kB each, "
            f"{b['old_load_s'] * 1e3:.0f} ms; programs {b['new_bytes_per_worker'] / 1e3:.0f} "
            f"kB each, pickled (their JSON {b['new_json_per_worker'] / 1e3:.0f} kB; "
            f"{b['old_bytes_per_worker'] / b['new_bytes_per_worker']:.1f}x fewer bytes), "
            f"{b['new_load_s'] * 1e3:.0f} ms ({b['old_load_s'] / b['new_load_s']:.1f}x "
            f"faster; medians of {args.rounds}, alternated)")


def _against_line(args: argparse.Namespace) -> str:
    d = against(args.against, args.workers, args.rounds)
    return (f"(d) Runtime.load first load, {args.workers} gloo workers, {d['rev']}'s code "
            f"vs this: {d['old_load_s'] * 1e3:.0f} ms vs {d['new_load_s'] * 1e3:.0f} ms, "
            f"{d['old_load_s'] / d['new_load_s']:.1f}x (medians of {d['loads']} loads each, "
            f"processes alternated)")


def _spmd_lines(args: argparse.Namespace) -> list[str]:
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for r in range(args.spmd_rounds):  # alternated: share, whole, whole, share, ...
        for whole in ((False, True) if r % 2 == 0 else (True, False)):
            runs[whole].append(spmd_rank(args.spmd_devices, whole))
    if len({c["digest"] for c in runs[False] + runs[True]}) != 1:
        raise SystemExit("(c) the share's digest differs from the whole plan's")
    out = []
    for whole, label in ((True, "the whole plan, cut"), (False, "its share only")):
        c = min(runs[whole], key=lambda c: c["total_s"])
        out.append(f"(c) SPMD rank of a {c['devices']} -> {c['devices']} all-to-all "
                   f"({c['tasks']} tasks, {c['own_tasks']} its own), {label}: plan + digest "
                   f"{c['plan_and_digest_s']:.2f} s, its program {c['cut_s']:.2f} s, total "
                   f"{c['total_s']:.2f} s, peak RSS {c['peak_rss_mb']:.0f} MB, program "
                   f"{c['program_kb']:.0f} kB")
    best = {w: min(c["total_s"] for c in runs[w]) for w in runs}
    rss = {w: min(c["peak_rss_mb"] for c in runs[w]) for w in runs}
    out.append(f"(c) share vs whole: {best[True] / best[False]:.1f}x faster, "
               f"{rss[True] / rss[False]:.1f}x less peak RSS (best of {args.spmd_rounds} "
               f"each, alternated); digests equal")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run (a), then (b), (d) and (c) where asked, and print their numbers."""
    args = _parser().parse_args(argv)
    before = cpu_times()
    parts = ((True, lambda: [_cut_line(args)]), (args.workers, lambda: [_load_line(args)]),
             (args.against, lambda: [_against_line(args)]),
             (args.spmd_devices, lambda: _spmd_lines(args)))
    for wanted, lines in parts:
        if wanted:
            for line in lines():
                print(line, flush=True)
    share = stolen(before, cpu_times())
    if share is not None:
        print(f"stolen CPU share over the run: {share:.1%}")
    print(f"this process's peak RSS: "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
