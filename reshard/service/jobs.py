"""The jobs a server runs in its worker processes (:mod:`reshard.service.workpool`):
module-level functions of picklable arguments, importing no grpc."""

from __future__ import annotations

from reshard.cluster import Cluster
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import plan_many
from reshard.planner.values.request import default_cluster, make_tensor_spec
from reshard.service import searches
from reshard.service.budget import check_cells
from reshard.service.convert import request_from_pb
from reshard.service.estimates import Answer, Limits, answer_within
from reshard.service.plan_codec import cost_to_pb, plan_from_pb
from reshard.service.v1 import reshard_pb2 as pb


def plan(request: bytes, cluster: Cluster | None, max_cells: int | None = None,
         what: str = "Plan") -> ReshardPlan:
    """The plan of a PlanRequest's bytes (``cluster``: the server's default), sized
    first: over ``max_cells`` it is refused (:class:`~reshard.service.budget.OverBudget`)
    before planning."""
    reqs, chosen, strategy = request_from_pb(pb.PlanRequest.FromString(request), cluster)
    if chosen is None:
        chosen = default_cluster(lay for r in reqs for lay in r[2:4])
    if max_cells is not None:
        specs = [make_tensor_spec(*r[:4], cluster=chosen, cast=r[4]) for r in reqs]
        check_cells(what, [(t.shape, t.dtype, t.src, t.dst) for t in specs], max_cells)
    return plan_many(reqs, cluster=chosen, strategy=strategy)


def cost(request: bytes, cluster: Cluster | None, max_cells: int | None = None) -> bytes:
    """The Cost message (its bytes) of a PlanRequest's plan, without sending the plan."""
    return bytes(cost_to_pb(plan(request, cluster, max_cells, "Estimate")).SerializeToString())


def estimate_many(requests: list[bytes], cluster: Cluster | None, limits: Limits,
                  until: float | None) -> list[Answer]:
    """The answers of an EstimateMany's uncached requests (their PlanRequests' bytes),
    sized first, until the monotonic time ``until``
    (:func:`reshard.service.estimates.answer_within`)."""
    return answer_within(requests, cluster, limits, until)


def search(request: bytes, cluster: Cluster | None, until: float,
           cap: float) -> tuple[bytes, bool]:
    """A SearchRequest's reply (encoded) and whether it is complete, the search stopped
    at the monotonic time ``until`` (:func:`reshard.service.searches.run`)."""
    return searches.run(request, cluster, until, cap)


def verify(message: bytes) -> ReshardPlan:
    """The verified plan of a Plan message's bytes."""
    return plan_from_pb(pb.Plan.FromString(message), verify=True)


__all__ = ["cost", "estimate_many", "plan", "search", "verify"]
