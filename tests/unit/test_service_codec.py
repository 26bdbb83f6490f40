"""The service's wire format: core types and plans <-> reshard.v1 messages (no network).

Oracles: the core types' own equality, ``ReshardPlan.to_json`` (the JSON form that
already round-trips), and the core constructors (``Cluster.preset`` / ``regular`` /
``from_hosts``) the cluster messages stand for.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster, DeviceMesh, Layout, ReshardPlan, ShardingSpec
from reshard.dtypes import Cast, ScaleMode
from reshard.errors import ClusterError, MeshError, PlanError, ReshardError, SpecError
from reshard.microbench.suites.realistic import realistic_cases
from reshard.planner.plan import make_tensor_spec, plan_tasks
from reshard.planner.values.strategy import Strategy
from reshard.service import convert, plan_codec
from reshard.service.status import (
    ERROR_CLASSES,
    ServiceError,
    error_name,
    raise_rpc_error,
    status_code,
)
from reshard.service.v1 import reshard_pb2 as pb
from reshard.spec import SplitRule

from ..common import STRATEGIES
from .test_planner_properties import planning_problems


def wire(plan: reshard.ReshardPlan) -> reshard.ReshardPlan:
    """``plan`` through bytes of the Plan message and back."""
    data = plan_codec.plan_to_pb(plan).SerializeToString()
    return plan_codec.plan_from_pb(pb.Plan.FromString(data))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planning_problems(), st.sampled_from(STRATEGIES))
def test_random_plans_survive_the_wire(problem, strategy):
    shape, dtype, src, dst, cluster = problem
    p = reshard.plan(shape, dtype, src, dst, cluster=cluster, strategy=strategy)
    back = wire(p)
    assert back == p
    assert back.to_json() == p.to_json()
    chunks = plan_codec.plan_chunks(p, max_tasks=3, max_bytes=1 << 20)
    assert len(chunks) == max(1, -(-len(p.tasks) // 3))
    merged, _ = plan_codec.merge_chunks(pb.PlanChunk.FromString(c.SerializeToString())
                                        for c in chunks)
    assert plan_codec.plan_from_pb(merged) == p


@pytest.mark.parametrize("shape", [(300, 260), (256, 256)])  # amax phase / own scales
def test_scaled_cast_plans_survive_the_wire(shape):
    src = Layout(DeviceMesh((2, 2)), "S0S1")
    dst = Layout(DeviceMesh((2,), devices=(4, 5)), "RS0")
    p = reshard.plan(shape, "bfloat16", src, dst, cluster=Cluster.regular(2, 4),
                     cast="float8_e4m3fn", scale="block128")
    back = wire(p)
    assert back == p and back.tensors[0].link == p.tensors[0].link >= 1
    assert [t.derive for t in back.tensors] == [t.derive for t in p.tensors]


def test_relays_steps_and_many_tensors_survive_the_wire():
    cases = {c.name: c for c in realistic_cases()}
    relayed = cases["tp8-to-tp4"]  # broadcasts relayed through devices that need nothing
    cluster = relayed.cluster()
    p = reshard.plan_many(relayed.requests_on(cluster), cluster=cluster)
    assert any(t.through for t in p.tasks)
    assert wire(p) == p
    stepped = cases["tp-row-partial-to-rep"]  # reductions fused with their broadcasts
    cluster = stepped.cluster()
    q = reshard.plan_many(stepped.small(1 << 16).requests_on(cluster), cluster=cluster)
    assert any(t.addends for t in q.tasks) and wire(q) == q
    assert any(t.addend_parents for t in q.tasks)  # summed by a star
    tensors = tuple(make_tensor_spec(*r[:4], cluster=cluster)  # pipelined: several steps
                    for r in stepped.small(4096).requests_on(cluster))
    tasks, _ = plan_tasks(tensors, cluster, Strategy.BROADCAST, fan_out=False)
    r = ReshardPlan(tensors, tasks, Strategy.BROADCAST, cluster)
    assert r.num_steps > 1 and wire(r) == r
    gathered = reshard.plan_many(stepped.small(4096).requests_on(cluster) * 3,
                                 cluster=cluster, strategy="allgather")
    assert any(t.pieces for t in gathered.tasks) and wire(gathered) == gathered


def test_chunks_respect_the_byte_budget():
    case = {c.name: c for c in realistic_cases()}["tp8-to-tp4"]
    cluster = case.cluster()
    p = reshard.plan_many(case.requests_on(cluster) * 8, cluster=cluster)
    budget = 1000  # the header alone is larger: the first chunk gets it and one task
    chunks = plan_codec.plan_chunks(p, max_tasks=10 ** 6, max_bytes=budget)
    assert len(chunks) > 2
    assert all(c.ByteSize() <= budget for c in chunks[1:])
    merged, _ = plan_codec.merge_chunks(chunks)
    assert merged == plan_codec.plan_to_pb(p)
    with pytest.raises(PlanError, match="stream ended after 1 of"):
        plan_codec.merge_chunks(chunks[:1])
    with pytest.raises(PlanError, match="arrived as number"):
        plan_codec.merge_chunks([chunks[0], chunks[2]])


def test_a_tampered_plan_is_refused_by_the_verifier():
    src = Layout(DeviceMesh((2, 2)), "S0R")
    dst = Layout(DeviceMesh((2, 2), devices=range(4, 8)), "RS0")
    msg = plan_codec.plan_to_pb(reshard.plan((8, 8), "int32", src, dst))
    msg.tasks[0].receivers[0] = 3  # a device that needs nothing (and misses it elsewhere)
    with pytest.raises(PlanError):
        plan_codec.plan_from_pb(msg)
    msg = plan_codec.plan_to_pb(reshard.plan((8, 8), "int32", src, dst))
    msg.format = 99
    with pytest.raises(PlanError, match="format 99 is not supported"):
        plan_codec.plan_from_pb(msg)
    msg.format = 2
    msg.tasks[0].kind = pb.TASK_KIND_UNSPECIFIED
    with pytest.raises(PlanError, match="task #0: kind TASK_KIND_UNSPECIFIED is not known"):
        plan_codec.plan_from_pb(msg)


# ----- specs ----------------------------------------------------------------------------
SPECS = ["S0RR", "RS01R", "S10", "S0R+P1", "R", "", "S01R:nested", "S[10]R", "RS0+P[11]"]


@pytest.mark.parametrize("text", SPECS)
def test_specs_round_trip_in_both_forms(text):
    spec = ShardingSpec.parse(text)
    msg = convert.spec_to_pb(spec)
    assert convert.spec_from_pb(msg) == spec
    assert convert.SPLIT_RULE.of[msg.split_rule] is spec.rule
    text_only = pb.ShardingSpec(text=text)
    assert convert.spec_from_pb(text_only) == spec
    structured = pb.ShardingSpec(dims=msg.dims, partial=msg.partial, split_rule=msg.split_rule)
    assert convert.spec_from_pb(structured) == spec


def test_nested_rule_changes_the_boxes_across_the_wire():
    mesh = DeviceMesh((2, 2))
    nested = Layout(mesh, ShardingSpec(((0, 1),), rule=SplitRule.NESTED))
    back = convert.layout_from_pb(convert.layout_to_pb(nested))
    # the two rules cut 5 elements differently: the wire keeps the nested one
    assert back.index_map((5,)) == nested.index_map((5,))
    assert back.index_map((5,)) != Layout(mesh, "S01").index_map((5,))


def test_disagreeing_spec_forms_are_refused():
    with pytest.raises(SpecError, match="disagree"):
        convert.spec_from_pb(pb.ShardingSpec(text="S0R", dims=[pb.MeshAxes(axes=[1]),
                                                               pb.MeshAxes()]))
    with pytest.raises(SpecError, match="split rule but split_rule is SPLIT_RULE_NESTED"):
        convert.spec_from_pb(pb.ShardingSpec(text="S01R", split_rule=pb.SPLIT_RULE_NESTED))
    with pytest.raises(SpecError, match="split rule 7 is not known"):
        convert.spec_from_pb(pb.ShardingSpec(text="S0R", split_rule=7))  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="spec: bad sharding spec"):
        convert.spec_from_pb(pb.ShardingSpec(text="S0X"))


def test_meshes_and_their_limits():
    mesh = DeviceMesh((2, 3), devices=[5, 4, 3, 2, 1, 0], axis_names=("dp", "tp"))
    assert convert.mesh_from_pb(convert.mesh_to_pb(mesh)) == mesh
    assert convert.mesh_from_pb(pb.Mesh(shape=[2, 2])) == DeviceMesh((2, 2))
    with pytest.raises(MeshError, match="over the service's limit"):
        convert.mesh_from_pb(pb.Mesh(shape=[1 << 10, 1 << 10]))
    with pytest.raises(MeshError, match="mesh: mesh devices must be distinct"):
        convert.mesh_from_pb(pb.Mesh(shape=[2], devices=[1, 1]))


# ----- clusters -------------------------------------------------------------------------
def test_cluster_forms_build_what_the_python_api_builds():
    preset = pb.Cluster(preset=pb.PresetCluster(name="dgx-h100", num_hosts=2))
    assert convert.cluster_from_pb(preset) == Cluster.preset("dgx-h100", 2)
    narrow = pb.Cluster(preset=pb.PresetCluster(name="paper", num_hosts=3, devices_per_host=2))
    assert convert.cluster_from_pb(narrow) == Cluster.preset("paper", 3, 2)
    regular = pb.Cluster(regular=pb.RegularCluster(
        num_hosts=4, devices_per_host=2, preset="aws-p4d.24xlarge",
        figures=pb.LinkFigures(nic_bandwidth=1e9, nics_per_host=2, shared_bandwidth=3e9,
                               message_cost=2e-5)))
    assert convert.cluster_from_pb(regular) == Cluster.regular(
        4, 2, preset="aws-p4d.24xlarge", nic_bandwidth=1e9, nics_per_host=2,
        shared_bandwidth=3e9, message_cost=2e-5)
    hosts = pb.Cluster(hosts=pb.HostsCluster(hosts=[pb.Host(devices=[0, 2]),
                                                    pb.Host(devices=[1, 3])], name="lab"))
    assert convert.cluster_from_pb(hosts) == Cluster.from_hosts([[0, 2], [1, 3]], name="lab")
    default = Cluster.regular(1, 4)
    assert convert.cluster_from_pb(pb.Cluster(), default) is default
    huge = pb.Cluster(hosts=pb.HostsCluster(hosts=[
        pb.Host(devices=range(k * 4096, (k + 1) * 4096)) for k in range(17)]))
    with pytest.raises(ClusterError, match="69632 devices, over the service's limit"):
        convert.cluster_from_pb(huge)


@pytest.mark.parametrize("cluster", [
    Cluster.preset("aws-p5.48xlarge", 2),
    Cluster.regular(3, 2, latency=1e-3, intra_latency=0.0),
    Cluster.from_hosts([[7, 3], [1], [0, 2, 4]], preset="dgx-a100", name="odd"),
])
def test_explicit_clusters_round_trip(cluster):
    msg = pb.Cluster.FromString(convert.cluster_to_pb(cluster).SerializeToString())
    back = convert.cluster_from_pb(msg)
    assert back == cluster and back.to_dict() == cluster.to_dict()


def test_bad_clusters_name_the_field():
    with pytest.raises(ClusterError, match=r"cluster\.preset: unknown preset 'dgx-z'; valid"):
        convert.cluster_from_pb(pb.Cluster(preset=pb.PresetCluster(name="dgx-z", num_hosts=1)))
    with pytest.raises(ClusterError, match="over the service's limit"):
        convert.cluster_from_pb(pb.Cluster(regular=pb.RegularCluster(
            num_hosts=1 << 20, devices_per_host=8)))
    with pytest.raises(ClusterError, match=r"cluster\.regular: need num_hosts >= 1"):
        convert.cluster_from_pb(pb.Cluster(regular=pb.RegularCluster(devices_per_host=8)))
    with pytest.raises(ClusterError, match="listed on host 0 and host 1"):
        convert.cluster_from_pb(pb.Cluster(hosts=pb.HostsCluster(
            hosts=[pb.Host(devices=[0]), pb.Host(devices=[0])])))


def test_requests_decode_to_plan_many_arguments():
    src = Layout(DeviceMesh((2, 2)), "S0R")
    dst = Layout(DeviceMesh((4,), devices=range(4, 8)), "RS0")
    cluster = Cluster.regular(2, 4)
    fp8 = Cast("float8_e4m3fn", ScaleMode.BLOCK128)
    msg = convert.request_to_pb([((8, 6), "int16", src, dst, None),
                                 ((256, 128), "bfloat16", src, dst, fp8)], cluster, "allgather")
    reqs, got_cluster, strategy = convert.request_from_pb(
        pb.PlanRequest.FromString(msg.SerializeToString()), None)
    assert reqs == [((8, 6), "int16", src, dst, None), ((256, 128), "bfloat16", src, dst, fp8)]
    assert got_cluster == cluster and strategy is reshard.Strategy.ALLGATHER
    msg.strategy = pb.STRATEGY_UNSPECIFIED
    assert convert.request_from_pb(msg, None)[2] is reshard.Strategy.BROADCAST
    with pytest.raises(ReshardError, match="the request has no tensors"):
        convert.request_from_pb(pb.PlanRequest(), None)
    msg.tensors[1].link = 0  # plans only
    with pytest.raises(ReshardError, match="derive/link"):
        convert.request_from_pb(msg, None)
    msg.tensors[1].ClearField("link")
    msg.tensors[1].cast = ""  # scales without a float8 cast
    with pytest.raises(ReshardError, match="needs a float8 cast"):
        convert.request_from_pb(msg, None)
    msg.tensors[1].scale = 99
    with pytest.raises(ReshardError, match="scale 99 is not known"):
        convert.request_from_pb(msg, None)
    del msg.tensors[1]
    del msg.tensors[0].dst.mesh.shape[:]
    msg.tensors[0].ClearField("dst")
    with pytest.raises(SpecError, match=r"tensors\[0\] has no dst layout"):
        convert.request_from_pb(msg, None)


# ----- errors ---------------------------------------------------------------------------
class FailedCall(grpc.RpcError, grpc.Call):
    """What a channel raises for a failed call (code, details, trailing metadata)."""

    def __init__(self, code, text, trailing=()):
        self._code, self._text, self._trailing = code, text, trailing

    def code(self):
        return self._code

    def details(self):
        return self._text

    def trailing_metadata(self):
        return self._trailing

    def initial_metadata(self):
        return ()

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False


@pytest.mark.parametrize("name", sorted(ERROR_CLASSES))
def test_every_error_class_comes_back_as_itself(name):
    cls = ERROR_CLASSES[name]
    err = cls("the rule, the value, the fix")
    code = status_code(err, deadline_expired=False)
    assert error_name(err) == name
    with pytest.raises(cls) as got:
        raise_rpc_error(FailedCall(code, str(err), (("reshard-error", name),)))
    assert type(got.value) is cls and str(got.value) == str(err)


def test_status_codes():
    codes = {name: status_code(cls("x"), False) for name, cls in ERROR_CLASSES.items()
             if cls is not ServiceError}
    assert codes.pop("ExecutionError") is grpc.StatusCode.ABORTED
    assert codes.pop("MissingDependencyError") is grpc.StatusCode.FAILED_PRECONDITION
    assert set(codes.values()) == {grpc.StatusCode.INVALID_ARGUMENT}
    assert status_code(reshard.ExecutionError("x"), True) is grpc.StatusCode.DEADLINE_EXCEEDED
    assert status_code(ServiceError("x", grpc.StatusCode.UNAVAILABLE), True) \
        is grpc.StatusCode.UNAVAILABLE
    with pytest.raises(ServiceError) as got:  # no class named: a failure of the service
        raise_rpc_error(FailedCall(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    assert got.value.code is grpc.StatusCode.UNAVAILABLE


def test_numpy_dtypes_and_shapes_cross_as_plain_values():
    src = Layout(DeviceMesh((2,)), "S0")
    dst = Layout(DeviceMesh((2,), devices=[2, 3]), "R")
    p = reshard.plan((np.int64(5),), np.float16, src, dst)
    assert wire(p) == p and wire(p).tensors[0].dtype == "float16"


def test_cache_keys_are_canonical_and_small():
    """Unknown fields and the fields that do not change the plan leave the key alone;
    any request's key is 32 bytes."""
    from reshard.service.servicer import request_key

    src = Layout(DeviceMesh((2, 2)), "S0R")
    dst = Layout(DeviceMesh((4,), devices=range(4, 8)), "RS0")
    msg = convert.request_to_pb([((8, 6), "int16", src, dst, None)], None, "broadcast")
    key = request_key(msg)
    assert len(key) == 32
    noisy = pb.PlanRequest.FromString(msg.SerializeToString() + b"\xa8\x06\x01")  # field 101
    assert noisy.SerializeToString() != msg.SerializeToString()  # kept the unknown field
    assert request_key(noisy) == key
    noisy.include_cost, noisy.max_chunk_tasks = True, 7
    assert request_key(noisy) == key
    other = convert.request_to_pb([((8, 7), "int16", src, dst, None)], None, "broadcast")
    assert request_key(other) != key
