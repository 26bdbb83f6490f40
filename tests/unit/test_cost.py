"""Cost model and lower bound against hand-computed values."""

from __future__ import annotations

import pytest

import reshard
from reshard import Cluster, DeviceMesh, Layout, ReshardPlan
from reshard.planner.costing.bound import ingress_time

NIC = 1e9  # bytes/s
CL = Cluster.regular(4, 2, nic_bandwidth=NIC, intra_bandwidth=1e11, latency=1e-3,
                     intra_latency=1e-5, copy_bandwidth=1e12)


def test_single_cross_host_send():
    src = Layout(DeviceMesh((1,), devices=[0]), "R")
    dst = Layout(DeviceMesh((1,), devices=[2]), "R")
    p = reshard.plan((250_000_000,), "int32", src, dst, cluster=CL)  # 1e9 bytes
    assert [t.kind.value for t in p.tasks] == ["send"]
    assert p.estimate() == pytest.approx(1e-3 + 1.0)
    assert p.lower_bound() == pytest.approx(1e-3 + 1.0)


def test_two_sends_share_a_nic():
    # host 0 (devices 0, 1) holds two halves; host 1 (devices 2, 3) needs them on
    # two devices: both transfers leave host 0's NIC together -> 2e9 bytes / 1e9 B/s
    src = Layout(DeviceMesh((2,), devices=[0, 1]), "S0")
    dst = Layout(DeviceMesh((2,), devices=[2, 3]), "S0")
    p = reshard.plan((500_000_000,), "int32", src, dst, cluster=CL)
    assert p.estimate() == pytest.approx(1e-3 + 2.0)
    assert p.lower_bound() == pytest.approx(1e-3 + 2.0)


