"""Property tests: any layout pair, any shape, every strategy moves the right bytes."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster, Layout, ShardingSpec
from reshard.planner.ir import ReshardPlan
from reshard.planner.values.tasks import TaskKind
from reshard.spec import SplitRule

from ..common import STRATEGIES, check_shards, problems, put_value, sample, specs, wire_bytes

POOL = tuple(range(24))  # device ids 0..23


@st.composite
def planning_problems(draw):
    """A random problem (tests/common.py), each layout under a random split rule (flat
    or nested: they differ where several axes split an uneven dim), and a random
    cluster of 1-8 devices and 1-8 NICs per host (several NICs: plans relay through
    devices that need nothing)."""
    shape, dtype, src, dst = draw(problems(POOL))
    src, dst = (Layout(lay.mesh, lay.spec.with_rule(draw(st.sampled_from(list(SplitRule)))))
                for lay in (src, dst))
    per_host = draw(st.integers(1, 8))
    order = draw(st.permutations(POOL))
    nics = draw(st.integers(1, per_host))
    cluster = Cluster.from_hosts([order[i:i + per_host] for i in range(0, len(POOL), per_host)],
                                 nics_per_host=nics)
    return shape, np.dtype(dtype), src, dst, cluster


@st.composite
def nested_problems(draw):
    """A planning problem whose source or destination (or both) is nested with one dim
    split by 2-3 mesh axes (any order) at a size where nested and flat boxes differ."""
    shape, dtype, src, dst, cluster = draw(planning_problems())
    which = draw(st.sampled_from(["src", "dst", "both"]))
    out = {"src": src, "dst": dst}
    shape_l = [max(1, s) for s in shape]  # no empty tensor: every example moves bytes
    d = draw(st.integers(0, len(shape) - 1))
    for name in (("src", "dst") if which == "both" else (which,)):
        sizes = draw(st.lists(st.integers(2, 4), min_size=2, max_size=3).filter(
            lambda s: math.prod(s) <= 16))
        devices = draw(st.permutations(POOL))[:math.prod(sizes)]
        axes = draw(st.permutations(range(len(sizes))))[:draw(st.integers(2, len(sizes)))]
        dims = tuple(tuple(axes) if i == d else () for i in range(len(shape)))
        spec = ShardingSpec(dims, rule=SplitRule.NESTED)
        out[name] = Layout(reshard.DeviceMesh(tuple(sizes), devices=devices), spec)
    lay = out["src"] if which != "dst" else out["dst"]
    shape_l[d] = draw(st.integers(1, 13))
    flat = Layout(lay.mesh, lay.spec.with_rule(SplitRule.FLAT))
    assume(flat.index_map(shape_l) != lay.index_map(shape_l))
    return tuple(shape_l), dtype, out["src"], out["dst"], cluster


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planning_problems(), st.sampled_from(STRATEGIES), st.integers(0, 2 ** 32 - 1))
def test_every_destination_shard_exact(problem, strategy, seed):
    _check_exact(problem, strategy, seed)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.filter_too_much])
@given(nested_problems(), st.sampled_from(STRATEGIES), st.integers(0, 2 ** 32 - 1))
def test_nested_uneven_destination_shard_exact(problem, strategy, seed):
    _check_exact(problem, strategy, seed)


def _check_exact(problem, strategy, seed):
    shape, dtype, src, dst, cluster = problem
    rng = np.random.default_rng(seed)
    value = sample(rng, shape, dtype.name)
    with reshard.Runtime(backend="local", cluster=cluster) as rt:
        x = put_value(rt, value, src, rng)
        p = rt.plan(x, dst, strategy)
        rt.group.fabric.reset_counters()
        y = rt.execute(p, [x])[0]
        assert rt.group.fabric.total_bytes() == wire_bytes(p)  # exactly the plan's bytes
        check_shards(rt, y, value)
        assert rt.get(y).tobytes() == value.tobytes()
        # the source is untouched (reductions work on private copies)
        assert rt.get(x).tobytes() == value.tobytes()


@settings(max_examples=80, deadline=None)
@given(planning_problems(), st.sampled_from(STRATEGIES))
def test_plan_json_round_trip_and_determinism(problem, strategy):
    shape, dtype, src, dst, cluster = problem
    p = reshard.plan(shape, dtype, src, dst, cluster=cluster, strategy=strategy)
    q = ReshardPlan.from_json(p.to_json())
    assert q == p and hash(q) == hash(p)
    assert reshard.plan(shape, dtype, src, dst, cluster=cluster, strategy=strategy) == p
    # one global order: steps never decrease; a task reads nothing its own step writes
    for a, b in zip(p.tasks, p.tasks[1:]):
        assert a.step <= b.step
    reduced = {(t.tensor, t.box): t.step for t in p.tasks if t.kind is TaskKind.REDUCE}
    for t in p.tasks:
        if t.kind is TaskKind.ALLGATHER:  # after the sends that delivered its pieces
            feeders = [u.step for u in p.tasks if u.tensor == t.tensor and
                       u.kind is TaskKind.SEND and u.box in t.pieces and
                       u.receivers[0] in t.receivers]
            assert all(s < t.step for s in feeders)
        if p.tensors[t.tensor].src.spec.is_partial and t.kind in (TaskKind.SEND,
                                                                   TaskKind.BROADCAST):
            assert all(s < t.step for (i, box), s in reduced.items()
                       if i == t.tensor and _overlaps(box, t.box))
    p.verify()
    assert p.estimate() >= p.lower_bound() * (1 - 1e-9)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planning_problems(), st.sampled_from(STRATEGIES), st.sampled_from([0, 4096, 1 << 20]))
def test_the_bound_counts_no_message_a_plan_can_do_without(problem, strategy, piece):
    """On a CPU machine's cluster whose messages cost far more than their bytes
    (Cluster.message_cost), the bound's fewest messages never exceed what a plan
    sends: every strategy's model stays at or above it."""
    shape, dtype, src, dst, cluster = problem
    cpu = dataclasses.replace(cluster, shared_bandwidth=1e9, message_cost=1e-3,
                              relay_piece=piece)
    p = reshard.plan(shape, dtype, src, dst, cluster=cpu, strategy=strategy)
    assert p.estimate() >= p.lower_bound() * (1 - 1e-9)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planning_problems(), st.sampled_from(STRATEGIES), st.sampled_from([1e5, 1e7, 1e9]),
       st.sampled_from([("bfloat16", "none"), ("float8_e4m3fn", "tensor"),
                        ("float8_e4m3fn", "block128")]))
