"""A two-stage JAX program on 8 CPU devices, activations moved between stages by reshard.

Stage 1 (devices 0-3, mesh ("dp", "tp") = (2, 2)) computes ``h = gelu(x @ w1)`` with
the batch split over dp and the hidden units over tp: ``h`` is ``P("dp", "tp")``.
Stage 2 (devices 4-7, mesh ("mp",) = (4,)) computes ``y = h @ w2`` with ``w2``'s rows
split over mp, so it wants ``h`` as ``P(None, "mp")``: a cross-mesh reshard with a
different layout, planned and executed by reshard (``reshard.adapters.jax``). The
result is checked against the same computation on one device.

Run: ``python examples/jax_two_stage.py`` (needs ``pip install "jax[cpu]"``).
"""

from __future__ import annotations

import argparse
import os
import sys

from reshard.core.cliargs import add_version

# 8 host devices; must be set before JAX initialises its CPU backend.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import reshard
from reshard.adapters import jax as rj


def stage1(x: jax.Array, w1: jax.Array) -> jax.Array:
    """First stage: a dense layer with GELU."""
    return jax.nn.gelu(x @ w1)


def stage2(h: jax.Array, w2: jax.Array) -> jax.Array:
    """Second stage: a dense layer."""
    return h @ w2


def main(argv: list[str] | None = None) -> int:
    """Run the two stages on ``--microbatches`` microbatches; 0 if every output matches
    the single-device result."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_version(ap)
    ap.add_argument("--batch", type=int, default=16, help="rows per microbatch (default 16)")
    ap.add_argument("--hidden", type=int, default=64, help="hidden units (default 64)")
    ap.add_argument("--microbatches", type=int, default=3, help="default 3")
    ap.add_argument("--strategy", default="broadcast",
                    help="reshard strategy: broadcast, send_recv, allgather (default broadcast)")
    args = ap.parse_args(argv)
    devices = np.array(jax.devices(), dtype=object)
    if len(devices) < 8:
        print(f"needs 8 JAX devices, found {len(devices)}", file=sys.stderr)
        return 2
    mesh1 = Mesh(devices[:4].reshape(2, 2), ("dp", "tp"))
    mesh2 = Mesh(devices[4:8].reshape(4), ("mp",))
    rng = np.random.default_rng(0)
    d_in, d_out = 32, 8
    w1_host = rng.standard_normal((d_in, args.hidden)).astype(np.float32)
    w2_host = rng.standard_normal((args.hidden, d_out)).astype(np.float32)

    w1 = jax.device_put(w1_host, NamedSharding(mesh1, P(None, "tp")))
    w2 = jax.device_put(w2_host, NamedSharding(mesh2, P("mp", None)))
    h_out = NamedSharding(mesh1, P("dp", "tp"))
    h_in = NamedSharding(mesh2, P(None, "mp"))
    run1 = jax.jit(stage1, out_shardings=h_out)
    run2 = jax.jit(stage2, out_shardings=NamedSharding(mesh2, P()))

    shape = (args.batch, args.hidden)
    src, dst = rj.to_layout(h_out, shape), rj.to_layout(h_in, shape)
    plan = reshard.plan(shape, np.float32, src, dst, strategy=args.strategy)
    print(f"activation {shape} float32: stage 1 {src} -> stage 2 {dst}")
    print(f"plan ({args.strategy}): {len(plan.tasks)} tasks, {plan.bytes_moved()} bytes moved")

    worst = 0.0
    with reshard.Runtime(backend="local") as rt:
        for mb in range(args.microbatches):
            x_host = rng.standard_normal((args.batch, d_in)).astype(np.float32)
            x = jax.device_put(x_host, NamedSharding(mesh1, P("dp", None)))
            h = run1(x, w1)
            h2 = rj.reshard_array(h, h_in, strategy=args.strategy, runtime=rt)
            y = run2(h2, w2)
            ref = stage2(stage1(jnp.asarray(x_host), jnp.asarray(w1_host)),
                         jnp.asarray(w2_host))
            err = float(np.max(np.abs(np.asarray(y) - np.asarray(ref))))
            worst = max(worst, err)
            on = sorted(d.id for d in h2.sharding.device_set)  # type: ignore[attr-defined]
            print(f"microbatch {mb}: activation on devices {on}, max |y - y_ref| = {err:.2e}")
    ok = worst <= 1e-3  # float32 sums in another order; a wrong slice is off by O(1)
    print("OK" if ok else f"MISMATCH: max error {worst:.2e} > 1e-3")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
