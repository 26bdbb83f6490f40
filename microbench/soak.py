"""Soak: threads sharing one gloo Runtime while workers are killed on purpose.

``--threads`` threads each run ``-n`` mixed reshards (transposes, partial
sums, overlapping meshes, uneven shapes, every strategy, several dtypes) on one
Runtime, and every ``--kill-every`` completed reshards (counted over all threads) a
random worker is SIGKILLed. The calls that were waiting on it must fail with an
``ExecutionError`` within the timeout; the first thread to see the failure replaces
the Runtime and every thread carries on. Reported:

* ``wrong``: destination bytes that differ from the expected slice, over every
  completed reshard (every destination shard is compared byte for byte); must be 0;
* ``errors``: calls failed by a kill, and the longest time from the kill (or the
  call's start, if later) to its error, against ``--timeout``; ``hangs``: calls
  that took longer than the timeout plus a second without an error; must be 0;
* memory: each generation's worker RSS after its first ``-w`` reshards and at
  its end, and the driver's RSS, threads and open files when the first Runtime was
  replaced and when the last one started: flat when nothing leaks across reshards or
  Runtimes.

Example::

    python -m reshard.microbench.soak --threads 8 -n 500 --kill-every 100 -J soak.json
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reshard.cluster import Cluster
from reshard.errors import ExecutionError
from reshard.layout import Layout
from reshard.mesh import DeviceMesh
from reshard.microbench import flags
from reshard.microbench.measure import count_wrong, partial_addends
from reshard.microbench.procmem import memory_mib
from reshard.microbench.report import Progress, machine, write_json
from reshard.runtime import Runtime

CLUSTER = Cluster.regular(4, 2)  # eight workers, four hosts
_M01 = DeviceMesh((2,), [0, 1])
_M23 = DeviceMesh((2,), [2, 3])
_M0123 = DeviceMesh((2, 2), [0, 1, 2, 3])
_M4567 = DeviceMesh((2, 2), [4, 5, 6, 7])
_M2345 = DeviceMesh((4,), [2, 3, 4, 5])  # overlaps both halves
CASES: tuple[tuple[Layout, Layout], ...] = (
    (Layout(_M01, "S0R"), Layout(_M23, "RS0")),  # all-to-all transpose
    (Layout(_M0123, "S0R+P1"), Layout(_M4567, "RS0")),  # partial sum, reduced and moved
    (Layout(_M01, "RR"), Layout(_M4567, "S0S1")),  # 1-to-m
    (Layout(_M0123, "S1S0"), Layout(_M2345, "S0R")),  # overlapping meshes
    (Layout(_M2345, "RS0"), Layout(_M0123, "S01R")),
    (Layout(_M4567, "S0R"), Layout(_M4567, "RR+P0")),  # partial destination, same mesh
)
SHAPES = ((13, 7), (64, 33), (129, 257), (1000, 9), (5, 1))
DTYPES = ("int32", "float64", "int16", "float32")
STRATEGIES = ("broadcast", "send_recv", "allgather")


def _rss_mib(pid: int) -> float:
    return memory_mib(pid).get("VmRSS", float("nan"))


def _driver_footprint() -> dict[str, float]:
    return {"rss_mib": _rss_mib(os.getpid()), "threads": threading.active_count(),
            "open_files": len(os.listdir("/proc/self/fd"))}


@dataclass
class Generation:
    """One Runtime's life."""

    index: int
    rt: Runtime
    started: float
    reshards: int = 0
    killed_at: float | None = None
    rss_warm: float | None = None
    rss_end: float | None = None
    samples: list[tuple[int, float]] = field(default_factory=list)  # (reshards, MiB)