def test_the_bound_counts_no_conversion_a_plan_can_do_without(problem, strategy, rate, cast):
    """Where the cluster prices casts on the wire (Cluster.cast_bandwidth: slow, as one
    machine's cores, to fast), the bound's conversions never exceed what a plan's
    devices convert: every strategy's model stays at or above it."""
    shape, _, src, dst, cluster = problem
    assume(not src.spec.is_partial and not dst.spec.is_partial)
    if cast[1] == "block128":
        assume(len(shape) >= 2)
    slow = dataclasses.replace(cluster, cast_bandwidth=rate)
    p = reshard.plan(shape, "float32", src, dst, cluster=slow, strategy=strategy,
                     cast=cast[0], scale=cast[1])
    event(f"bound from conversions: {p.lower_bound() > p.priced_on(cluster).lower_bound()}")
    assert p.estimate() >= p.lower_bound() * (1 - 1e-9)


def _overlaps(a, b):
    return all(max(lo1, lo2) < min(hi1, hi2) for (lo1, hi1), (lo2, hi2) in zip(a, b))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3).flatmap(lambda n: specs(n, n + 1, True)))
def test_spec_text_round_trip(spec):
    text = str(spec)
    nested = spec.with_rule(SplitRule.NESTED)
    assert ShardingSpec.parse(str(nested)) == nested
    again = ShardingSpec.parse(text)
    assert again == spec and hash(again) == hash(spec) and str(again) == text


