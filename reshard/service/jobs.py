"""The jobs a server runs in its worker processes (:mod:`reshard.service.workpool`):
module-level functions of picklable arguments, importing no grpc."""

from __future__ import annotations

from reshard.cluster import Cluster
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import plan_many
from reshard.service.convert import request_from_pb
from reshard.service.plan_codec import cost_to_pb, plan_from_pb
from reshard.service.v1 import reshard_pb2 as pb


def plan(request: bytes, cluster: Cluster | None) -> ReshardPlan:
    """The plan of a PlanRequest's bytes (``cluster``: the server's default)."""
    reqs, chosen, strategy = request_from_pb(pb.PlanRequest.FromString(request), cluster)
    return plan_many(reqs, cluster=chosen, strategy=strategy)


def cost(request: bytes, cluster: Cluster | None) -> bytes:
    """The Cost message (its bytes) of a PlanRequest's plan, without sending the plan."""
    return bytes(cost_to_pb(plan(request, cluster)).SerializeToString())


def verify(message: bytes) -> ReshardPlan:
    """The verified plan of a Plan message's bytes."""
    return plan_from_pb(pb.Plan.FromString(message), verify=True)


__all__ = ["cost", "plan", "verify"]
