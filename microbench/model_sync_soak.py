"""ModelSync's versions soaked, with and without a trainer rank killed mid-sync.

Four processes, one per rank of the ``--backend`` (tcp or nixl): trainer ranks 0 and
1, engine ranks 2 and 3, a small model (:data:`MODEL`, 3 MiB: FSDP rows on the
trainer, column / row parallel and replicated on the engine). Every rank syncs versions
``0 .. --syncs - 1`` in ``--mode``; each engine rank runs a reader thread that reads
whole weight sets (:meth:`reshard.model_sync.ModelSync.reading`) as fast as it can and
sorts every read it gets:

* ``whole``: every element equals the version it was told;
* ``torn``: it held two values (two versions);
* ``mislabelled``: one value, but not the version it was told;
* ``refused``: reading raised (the buffers hold no whole version after a failed sync).

With ``--crash-at K`` trainer rank 0 SIGKILLs itself inside sync K, at its first send:
with ``--hold`` before it posts (it sleeps 0.5 s first, so the other trainer's bytes of
K land and the engines' buffers hold two versions for certain), else after a random
delay up to ``--kill-window`` seconds while its bytes move. The surviving ranks'
syncs must fail (the backend's ``--timeout`` at most) and every engine reader goes on
reading for ``--after`` seconds. Each of ``--rounds`` rounds is a new set of processes;
a line per round, then the totals and the stolen CPU share. Torn and mislabelled must
be 0 in ``"lock"`` and ``"double"`` modes (``"none"`` is the control that tears).

Example::

    python -m reshard.microbench.model_sync_soak --mode lock --syncs 100
    python -m reshard.microbench.model_sync_soak --mode lock --syncs 20 --rounds 5 --crash-at 15
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reshard.cluster import Cluster
from reshard.comm.backend import builtin_backends
from reshard.comm.bootstrap.rendezvous import TcpRendezvousServer
from reshard.comm.executor import Executor
from reshard.errors import ExecutionError
from reshard.layout import Layout
from reshard.mesh import DeviceMesh
from reshard.microbench import flags
from reshard.microbench.steal import cpu_times, stolen_note
from reshard.model_sync import ModelSync, Param

TRAIN, ENGINE = DeviceMesh((2,), [0, 1]), DeviceMesh((2,), [2, 3])
WORLD = (0, 1, 2, 3)
MODEL = (Param("embed", (1024, 256), "float32", Layout(TRAIN, "S0R"), Layout(ENGINE, "S0R")),
         Param("q_proj", (512, 256), "float32", Layout(TRAIN, "S0R"), Layout(ENGINE, "RS0")),
         Param("o_proj", (256, 512), "float32", Layout(TRAIN, "S0R"), Layout(ENGINE, "RS0")),
         Param("norm", (256,), "float32", Layout(TRAIN, "S0"), Layout(ENGINE, "R")))
"""The synced model: 4 tensors, 3 MiB of float32."""
KINDS = ("whole", "torn", "mislabelled", "refused")
"""How a read is counted (module docstring)."""
VICTIM = 0
"""The trainer rank that a crash kills."""


@dataclass(frozen=True)
class Soak:
    """One round's settings (the command line's, module docstring)."""

    mode: str = "lock"
    syncs: int = 100
    crash_at: int | None = None
    hold: bool = False
    kill_window: float = 0.02
    backend: str = "tcp"
    timeout: float = 10.0
    after: float = 0.5
    seed: int = 0
    switch: float | None = None


def shards(device: int, version: int) -> dict[str, np.ndarray]:
    """This trainer rank's shards at ``version``: every element the version."""
    out = {}
    for p in MODEL:
        box = p.src.boxes(p.shape).get(device)
        if box is not None:
            out[p.name] = np.full(tuple(b - a for a, b in box), float(version), np.float32)
    return out


def classify(version: int, weights: dict[str, Any]) -> str:
    """What one read held, against the version it was told (:data:`KINDS`)."""
    values = {float(f(w)) for w in weights.values() for f in (np.min, np.max)}
    if len(values) > 1:
        return "torn"
    return "whole" if values == {float(version)} else "mislabelled"


class Reader:
    """An engine rank's reader thread: reads until stopped, counting each kind."""

    def __init__(self, sync: ModelSync) -> None:
        self.sync = sync
        self.counts = dict.fromkeys(KINDS, 0)
        self.versions: set[int] = set()
        self.refusal = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self.sync.reading() as (version, weights):
                    kind = None if version < 0 else classify(version, dict(weights))
            except ExecutionError as e:
                self.counts["refused"] += 1
                self.refusal = str(e)[:300]
                time.sleep(0.001)
                continue
            if kind is not None:
                self.counts[kind] += 1
                self.versions.add(version)

    def stop(self) -> dict[str, Any]:
        """Stop and report."""
        self._stop.set()
        self._thread.join(30)
        return {**self.counts, "versions": len(self.versions), "refusal": self.refusal}


def _arm_kill(backend: Any, cfg: Soak) -> None:
    """Make ``backend``'s next send kill this process (module docstring): before it
    posts (``cfg.hold``), or a random moment after."""
    real = backend.send
    armed = [True]

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def send(*args: Any, **kwargs: Any) -> Any:
        if armed[0]:
            armed[0] = False
            if cfg.hold:
                time.sleep(0.5)
                die()
            delay = random.Random(cfg.seed).uniform(0, cfg.kill_window)
            threading.Timer(delay, die).start()
        return real(*args, **kwargs)

    backend.send = send