@dataclass
class Soak:
    """Shared state of a soak run."""

    args: argparse.Namespace
    progress: Progress = field(default_factory=lambda: Progress(0, False))
    lock: threading.Lock = field(default_factory=threading.Lock)
    gens: list[Generation] = field(default_factory=list)
    done: int = 0
    wrong: int = 0
    errors: list[float] = field(default_factory=list)  # seconds to each error
    hangs: int = 0
    driver: list[dict] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def new_runtime(self) -> None:
        """Start the next generation (lock held or single-threaded)."""
        self.driver.append(_driver_footprint())
        rt = Runtime("gloo", CLUSTER, "process", timeout=self.args.timeout)
        self.gens.append(Generation(len(self.gens), rt, time.monotonic()))

    def current(self) -> Generation:
        with self.lock:
            return self.gens[-1]

    def replace(self, gen: Generation) -> None:
        """Replace ``gen``'s runtime unless another thread already did."""
        with self.lock:
            if self.gens[-1] is gen:
                gen.rss_end = gen.rss_end or float("nan")
                gen.rt.close()
                self.new_runtime()

    def finished_one(self, gen: Generation, rng: random.Random) -> None:
        with self.lock:
            self.done += 1
            self.progress.advance()
            gen.reshards += 1
            pids = gen.rt.group.pids
            if gen.reshards == self.args.warmup:
                gen.rss_warm = sum(_rss_mib(p) for p in pids.values())
            if gen.reshards % self.args.sample_every == 0:
                gen.samples.append((gen.reshards, sum(_rss_mib(p) for p in pids.values())))
            if self.args.kill_every and self.done % self.args.kill_every == 0 \
                    and gen.killed_at is None:
                gen.rss_end = sum(_rss_mib(p) for p in pids.values())
                victim = rng.choice(sorted(pids))
                gen.killed_at = time.monotonic()
                os.kill(pids[victim], signal.SIGKILL)