@settings(max_examples=100, deadline=None)
@given(planning_problems())
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


@st.composite
def box_maps(draw, shape):
    """Up to 6 random boxes inside ``shape`` (possibly empty or overlapping), each held
    by up to 3 of 12 devices."""
    out = {}
    for _ in range(draw(st.integers(0, 6))):
        box = []
        for s in shape:
            a, b = draw(st.integers(0, s)), draw(st.integers(0, s))
            box.append((min(a, b), max(a, b)))
        out[tuple(box)] = frozenset(draw(st.sets(st.integers(0, 11), max_size=3)))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 7), max_size=3).flatmap(
    lambda shape: st.tuples(st.just(tuple(shape)), box_maps(shape), box_maps(shape))))
def test_decompositions_against_every_element(problem):
    """The numpy decomposition (cell_table) lists the same cells, in the same order, as
    the cell-by-cell one; and those cells cover every element some device needs once,
    each with exactly the devices whose boxes contain it (checked element by element)."""
    from reshard.planner.cells.decompose import decompose, decompose_table

    shape, holders, needers = problem
    cells = decompose(shape, holders, needers)
    assert decompose_table(shape, holders, needers).cells() == cells
    assert all(c.size == math.prod(b - a for a, b in c.box) for c in cells)

    def owners(boxes, index):
        return frozenset().union(*(devs for b, devs in boxes.items()
                                   if all(lo <= i < hi for i, (lo, hi) in zip(index, b))))

    covered = {}
    for c in cells:
        assert c.needers and c.size
        for index in np.ndindex(*(hi - lo for lo, hi in c.box)):
            element = tuple(lo + i for i, (lo, _) in zip(index, c.box))
            assert element not in covered
            covered[element] = c
            assert c.holders == owners(holders, element)
            assert c.needers == owners(needers, element)
    for element in np.ndindex(*shape):
        assert (element in covered) == bool(owners(needers, element))


@settings(max_examples=60, deadline=None)
@given(planning_problems(), st.sampled_from(STRATEGIES))
def test_bulk_planning_equals_cell_by_cell(problem, strategy):
    """Planning point-to-point slices in bulk (numpy decomposition, columns, batched NIC
    loads) gives exactly the plan of planning every cell one by one."""
    from unittest import mock

    from reshard.planner import cuts

    shape, dtype, src, dst, cluster = problem
    with mock.patch.object(cuts, "TABLE_FROM", 0), \
            mock.patch("reshard.planner.schedule.work.BULK_FLUSH", 1):
        bulk = reshard.plan(shape, dtype, src, dst, cluster=cluster, strategy=strategy)
    with mock.patch.object(cuts, "TABLE_FROM", 10 ** 18):
        cells = reshard.plan(shape, dtype, src, dst, cluster=cluster, strategy=strategy)
    assert bulk.to_json() == cells.to_json()


def test_bulk_loads_steer_later_choices():
    """Point-to-point slices charged in bulk steer the choices planned after them as
    they do one by one: big transfers out of device 1 load host 0's NIC, so the smaller
    replicated tensor leaves from host 1 (device 2), not from idle device 0."""
    from unittest import mock

    from reshard.planner import cuts

    cluster = Cluster.regular(4, 2)
    mesh = reshard.DeviceMesh
    big = ((4096, 64), "float32", Layout(mesh((1,), devices=[1]), "RR"),
           Layout(mesh((2,), devices=[4, 5]), "S0R"))
    small = ((16, 64), "float32", Layout(mesh((2,), devices=[0, 2]), "RR"),
             Layout(mesh((1,), devices=[6]), "RR"))
    plans = []
    for table_from, flush in ((0, 1), (10 ** 18, 32)):
        with mock.patch.object(cuts, "TABLE_FROM", table_from), \
                mock.patch("reshard.planner.schedule.work.BULK_FLUSH", flush):
            plans.append(reshard.plan_many([big, small], cluster=cluster))
    assert plans[0].to_json() == plans[1].to_json()
    (send,) = [t for t in plans[0].tasks if t.tensor == 1]
    assert send.root == 2  # host 0's NIC carries the big tensor