def _chain_task(root, receivers, nbytes=1_000_000_000):
    from reshard.planner.values.tasks import Task, TaskKind
    return Task(TaskKind.BROADCAST, 0, ((0, nbytes // 4),), root, tuple(receivers), nbytes)


def test_broadcast_chain_crosses_each_host_once():
    # one device to every device of hosts 1, 2, 3: a chain, each NIC carries 1e9 once,
    # 3 network and 3 intra-host latencies
    from reshard.planner.costing.cost import task_path

    path, lat = task_path(_chain_task(0, range(2, 8)), CL)
    assert lat == pytest.approx(3e-3 + 3e-5)
    nics = [r for r, f in path if r[0].startswith("nic")]
    assert sorted(nics) == sorted({*nics})  # each NIC direction once
    assert len(nics) == 6


def test_broadcast_over_many_hosts_is_two_trees():
    # 1 MB to every device of hosts 1, 2, 3, where latency matters: the planner halves
    # it over two binary trees over the hosts (host 1 inner in the first, host 2 in the
    # second): every NIC still carries 1e6 bytes in each direction it is used, and the
    # deepest receiver is 2 network + 1 intra-host hops away (the chain: 3 + 3)
    src = Layout(DeviceMesh((1,), devices=[0]), "R")
    dst = Layout(DeviceMesh((3, 2), devices=range(2, 8)), "R")
    b = reshard.plan((250_000,), "int32", src, dst, cluster=CL, strategy="broadcast")
    s = reshard.plan((250_000,), "int32", src, dst, cluster=CL, strategy="send_recv")
    assert [len(t.parents) for t in b.tasks] == [6, 6]
    assert b.estimate() == pytest.approx(1e-3 + 2e-3 + 1e-5, rel=1e-6)
    assert s.estimate() > 2 * b.estimate()  # host 0 sends 6 copies
    # each host's two devices: one entry and a hop, or an entry each (half a hop less)
    assert b.lower_bound() == pytest.approx(1e-3 + 1e-3 + 1e-5 / 2)
    # the chain it replaced: one latency per host
    chain = ReshardPlan(b.tensors, (_chain_task(0, range(2, 8), 1_000_000),), b.strategy,
                        b.cluster)
    assert chain.estimate() == pytest.approx(1e-3 + 3e-3 + 3e-5, rel=1e-6)


def test_send_side_lower_bound():
    # host 0 alone holds everything; hosts 1..3 each need a third: host 0's NIC must
    # send it all (3e9 bytes) although each receiver takes only 1e9
    src = Layout(DeviceMesh((1,), devices=[0]), "R")
    dst = Layout(DeviceMesh((3,), devices=[2, 4, 6]), "S0")
    p = reshard.plan((750_000_000,), "int32", src, dst, cluster=CL)
    assert p.lower_bound() == pytest.approx(3.0 + 1e-3)


def test_local_copy_only():
    mesh = DeviceMesh((2,), devices=[0, 1])
    p = reshard.plan((1000,), "float64", Layout(mesh, "S0"), Layout(mesh, "S0"), cluster=CL)
    assert {t.kind.value for t in p.tasks} == {"copy"}
    assert p.bytes_moved() == 0
    assert p.estimate() == pytest.approx(4000 / 1e12)


@pytest.mark.parametrize("name", ["tp-row-partial-to-rep", "tp-row-rrp1-to-rs0",
                                  "partial-h100-4x8"])
def test_partial_sum_broadcast_never_worse_than_baselines(name):
    """The realistic suite's partial sums (pipelined reductions, fanned-out chains where
    the model prefers them): the broadcast plan's model time is at most the
    all-gather's and send/recv's, and never below the lower bound."""
    from reshard.microbench.suites.realistic import realistic_cases

    (case,) = [c for c in realistic_cases() if c.name == name]
    requests, cluster = case.build_many()
    est = {s: reshard.plan_many(requests, cluster=cluster, strategy=s).estimate()
           for s in ("broadcast", "allgather", "send_recv")}
    bound = reshard.plan_many(requests, cluster=cluster).lower_bound()
    assert bound <= est["broadcast"] <= min(est["allgather"], est["send_recv"])


def test_relays_that_hold_a_piece_add_it_for_each_child():
    """Cluster.relay_piece: a relay passes bytes on once it holds a piece, so each relay
    hop adds the piece's time (for each child it feeds) to the farthest receiver's
    latency; the root's own hops and relay_piece 0 add nothing."""
    import pickle

    from reshard.planner.costing.cost import task_path
    from reshard.planner.values.tasks import Task, TaskKind

    box = ((0, 1000),)
    chain = Task(TaskKind.BROADCAST, 0, box, 0, (1, 2), 4000)
    tree = Task(TaskKind.BROADCAST, 0, box, 0, (1, 2, 3), 4000, parents=(0, 1, 1))
    small = Task(TaskKind.BROADCAST, 0, ((0, 100),), 0, (1, 2), 400)
    plain = Cluster.regular(4, 1, nic_bandwidth=1e9, latency=1e-5)
    piece = Cluster.regular(4, 1, nic_bandwidth=1e9, latency=1e-5, relay_piece=1000)
    assert task_path(chain, plain)[1] == pytest.approx(2e-5)
    assert task_path(chain, piece)[1] == pytest.approx(2e-5 + 1000 / 1e9)
    assert task_path(tree, piece)[1] == pytest.approx(2e-5 + 2 * 1000 / 1e9)  # two children
    assert task_path(small, piece)[1] == pytest.approx(2e-5 + 400 / 1e9)  # all it has
    assert "relay_piece" not in plain.to_dict()
    assert Cluster.from_dict(piece.to_dict()) == piece == pickle.loads(pickle.dumps(piece))
    for bad in (-1, 1.5, True):
        with pytest.raises(reshard.ClusterError, match="relay_piece"):
            Cluster.regular(2, 1, relay_piece=bad)


def test_a_shared_bandwidth_carries_every_received_byte_once():
    """Cluster.shared_bandwidth (one machine's cores under all its loopback links): two
    sends on disjoint links that each alone would take 1 s take 2 s when the shared
    resource moves only one link's bytes per second, a chain's relays count each hop's
    bytes, and the bound counts every byte a device must receive over it."""
    import pickle

    from reshard.planner.costing.cost import task_path
    from reshard.planner.values.resources import SHARED
    from reshard.planner.values.tasks import Task, TaskKind

    links = {"nic_bandwidth": 2e9, "intra_bandwidth": 1e9, "latency": 0.0,
             "intra_latency": 0.0, "nics_per_host": 2}
    plain = Cluster.regular(2, 2, **links)
    shared = Cluster.regular(2, 2, shared_bandwidth=1e9, **links)
    src = Layout(DeviceMesh((2,), devices=[0, 1]), "S0")
    dst = Layout(DeviceMesh((2,), devices=[2, 3]), "S0")
    for cluster, seconds in ((plain, 1.0), (shared, 2.0)):
        p = reshard.plan((500_000_000,), "int32", src, dst, cluster=cluster)
        assert len(p.tasks) == 2
        assert p.estimate() == pytest.approx(seconds)
        assert p.lower_bound() == pytest.approx(seconds)
    chain = Task(TaskKind.BROADCAST, 0, ((0, 1000),), 0, (1, 2, 3), 4000)
    assert ((SHARED, 0), 3.0) in task_path(chain, shared)[0]
    assert all(r[0] != SHARED for r, _ in task_path(chain, plain)[0])
    copy = Task(TaskKind.COPY, 0, ((0, 1000),), 0, (0,), 4000)
    assert all(r[0] != SHARED for r, _ in task_path(copy, shared)[0])
    assert "shared_bandwidth" not in plain.to_dict()
    assert Cluster.from_dict(shared.to_dict()) == shared == pickle.loads(pickle.dumps(shared))
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(reshard.ClusterError, match="shared_bandwidth"):
            Cluster.regular(2, 1, shared_bandwidth=bad)


def test_each_end_of_each_message_takes_its_share_of_the_shared_bandwidth():
    """Cluster.message_cost (a CPU machine's work per message end, posting, matching,
    completing: ``--cluster local`` times it through the run's backend): a send cut in
    pieces pays two ends per piece, an all-gather one message per member piece to each
    other member, a chain one per piece per hop; without a shared bandwidth it is not
    charged, and the model of a plan of many messages rises by exactly their cost."""
    import pickle

    from reshard.planner.costing.cost import messages, task_path
    from reshard.planner.values.resources import SHARED
    from reshard.planner.values.tasks import Task, TaskKind

    links = {"nic_bandwidth": 2e9, "intra_bandwidth": 1e9, "latency": 0.0,
             "intra_latency": 0.0, "relay_piece": 1 << 20}
    shared = Cluster.regular(2, 4, shared_bandwidth=1e9, **links)
    costly = Cluster.regular(2, 4, shared_bandwidth=1e9, message_cost=1e-4, **links)
    mib = 1 << 20
    send = Task(TaskKind.SEND, 0, ((0, 2 * mib),), 0, (4,), 8 * mib)
    assert messages(send, costly) == 8  # 1 MiB pieces
    gather = Task(TaskKind.ALLGATHER, 0, ((0, mib),), -1, (4, 5, 6, 7), 4 * mib,
                  pieces=tuple(((i * mib // 4, (i + 1) * mib // 4),) for i in range(4)))
    assert messages(gather, costly) == 4 * 3 * 4  # 1 MiB a member: in quarters
    chain = Task(TaskKind.BROADCAST, 0, ((0, mib // 4),), 0, (1, 2, 3), mib)
    assert messages(chain, costly) == 3 * 4
    copy = Task(TaskKind.COPY, 0, ((0, 1000),), 0, (0,), 4000)
    assert messages(copy, costly) == 0
    for task, staged in ((send, 0), (gather, 4 * 4 * mib), (chain, 0)):
        plain_share = dict(task_path(task, shared)[0])[(SHARED, 0)]
        share = dict(task_path(task, costly)[0])[(SHARED, 0)]
        extra_seconds = (share - plain_share) * task.nbytes / 1e9
        # and an all-gather's four members each copy its 4 MiB box through its rows
        assert extra_seconds == pytest.approx(2 * messages(task, costly) * 1e-4
                                              + staged / costly.copy_bandwidth)
    nic_only = Cluster.regular(2, 4, message_cost=1e-4, **links)
    assert all(r[0] != SHARED for r, _ in task_path(send, nic_only)[0])
    # a plan: 16 MiB from one device to another, in 16 pieces of 1 MiB
    src = Layout(DeviceMesh((1,), devices=[0]), "R")
    dst = Layout(DeviceMesh((1,), devices=[4]), "R")
    a = reshard.plan((4 * mib,), "int32", src, dst, cluster=shared)
    b = reshard.plan((4 * mib,), "int32", src, dst, cluster=costly)
    assert a.tasks == b.tasks and len(b.tasks) == 1
    assert b.estimate() - a.estimate() == pytest.approx(2 * 16 * 1e-4)
    # no plan delivers 16 MiB in fewer than 16 messages of at most 1 MiB
    assert b.lower_bound() - a.lower_bound() == pytest.approx(2 * 16 * 1e-4)
    assert b.estimate() >= b.lower_bound() * (1 - 1e-9)
    # 40 small tensors of one step travel coalesced: one message, not 40
    small = [((1024,), "float32", src, dst)] * 40
    many = reshard.plan_many(small, cluster=costly)
    alone = reshard.plan_many(small, cluster=shared)
    assert len(many.tasks) == 40 and len({t.step for t in many.tasks}) == 1
    assert many.estimate() - alone.estimate() == pytest.approx(2 * 1e-4, rel=0.05)
    assert "message_cost" not in shared.to_dict()
    assert Cluster.from_dict(costly.to_dict()) == costly == pickle.loads(pickle.dumps(costly))
    assert costly != shared
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(reshard.ClusterError, match="message_cost"):
            Cluster.regular(2, 1, message_cost=bad)


def test_each_part_a_coalesced_message_carries_costs_its_ends():
    """Cluster.part_cost (what a backend spends on each box a coalesced message carries
    beyond its first: a WRITE's descriptor, a send's iovec): 40 small tensors of one
    step travel in one message, which costs 39 parts at each end on the shared
    resource, and nothing more where nothing is coalesced or nothing is shared; the
    figure survives JSON, pickle and the service's cluster message, and a bad one is
    refused by name."""
    import pickle

    from reshard.planner.costing.cost import task_path
    from reshard.planner.values.resources import SHARED
    from reshard.planner.values.tasks import Task, TaskKind

    links = {"nic_bandwidth": 2e9, "intra_bandwidth": 1e9, "latency": 0.0,
             "intra_latency": 0.0, "relay_piece": 1 << 20, "shared_bandwidth": 1e9}
    plain = Cluster.regular(2, 4, message_cost=1e-4, **links)
    parted = Cluster.regular(2, 4, message_cost=1e-4, part_cost=2e-5, **links)
    src = Layout(DeviceMesh((1,), devices=[0]), "R")
    dst = Layout(DeviceMesh((1,), devices=[4]), "R")
    small = [((1024,), "float32", src, dst)] * 40
    a = reshard.plan_many(small, cluster=plain)
    b = reshard.plan_many(small, cluster=parted)
    assert a.tasks == b.tasks and len({t.step for t in b.tasks}) == 1
    assert b.estimate() - a.estimate() == pytest.approx(2 * 39 * 2e-5, rel=0.05)
    # a rider's share: one part at each end of each edge; a message's first: none
    chain = Task(TaskKind.BROADCAST, 0, ((0, 1024),), 0, (4, 5), 4096)
    share = dict(task_path(chain, parted, rides=True)[0])[(SHARED, 0)]
    base = dict(task_path(chain, plain, rides=True)[0])[(SHARED, 0)]
    assert (share - base) * 4096 / 1e9 == pytest.approx(2 * 2 * 2e-5)
    assert task_path(chain, parted) == task_path(chain, plain)
    # one tensor: no message carries a second part
    one = [((1 << 16,), "float32", src, dst)]
    assert reshard.plan_many(one, cluster=parted).estimate() == pytest.approx(
        reshard.plan_many(one, cluster=plain).estimate())
    # without a shared resource the figure is not charged
    bare = {k: v for k, v in links.items() if k != "shared_bandwidth"}
    assert reshard.plan_many(small, cluster=Cluster.regular(2, 4, part_cost=1e-3, **bare)
                             ).estimate() == pytest.approx(
        reshard.plan_many(small, cluster=Cluster.regular(2, 4, **bare)).estimate())
    assert "part_cost" not in plain.to_dict() and parted.to_dict()["part_cost"] == 2e-5
    assert Cluster.from_dict(parted.to_dict()) == parted == pickle.loads(pickle.dumps(parted))
    assert parted != plain
    from reshard.service import convert
    from reshard.service.v1 import reshard_pb2 as pb

    msg = pb.Cluster(regular=pb.RegularCluster(num_hosts=2, devices_per_host=4,
                                               figures=pb.LinkFigures(part_cost=2e-5)))
    assert convert.cluster_from_pb(msg) == Cluster.regular(2, 4, part_cost=2e-5)
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(reshard.ClusterError, match="part_cost"):
            Cluster.regular(2, 1, part_cost=bad)


def test_a_cast_waits_for_its_devices_conversions():
    """Cluster.cast_bandwidth (bytes/s of source data a device converts for a cast on
    the wire): a broadcast whose root converts its box starts that box's bytes later by
    the box over the rate; the figure is charged only where the plan casts, keeps the
    floor below the model, survives JSON, pickle and the service's cluster message, and
    a bad one is refused by name."""
    import pickle

    from reshard.planner.costing.casts import cast_waits
    from reshard.planner.costing.cost import stepped_floor

    links = {"nic_bandwidth": 1e9, "intra_bandwidth": 1e10, "latency": 1e-4,
             "intra_latency": 0.0, "copy_bandwidth": 1e12}
    plain = Cluster.regular(2, 2, **links)
    casting = Cluster.regular(2, 2, cast_bandwidth=1e8, **links)
    src = Layout(DeviceMesh((1,), devices=[0]), "RR")
    dst = Layout(DeviceMesh((2,), devices=[2, 3]), "RR")
    shape = (1024, 1024)  # 2 MiB of bfloat16 on the root
    a = reshard.plan(shape, "bfloat16", src, dst, cluster=plain, cast="float8_e4m3fn")
    b = reshard.plan(shape, "bfloat16", src, dst, cluster=casting, cast="float8_e4m3fn")
    assert a.tasks == b.tasks and len(b.tasks) == 1
    assert b.estimate() - a.estimate() == pytest.approx(2 * 1024 * 1024 / 1e8)
    assert stepped_floor(b) <= b.estimate() * (1 + 1e-9)
    # the same move without a cast pays nothing
    same = reshard.plan(shape, "bfloat16", src, dst, cluster=casting)
    assert cast_waits(same) is None
    assert same.estimate() == pytest.approx(
        reshard.plan(shape, "bfloat16", src, dst, cluster=plain).estimate())
    # a scaled cast: each device of a split source converts its own rows, at once
    split = Layout(DeviceMesh((2,), devices=[0, 1]), "S0R")
    c = reshard.plan(shape, "bfloat16", split, dst, cluster=casting, cast="float8_e4m3fn",
                     scale="block128")
    waits = cast_waits(c)
    assert waits is not None
    values = [i for i, t in enumerate(c.tasks) if t.tensor == 0]
    assert values and all(waits[i] == pytest.approx(512 * 1024 * 2 / 1e8) for i in values)
    assert stepped_floor(c) <= c.estimate() * (1 + 1e-9)
    assert "cast_bandwidth" not in plain.to_dict() and casting.to_dict()["cast_bandwidth"] == 1e8
    assert Cluster.from_dict(casting.to_dict()) == casting == pickle.loads(pickle.dumps(casting))
    from reshard.service import convert
    from reshard.service.v1 import reshard_pb2 as pb

    msg = pb.Cluster(regular=pb.RegularCluster(num_hosts=2, devices_per_host=2,
                                               figures=pb.LinkFigures(cast_bandwidth=1e8)))
    assert convert.cluster_from_pb(msg) == Cluster.regular(2, 2, cast_bandwidth=1e8)
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(reshard.ClusterError, match="cast_bandwidth"):
            Cluster.regular(2, 1, cast_bandwidth=bad)


def test_conversions_are_worked_out_once_a_plan_and_count_in_the_serial_floor(monkeypatch):
    """The simulation and the floors read one cached, read-only array of the tasks'
    latencies and conversion waits; the one-at-a-time floor counts each device's own
    conversions (its tasks wait for them) and stays under the model."""
    from reshard.planner.costing import casts
    from reshard.planner.costing.cost import one_at_a_time_time, stepped_floor

    links = {"nic_bandwidth": 1e9, "intra_bandwidth": 1e10, "latency": 1e-4,
             "intra_latency": 0.0, "copy_bandwidth": 1e12}
    src = Layout(DeviceMesh((2,), devices=[0, 1]), "S0R")
    dst = Layout(DeviceMesh((2,), devices=[2, 3]), "RS0")
    shape = (1024, 1024)
    calls = []
    real = casts.cast_waits
    monkeypatch.setattr(casts, "cast_waits", lambda plan: calls.append(plan) or real(plan))
    plans = {rate: reshard.plan(shape, "bfloat16", src, dst, cast="float8_e4m3fn",
                                cluster=Cluster.regular(2, 2, cast_bandwidth=rate, **links))
             for rate in (0.0, 1e8)}
    from reshard.planner.ir import ReshardPlan
    from reshard.planner.schedule.order import one_at_a_time

    slow = plans[1e8]
    fresh = ReshardPlan(slow.tensors, slow.tasks, slow.strategy, slow.cluster)  # no cache
    calls.clear()
    assert stepped_floor(fresh) <= fresh.estimate() * (1 + 1e-9)
    assert len(calls) == 1 and fresh.estimate() == slow.estimate()
    assert not slow.latencies().flags.writeable
    # each source device converts the rows it sends: its half, 1 MiB of bfloat16
    assert casts.conversion_seconds(slow) == pytest.approx({0: 2**20 / 1e8, 1: 2**20 / 1e8})
    assert casts.conversion_seconds(plans[0.0]) == {}
    assert one_at_a_time_time(slow) - one_at_a_time_time(plans[0.0]) == pytest.approx(
        2**20 / 1e8)
    # a plan of one task per device and step: the floor holds under its own model
    serial = ReshardPlan(slow.tensors, one_at_a_time(slow.tasks), slow.strategy, slow.cluster)
    assert one_at_a_time_time(serial) <= serial.estimate() * (1 + 1e-9)


def test_the_bound_counts_the_conversions_a_cast_needs():
    """Source bytes held only by a set of devices are converted by those devices: the
    bound is at least their bytes over the set's rate (a lone holder converts all it
    alone holds; a replicated source may share the work), and the model stays above."""
    links = {"nic_bandwidth": 1e9, "intra_bandwidth": 1e10, "latency": 1e-4,
             "intra_latency": 0.0, "copy_bandwidth": 1e12}
    slow = Cluster.regular(2, 2, cast_bandwidth=1e6, **links)  # conversions dominate
    dst = Layout(DeviceMesh((2,), devices=[2, 3]), "RR")
    shape, nbytes = (1024, 1024), 2 * 1024 * 1024  # bfloat16
    cases = {"RR on one": (Layout(DeviceMesh((1,), devices=[0]), "RR"), nbytes / 1e6),
             "RR on two": (Layout(DeviceMesh((2,), devices=[0, 1]), "RR"), nbytes / 2e6),
             "S0R on two": (Layout(DeviceMesh((2,), devices=[0, 1]), "S0R"), nbytes / 2e6)}
    for name, (src, want) in cases.items():
        p = reshard.plan(shape, "bfloat16", src, dst, cluster=slow, cast="float8_e4m3fn")
        assert p.lower_bound() == pytest.approx(want), name
        assert p.lower_bound() <= p.estimate() * (1 + 1e-9), name
        plain = reshard.plan(shape, "bfloat16", src, dst, cluster=slow)  # no cast
        assert plain.lower_bound() < 0.01 * want, name
    one = reshard.plan(shape, "bfloat16", cases["RR on one"][0], dst, cluster=slow,
                       cast="float8_e4m3fn")
    assert one.estimate() <= 1.01 * one.lower_bound()  # the root converts, then sends


def test_a_coalesced_message_waits_only_for_the_conversions_before_it():
    """A device prepares its step in plan order: a coalesced message of small cast
    tensors leaves once its own payloads and those before it are converted; a task that
    travels alone, once every payload of the step is."""
    import dataclasses

    from reshard.planner.costing.casts import cast_waits
    from reshard.planner.schedule.coalesce import followers

    plain = Cluster.regular(2, 2, nic_bandwidth=1e9)
    casting = dataclasses.replace(plain, cast_bandwidth=1e8)
    src = Layout(DeviceMesh((1,), devices=[0]), "RR")
    dst = Layout(DeviceMesh((1,), devices=[2]), "RR")
    small = [((64, 64), "bfloat16", src, dst, "float8_e4m3fn")] * 3
    large = [((1024, 1024), "bfloat16", src, dst, "float8_e4m3fn")]
    # planned where casting is free (one step), priced where it is not
    p = dataclasses.replace(reshard.plan_many(small + large, cluster=plain),
                            cluster=casting, _cache={})
    assert len({t.step for t in p.tasks}) == 1
    riders = followers(p.tasks, p.tensors)
    waits = cast_waits(p)
    assert waits is not None and len(riders) == 2
    smalls, total = 3 * 64 * 64 * 2 / 1e8, (3 * 64 * 64 + 1024 * 1024) * 2 / 1e8
    # the planner put the large box first: everything waits for every conversion
    assert p.tasks[0].tensor == 3
    assert waits.tolist() == pytest.approx([total] * 4)
    # the message first: it waits for its own three boxes only; the large box for all
    first = dataclasses.replace(p, tasks=(*p.tasks[1:], p.tasks[0]), _cache={})
    assert followers(first.tasks, first.tensors) == {1, 2}
    assert cast_waits(first).tolist() == pytest.approx([smalls] * 3 + [total])


def test_the_bound_holds_under_a_shared_bandwidth():
    """Every strategy's model stays at or above the bound when every link shares one
    resource, on a transpose, a 1-to-m broadcast and a partial sum."""
    cluster = Cluster.regular(3, 4, nic_bandwidth=4e9, intra_bandwidth=1e9, latency=3e-5,
                              intra_latency=3e-5, nics_per_host=4, shared_bandwidth=2.5e9,
                              message_cost=3e-5, relay_piece=1 << 20)
    cases = [((64, 64), "S0R", "RS0", range(6), range(6, 12)),
             ((4096,), "R", "R", [0], range(4, 12)),
             ((64, 64), "S0R+P1", "RS0", range(8), range(4, 12))]
    for shape, a, b, sd, dd in cases:
        sd, dd = list(sd), list(dd)
        sm = DeviceMesh((2, len(sd) // 2) if len(sd) > 1 else (1,), devices=sd)
        dm = DeviceMesh((2, len(dd) // 2), devices=dd)
        src = Layout(sm, a)
        dst = Layout(dm, b)
        for strategy in ("send_recv", "allgather", "broadcast"):
            p = reshard.plan(shape, "float32", src, dst, cluster=cluster, strategy=strategy)
            assert p.estimate() >= p.lower_bound() * (1 - 1e-9), (a, b, strategy)


def test_a_partial_sum_is_held_by_no_single_addend():
    """An addend holds a part of a sum, not the sum: a device that needs the value
    receives every element of it at least once (from another addend, or the sum), and
    a host holds the sum only when one whole group of addends lies inside it. The
    bound counts both (before, an addend counted as holding the sum: 1e-3 s here), and
    every strategy's model stays above it."""
    gb = 1_000_000_000
    one_host = Cluster.regular(1, 2, intra_bandwidth=1e9, intra_latency=1e-5,
                               copy_bandwidth=1e12)
    two_hosts = Cluster.regular(2, 1, nic_bandwidth=1e9, latency=1e-4, copy_bandwidth=1e12)
    pair = DeviceMesh((2,), devices=[0, 1])
    src, dst = Layout(pair, "R+P0"), Layout(pair, "R")
    for cluster, seconds in ((one_host, 1e-5 + 1.0), (two_hosts, 1e-4 + 1.0)):
        for strategy in ("send_recv", "allgather", "broadcast"):
            p = reshard.plan((gb // 4,), "int32", src, dst, cluster=cluster, strategy=strategy)
            assert p.lower_bound() == pytest.approx(seconds)
            assert p.estimate() >= p.lower_bound() * (1 - 1e-9)
    # a whole group on one host sums there: only the other host receives over its NIC
    cl = Cluster.regular(2, 2, nic_bandwidth=1e9, intra_bandwidth=1e12, latency=1e-4,
                         intra_latency=0.0, copy_bandwidth=1e12)
    src = Layout(DeviceMesh((1, 2), devices=[0, 1]), "R+P1")  # one group, on host 0
    dst = Layout(DeviceMesh((2,), devices=[1, 2]), "R")
    p = reshard.plan((gb // 4,), "int32", src, dst, cluster=cl)
    assert p.lower_bound() == pytest.approx(1e-4 + 1.0)  # host 1's NIC, once


def test_each_bound_term_pays_only_the_latency_its_bytes_must():
    """A big box to a device of the source's own host and a tiny one to another host: the
    big one's link bounds the time plus an intra-host latency, not a network one (the
    bound once added the network latency to every term, above the plan's own model)."""
    cluster = Cluster.regular(2, 2, intra_bandwidth=1e9, nic_bandwidth=1e12, latency=1e-3,
                              intra_latency=1e-6)
    one = Layout(DeviceMesh((1,), [0]), "R")
    reqs = [((250000,), "float32", one, Layout(DeviceMesh((1,), [1]), "R")),
            ((250,), "float32", one, Layout(DeviceMesh((1,), [2]), "R"))]
    for strategy in ("send_recv", "broadcast"):
        p = reshard.plan_many(reqs, cluster=cluster, strategy=strategy)
        assert p.lower_bound() == pytest.approx(1e-3 + 1e-6)
        assert p.estimate() >= p.lower_bound()


def test_a_sum_inside_one_host_is_bound_by_its_merges():
    """Eight addends on one host's eight devices: summing takes seven moves of every
    element, each landing on one of the host's links (or leaving through its NIC), so a
    reduce-scatter is bound by 7/8 of the bytes over the links, as NCCL's bus bandwidth
    says, not by the 1/8 each device receives; an all-reduce by 14/8."""
    cluster = Cluster.regular(1, 8, intra_bandwidth=100e9, nic_bandwidth=10e9,
                              intra_latency=1e-6)
    mesh = DeviceMesh((8,), range(8))
    nbytes = 8_000_000 * 4
    for dst, moves in (("S0", 7), ("R", 14)):
        p = reshard.plan((8_000_000,), "float32", Layout(mesh, "R+P0"), Layout(mesh, dst),
                         cluster=cluster)
        assert p.lower_bound() == pytest.approx(moves * nbytes / (8 * 100e9 + 10e9) + 1e-6)
        assert p.estimate() >= p.lower_bound()


def test_ingress_time_in_its_three_windows():
    """Bytes a host takes in: in the first hop after the first arrival each costs
    ``k`` crossings (nothing merged yet) and in the last hop ``g`` (no time left to
    spread it); both at once ``k g``; in between one."""
    hop = 1.0
    assert ingress_time(5.0, 1, 1, hop) == 5.0
    assert ingress_time(0.01, 4, 2, hop) == pytest.approx(0.08)  # all in the overlap
    # tau = hop: hop / (k g) done; tau = 2 hop: hop / k + hop / g; then one per second
    assert ingress_time(1 / 8, 4, 2, hop) == pytest.approx(1.0)
    assert ingress_time(0.75, 4, 2, hop) == pytest.approx(2.0)
    assert ingress_time(0.75 + 3.0, 4, 2, hop) == pytest.approx(5.0)
    mid = 0.125 + 0.5 * (0.75 - 0.125)
    assert ingress_time(mid, 4, 2, hop) == pytest.approx(1.5)
    # a hop-free cluster, or one addend and one needer: the NIC time alone
    assert ingress_time(3.0, 8, 8, 0.0) == 3.0
    assert ingress_time(3.0, 1, 8, hop) == pytest.approx(2 * hop + 3.0 - hop - hop / 8)


def test_a_host_spreads_what_it_takes_in_or_takes_it_in_per_device():
    """Host 1's four devices all need what host 0 holds: either a byte enters once and
    hops to the others (a latency more), or it enters through each device's own NIC
    (four times the bytes). The bound charges the cheaper in each window; the model of
    the planner's tree (one entry, one hop) stays above it."""
    nic, lat, hop = 4e9, 1e-4, 1e-5
    cl = Cluster.regular(2, 4, nic_bandwidth=nic, intra_bandwidth=1e12, latency=lat,
                         intra_latency=hop, copy_bandwidth=1e13, nics_per_host=4)
    src = Layout(DeviceMesh((1,), [0]), "R")
    dst = Layout(DeviceMesh((4,), [4, 5, 6, 7]), "R")
    nbytes = 4_000_000
    p = reshard.plan((nbytes // 4,), "float32", src, dst, cluster=cl, strategy="broadcast")
    busy = nbytes / nic
    assert p.lower_bound() == pytest.approx(lat + hop - hop / 4 + busy)
    assert p.estimate() >= p.lower_bound()


def test_a_sum_merges_before_the_network_and_spreads_after_it():
    """S0R+P1 (4, 8) -> RS0 (4, 8) on dgx-h100, 4 MiB: each destination host takes in a
    quarter of the tensor, every byte of it the sum of eight addends on another host and
    needed by all eight of its GPUs. A byte that skips the merge crosses eight times, one
    that skips the spread eight times too, so the bound is the network latency, two
    NVLink hops less an eighth of each, and the NIC time; the plan is within 1.10."""
    cl = Cluster.preset("dgx-h100", 8)
    src = Layout(DeviceMesh((4, 8), devices=range(32)), "S0R+P1")
    dst = Layout(DeviceMesh((4, 8), devices=range(32, 64)), "RS0")
    p = reshard.plan((1024, 1024), "float32", src, dst, cluster=cl, strategy="broadcast")
    hop = cl.intra_latency
    busy = 1024 * 1024 * 4 / 4 / cl.nic_bandwidth
    assert p.lower_bound() == pytest.approx(cl.latency + 2 * hop - hop / 8 - hop / 8 + busy)
    assert p.lower_bound() <= p.estimate() <= 1.10 * p.lower_bound()


def test_the_bounds_one_holder_one_needer_path_counts_as_the_general_one(monkeypatch):
    """_Intake._pair (a cell group one device holds and one needs: an all-to-all's every
    cell) counts exactly what _Intake._cell counts for it, on all-to-alls within and
    across hosts, with and without a message cost."""
    from reshard.planner.costing import bound

    def general(self, s, d, nbytes):
        self._cell(frozenset((s,)), frozenset((d,)), nbytes, 0, set())

    cases = [((64, 96), "S01R", "RS10", range(8), range(8, 16)),
             ((64, 96), "S0S1", "S1S0", range(8), range(8)),
             ((60, 90), "S0R", "RS0", range(4), range(2, 6))]
    for figures in ({}, {"shared_bandwidth": 3e9, "message_cost": 2e-5, "relay_piece": 4096}):
        cluster = Cluster.regular(4, 4, **figures)
        for shape, a, b, sd, dd in cases:
            sm = DeviceMesh((2, len(sd) // 2), devices=list(sd))
            dm = DeviceMesh((2, len(dd) // 2), devices=list(dd))
            p = reshard.plan(shape, "float32", Layout(sm, a), Layout(dm, b), cluster=cluster)
            fast = bound.lower_bound(p.tensors, cluster)
            with monkeypatch.context() as m:
                m.setattr(bound._Intake, "_pair", general)
                assert bound.lower_bound(p.tensors, cluster) == fast, (a, b, figures)
