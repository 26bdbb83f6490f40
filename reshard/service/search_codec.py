"""The stage search's values <-> ``reshard.v1`` messages: layers and their candidates,
graphs, choices, replicated answers, and the Search request and reply.

Decoding is the service's edge for the search: every layer and candidate is built by its
own constructor (:class:`reshard.search.Layer`, :class:`reshard.search.Candidate`), whose
:class:`reshard.SearchError` names the layer, the candidate and the value; this module
adds where in the request it was (``layers[3] ('block3') on (1, 2)``). The schedule, the
moves and the method are protobuf enums paired by name with the search's choices
(:class:`reshard.service.enums.ChoicePair`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reshard.cluster import Cluster
from reshard.errors import ReshardBaseError, SearchError
from reshard.search import (
    METHODS,
    MOVES,
    SCHEDULES,
    Candidate,
    Choice,
    Graph,
    Layer,
    Placement,
    Replicated,
    Stage,
)
from reshard.service.convert import cluster_from_pb, cluster_to_pb
from reshard.service.enums import ChoicePair
from reshard.service.v1 import reshard_pb2 as pb

SCHEDULE = ChoicePair(SCHEDULES, pb.Schedule, "SCHEDULE_", "schedule")
"""The search's schedules and ``reshard.v1.Schedule``."""
MOVE_PRICING = ChoicePair(MOVES, pb.Moves, "MOVES_", "moves")
"""How a chain search prices moves while it chooses, and ``reshard.v1.Moves``."""
METHOD = ChoicePair(METHODS, pb.SearchMethod, "SEARCH_METHOD_", "method")
"""A graph search's methods and ``reshard.v1.SearchMethod``."""
BASELINES = ("alpa", "megatron")
"""The baselines a search's answer is measured against, by name."""
BASELINE = ChoicePair(BASELINES, pb.Baseline, "BASELINE_", "baseline")

GRAPH_ONLY = ("method", "few", "steps", "seed", "beta")
"""SearchRequest fields only a graph search reads."""


# ----- layers ---------------------------------------------------------------------------
def layer_to_pb(layer: Layer) -> pb.SearchLayer:
    """A layer's message (its candidates per submesh shape, in its order)."""
    if not isinstance(layer, Layer):
        raise SearchError(f"a layer must be a reshard.search.Layer, got {layer!r:.80}")
    try:
        return pb.SearchLayer(
            name=layer.name, output_shape=layer.output_shape, dtype=layer.dtype,
            submeshes=[pb.SubmeshCandidates(
                shape=pb.SubmeshShape(hosts=s[0], devices=s[1]),
                candidates=[pb.SearchCandidate(name=c.name, compute=c.compute, input=c.input,
                                               output=c.output, memory=c.memory,
                                               grads=c.grads, activations=c.activations)
                            for c in cands])
                for s, cands in layer.candidates.items()])
    except (ValueError, TypeError) as e:  # a number the message cannot hold
        raise SearchError(f"layer {layer.name!r} does not fit the service's message: {e}; "
                          f"sizes and bytes must be integers below 2^64") from None


def _candidate(m: pb.SearchCandidate, where: str) -> Candidate:
    try:
        return Candidate(m.name, m.compute, m.input, m.output, m.memory, m.grads,
                         m.activations)
    except SearchError as e:
        raise SearchError(f"{where}: {e}") from None


def layer_from_pb(m: pb.SearchLayer, k: int) -> Layer:
    """Layer ``k`` of a request (a SearchError naming it, its submesh shape and its
    candidate where one is bad)."""
    where = f"layers[{k}] ({m.name!r})"
    cands: dict[tuple[int, int], tuple[Candidate, ...]] = {}
    for sub in m.submeshes:
        shape = (sub.shape.hosts, sub.shape.devices)
        if shape in cands:
            raise SearchError(f"{where} gives candidates on submesh shape {shape} twice; "
                              f"give each shape once, with all its candidates")
        cands[shape] = tuple(_candidate(c, f"{where} on {shape}") for c in sub.candidates)
    try:
        return Layer(m.name, tuple(m.output_shape), m.dtype, cands)
    except SearchError as e:
        raise SearchError(f"layers[{k}]: {e}") from None