def rank(device: int, address: Any, cfg: Soak, results: Any) -> None:
    """One process's rank: sync ``cfg.syncs`` versions (the victim dies inside
    ``cfg.crash_at``), read meanwhile on an engine rank, and report."""
    import traceback

    try:
        if cfg.switch is not None:
            sys.setswitchinterval(cfg.switch)
        ex = Executor.create(cfg.backend, device, WORLD, address.connect(30), cfg.timeout)
        with ex, ModelSync(ex, MODEL, Cluster.regular(2, 2), mode=cfg.mode) as sync:
            reader = Reader(sync) if device in ENGINE.devices else None
            failed = ""
            for v in range(cfg.syncs):
                if device == VICTIM and v == cfg.crash_at:
                    _arm_kill(sync.loaded.backend, cfg)
                t0 = time.monotonic()
                try:
                    sync.sync(shards(device, v), v)
                except ExecutionError as e:
                    failed = f"sync {v} failed in {time.monotonic() - t0:.1f}s: {e}"[:300]
                    break
            if reader is not None:
                time.sleep(cfg.after if failed else 0.0)
            got = reader.stop() if reader is not None else {}
            results.put((device, {**got, "version": sync.version, "failed": failed,
                                  "cpu": time.process_time()}))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((device, traceback.format_exc()))


def run_round(cfg: Soak, wait: float = 240.0) -> dict[int, dict[str, Any]]:
    """One round in four new processes: ``{device: its report}`` of every rank that
    survives (the victim too when it was not to die). Raises AssertionError on a rank's
    traceback, a rank that does not report within ``wait`` seconds, or a victim that
    did not die."""
    ctx: Any = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods()
                              else "spawn")
    server = TcpRendezvousServer()
    results = ctx.Queue()
    procs = {d: ctx.Process(target=rank, args=(d, server.address, cfg, results), daemon=True)
             for d in WORLD}
    expect = set(WORLD) - ({VICTIM} if cfg.crash_at is not None else set())
    got: dict[int, dict[str, Any]] = {}
    try:
        for p in procs.values():
            p.start()
        end = time.monotonic() + wait
        while set(got) != expect:
            try:
                d, r = results.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"ranks {sorted(expect - set(got))} did not report "
                                     f"within {wait:g}s") from None
            assert isinstance(r, dict), f"device {d} failed:\n{r}"
            got[d] = r
    finally:
        for p in procs.values():
            p.join(15)
            if p.is_alive():
                p.kill()
                p.join(5)
        server.close()
    if cfg.crash_at is not None:
        code = procs[VICTIM].exitcode
        assert code == -signal.SIGKILL, f"the victim exited with {code}, not SIGKILL"
    return got


def main(argv: Sequence[str] | None = None) -> int:
    """Run the rounds and print."""
    ap = flags.parser("python -m reshard.microbench.model_sync_soak", __doc__ or "")
    ap.add_argument("--mode", default="lock", choices=["double", "lock", "none"])
    ap.add_argument("--syncs", type=int, default=100, help="versions synced a round")
    ap.add_argument("--rounds", type=int, default=1, help="rounds (new processes each)")
    ap.add_argument("--crash-at", type=int, default=None,
                    help="the version during whose sync trainer rank 0 is SIGKILLed")
    ap.add_argument("--hold", action="store_true",
                    help="the victim sends none of its bytes before it dies")
    ap.add_argument("--kill-window", type=float, default=0.02,
                    help="without --hold: the kill comes up to this many seconds into "
                         "the victim's sends")
    # the CPU planes whose communicators need not every rank of the world: a killed
    # trainer rank leaves its peers' communicators usable
    ap.add_argument("--backend", default="tcp", choices=[
        e.name for e in builtin_backends().entries
        if e.name in flags.CPU_PLANES and not e.capabilities.groups_need_world])
    ap.add_argument("--timeout", type=float, default=10.0, help="the backend's timeout")
    ap.add_argument("--switch-us", type=float, default=None,
                    help="the ranks' thread switch interval in microseconds (Python's "
                         "default: 5,000); small values make reads and syncs race more")
    args = ap.parse_args(argv)
    before, wall0 = cpu_times(), time.monotonic()
    total = dict.fromkeys(KINDS, 0)
    cpu = 0.0
    for r in range(args.rounds):
        cfg = Soak(args.mode, args.syncs, args.crash_at, args.hold, args.kill_window,
                   args.backend, args.timeout, seed=r,
                   switch=None if args.switch_us is None else args.switch_us * 1e-6)
        got = run_round(cfg)
        crash = "" if cfg.crash_at is None else f", rank {VICTIM} killed " + (
            f"in sync {cfg.crash_at} before sending" if cfg.hold else
            f"0-{1e3 * cfg.kill_window:g} ms after its first send of sync {cfg.crash_at}")
        if args.switch_us is not None:
            crash += f", threads switching every {args.switch_us:g} us"
        print(f"round {r}: {args.mode}, {args.backend}, {args.syncs} syncs{crash}")
        for d in sorted(got):
            g = got[d]
            cpu += g["cpu"]
            if d in ENGINE.devices:
                for k in KINDS:
                    total[k] += g[k]
                print(f"  engine {d}: " + ", ".join(f"{g[k]:,} {k}" for k in KINDS) +
                      f" ({g['versions']} versions seen; last whole {g['version']})")
            if g["failed"]:
                print(f"  rank {d}: {g['failed'][:160]}")
    print(f"total: {args.rounds} round(s) of {args.syncs} syncs: " +
          ", ".join(f"{total[k]:,} {k}" for k in KINDS) +
          f"; {time.monotonic() - wall0:.0f}s wall, the ranks' CPU {cpu:.0f}s (the killed "
          f"ones' not counted); load {os.getloadavg()[0]:.1f}"
          f"{stolen_note(before, cpu_times())}")
    return 0 if total["torn"] == total["mislabelled"] == 0 or args.mode == "none" else 1


if __name__ == "__main__":
    raise SystemExit(main())
