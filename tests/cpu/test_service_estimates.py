"""EstimateMany through the service: every answer equals reshard.plan(...).estimate()
in this process, in order, across the stream's runs; a malformed request fails alone
with its position and class; a batch over the budget is refused before work; repeated
batches come from the server's cache."""

from __future__ import annotations

import math

import grpc
import pytest
from hypothesis import given, settings

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.service import Client, ServeOptions, Server, ServiceError, convert
from reshard.service.servicer import ESTIMATE_RUN
from reshard.service.v1 import reshard_pb2 as pb
from reshard.service.v1 import reshard_pb2_grpc as pb_grpc

from ..unit.test_planner_properties import planning_problems

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def server():
    with Server(ServeOptions(port=0, backend=None, workers=4, max_plan_cells=50_000)).start() as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with Client(server.address, timeout=60) as c:
        yield c


@pytest.mark.timeout(300)
@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(problem=planning_problems())
def test_estimates_through_the_service_are_the_planners(client, problem):
    shape, dtype, src, dst, cluster = problem
    reqs = [(shape, dtype, src, dst, cluster, s) for s in ("broadcast", "send_recv")]
    want = [reshard.plan(shape, dtype, src, dst, cluster=cluster, strategy=s).estimate()
            for s in ("broadcast", "send_recv")]
    assert client.estimate_many(reqs) == pytest.approx(want, rel=1e-9, abs=1e-15)


@pytest.mark.timeout(120)
def test_a_long_batch_streams_in_order_and_bad_requests_fail_alone(client):
    cluster = Cluster.regular(4, 2)
    a, b = DeviceMesh((2,), [0, 1]), DeviceMesh((2, 2), [2, 3, 4, 5])
    good = [((n, 6), "float32", Layout(a, "S0R"), Layout(b, "RS1"), cluster)
            for n in range(1, 41)]
    reqs = good * 30  # 1,200: three runs of the stream
    bad = {7: ((8, 8), "float32", Layout(a, "S0R"), Layout(DeviceMesh((2,), [2, 99]), "RS0"),
               cluster),
           600: ((8,), "float32", Layout(a, "S0R"), Layout(b, "RS1"), cluster),
           1100: ((8, 8), "bool", Layout(a, "RR+P0"), Layout(b, "RS1"), cluster),
           1150: ((8, 8), "float32", "S0R", Layout(b, "RS1"), cluster)}
    for i, r in bad.items():
        reqs[i] = r
    assert len(reqs) > 2 * ESTIMATE_RUN
    with pytest.raises(reshard.EstimateError) as info:
        client.estimate_many(reqs)
    err = info.value
    assert sorted(err.failures) == sorted(bad)
    assert type(err.failures[7]) is reshard.ClusterError
    assert type(err.failures[600]) is reshard.SpecError
    assert type(err.failures[1100]) is reshard.PartialError
    assert type(err.failures[1150]) is reshard.ReshardError  # refused by the client
    want = {r[0]: reshard.plan(*r[:4], cluster=cluster).estimate() for r in good}
    for i, r in enumerate(reqs):
        if i in bad:
            assert math.isnan(err.estimates[i])
        else:
            assert err.estimates[i] == pytest.approx(want[r[0]], rel=1e-9)


@pytest.mark.timeout(120)
def test_a_batch_over_the_budget_is_refused_before_work(server, client):
    cluster = Cluster.regular(8, 8)
    a, b = DeviceMesh((64,), range(64)), DeviceMesh((8, 8), range(64))
    big = [((n, 64 * 64), "float32", Layout(a, "S0R"), Layout(b, "RS01"), cluster)
           for n in range(4096, 4160)]  # about 4,096 cells each: 64 of them pass 50,000
    with pytest.raises(ServiceError) as e:
        client.estimate_many(big)
    assert e.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-plan-cells" in str(e.value)


@pytest.mark.timeout(60)
def test_an_empty_batch_and_raw_messages(server):
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.ReshardStub(ch)
        replies = list(stub.EstimateMany(pb.EstimateManyRequest(), timeout=30))
        assert len(replies) == 1 and not replies[0].results
        a = Layout(DeviceMesh((2,), [0, 1]), "S0R")
        good = convert.request_to_pb([((8, 8), "float32", a, a, None)], None, "broadcast")
        msg = pb.EstimateManyRequest(requests=[pb.PlanRequest(), good])
        (reply,) = stub.EstimateMany(msg, timeout=30)
        first, second = reply.results
        assert first.index == 0 and first.error_type == "ReshardError" and "no tensors" in \
            first.error
        assert second.index == 1 and not second.error and second.seconds > 0