# ----- choices --------------------------------------------------------------------------
def choice_to_pb(choice: Choice, into: pb.SearchChoice | None = None) -> pb.SearchChoice:
    """A choice's message (``into``: filled in place)."""
    out = pb.SearchChoice() if into is None else into
    for s in choice.stages:
        p = s.placement
        out.stages.add(first=s.first, last=s.last, choices=s.choices, compute=s.compute,
                       inner=s.inner, move_in=s.move_in, placement=pb.Submesh(
                           shape=pb.SubmeshShape(hosts=p.shape[0], devices=p.shape[1]),
                           first=p.first))
    out.microbatches = choice.microbatches
    out.schedule = SCHEDULE.encode(choice.schedule, SearchError)
    out.time, out.compute = choice.time, choice.compute
    out.transfer, out.bubble = choice.transfer, choice.bubble
    if choice.simulated is not None:
        out.simulated = choice.simulated
    out.chunks = choice.chunks
    return out


def choice_from_pb(m: pb.SearchChoice) -> Choice:
    """The choice of a message (equal to the one encoded)."""
    stages = tuple(Stage(s.first, s.last, Placement(
        (s.placement.shape.hosts, s.placement.shape.devices), s.placement.first),
        tuple(s.choices), s.compute, s.inner, s.move_in) for s in m.stages)
    return Choice(stages, m.microbatches, SCHEDULE.decode(m.schedule, SearchError), m.time,
                  m.compute, m.transfer, m.bubble,
                  m.simulated if m.HasField("simulated") else None, max(1, m.chunks))


def replicated_to_pb(r: Replicated, into: pb.SearchReplicated) -> None:
    """Fill ``into`` with a replicated answer (its choice goes in the reply's own)."""
    into.replicas = r.replicas
    into.cluster.CopyFrom(cluster_to_pb(r.cluster))
    into.layers.extend(layer_to_pb(layer) for layer in r.layers)
    for degree, outcome in r.tried:
        t = into.tried.add(replicas=degree)
        if isinstance(outcome, str):
            t.error = outcome
        else:
            t.time = outcome


def replicated_from_pb(m: pb.SearchReplicated, choice: Choice) -> Replicated:
    """The replicated answer of a message and the reply's choice."""
    cluster = cluster_from_pb(m.cluster)
    assert cluster is not None  # the server always sets it
    tried = tuple((t.replicas, t.error if t.WhichOneof("outcome") == "error" else t.time)
                  for t in m.tried)
    return Replicated(m.replicas, cluster,
                      tuple(layer_from_pb(layer, k) for k, layer in enumerate(m.layers)),
                      choice, tried)


# ----- requests -------------------------------------------------------------------------
def _set_optional(msg: pb.SearchRequest, options: Mapping[str, Any]) -> None:
    """The request's scalar options (None: unset, the search's default)."""
    for name in ("memory_limit", "block", "few", "steps", "seed", "beta", "time_limit",
                 "chunks"):
        value = options.get(name)
        if value is None:
            continue
        try:
            setattr(msg, name, value)
        except (TypeError, ValueError) as e:
            raise SearchError(f"{name} {value!r} does not fit the request: {e}") from None
    rerank = options.get("rerank")
    if rerank is not None:
        if isinstance(rerank, bool):
            rerank = int(rerank)
        try:
            msg.rerank = rerank
        except (TypeError, ValueError):
            raise SearchError(f"rerank must be an integer >= 0 (or a bool for a graph), "
                              f"got {rerank!r}") from None
    for name, pair in (("schedule", SCHEDULE), ("moves", MOVE_PRICING), ("method", METHOD)):
        value = options.get(name)
        if value is not None:
            setattr(msg, name, pair.encode(value, SearchError))


