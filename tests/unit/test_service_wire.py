"""Counting repeated messages on the wire (reshard.service.wire) agrees with the parsed
message, stops one past its limit, and leaves bytes that are no message to the parser."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshard.service import budget, wire
from reshard.service.v1 import reshard_pb2 as pb


def tensor(k: int, devices: int = 2) -> pb.Tensor:
    lay = pb.Layout(mesh=pb.Mesh(shape=[devices], devices=range(1000, 1000 + devices)),
                    spec=pb.ShardingSpec(text="S0"))
    return pb.Tensor(shape=[8 + k, 300 + k], dtype="float32", src=lay, dst=lay)


def plan_request(tensors: int, cluster: bool, pad: int) -> bytes:
    msg = pb.PlanRequest(tensors=[tensor(k, 2 + k % 200) for k in range(tensors)],
                         strategy=pb.STRATEGY_ALLGATHER, max_chunk_tasks=1 << 20)
    if cluster:
        msg.cluster.hosts.hosts.add(devices=range(300))
        msg.cluster.hosts.figures.latency = 1e-6
    raw = msg.SerializeToString()
    return raw + b"\xa2\x3e" + bytes([pad]) + b"x" * pad if pad else raw  # field 999


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(tensors=st.integers(0, 40), cluster=st.booleans(), pad=st.integers(0, 127))
def test_a_plan_requests_tensors_are_counted_as_parsed(tensors, cluster, pad):
    raw = plan_request(tensors, cluster, pad)
    assert len(pb.PlanRequest.FromString(raw).tensors) == tensors
    assert wire.entries(raw, 1, 1 << 30) == tensors
    assert wire.entries(raw, 1, 3) == min(tensors, 4)  # stops one past the limit


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(sizes=st.lists(st.integers(0, 5), max_size=30), cluster=st.booleans())
def test_an_estimate_manys_requests_and_tensors_are_counted_as_parsed(sizes, cluster):
    msg = pb.EstimateManyRequest()
    for n in sizes:
        msg.requests.append(pb.PlanRequest.FromString(plan_request(n, cluster, 3)))
    raw = msg.SerializeToString()
    assert wire.estimate_many_counts(raw, 1 << 20, 1 << 20) == (len(sizes), sum(sizes))
    _, tensors = wire.estimate_many_counts(raw, 1 << 20, 2)
    assert tensors == min(sum(sizes), 3)
    requests, _ = wire.estimate_many_counts(raw, 4, 1 << 20)
    assert requests == min(len(sizes), 5)


def test_counts_stop_one_past_the_limit_and_short_messages_pass_unscanned():
    raw = pb.PlanRequest(tensors=[pb.Tensor()] * 10).SerializeToString()  # 2 bytes each
    assert wire.plan_request_tensors(raw * 2, 9) == 10
    many = pb.EstimateManyRequest(requests=[pb.PlanRequest(tensors=[pb.Tensor()])] * 50)
    assert wire.estimate_many_counts(many.SerializeToString(), 10, 1000) == (11, 10)
    budget.check_plan_request_wire("Plan", raw, 10)  # 20 bytes: cannot hold 11
    with pytest.raises(budget.OverBudget, match="more than 9 tensors"):
        budget.check_plan_request_wire("Plan", raw, 9)
    budget.check_estimate_many_wire(many.SerializeToString(), 50, 1000)
    with pytest.raises(budget.OverBudget, match="more than 49 requests"):
        budget.check_estimate_many_wire(many.SerializeToString(), 49, 1000)


@pytest.mark.parametrize("raw", [b"\x0a\xff", b"\x0a\x05abc", b"\x0b\x00", b"\xff" * 12,
                                 b"\x09\x00\x00", b"\x08"])
def test_bytes_that_are_no_message_are_left_to_the_parser(raw):
    with pytest.raises(wire.Malformed):
        wire.entries(raw, 1, 100)
    assert wire.plan_request_tensors(raw * 20, 1) == 0
    assert wire.estimate_many_counts(raw * 20, 1, 1) == (0, 0)


def test_a_request_padded_with_fields_is_refused_at_the_scans_bound():
    """A request of a million tiny unknown fields (3 MB; each skipped field costs the
    scan as much as a tensor) is refused after ``4 x budget + 64`` fields, top level
    or nested, where the scan would have walked them all."""
    pad = b"\xa8\x06\x01" * 1_000_000  # field 101, varint 1
    one = pb.PlanRequest(tensors=[tensor(0)]).SerializeToString()
    with pytest.raises(wire.TooLong):
        wire.plan_request_tensors(one + pad, 1000)
    with pytest.raises(budget.OverBudget, match=r"more than 4064 fields \(counted before"):
        budget.check_plan_request_wire("Estimate", one + pad, 1000)
    assert wire.plan_request_tensors(one + pad[:3000], 1000) == 1  # a few are fine
    nested = pb.EstimateManyRequest(requests=[pb.PlanRequest.FromString(one + pad)])
    with pytest.raises(budget.OverBudget, match="fields"):
        budget.check_estimate_many_wire(nested.SerializeToString(), 100, 1000)
    assert wire.first_entries(pad + one, 1, 16) == []  # the sample gives up as well
