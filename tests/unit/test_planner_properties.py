"""Property tests: any layout pair, any shape, every strategy moves the right bytes."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster, DeviceMesh, Layout, ShardingSpec
from reshard.planner.ir import ReshardPlan

from .conftest import check_shards, wire_bytes

STRATEGIES = ("send_recv", "allgather", "broadcast")
DTYPES = ("int8", "uint16", "int32", "int64", "float32", "float64", "complex64", "bool")
POOL = 24  # device ids 0..23


@st.composite
def meshes(draw, devices=None):
    ndim = draw(st.integers(1, 3))
    shape = []
    for _ in range(ndim):
        limit = 16 // max(1, math.prod(shape))
        shape.append(draw(st.integers(1, max(1, min(4, limit)))))
    n = math.prod(shape)
    if devices is None:
        devs = draw(st.permutations(range(POOL)))[:n]
    else:
        devs = devices[:n]
    return DeviceMesh(tuple(shape), devices=devs)


@st.composite
def specs(draw, mesh_ndim, rank, allow_partial):
    dims: list[list[int]] = [[] for _ in range(rank)]
    partial = []
    for axis in draw(st.permutations(range(mesh_ndim))):  # random major/minor order
        choice = draw(st.sampled_from(["R", "S", "P"] if allow_partial else ["R", "S"]))
        if choice == "S" and rank:
            dims[draw(st.integers(0, rank - 1))].append(axis)
        elif choice == "P":
            partial.append(axis)
    return ShardingSpec(tuple(tuple(d) for d in dims), tuple(partial))


@st.composite
def problems(draw, allow_partial=True):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank)))
    dtype = draw(st.sampled_from(DTYPES))
    summable = dtype != "bool"
    src_mesh = draw(meshes())
    if draw(st.booleans()):  # overlapping meshes: destination drawn from source devices
        pool = list(src_mesh.devices) + [d for d in range(POOL) if d not in src_mesh.devices]
        dst_mesh = draw(meshes(devices=draw(st.permutations(pool))))
    else:
        dst_mesh = draw(meshes())
    src = Layout(src_mesh, draw(specs(src_mesh.ndim, rank, allow_partial and summable)))
    dst = Layout(dst_mesh, draw(specs(dst_mesh.ndim, rank, allow_partial and summable)))
    per_host = draw(st.integers(1, 8))
    order = draw(st.permutations(range(POOL)))
    cluster = Cluster.from_hosts([order[i:i + per_host] for i in range(0, POOL, per_host)])
    return shape, np.dtype(dtype), src, dst, cluster


def random_value(shape, dtype, rng):
    v = rng.integers(-50, 50, size=shape)
    if dtype.kind == "b":
        return v > 0
    if dtype.kind == "u":
        v = np.abs(v)
    if dtype.kind == "c":
        return (v + 1j * rng.integers(-5, 5, size=shape)).astype(dtype)
    return v.astype(dtype)


def put_value(rt, value, layout, rng):
    """Put ``value``; a partial layout gets random addends that sum to it."""
    if not layout.spec.is_partial:
        return rt.put(value, layout)
    boxes = layout.boxes(value.shape)
    shards = {}
    for group in layout.partial_groups():
        sl = tuple(slice(a, b) for a, b in boxes[group[0]])
        rest = value[sl].copy()
        for d in group[1:]:
            addend = random_value(rest.shape, value.dtype, rng)
            shards[d] = addend
            rest = rest - addend
        shards[group[0]] = rest
    return rt.put_shards(shards, layout, value.shape, value.dtype)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from(STRATEGIES), st.integers(0, 2 ** 32 - 1))
def test_every_destination_shard_exact(problem, strategy, seed):
    shape, dtype, src, dst, cluster = problem
    rng = np.random.default_rng(seed)
    value = random_value(shape, dtype, rng)
    with reshard.Runtime(backend="local", cluster=cluster) as rt:
        x = put_value(rt, value, src, rng)
        p = rt.plan(x, dst, strategy)
        rt.group.fabric.reset_counters()
        y = rt.execute(p, [x])[0]
        assert rt.group.fabric.total_bytes() == wire_bytes(p)  # exactly the plan's bytes
        check_shards(rt, y, value)
        assert np.array_equal(rt.get(y), value)
        # the source is untouched (reductions work on private copies)
        assert np.array_equal(rt.get(x), value)


@settings(max_examples=80, deadline=None)
@given(problems(), st.sampled_from(STRATEGIES))
def test_plan_json_round_trip_and_determinism(problem, strategy):
    shape, dtype, src, dst, cluster = problem
    p = reshard.plan(shape, dtype, src, dst, cluster=cluster, strategy=strategy)
    q = ReshardPlan.from_json(p.to_json())
    assert q == p and hash(q) == hash(p)
    assert reshard.plan(shape, dtype, src, dst, cluster=cluster, strategy=strategy) == p
    # one global order: steps never decrease, a device never has two tasks in one step
    seen = set()
    for a, b in zip(p.tasks, p.tasks[1:]):
        assert a.step <= b.step
    for t in p.tasks:
        for d in set(t.devices):
            assert (t.step, d) not in seen
            seen.add((t.step, d))
    assert p.estimate() >= p.lower_bound() * (1 - 1e-9)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3).flatmap(lambda n: specs(n, n + 1, True)))
def test_spec_text_round_trip(spec):
    text = str(spec)
    again = ShardingSpec.parse(text)
    assert again == spec and hash(again) == hash(spec) and str(again) == text


@settings(max_examples=100, deadline=None)
@given(problems())
def test_layouts_cover_tensor(problem):
    shape, _, src, dst, _ = problem
    for lay in (src, dst):
        count = np.zeros(shape, int)
        for d, sl in lay.index_map(shape).items():
            if d in lay.partial_leaders():
                count[sl] += 1
        replicas = lay.mesh.size // math.prod(
            lay.mesh.shape[a] for axes in lay.spec.dims for a in axes) // math.prod(
            lay.mesh.shape[a] for a in lay.spec.partial)
        assert (count == replicas).all()