def _value(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return rng.integers(-1000, 1000, size=shape).astype(dtype)


def _put(rt: Runtime, rng: np.random.Generator, value: np.ndarray, src: Layout) -> Any:
    if not src.spec.is_partial:
        return rt.put(value, src)
    shards = partial_addends(value, src, lambda shape: _value(rng, shape, value.dtype.name))
    return rt.put_shards(shards, src, value.shape, value.dtype)


def _thread(soak: Soak, k: int) -> None:
    rng = np.random.default_rng(1000 + k)
    pick = random.Random(k)
    kill_rng = random.Random(10_000 + k)
    for _ in range(soak.args.iters):
        gen = soak.current()
        src, dst = CASES[pick.randrange(len(CASES))]
        shape = SHAPES[pick.randrange(len(SHAPES))]
        value = _value(rng, shape, DTYPES[pick.randrange(len(DTYPES))])
        strategy = STRATEGIES[pick.randrange(len(STRATEGIES))]
        start = time.monotonic()
        try:
            x = _put(gen.rt, rng, value, src)
            y = gen.rt.reshard(x, dst, strategy)
            wrong = count_wrong(gen.rt, y, value)
            gen.rt.free(x, y)
        except ExecutionError as e:
            took = time.monotonic() - max(start, gen.killed_at or start)
            with soak.lock:
                soak.progress.advance()
                soak.errors.append(took)
                if gen.killed_at is None:
                    soak.unexpected.append(
                        f"thread {k}: an error without a kill (runtime {gen.index}): {e}")
            soak.replace(gen)
            continue
        except Exception as e:  # noqa: BLE001 - a bug: reported, the run goes on
            with soak.lock:
                soak.progress.advance()
                soak.unexpected.append(f"thread {k}: {type(e).__name__}: {e}")
            continue
        took = time.monotonic() - start
        with soak.lock:
            soak.wrong += wrong * value.itemsize
            if took > soak.args.timeout + 1.0:
                soak.hangs += 1
        soak.finished_one(gen, kill_rng)


def run(args: argparse.Namespace, progress: Progress | None = None) -> dict:
    """The soak run (``progress``: a step per reshard, done or failed); returns the
    summary."""
    soak = Soak(args, progress or Progress(0, False))
    t0 = time.monotonic()
    soak.new_runtime()
    threads = [threading.Thread(target=_thread, args=(soak, k), daemon=True)
               for k in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gen = soak.current()
    gen.rss_end = sum(_rss_mib(p) for p in gen.rt.group.pids.values())
    gen.rt.close()
    # The driver after its first runtime was replaced vs before the last one started:
    # what stays behind from every runtime closed in between.
    driver = [soak.driver[min(1, len(soak.driver) - 1)], soak.driver[-1]]
    gens: list[dict[str, Any]] = [
        {"generation": g.index, "reshards": g.reshards, "worker_rss_warm_mib": g.rss_warm,
         "worker_rss_end_mib": g.rss_end, "worker_rss_samples": g.samples}
        for g in soak.gens]
    growth = [g["worker_rss_end_mib"] - g["worker_rss_warm_mib"] for g in gens
              if g["worker_rss_warm_mib"] is not None and g["worker_rss_end_mib"] is not None]
    return {
        "threads": args.threads, "iterations": args.iters, "kill_every": args.kill_every,
        "timeout_s": args.timeout, "seconds": time.monotonic() - t0,
        "reshards_ok": soak.done, "wrong_bytes": soak.wrong, "hangs": soak.hangs,
        "errors": len(soak.errors), "max_error_s": max(soak.errors, default=0.0),
        "runtimes": len(soak.gens), "unexpected": soak.unexpected,
        "worker_rss_growth_mib_max": max(growth, default=0.0),
        "driver_first": driver[0], "driver_last": driver[1], "generations": gens,
    }


def build_parser() -> argparse.ArgumentParser:
    """The shared benchmark flags (-n: reshards per thread, -w: reshards before the
    first memory sample, --timeout, -J) and the soak's own."""
    ap = flags.parser("python -m reshard.microbench.soak", __doc__ or "")
    flags.add_iterations(ap, iters=500, warmup=30, iters_help="reshards per thread",
                         warmup_help="reshards per Runtime before its worker memory is "
                                     "first sampled")
    g = ap.add_argument_group("soak")
    g.add_argument("--threads", type=flags.positive_int, default=8, metavar="N",
                   help="threads sharing the Runtime")
    g.add_argument("--kill-every", type=flags.natural_int, default=100, metavar="N",
                   help="SIGKILL a random worker every N completed reshards (0: never)")
    g.add_argument("--sample-every", type=flags.positive_int, default=500, metavar="N",
                   help="sample the workers' memory every N reshards of a Runtime")
    flags.add_runtime(ap, timeout=10.0, backends=())
    flags.add_output(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; exit code 1 if any byte was wrong, any call hung, or anything
    but an ExecutionError after a kill went wrong."""
    ap = build_parser()
    args = ap.parse_args(argv)
    flags.check_output_paths(ap, [args.json])
    with Progress(args.threads * args.iters, not args.no_progress, "soak") as progress:
        out = run(args, progress)
    d0, d1 = out["driver_first"], out["driver_last"]
    print(f"# soak: {out['threads']} threads x {out['iterations']} reshards on gloo "
          f"({len(CASES)} layout pairs, {len(SHAPES)} shapes, {len(DTYPES)} dtypes, every "
          f"strategy), a worker killed every {out['kill_every']}: {out['seconds']:.0f} s")
    print(f"reshards completed      {out['reshards_ok']}")
    print(f"wrong bytes             {out['wrong_bytes']}")
    print(f"hangs                   {out['hangs']}")
    print(f"errors after kills      {out['errors']} (slowest {out['max_error_s']:.2f} s, "
          f"timeout {out['timeout_s']:g} s), runtimes {out['runtimes']}")
    print(f"worker RSS growth       {out['worker_rss_growth_mib_max']:+.1f} MiB at most "
          f"per runtime (after {args.warmup} reshards to its end, all workers summed)")
    longest = max(out["generations"], key=lambda g: g["reshards"])
    if longest["worker_rss_samples"]:
        series = ", ".join(f"{n}: {m:.0f}" for n, m in longest["worker_rss_samples"])
        print(f"worker RSS (all workers, MiB) after N reshards of the longest runtime: "
              f"{series}")
    print(f"driver RSS / threads / files  after the first runtime {d0['rss_mib']:.0f} MiB "
          f"/ {d0['threads']} / {d0['open_files']}, before the last {d1['rss_mib']:.0f} MiB "
          f"/ {d1['threads']} / {d1['open_files']}")
    for u in out["unexpected"][:10]:
        print("unexpected:", u)
    if args.json:
        write_json(args.json, {"schema_version": 1, "tool": "soak", "machine": machine(),
                               "args": flags.as_dict(args), **out})
    bad = out["wrong_bytes"] or out["hangs"] or out["unexpected"] or \
        out["max_error_s"] > args.timeout + 1.0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
