"""The Search call's work: sized before any, then run in a job worker until its time runs
out, the answer measured against the baselines.

*Sizing* (on the serving thread, off the message alone: nothing is built from it): the
cluster's devices (over ``--max-devices`` refused), and the search's *cells*, what its
stage options grow with: per layer and submesh shape, the candidates times the submesh
*classes* of that shape (the places on a host a submesh of it can start: ``G - g + 1``
for ``(1, g)`` on hosts of ``G`` devices, 1 for whole hosts; the search builds each
class's options once), summed, times the blocks the chain is searched in (a stage may
start at each: ``min(L, 48)`` by default), times the searches the request runs (one per
data-parallel degree), times the stages each submesh holds (virtual stages: interleaved
1F1B's ``chunks``, default 2; ZB-V and DualPipeV 2; the DP places each stage option at
every piece). Over ``--max-search-cells`` the request is refused
(RESOURCE_EXHAUSTED) before any work; the 16-layer, 8-candidate instance built to hold a
search on 2 x 4 devices is 18,432 cells, GPT-3 175B on 1,024 devices (2 candidates on 8
shapes, 96 layers in 48 blocks) with degrees 8 and 16 460,800.

*Running* (:func:`run`, in a job worker: never on a serving thread): the request decoded
(a bad one: the search's own SearchError, INVALID_ARGUMENT), the search run with its
``time_limit`` set to the time the caller gave (its deadline or the server's
``--job-timeout``, less a margin to answer) or the request's own, whichever is shorter;
a search stopped by it ends DEADLINE_EXCEEDED naming the phase. Then, in what time is
left, Alpa's and Megatron's own choices on the same layers (:func:`baselines`), priced
(and simulated where the search re-ranks) as the answer is; one the time did not allow
is reported missing, and that answer is not cached.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from reshard.cluster import Cluster
from reshard.errors import SearchError
from reshard.planner.estimates import CostCache
from reshard.presets import PAPER_PRESET, PRESETS
from reshard.search import (
    Choice,
    Graph,
    Layer,
    evaluate_graph,
    search_chain,
    search_graph,
    search_replicated,
    simulated,
)
from reshard.search.baselines import uniform
from reshard.search.chain import MAX_BLOCKS
from reshard.search.costs import MoveCosts
from reshard.search.kinds import TRAITS, SearchSchedule
from reshard.search.model import Budget
from reshard.service.budget import OverBudget
from reshard.service.search_codec import (
    BASELINE,
    SCHEDULE,
    SearchAsk,
    choice_to_pb,
    error_text,
    faster,
    replicated_to_pb,
    request_from_pb,
)
from reshard.service.status import ServiceError
from reshard.service.v1 import reshard_pb2 as pb

MARGIN = 0.5
"""Seconds (at most a quarter of the time it has) a search keeps to send its answer
back before the call's deadline or the server's cap: its ``time_limit`` is the rest."""

PRESET_DEVICES = 72
"""A preset's devices per host where its name is not known (the most of any preset; the
decoder refuses the name later)."""


# ----- sizing ---------------------------------------------------------------------------
def grid(m: pb.SearchRequest, default: Cluster | None) -> tuple[int, int, int]:
    """``(hosts, devices per host, devices)`` of the request's cluster, read off its
    message (the server's ``default`` where it names none)."""
    kind = m.cluster.WhichOneof("kind")
    if kind == "preset":
        c = m.cluster.preset
        known = PRESETS.get(PAPER_PRESET if c.name in ("", "paper") else c.name)
        per = c.devices_per_host or (known.devices_per_host if known else PRESET_DEVICES)
        return c.num_hosts, per, c.num_hosts * per
    if kind == "regular":
        r = m.cluster.regular
        return r.num_hosts, r.devices_per_host, r.num_hosts * r.devices_per_host
    if kind == "hosts":
        hosts = m.cluster.hosts.hosts
        sizes = [len(h.devices) for h in hosts]
        return len(hosts), max(sizes, default=0), sum(sizes)
    if default is None:
        raise SearchError("the request names no cluster and the server has none (reshard "
                          "serve --cluster): set SearchRequest.cluster")
    return default.num_hosts, len(default.hosts[0]), len(default.devices)


def classes(hosts: int, devices: int, num_hosts: int, per_host: int) -> int:
    """The submesh classes of shape ``(hosts, devices)`` on ``num_hosts`` hosts of
    ``per_host`` devices (module docstring); 0 where none fits."""
    if hosts == 1 and 1 <= devices <= per_host:
        return per_host - devices + 1
    return int(1 < hosts <= num_hosts and devices == per_host)


def cells(m: pb.SearchRequest, num_hosts: int, per_host: int) -> int:
    """The request's search cells (module docstring)."""
    known: dict[tuple[int, int], int] = {}
    total = 0
    for layer in m.layers:
        for sub in layer.submeshes:
            shape = (sub.shape.hosts, sub.shape.devices)
            if shape not in known:
                known[shape] = max(1, classes(*shape, num_hosts, per_host))
            total += len(sub.candidates) * known[shape]
    n = len(m.layers)
    block = m.block if m.HasField("block") and m.block > 0 else max(1, -(-n // MAX_BLOCKS))
    searches = 1
    if m.HasField("replicas"):
        searches = len(m.replicas.degrees) or sum(1 for h in range(1, num_hosts + 1)
                                                   if num_hosts % h == 0)
    return max(1, -(-n // block)) * total * max(1, searches) * pieces(m)


def pieces(m: pb.SearchRequest) -> int:
    """The stages per submesh the request's schedule runs (virtual stages: each stage
    option is placed at every piece of its submesh, so the DP's work grows with them);
    1 for a one-chunk schedule or one the sizing cannot read (decoding refuses it)."""
    if m.schedule == pb.SCHEDULE_UNSPECIFIED:
        return 1
    try:
        sched = SearchSchedule(SCHEDULE.decode(m.schedule, SearchError))
    except (SearchError, ValueError):
        return 1
    fixed = TRAITS[sched].chunks
    if fixed > 0:
        return fixed
    return m.chunks if m.HasField("chunks") and m.chunks > 0 else sched.chunks()


def check_search(m: pb.SearchRequest, default: Cluster | None, max_devices: int,
                 max_cells: int) -> int:
    """The request's cells, refused (:class:`OverBudget`) over the server's budgets."""
    num_hosts, per_host, devices = grid(m, default)
    if devices > max_devices:
        raise OverBudget(f"Search: the request's cluster has {devices} devices, over the "
                         f"server's budget of {max_devices} (--max-devices); search it in "
                         f"process (reshard.search) or on a server with a larger budget")
    size = cells(m, num_hosts, per_host)
    if size > max_cells:
        raise OverBudget(
            f"Search: the request's search has about {size} cells (layers' candidates x "
            f"submesh classes x blocks x degrees: docs/service.md), over the server's "
            f"budget of {max_cells} (--max-search-cells); give fewer candidates or "
            f"submesh shapes, larger blocks, fewer degrees, or search it in process")
    return size


# ----- running --------------------------------------------------------------------------
def _chain(ask: SearchAsk, budget: Budget, cache: CostCache) -> tuple[Choice, Any]:
    return search_chain(ask.layers, ask.cluster, ask.microbatches, cache=cache,
                        time_limit=budget, **ask.options), None


def _graph(ask: SearchAsk, budget: Budget, cache: CostCache) -> tuple[Choice, Any]:
    assert ask.graph is not None
    return search_graph(ask.graph, ask.cluster, ask.microbatches, cache=cache,
                        time_limit=budget, **ask.options), None


def _replicated(ask: SearchAsk, budget: Budget, cache: CostCache) -> tuple[Choice, Any]:
    got = search_replicated(ask.layers, ask.cluster, ask.microbatches, cache=cache,
                            time_limit=budget, **ask.options)
    return got.choice, got


SEARCHES: dict[str, Callable[[SearchAsk, Budget, CostCache], tuple[Choice, Any]]] = {
    "chain": _chain, "graph": _graph, "replicated": _replicated}
"""The search each kind of request runs: its choice, and the Replicated answer (None
without replicas)."""


def _alpa(layers: Sequence[Layer], edges: Sequence[tuple[int, int]] | None,
          cluster: Cluster, b: int, kw: dict[str, Any]) -> Choice:
    """Alpa's choice: the chain DP with moves free, priced (on the graph's edges, as
    :func:`reshard.search.search_graph` prices its baseline)."""
    if edges is None:
        return search_chain(layers, cluster, b, moves="free", rerank=0, **kw)
    got = search_chain(layers, cluster, b, moves="free", rerank=0, edges=edges, **kw)
    graph = Graph(tuple(layers), tuple(edges))
    return evaluate_graph(graph, got.stages, cluster, b, got.schedule,
                          MoveCosts(cluster, cache=kw["cache"]), got.chunks)


def _megatron(layers: Sequence[Layer], edges: Sequence[tuple[int, int]] | None,
              cluster: Cluster, b: int, kw: dict[str, Any]) -> Choice:
    """Megatron's choice, priced by the objective (on the graph's edges)."""
    return uniform(layers, cluster, b, kw.get("schedule", "1f1b"),
                   memory_limit=kw.get("memory_limit"),
                   costs=MoveCosts(cluster, cache=kw["cache"]), time_limit=kw["time_limit"],
                   edges=edges, chunks=kw.get("chunks"))


BASELINE_SEARCHES = {"alpa": _alpa, "megatron": _megatron}
"""How each baseline's own choice is found."""


def baselines(ask: SearchAsk, answer: Choice, replicated: Any, budget: Budget,
              cache: CostCache) -> tuple[list[pb.BaselineResult], bool]:
    """Each baseline's result (its choice where it has one) on the layers, cluster and
    microbatches the answer was searched on (with replicas: the chosen degree's), and
    whether every one was found within ``budget`` (an answer without is not cached)."""
    layers, cluster, b = ask.layers, ask.cluster, ask.microbatches
    if replicated is not None:
        layers, cluster, b = replicated.layers, replicated.cluster, answer.microbatches
    edges = None if ask.graph is None else ask.graph.edges
    kw: dict[str, Any] = {"cache": cache, "time_limit": budget,
                          **{k: ask.options[k] for k in ("schedule", "memory_limit", "block",
                                                         "chunks") if k in ask.options}}
    out, complete = [], True
    for name, find in BASELINE_SEARCHES.items():
        result = pb.BaselineResult(baseline=BASELINE.to_pb[name])
        try:
            got = find(layers, edges, cluster, b, kw)
            if answer.simulated is not None:
                got = dataclasses.replace(got, simulated=simulated(
                    layers, got, cluster, MoveCosts(cluster, cache=cache), edges))
                budget.check("simulating the {} baseline", name)
        except SearchError as e:
            if budget.left() <= 0:
                complete = False
                result.missing = (f"the time ran out before {name}'s choice was found "
                                  f"(the search itself took the rest)")
            else:
                result.missing = error_text(e)
            out.append(result)
            continue
        choice_to_pb(got, into=result.choice)
        result.beaten = faster(answer, got)
        out.append(result)
    return out, complete


def _stopped(e: SearchError, ask: SearchAsk, seconds: float, cap: float) -> ServiceError:
    """The DEADLINE_EXCEEDED of a search its time limit stopped."""
    if ask.time_limit is not None and ask.time_limit <= seconds:
        why = f"the request's time_limit of {ask.time_limit:g} s"
    else:
        why = (f"{seconds:.3g} s: the call's deadline or the server's cap of {cap:g} s "
               f"(--job-timeout), less a margin to send the answer")
    return ServiceError(f"Search: stopped at {why}: {e}", grpc.StatusCode.DEADLINE_EXCEEDED)


def run(request: bytes, default: Cluster | None, until: float, cap: float) -> tuple[bytes, bool]:
    """A Search request's reply (encoded) and whether it is complete (cacheable): what
    a job worker runs (module docstring). ``until``: the :func:`time.monotonic` time
    the search must end by; ``cap``: the server's ``--job-timeout`` (for messages)."""
    start = time.monotonic()
    m = pb.SearchRequest.FromString(request)
    ask = request_from_pb(m, default)
    seconds = until - start
    if ask.time_limit is not None:
        seconds = min(seconds, ask.time_limit)
    if seconds <= 0:
        raise ServiceError("Search: no time was left for the search before the call's "
                           "deadline; give it a longer deadline",
                           grpc.StatusCode.DEADLINE_EXCEEDED)
    budget = Budget(seconds, start)
    cache = CostCache()
    try:
        choice, replicated = SEARCHES[ask.kind](ask, budget, cache)
    except SearchError as e:
        if budget.left() <= 0:
            raise _stopped(e, ask, seconds, cap) from None
        raise
    reply = pb.SearchReply()
    choice_to_pb(choice, into=reply.choice)
    if replicated is not None:
        replicated_to_pb(replicated, reply.replicated)
    found, complete = baselines(ask, choice, replicated, budget, cache)
    reply.baselines.extend(found)
    return reply.SerializeToString(), complete


def until(time_left: float | None, cap: float, margin: float) -> float:
    """When (:func:`time.monotonic`) a search must end: the caller's deadline
    (``time_left`` seconds; None: none) or the server's cap, less ``margin`` seconds
    (at most a quarter of the time) to send the answer back."""
    hard = cap if time_left is None else min(time_left, cap)
    return time.monotonic() + max(0.0, hard - min(margin, max(0.0, hard) / 4))


__all__ = ["BASELINE_SEARCHES", "MARGIN", "SEARCHES", "baselines", "cells", "check_search",
           "classes", "grid", "pieces", "run", "until"]

