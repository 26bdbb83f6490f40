"""Multi-controller JAX: reshard's ``ProcessMove`` beside JAX's own cross-process path.

Each JAX process sees one CPU device (``jax.distributed.initialize`` on loopback, gloo
collectives); the array (64 MiB float32 unless said) lives on a 2x2 mesh of four
processes or a 2x4 mesh of all eight. JAX moves it across processes only within one
device set: a jitted identity whose output sharding is the target (XLA's collectives
over gloo), timed against
``reshard.adapters.jax.ProcessMove`` on the same processes (reshard's Executor, one gloo
rank per process; planned for this machine's links, measured first as
``reshard-bench --cluster local`` measures them), alternated, the slowest process of each round, median of
``--repeats``. Between two device sets (four processes to four others) JAX refuses
(``jax.device_put``: "input and target sharding should have the same set of devices";
its experimental support is for TPU alone): the table gives its message and
reshard's time. Every result is checked against the source's expected slice, bit for
bit, in every process. Prints the ratios and the CPU steal.

Example::

    python -m reshard.microbench.jax_processes [--repeats 7]
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import statistics
import time
from collections.abc import Sequence
from typing import Any

from reshard.microbench import flags
from reshard.microbench.steal import cpu_times, stolen_note

CASES = (  # name, source spec, destination spec, disjoint device sets
    ("S0 -> S1 (2x4)", ("a", None), (None, "a"), False),
    ("S0S1 -> S1S0 (2x4)", ("a", "b"), ("b", "a"), False),
    ("S01 -> R (2x4)", (("a", "b"), None), (), False),
    ("S0S1 -> S1S0, 2x2: 0-3 -> 4-7", ("a", "b"), ("b", "a"), True),
)


def _case(jax: Any, ex: Any, case: tuple, shape: tuple[int, int], repeats: int,
          full: Any, cluster: Any) -> dict[str, Any]:
    """One case in this process: per round the seconds of JAX's path and of reshard's."""
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from reshard.adapters.jax import ProcessMove

    name, a, b, disjoint = case
    devs = np.array(sorted(jax.devices(), key=lambda d: d.id))
    if disjoint:  # a 2x2 mesh of four processes to one of the other four
        src = NamedSharding(Mesh(devs[:4].reshape(2, 2), ("a", "b")), P(*a))
        dst = NamedSharding(Mesh(devs[4:].reshape(2, 2), ("a", "b")), P(*b))
    else:  # one 2x4 mesh of every process
        mesh = Mesh(devs.reshape(2, 4), ("a", "b"))
        src, dst = NamedSharding(mesh, P(*a)), NamedSharding(mesh, P(*b))
    x = jax.make_array_from_callback(shape, src, lambda i: full[i], dtype=np.float32)
    move = ProcessMove(ex, shape, np.float32, src, dst, cluster=cluster)
    calls = {"reshard": lambda: move(x)}
    out: dict[str, Any] = {}
    if disjoint:
        try:
            jax.device_put(x, dst).block_until_ready()
            out["jax_refused"] = ""
        except ValueError as e:
            out["jax_refused"] = str(e).split(".")[0]
    else:
        same = jax.jit(lambda v: v, out_shardings=dst)
        calls["jax"] = lambda: same(x)
    times: dict[str, list[float]] = {k: [] for k in calls}
    for r in range(repeats + 1):  # the first round warms up
        for k, call in calls.items():
            multihost_utils.sync_global_devices(f"{name}/{k}/{r}")
            t0 = time.perf_counter()
            y = call()
            y.block_until_ready()
            if r:
                times[k].append(time.perf_counter() - t0)
            for s in y.addressable_shards:
                if not np.array_equal(np.asarray(s.data), full[s.index]):
                    raise AssertionError(f"{name}: {k}'s shard on {s.device} differs")
    out.update(times)
    return out


def _worker(pid: int, n: int, port: int, address: Any, shape: tuple[int, int], repeats: int,
            figures: dict[str, Any], results: Any) -> None:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        import jax
        import numpy as np

        from reshard.cluster import Cluster
        from reshard.comm.executor import Executor

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=n, process_id=pid)
        ids = sorted(d.id for d in jax.devices())
        me = jax.local_devices()[0].id
        full = np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape)
        cluster = Cluster.from_hosts([[i] for i in ids], **figures)  # a process a host
        with Executor.create("gloo", me, ids, address.connect(60.0), 120.0) as ex:
            got = [_case(jax, ex, c, shape, repeats, full, cluster) for c in CASES]
        results.put((pid, got))
        jax.distributed.shutdown()
    except BaseException as e:  # noqa: BLE001 - reported to the driver
        results.put((pid, f"{type(e).__name__}: {e}"))


def run(repeats: int = 7, rows: int = 4096, measured: bool = True) -> list[dict[str, Any]]:
    """Every case on 8 processes; per case the median over rounds of the slowest
    process's seconds, per path (and JAX's refusal where it has no path).
    ``measured``: plan for this machine's links (else the paper preset's)."""
    from reshard.comm.bootstrap.rendezvous import TcpRendezvousServer
    from reshard.microbench.calibrate import measure
    from reshard.microbench.infra.procs import reap

    n = 8
    shape = (rows, 4096)
    # reshard plans for this machine's links, measured (reshard-bench --cluster local)
    figures = measure(n // 2, backend="gloo").overrides(1) if measured else {}
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    server = TcpRendezvousServer()
    with socket.socket() as probe:  # a port for JAX's coordinator
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    procs = [ctx.Process(target=_worker, daemon=True,
                         args=(i, n, port, server.address, shape, repeats, figures,
                               results))
             for i in range(n)]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=600) for _ in procs)
    finally:
        reap(procs, 60.0)
        server.close()
    bad = {pid: r for pid, r in got.items() if isinstance(r, str)}
    if bad:
        raise RuntimeError(f"worker(s) failed: {bad}")
    out = []
    for k, (name, *_rest) in enumerate(CASES):
        per = [got[pid][k] for pid in sorted(got)]
        row: dict[str, Any] = {"case": name, "bytes": shape[0] * shape[1] * 4}
        for path in ("jax", "reshard"):
            if path in per[0]:
                rounds = zip(*(p[path] for p in per))
                row[f"{path}_ms"] = 1e3 * statistics.median(max(r) for r in rounds)
        row["jax_refused"] = per[0].get("jax_refused")
        out.append(row)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the cases and print the table."""
    ap = flags.parser("python -m reshard.microbench.jax_processes", __doc__ or "")
    ap.add_argument("--repeats", type=int, default=7, help="timed rounds of each path")
    ap.add_argument("--rows", type=int, default=4096,
                    help="rows of the 4096-column float32 array (tests: fewer)")
    args = ap.parse_args(argv)
    before = cpu_times()
    rows = run(args.repeats, args.rows)
    print(f"# {rows[0]['bytes'] / 2**20:.0f} MiB float32, 8 JAX processes of one CPU device "
          f"each; median of {args.repeats}, the slowest process a round")
    print(f"{'case':36s} {'jax (ms)':>10s} {'reshard (ms)':>13s} {'jax / reshard':>14s}")
    for r in rows:
        if r.get("jax_ms") is not None:
            print(f"{r['case']:36s} {r['jax_ms']:10.2f} {r['reshard_ms']:13.2f} "
                  f"{r['jax_ms'] / r['reshard_ms']:14.2f}")
        else:
            print(f"{r['case']:36s} {'refused':>10s} {r['reshard_ms']:13.2f} "
                  f"{'-':>14s}  (JAX: {r['jax_refused']})")
    print(f"# this run{stolen_note(before, cpu_times())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
