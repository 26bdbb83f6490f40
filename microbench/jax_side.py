"""``reshard.adapters.jax.reshard_array`` side by side with ``jax.device_put``.

In one process on 8 JAX CPU devices, each case moves an array (64 MiB unless said) from
a 2x2 mesh to another 2x2 mesh (devices 0-3 -> 4-7; the overlapping case 0-3 -> 2-5),
alternating the two calls, median of ``--repeats``: ``reshard_array`` as a user calls
it (JAX makes the move where it can: every device here, no reshard-only option) against
``jax.device_put``, every result checked bit for bit against device_put's; and, for
reference, the same move forced through a reshard plan (``strategy="broadcast"``: the
path that also serves devices of other processes, byte budgets and casts). Prints the
ratio per case (goal <= 1.2) and the CPU steal.

Example::

    python -m reshard.microbench.jax_side [--repeats 7]
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from reshard.microbench import flags
from reshard.microbench.steal import cpu_times, stolen_note

CASES = (  # name, shape, dtype, source spec, destination spec, destination devices
    ("S0 -> S1", (4096, 4096), "float32", ("a", None), (None, "a"), (4, 8)),
    ("S01 -> R", (4096, 4096), "float32", (("a", "b"), None), (), (4, 8)),
    ("R -> S10", (4096, 4096), "float32", (), (("b", "a"), None), (4, 8)),
    ("S0S1 -> S1S0", (4096, 4096), "float32", ("a", "b"), ("b", "a"), (4, 8)),
    ("uneven 3000x5462", (3000, 5462), "float32", ("a", "b"), ("b", None), (4, 8)),
    ("bf16 S0 -> S1", (4096, 8192), "bfloat16", ("a", None), (None, "a"), (4, 8)),
    ("overlapping S0S1 -> S1S0", (4096, 4096), "float32", ("a", "b"), ("b", "a"), (2, 6)),
)


def _median_ms(fn: Callable[[], Any], results: list) -> float:
    t0 = time.perf_counter()
    y = fn()
    y.block_until_ready()
    results.append(y)
    return 1e3 * (time.perf_counter() - t0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the cases and print the table."""
    ap = flags.parser("python -m reshard.microbench.jax_side", __doc__ or "")
    ap.add_argument("--repeats", type=int, default=7, help="timed rounds of each call")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="shrink every case's rows by this factor (tests: 0.01)")
    args = ap.parse_args(argv)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from reshard.adapters.jax import reshard_array
    from reshard.dtypes import parse_dtype

    devices = np.array(jax.devices(), dtype=object)
    if len(devices) < 8:
        print(f"needs 8 JAX CPU devices, got {len(devices)} (jax initialised before "
              f"XLA_FLAGS was set)")
        return 1
    before = cpu_times()
    rng = np.random.default_rng(0)
    print(f"{'case':<26} {'MiB':>5} {'device_put':>11} {'reshard_array':>14} {'ratio':>6} "
          f"{'via a plan':>11} {'equal':>6}")
    worst = 0.0
    for name, shape, dtype, src_spec, dst_spec, (lo, hi) in CASES:
        rows = max(4, int(shape[0] * args.scale) // 4 * 4)
        shape = (rows, shape[1])
        src = NamedSharding(Mesh(devices[:4].reshape(2, 2), ("a", "b")), P(*src_spec))
        dst = NamedSharding(Mesh(devices[lo:hi].reshape(2, 2), ("a", "b")), P(*dst_spec))
        value = rng.standard_normal(shape).astype(parse_dtype(dtype))
        x = jax.device_put(value, src)
        x.block_until_ready()
        times: dict[str, list[float]] = {"jax": [], "ours": [], "plan": []}
        outs: dict[str, list] = {"jax": [], "ours": [], "plan": []}
        calls = {"jax": lambda x=x, dst=dst: jax.device_put(x, dst),
                 "ours": lambda x=x, dst=dst: reshard_array(x, dst),
                 "plan": lambda x=x, dst=dst: reshard_array(x, dst, strategy="broadcast")}
        for r in range(args.repeats + 1):  # the first round warms up
            order = ("jax", "ours", "plan") if r % 2 else ("ours", "jax", "plan")
            for kind in order:
                t = _median_ms(calls[kind], outs[kind])
                if r:
                    times[kind].append(t)
        ref = np.asarray(outs["jax"][-1])
        equal = all(np.asarray(y).tobytes() == ref.tobytes() and y.sharding == dst
                    for kind in ("ours", "plan") for y in outs[kind][-1:])
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = med["ours"] / med["jax"]
        worst = max(worst, ratio)
        mib = value.nbytes / 2**20
        print(f"{name:<26} {mib:>5.0f} {med['jax']:>9.2f}ms {med['ours']:>12.2f}ms "
              f"{ratio:>6.2f} {med['plan']:>9.1f}ms {'yes' if equal else 'NO':>6}", flush=True)
        if not equal:
            return 1
    print(f"worst ratio {worst:.2f} (goal <= 1.2: {'met' if worst <= 1.2 else 'MISSED'}); "
          f"median of {args.repeats}, alternated{stolen_note(before, cpu_times())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