def search_request(model: Sequence[Layer] | Graph, cluster: Cluster | None,
                   microbatches: int, *, replicas: Sequence[int] | bool | None = None,
                   encode: Any = cluster_to_pb, **options: Any) -> pb.SearchRequest:
    """The SearchRequest of a search's arguments.

    Args:
        model: the layers (a chain) or a :class:`reshard.search.Graph`.
        cluster: the cluster (None: unset, the server's ``--cluster``).
        microbatches: B.
        replicas: search the data-parallel degree among these (True: every divisor of
            the host count); None / False: no replicas.
        encode: the message of a Cluster (a client passes a cached one).
        options: the search's keyword arguments (``schedule``, ``memory_limit``,
            ``moves``, ``block``, ``rerank``, ``method``, ``few``, ``steps``, ``seed``,
            ``beta``, ``time_limit``, ``chunks``); None: unset.
    """
    msg = pb.SearchRequest()
    if isinstance(model, Graph):
        layers: Sequence[Layer] = model.layers
        msg.graph.SetInParent()
        for u, v in model.edges:
            msg.graph.edges.add(producer=u, consumer=v)
    elif isinstance(model, Sequence) and not isinstance(model, str):
        layers = model
    else:
        raise SearchError(f"the model must be a sequence of reshard.search.Layer or a "
                          f"reshard.search.Graph, got {type(model).__name__} (a function "
                          f"building layers runs only in process)")
    msg.layers.extend(layer_to_pb(layer) for layer in layers)
    if cluster is not None:
        if not isinstance(cluster, Cluster):
            raise SearchError(f"cluster must be a reshard.Cluster, got {type(cluster).__name__}")
        msg.cluster.CopyFrom(encode(cluster))
    try:
        if isinstance(microbatches, bool):
            raise TypeError(microbatches)
        msg.microbatches = operator.index(microbatches)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise SearchError(f"microbatches must be an integer >= 1, got {microbatches!r}") from None
    if replicas is not None and replicas is not False:
        msg.replicas.SetInParent()
        if replicas is not True:
            msg.replicas.degrees.extend(replicas)
    _set_optional(msg, options)
    return msg


@dataclass(frozen=True)
class SearchAsk:
    """A Search request decoded: which search, on what, with which options.

    Attributes:
        kind: ``"chain"``, ``"graph"`` or ``"replicated"``.
        layers: the layers.
        graph: the graph (a graph search), else None.
        cluster: the cluster.
        microbatches: B.
        options: the search function's keyword arguments the request sets (neither
            ``time_limit`` nor ``cache``: the server sets those).
        time_limit: the request's own time limit (None: none).
    """

    kind: str
    layers: tuple[Layer, ...]
    graph: Graph | None
    cluster: Cluster
    microbatches: int
    options: Mapping[str, Any] = field(hash=False)
    time_limit: float | None = None


def _options(m: pb.SearchRequest, kind: str) -> dict[str, Any]:
    """The keyword arguments ``m`` sets for a search of ``kind`` (a SearchError for one
    that search does not take)."""
    out: dict[str, Any] = {}
    if m.schedule != pb.SCHEDULE_UNSPECIFIED:
        out["schedule"] = SCHEDULE.decode(m.schedule, SearchError)
    for name in ("memory_limit", "block", "chunks"):
        if m.HasField(name):
            out[name] = getattr(m, name)
    if m.HasField("rerank"):
        out["rerank"] = bool(m.rerank) if kind == "graph" else m.rerank
    if m.moves != pb.MOVES_UNSPECIFIED:
        if kind != "chain":
            raise SearchError(f"moves is a chain search's option; a {kind} search prices "
                              f"every move: leave SearchRequest.moves unset")
        out["moves"] = MOVE_PRICING.decode(m.moves, SearchError)
    graph_set = [n for n in GRAPH_ONLY if (m.HasField(n) if n != "method" else
                                          m.method != pb.SEARCH_METHOD_UNSPECIFIED)]
    if graph_set and kind != "graph":
        raise SearchError(f"{', '.join(graph_set)}: only a graph search takes them (set "
                          f"SearchRequest.graph, or leave them unset)")
    if m.method != pb.SEARCH_METHOD_UNSPECIFIED:
        out["method"] = METHOD.decode(m.method, SearchError)
    for name in ("few", "steps", "seed", "beta"):
        if m.HasField(name):
            out[name] = getattr(m, name)
    if kind == "replicated":
        out["replicas"] = tuple(m.replicas.degrees) or None
    return out