def _broadcast_tasks(tensors, cluster, fan_out):
    import reshard.planner.plan as plan_module
    from reshard.planner.values.strategy import Strategy

    tasks, _ = plan_module.plan_tasks(tensors, cluster, Strategy.BROADCAST, fan_out)
    return ReshardPlan(tensors, tasks, Strategy.BROADCAST, cluster)


def _run_exact(plan, src, rng):
    """Execute ``plan`` (one tensor) on the local backend: every destination shard
    exact, exactly the plan's bytes on the wire."""
    t = plan.tensors[0]
    value = sample(rng, t.shape, t.dtype)
    with reshard.Runtime(backend="local", cluster=plan.cluster) as rt:
        x = put_value(rt, value, src, rng)
        rt.group.fabric.reset_counters()
        y = rt.execute(plan, [x])[0]
        assert rt.group.fabric.total_bytes() == wire_bytes(plan)
        check_shards(rt, y, value)


@st.composite
def partial_pipelines(draw):
    """A partial sum over mesh axis 1 (2-4 addends) moved to a layout replicated over
    2-4 devices per box, on random devices of a cluster of 2-4 devices and 1-4 NICs
    per host: the pipelined reductions' broadcasts reach several devices of a host."""
    per_host = draw(st.integers(2, 4))
    order = draw(st.permutations(POOL))
    cluster = Cluster.from_hosts([order[i:i + per_host] for i in range(0, len(POOL), per_host)],
                                 nics_per_host=draw(st.integers(1, per_host)))
    a, b, c, d = (draw(st.integers(lo, 3)) for lo in (1, 2, 1, 2))
    devices = draw(st.permutations(POOL))
    src = Layout(reshard.DeviceMesh((a, b), devices=devices[:a * b]),
                 draw(st.sampled_from(["S0R+P1", "RR+P1", "RS0+P1"])))
    others = devices[a * b:] if draw(st.booleans()) else devices
    dst = Layout(reshard.DeviceMesh((c, d), devices=others[:c * d]),
                 draw(st.sampled_from(["S0R", "RR", "RS0"])))
    shape = (draw(st.integers(8, 40)), draw(st.integers(1, 9)))
    return shape, np.dtype(draw(st.sampled_from(["int32", "float64", "int16"]))), src, dst, \
        cluster


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(partial_pipelines(), st.integers(2, 4), st.integers(0, 2 ** 32 - 1))
def test_fanned_out_partial_sums_exact(problem, pieces, seed):
    """Broadcasts of pipelined partial-sum pieces fanning out inside their last host
    (a cross-host chain, then a relay from the entry's destination shard at the next
    step) move the same bytes as whole chains, and every destination shard is exact."""
    from unittest import mock

    from reshard.planner.plan import make_tensor_spec

    shape, dtype, src, dst, cluster = problem
    with mock.patch("reshard.planner.cells.reduce.reduce_pieces", lambda *_: pieces):
        tensors = (make_tensor_spec(shape, dtype, src, dst, cluster),)
        chains = _broadcast_tasks(tensors, cluster, fan_out=False)
        fanned = _broadcast_tasks(tensors, cluster, fan_out=True)
    fanned.verify()
    assert wire_bytes(fanned) == wire_bytes(chains)
    assert _links(fanned) == _links(chains)  # the same bytes over the same links
    event(f"fanned-out chains: {sum(t.source.value == 'dst' for t in fanned.tasks) > 0}")
    _run_exact(fanned, src, np.random.default_rng(seed))


