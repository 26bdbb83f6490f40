"""What a planned model-level sync costs over the bare transfer.

:class:`reshard.model_sync.ModelSync` plans once and then only moves bytes; its
versioning (double buffers, the swap, the version check) must cost next to nothing.
This runs, on ranks of the tcp backend (threads of one process: 2 trainer ranks, 2
engine ranks), a transformer-shaped state dict (``--layers`` blocks of width
``--width``, float32; FSDP rows on the trainer, Megatron tensor parallelism on the
engine) synced ``--rounds`` times each way, alternated: ``ModelSync.sync`` (mode
``double``, the default) against ``Executor.run`` of the same loaded plan into one
fixed buffer set. Prints the medians, their ratio (goal <= 1.05) and the CPU steal.

Example::

    python -m reshard.microbench.model_sync_bench [--layers 4 --width 1024 --rounds 15]
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence

import numpy as np

from reshard.cluster import Cluster
from reshard.comm.backends.tcp import TcpBackend
from reshard.comm.bootstrap.rendezvous import TcpRendezvousServer
from reshard.comm.executor import Executor
from reshard.layout import Layout
from reshard.mesh import DeviceMesh
from reshard.microbench import flags
from reshard.microbench.steal import cpu_times, stolen_note
from reshard.model_sync import ModelSync, Param

TRAIN, ENGINE = DeviceMesh((2,), [0, 1]), DeviceMesh((2,), [2, 3])


def params(layers: int, width: int) -> list[Param]:
    """A transformer's matrices and norms: FSDP rows -> column / row parallel, norms
    replicated."""
    out = []
    for i in range(layers):
        for name, shape, spec in ((f"{i}.qkv", (3 * width, width), "S0R"),
                                  (f"{i}.out", (width, width), "RS0"),
                                  (f"{i}.up", (4 * width, width), "S0R"),
                                  (f"{i}.down", (width, 4 * width), "RS0"),
                                  (f"{i}.norm", (width,), "R")):
            src = Layout(TRAIN, "S0" + "R" * (len(shape) - 1))
            out.append(Param(name, shape, "float32", src, Layout(ENGINE, spec)))
    return out


def rank(device: int, address, ps: list[Param], rounds: int, out: dict) -> None:
    """One rank: alternate a ModelSync.sync and a bare run, ``rounds`` times each."""
    b = TcpBackend(device, (0, 1, 2, 3), address.connect(10), 60.0)
    try:
        ex = Executor(b)
        with ModelSync(ex, ps, Cluster.regular(2, 2)) as sync:
            mine = {p.name: np.ones([c - a for a, c in p.src.boxes(p.shape)[device]],
                                    np.float32)
                    for p in ps if device in p.src.boxes(p.shape)}
            shards = [mine.get(p.name) for p in ps]
            bufs = {d.tensor: d.empty() for d in sync.loaded.destinations()}
            timed: dict[str, list[float]] = {"sync": [], "bare": []}
            for r in range(rounds + 1):  # the first of each warms up
                for kind in ("sync", "bare") if r % 2 else ("bare", "sync"):
                    t0 = time.perf_counter()
                    if kind == "sync":
                        sync.sync(mine, r)
                    else:
                        ex.run(sync.loaded, shards, out=bufs).wait()
                    if r:
                        timed[kind].append(time.perf_counter() - t0)
            out[device] = timed
    finally:
        b.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print."""
    ap = flags.parser("python -m reshard.microbench.model_sync_bench", __doc__ or "")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks")
    ap.add_argument("--width", type=int, default=1024, help="model width")
    ap.add_argument("--rounds", type=int, default=15, help="timed rounds of each call")
    args = ap.parse_args(argv)
    ps = params(args.layers, args.width)
    nbytes = sum(4 * int(np.prod(p.shape)) for p in ps)
    before = cpu_times()
    server = TcpRendezvousServer()
    out: dict = {}
    threads = [threading.Thread(target=rank, args=(d, server.address, ps, args.rounds, out))
               for d in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
    finally:
        server.close()
    if len(out) != 4:
        print("a rank failed")
        return 1
    # a round ends when its slowest rank does
    sync = statistics.median(max(out[d]["sync"][i] for d in out)
                             for i in range(args.rounds))
    bare = statistics.median(max(out[d]["bare"][i] for d in out)
                             for i in range(args.rounds))
    ratio = sync / bare
    print(f"{len(ps)} tensors, {nbytes / 2**20:.0f} MiB, 2 -> 2 tcp ranks (threads), "
          f"median of {args.rounds} each, alternated")
    print(f"  ModelSync.sync {1e3 * sync:8.1f} ms   bare Executor.run {1e3 * bare:8.1f} ms   "
          f"ratio {ratio:.3f} (goal <= 1.05: {'met' if ratio <= 1.05 else 'MISSED'})")
    print(f"this run{stolen_note(before, cpu_times())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
