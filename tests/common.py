"""Checks and random problems shared by every test tier (unit, cpu, gpu)."""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable

import numpy as np
from hypothesis import strategies as st

from reshard import DeviceMesh, Layout, ShardingSpec
from reshard.dtypes import is_float8, parse_dtype
from reshard.dtypes import summable as dtypes_summable
from reshard.microbench.measure import partial_addends
from reshard.planner.ir import ReshardPlan
from reshard.planner.values.tasks import TaskKind

STRATEGIES = ("send_recv", "allgather", "broadcast")
DTYPES = ("int8", "uint16", "int32", "int64", "float32", "float64", "complex64", "bool",
          "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


def sample(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random values of ``dtype`` whose sums stay exact (small integers; bfloat16 and
    float16: within +-8, so a partial group's addends, up to 16 of them, sum exactly
    in the type itself); float8: any bit pattern, NaNs included (float8 is moved, never
    summed)."""
    dt = parse_dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if is_float8(dt.name):
        return rng.integers(0, 256, size=shape).astype(np.uint8).view(dt)
    if dt.name in ("bfloat16", "float16"):
        return rng.integers(-8, 9, size=shape).astype(dt)
    vals = rng.integers(-50, 50, size=shape)
    if dt.kind == "u":
        vals = np.abs(vals)
    if dt.kind == "c":
        vals = vals + 1j * rng.integers(-50, 50, size=shape)
    return vals.astype(dt)


def addends(rng: np.random.Generator, value: np.ndarray, layout: Layout) -> dict[int, np.ndarray]:
    """Per-device shards of ``value`` on ``layout``; on partial axes, random addends
    that sum (with the dtype's wrap-around) to the value."""
    return partial_addends(value, layout, lambda shape: sample(rng, shape, value.dtype.name))


def put_value(rt, value: np.ndarray, layout: Layout, rng: np.random.Generator):
    """Put ``value`` on ``layout``; a partial layout gets random addends."""
    if not layout.spec.is_partial:
        return rt.put(value, layout)
    return rt.put_shards(addends(rng, value, layout), layout, value.shape, value.dtype)


def in_threads(work: Callable[[int], None], count: int, timeout: float) -> list[str]:
    """Run ``work(k)`` for ``k`` in ``range(count)``, each in its own thread, with a tiny
    switch interval (threads interleave as often as they can); returns one line per
    thread that raised or did not finish within ``timeout`` seconds."""
    errors: list[str] = []

    def run(k: int) -> None:
        try:
            work(k)
        except Exception as e:  # noqa: BLE001 - reported to the caller
            errors.append(f"thread {k}: {type(e).__name__}: {e}")

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(count)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
    finally:
        sys.setswitchinterval(old)
    errors += [f"thread {k}: did not finish" for k, t in enumerate(threads) if t.is_alive()]
    return errors


def check_shards(rt, y, value: np.ndarray) -> None:
    """Every destination shard equals its slice of ``value`` byte for byte (partial
    destinations: partial leaders hold the value, the other addends zeros)."""
    shards = rt.shards(y)
    leaders = y.layout.partial_leaders()
    for d, sl in y.layout.index_map(value.shape).items():
        want = np.ascontiguousarray(value[sl] if d in leaders else np.zeros_like(value[sl]))
        got = shards[d]
        assert got.shape == want.shape and got.dtype == want.dtype, (d, got.shape, want.shape)
        assert got.tobytes() == want.tobytes(), f"device {d} of {y.layout} differs"


def allreduce_first_moves(rt, value: np.ndarray, src: Layout, dst: Layout,
                          rng: np.random.Generator):
    """Put ``value`` on ``src`` (random addends where partial), move it to ``dst`` with
    the all-reduce-first plan (reshard.planner.passes.allreduce; it must begin with an
    ALLREDUCE), check every destination shard byte for byte; returns ``(x, y)``."""
    from reshard.planner.passes.allreduce import allreduce_first
    from reshard.planner.plan import _best_plan

    x = put_value(rt, value, src, rng)
    p = rt.plan(x, dst)
    first = allreduce_first(p.tensors, p.cluster, p.strategy, _best_plan)
    assert first is not None and first.tasks[0].kind is TaskKind.ALLREDUCE
    (y,) = rt.execute(first, [x])
    check_shards(rt, y, value)
    return x, y


def wire_bytes(plan: ReshardPlan) -> int:
    """Bytes a plan puts on the wire, from its tasks alone: a send carries its box once,
    a broadcast once per receiver (and, summing addends, once per addend), a reduction
    once per contributor, an all-gather each member's (padded) piece to every other
    member."""
    total = 0
    for t in plan.tasks:
        if t.kind is TaskKind.SEND:
            total += t.nbytes
        elif t.kind in (TaskKind.BROADCAST, TaskKind.REDUCE):
            total += t.nbytes * (len(t.receivers) + len(t.addends))
        elif t.kind is TaskKind.ALLGATHER:
            itemsize = plan.tensors[t.tensor].itemsize
            m = max(math.prod(b - a for a, b in p) for p in t.pieces)
            k = len(t.receivers)
            total += m * itemsize * k * (k - 1)
    return total


def narrow_addends(rng: np.random.Generator, shape: tuple[int, ...], layout: Layout,
                   dtype: str) -> dict[int, np.ndarray]:
    """Random addends per partial group whose float32 sum is exact, so any summing
    order gives the reference: ``m * 2**e`` with ``|m| < 256`` (8 significant bits,
    exact in bfloat16 and float16) and ``e`` in -12..-4; 16 such addends span 20 bits,
    within float32's 24. Replicas of a box get the same addends."""
    dt = parse_dtype(dtype)
    boxes = layout.boxes(shape)
    drawn: dict = {}  # replicas of a box (or of a partial group) hold the same addends
    shards = {}
    for group in layout.partial_groups():
        box = boxes[group[0]]
        sub = tuple(b - a for a, b in box)
        for k, d in enumerate(group):
            if (box, k) not in drawn:
                mant = rng.integers(-255, 256, size=sub).astype(np.float32)
                drawn[(box, k)] = (mant * np.exp2(rng.integers(-12, -3, size=sub))).astype(dt)
            shards[d] = drawn[(box, k)]
    return shards


def cast_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Normal values scaled per leading row by 0.01 .. 1000 (blocks of very different
    amax), of ``dtype``."""
    x = rng.standard_normal(shape) * rng.uniform(0.01, 1000, shape[:1] + (1,) * (len(shape) - 1))
    return x.astype(parse_dtype(dtype))


# ----- random problems ------------------------------------------------------------------
@st.composite
def meshes(draw, pool: tuple[int, ...], max_ndim: int = 3, max_size: int = 16) -> DeviceMesh:
    """A mesh of 1..max_ndim axes and at most ``max_size`` devices over a prefix of
    ``pool``."""
    ndim = draw(st.integers(1, max_ndim))
    limit = min(max_size, len(pool))
    shape: list[int] = []
    for _ in range(ndim):
        room = limit // max(1, math.prod(shape))
        shape.append(draw(st.integers(1, max(1, min(4, room)))))
    return DeviceMesh(tuple(shape), devices=pool[:math.prod(shape)])


@st.composite
def specs(draw, mesh_ndim: int, rank: int, allow_partial: bool) -> ShardingSpec:
    """Each mesh axis splits a random dim (random major/minor order), replicates, or
    (if allowed) is partial."""
    dims: list[list[int]] = [[] for _ in range(rank)]
    partial = []
    for axis in draw(st.permutations(range(mesh_ndim))):
        choice = draw(st.sampled_from(["R", "S", "P"] if allow_partial else ["R", "S"]))
        if choice == "S" and rank:
            dims[draw(st.integers(0, rank - 1))].append(axis)
        elif choice == "P":
            partial.append(axis)
    return ShardingSpec(tuple(tuple(d) for d in dims), tuple(partial))


@st.composite
def problems(draw, devices: tuple[int, ...], max_ndim: int = 3, max_size: int = 16):
    """(shape, dtype, src layout, dst layout): uneven shapes (dims 0 and 1 included),
    disjoint or overlapping meshes, S01/S10 orders, replication, partial sources and
    destinations for summable dtypes."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank)))
    dtype = draw(st.sampled_from(DTYPES))
    summable = dtypes_summable(dtype)
    order = tuple(draw(st.permutations(devices)))
    src_mesh = draw(meshes(order, max_ndim, max_size))
    if draw(st.booleans()):  # overlapping: the destination reuses source devices
        dst_pool = tuple(draw(st.permutations(order)))
    else:
        rest = tuple(d for d in order if d not in src_mesh.devices)
        dst_pool = rest if rest else order
    dst_mesh = draw(meshes(dst_pool, max_ndim, max_size))
    src = Layout(src_mesh, draw(specs(src_mesh.ndim, rank, summable)))
    dst = Layout(dst_mesh, draw(specs(dst_mesh.ndim, rank, summable)))
    return shape, dtype, src, dst