def _links(plan):
    """Every (sender, receiver, box) hop of a plan's chains (reductions: towards the
    root), with multiplicity."""
    from collections import Counter
    from itertools import pairwise

    hops: Counter = Counter()
    for t in plan.tasks:
        chain = (*t.receivers, t.root) if t.kind is TaskKind.REDUCE else (t.root, *t.receivers)
        if t.kind is not TaskKind.COPY:
            hops.update((a, b, t.box) for a, b in pairwise(chain))
    return hops


def test_fan_out_splits_chains_of_all_but_the_last_piece():
    """A partial sum on host 0 reduced in 4 pieces, wanted replicated on host 1: the
    chains of pieces 0-2 cross to one device of host 1, which relays each piece to the
    others at the next step; the last piece stays one chain (no later step to hide a
    fan-out behind). The result is exact."""
    from unittest import mock

    from reshard.planner.plan import make_tensor_spec

    cluster = Cluster.regular(2, 4)
    src = Layout(reshard.DeviceMesh((1, 4), devices=range(4)), "RR+P1")
    dst = Layout(reshard.DeviceMesh((1, 4), devices=range(4, 8)), "RR")
    with mock.patch("reshard.planner.cells.reduce.reduce_pieces", lambda *_: 4):
        tensors = (make_tensor_spec((64, 32), "int32", src, dst, cluster),)
        plan = _broadcast_tasks(tensors, cluster, fan_out=True)
    plan.verify()
    steps = {t.step for t in plan.tasks if t.kind is TaskKind.REDUCE}
    assert steps == {0, 1, 2, 3}
    relays = [t for t in plan.tasks if t.source.value == "dst"]
    crossings = [t for t in plan.tasks if t.kind is not TaskKind.REDUCE and
                 t.source.value == "src"]
    assert len(relays) == 3 and len(crossings) == 4
    for r in relays:  # from the device the crossing of that piece landed on, one step on
        (cross,) = [c for c in crossings if c.box == r.box]
        assert cross.receivers == (r.root,) and r.step == cross.step + 1
        assert set(r.receivers) | {r.root} == set(range(4, 8))
    (last,) = [c for c in crossings if not any(r.box == c.box for r in relays)]
    assert sorted(last.receivers) == [4, 5, 6, 7] and last.step == 4
    _run_exact(plan, src, np.random.default_rng(0))
    # one task per device and step (what the planner keeps when concurrency gains
    # nothing) still relays after the crossing
    from reshard.planner.schedule.order import one_at_a_time

    serial = ReshardPlan(plan.tensors, one_at_a_time(plan.tasks), plan.strategy, cluster)
    serial.verify()
    _run_exact(serial, src, np.random.default_rng(1))


def test_decomposition_memory_is_linear_in_pieces():
    """8,192 devices per mesh, S0 -> S0 on different meshes: the numpy decomposition
    keeps sets of pieces as their members, never an intervals x pieces matrix (that
    peaked at 139 MiB here; now about 19 MiB). Memory measured by tracemalloc,
    which is deterministic."""
    import tracemalloc

    from reshard.planner.cells.decompose import decompose_table

    n = 8192
    shape = (2 * n, 16)
    src = Layout(reshard.DeviceMesh((n // 8, 8)), "S01R")
    dst = Layout(reshard.DeviceMesh((n // 8, 8), devices=range(n, 2 * n)), "S10R")

    def by_box(layout):
        out: dict = {}
        for dev, box in layout.boxes(shape).items():
            out.setdefault(box, set()).add(dev)
        return {b: frozenset(d) for b, d in out.items()}

    holders, needers = by_box(src), by_box(dst)
    tracemalloc.start()
    try:
        table = decompose_table(shape, holders, needers)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(table) == n  # both layouts cut dim 0 into the same n chunks
    assert table.size.sum() == math.prod(shape)
    assert peak < 48 << 20, f"decomposition peaked at {peak / 2**20:.0f} MiB"