def request_from_pb(m: pb.SearchRequest, default_cluster: Cluster | None) -> SearchAsk:
    """The search a SearchRequest asks for (``default_cluster``: the server's)."""
    if m.HasField("graph") and m.HasField("replicas"):
        raise SearchError("a search with data-parallel replicas takes a chain of layers, "
                          "not a graph: unset SearchRequest.graph or SearchRequest.replicas")
    kind = "graph" if m.HasField("graph") else "replicated" if m.HasField("replicas") \
        else "chain"
    options = _options(m, kind)
    layers = tuple(layer_from_pb(layer, k) for k, layer in enumerate(m.layers))
    graph = None
    if kind == "graph":
        graph = Graph(layers, tuple((e.producer, e.consumer) for e in m.graph.edges))
    cluster = cluster_from_pb(m.cluster, default_cluster)
    if cluster is None:
        raise SearchError("the request names no cluster and the server has none (reshard "
                          "serve --cluster): set SearchRequest.cluster")
    limit = None
    if m.HasField("time_limit"):
        if not (math.isfinite(m.time_limit) and m.time_limit > 0):
            raise SearchError(f"time_limit (seconds) must be a finite number > 0, got "
                              f"{m.time_limit!r}")
        limit = m.time_limit
    return SearchAsk(kind, layers, graph, cluster, m.microbatches, options, limit)


# ----- replies --------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchResult:
    """A remote search's answer (:meth:`reshard.service.Client.search`).

    Attributes:
        choice: the search's :class:`reshard.search.Choice`, equal to the one the same
            search returns in process (with replicas: one replica's, as
            ``Replicated.choice``).
        baselines: Alpa's and Megatron's own choices by name (``"alpa"``,
            ``"megatron"``), priced as the answer is (simulated where the search
            re-ranks); a baseline without one is in ``missing``.
        missing: why a baseline has no choice (none fits; the time ran out first).
        beats: the baselines the answer is faster than (by the simulator where the
            search re-ranked, else by the objective); a baseline whose own choice the
            answer is, is not beaten.
        replicated: with replicas, the :class:`reshard.search.Replicated` answer (equal
            to ``search_replicated``'s); else None.
    """

    choice: Choice
    baselines: Mapping[str, Choice] = field(default_factory=dict, hash=False)
    missing: Mapping[str, str] = field(default_factory=dict, hash=False)
    beats: tuple[str, ...] = ()
    replicated: Replicated | None = None


def reply_from_pb(m: pb.SearchReply) -> SearchResult:
    """The result of a SearchReply."""
    choice = choice_from_pb(m.choice)
    baselines: dict[str, Choice] = {}
    missing: dict[str, str] = {}
    beats = []
    for b in m.baselines:
        name = BASELINE.decode(b.baseline, SearchError)
        if b.HasField("choice"):
            baselines[name] = choice_from_pb(b.choice)
        else:
            missing[name] = b.missing
        if b.beaten:
            beats.append(name)
    replicated = replicated_from_pb(m.replicated, choice) if m.HasField("replicated") else None
    return SearchResult(choice, baselines, missing, tuple(beats), replicated)


def faster(a: Choice, b: Choice) -> bool:
    """Whether ``a`` is faster than ``b``: by the simulator where both were simulated,
    else by the objective (ties: not faster)."""
    if a.simulated is not None and b.simulated is not None:
        return a.simulated < b.simulated * (1 - 1e-12)
    return a.time < b.time * (1 - 1e-12)


def error_text(error: BaseException) -> str:
    """A baseline's reason for having no choice."""
    return str(error) if isinstance(error, ReshardBaseError) else \
        f"internal error: {type(error).__name__}: {error}"


__all__ = ["BASELINE", "BASELINES", "METHOD", "MOVE_PRICING", "SCHEDULE", "SearchAsk",
           "SearchResult", "choice_from_pb", "choice_to_pb", "error_text", "faster",
           "layer_from_pb", "layer_to_pb", "replicated_from_pb", "replicated_to_pb",
           "reply_from_pb", "request_from_pb", "search_request"]
