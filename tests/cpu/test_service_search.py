"""The Search rpc against a real server: its answer is the in-process search's (chains,
a graph, data-parallel replicas) with the baselines' own choices beside it; bad input is
INVALID_ARGUMENT with the search's own message naming the layer; a search over the
server's budgets is refused before any work; one built to hold the search ends
DEADLINE_EXCEEDED inside its deadline, a cancelled one's worker is killed, and small
calls keep flowing meanwhile (reshard.service.searches)."""

from __future__ import annotations

import dataclasses
import random
import time

import grpc
import pytest

from reshard import Cluster, DeviceMesh, Layout, SearchError
from reshard.planner.estimates import CostCache
from reshard.search import (
    Candidate,
    Graph,
    Layer,
    evaluate_graph,
    search_chain,
    search_graph,
    search_replicated,
    simulated,
)
from reshard.search.baselines import uniform
from reshard.search.costs import MoveCosts
from reshard.service import Client, ServeOptions, Server, ServiceError
from reshard.service.search_codec import faster, search_request
from reshard.service.status import ERROR_KEY
from reshard.service.v1 import reshard_pb2_grpc as pb_grpc

pytestmark = pytest.mark.cpu

CLUSTER = Cluster.regular(2, 2)
SPECS = ["RR", "S0R", "RS1", "S01R"]


def chain(n: int, seed: int, grads: int = 0,
          shapes: tuple[tuple[int, int], ...] = ((1, 1), (1, 2), (2, 2))) -> list[Layer]:
    rng = random.Random(seed)
    return [Layer(f"l{k}", (rng.choice([64, 4096]), 256), "float32", {
        s: tuple(Candidate(f"c{j}", rng.uniform(1e-4, 3e-3), rng.choice(SPECS),
                           rng.choice(SPECS), rng.randrange(1 << 20), grads)
                 for j in range(rng.randint(1, 3))) for s in shapes}) for k in range(n)]


def hostile(candidates: int = 8, seed: int = 0) -> list[Layer]:
    """16 layers, every candidate a distinct layout pair and weight on every submesh
    shape of a 2 x 4 cluster (tests/unit/test_search_input.py's: the search held for
    minutes before it kept deadlines)."""
    rng = random.Random(seed)
    specs = ["RR", "S0R", "RS1", "S1R", "RS0", "S01R", "RS01", "S0S1", "S1S0"]
    shapes = [(1, 1), (1, 2), (1, 4), (2, 4)]
    return [Layer(f"l{k}", (1024, 1024), "float32", {
        s: tuple(Candidate(f"c{j}", rng.uniform(1e-4, 1e-2), rng.choice(specs),
                           rng.choice(specs), rng.randrange(1, 1 << 20))
                 for j in range(candidates)) for s in shapes}) for k in range(16)]


@pytest.fixture(scope="module")
def served():
    options = ServeOptions(port=0, backend=None, job_workers=1)
    with Server(options).start() as server, Client(server.address, timeout=120) as client:
        yield server, client


def _wait(what, seconds: float = 20.0) -> bool:
    until = time.monotonic() + seconds
    while not what() and time.monotonic() < until:
        time.sleep(0.01)
    return bool(what())


def _baselines_in_process(layers, cluster, b, answer, edges=None, **kw):
    """Alpa's and Megatron's own choices as the service reports them."""
    cache = CostCache()
    alpa = search_chain(layers, cluster, b, moves="free", rerank=0, cache=cache, edges=edges,
                        **kw)
    if edges is not None:
        alpa = evaluate_graph(Graph(tuple(layers), edges), alpa.stages, cluster, b,
                              alpa.schedule, MoveCosts(cluster, cache=cache), alpa.chunks)
    mega = uniform(layers, cluster, b, kw.get("schedule", "1f1b"), cache=cache,
                   memory_limit=kw.get("memory_limit"), edges=edges, chunks=kw.get("chunks"))
    out = {}
    for name, c in (("alpa", alpa), ("megatron", mega)):
        if answer.simulated is not None:
            c = dataclasses.replace(c, simulated=simulated(layers, c, cluster, edges=edges))
        out[name] = c
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed, options", [
    (0, {}),
    (1, {"schedule": "eager-1f1b", "memory_limit": 3 << 20}),
    (2, {"rerank": 0}),
    (3, {"moves": "free"}),
    (4, {"block": 2, "rerank": 2}),
    (5, {"schedule": "interleaved-1f1b", "chunks": 2}),
    (6, {"schedule": "zb-v", "memory_limit": 3 << 20}),
])
def test_a_chain_answers_as_the_in_process_search(served, seed, options):
    _, client = served
    layers = chain(random.Random(seed).randint(2, 6), seed)
    got = client.search(layers, CLUSTER, 8, **options)
    assert got.choice == search_chain(layers, CLUSTER, 8, **options)
    assert got.replicated is None and got.missing == {}
    kw = {k: v for k, v in options.items()
          if k in ("schedule", "memory_limit", "block", "chunks")}
    want = _baselines_in_process(layers, CLUSTER, 8, got.choice, **kw)
    assert got.baselines == want
    assert got.beats == tuple(n for n in ("alpa", "megatron") if faster(got.choice, want[n]))
    if got.choice.simulated is not None:  # re-ranked: never slower than either
        assert all(got.choice.simulated <= c.simulated * (1 + 1e-12) for c in want.values())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("options", [{}, {"method": "mcmc", "steps": 60, "seed": 7},
                                     {"rerank": False, "few": 2}])
def test_a_graph_answers_as_the_in_process_search(served, options):
    _, client = served
    layers = chain(5, 11)
    graph = Graph(tuple(layers), ((0, 1), (1, 2), (2, 3), (3, 4), (0, 3), (1, 4)))
    got = client.search(graph, CLUSTER, 8, **options)
    assert got.choice == search_graph(graph, CLUSTER, 8, **options)
    assert got.baselines == _baselines_in_process(layers, CLUSTER, 8, got.choice,
                                                  edges=graph.edges)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("replicas", [None, (1, 2)])
def test_replicas_answer_as_the_in_process_search(served, replicas):
    _, client = served
    cluster = Cluster.regular(4, 2)
    layers = chain(4, 5, grads=4 << 20, shapes=((1, 1), (1, 2), (2, 2)))
    got = client.search_replicated(layers, cluster, 8, replicas=replicas)
    want = search_replicated(layers, cluster, 8, replicas=replicas)
    assert got.replicated == want and got.choice == want.choice
    assert [r for r, _ in want.tried] == ([1, 2, 4] if replicas is None else [1, 2])
    sub = want.cluster
    assert got.baselines == _baselines_in_process(list(want.layers), sub,
                                                  want.choice.microbatches, want.choice)


@pytest.mark.timeout(120)
def test_bad_input_is_invalid_argument_with_the_searchs_message(served):
    server, client = served
    layers = chain(4, 0)
    narrow = Layer("narrow", (64, 256), "float32", {(1, 8): (Candidate("x", 1e-3, "RR", "RR"),)})
    with pytest.raises(SearchError, match=r"layer 2 \('narrow'\) has candidates only on "
                                          r"submesh shapes \[\(1, 8\)\], none of which fits"):
        client.search([*layers[:2], narrow, layers[3]], CLUSTER, 8)
    msg = search_request(layers, CLUSTER, 8)
    msg.layers[1].submeshes[0].candidates[0].compute = float("nan")
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.ReshardStub(channel).Search(msg, timeout=60)
    err = info.value
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert dict(err.trailing_metadata())[ERROR_KEY] == "SearchError"
    assert err.details().startswith("layers[1] ('l1') on (1, 1): candidate 'c0': compute")
    with pytest.raises(SearchError, match="unknown schedule '2f2b'; valid: 1f1b, eager-1f1b"):
        client.search(layers, CLUSTER, 8, schedule="2f2b")  # refused before the call
    with pytest.raises(SearchError, match="moves is a chain search's option"):
        client.search(Graph.chain(layers), CLUSTER, 8, moves="free")


@pytest.mark.timeout(120)
def test_a_search_over_the_budgets_is_refused_before_any_work():
    options = ServeOptions(port=0, backend=None, job_workers=1, max_search_cells=5000,
                           max_search_candidates=1000, max_devices=64)
    with Server(options).start() as server, Client(server.address, timeout=60) as client:
        ran = []
        real = server.servicer._job
        server.servicer._job = lambda *a: ran.append(a[0]) or real(*a)
        cluster = Cluster.regular(2, 4)
        with pytest.raises(ServiceError, match=r"Search: the request's search has about "
                                               r"18432 cells .*--max-search-cells") as e:
            client.search(hostile(), cluster, 8)
        assert e.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        big = [dataclasses.replace(layer, name=f"m{k}") for k in range(150)
               for layer in chain(1, k)]
        with pytest.raises(ServiceError, match=r"more than 1000 layers, submeshes, candidates "
                                               r"and edges .*--max-search-candidates") as e:
            client.search(big, cluster, 8)
        assert e.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(ServiceError, match=r"128 devices, over the server's budget of "
                                               r"64 \(--max-devices\)") as e:
            client.search(chain(2, 0), Cluster.regular(16, 8), 8)
        assert e.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ran == []  # no job for any of them
        assert client.search(chain(3, 1), CLUSTER, 8).choice == search_chain(chain(3, 1),
                                                                               CLUSTER, 8)
        assert ran == ["Search"]


@pytest.mark.timeout(120)
def test_a_hostile_search_ends_deadline_exceeded_inside_its_deadline(served):
    """16 layers x 8 candidates with a 2 s deadline: the search's time limit is the
    deadline less the margin, so it stops itself and the call ends DEADLINE_EXCEEDED
    naming the phase (the worker is killed at the deadline if it does not); the worker
    is free at once for the next search. The request's own time_limit does the same."""
    server, client = served
    cluster = Cluster.regular(2, 4)
    t0 = time.monotonic()
    with pytest.raises(ServiceError, match=r"Search: stopped at .*the call's deadline .* "
                                           r"ran past its time_limit") as e:
        client.search(hostile(), cluster, 8, memory_limit=1 << 40, timeout=2.0)
    took = time.monotonic() - t0
    assert e.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert took < 5.0, took  # it stops (it held a worker for minutes); speed: the benchmark
    assert _wait(server.servicer.jobs.free, 5)
    with pytest.raises(ServiceError, match=r"stopped at the request's time_limit of 1 s") as e:
        client.search(hostile(seed=1), cluster, 8, memory_limit=1 << 40, time_limit=1,
                      timeout=30)
    assert e.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert client.search(chain(3, 2), CLUSTER, 8).choice == search_chain(chain(3, 2),
                                                                           CLUSTER, 8)


@pytest.mark.timeout(120)
def test_a_cancelled_search_is_killed_and_small_calls_keep_flowing(served):
    """While a hostile search holds the one job worker, another is refused at once
    (busy, before it is parsed), a search answered before is answered from the cache,
    and small Estimates are answered; cancelling the call kills the worker."""
    server, client = served
    jobs = server.servicer.jobs
    killed = jobs.killed
    small = chain(3, 31)
    before = client.search(small, CLUSTER, 8)
    msg = search_request(hostile(seed=2), Cluster.regular(2, 4), 8, memory_limit=1 << 40)
    with grpc.insecure_channel(server.address) as channel:
        future = pb_grpc.ReshardStub(channel).Search.future(msg, timeout=60)
        assert _wait(lambda: bool(jobs._busy)), "the search never reached the job worker"
        with pytest.raises(ServiceError, match="workers for expensive requests are busy") as e:
            client.search(hostile(seed=3), Cluster.regular(2, 4), 8, timeout=30)
        assert e.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert client.search(small, CLUSTER, 8, timeout=10) == before  # cached
        src = Layout(DeviceMesh((2, 2)), "S0R")
        dst = Layout(DeviceMesh((4,), range(4, 8)), "RS0")
        for k in range(10):
            assert client.estimate((64 + k, 32), "float32", src, dst, timeout=10)[0] > 0
        assert jobs._busy, "the search ended too early for this test"
        future.cancel()
        assert _wait(lambda: jobs.killed > killed, 10), "the cancelled search's worker lives"
    assert _wait(jobs.free, 5)


@pytest.mark.timeout(120)
def test_answers_are_cached_by_their_canonical_request(served):
    """The same search again (another time_limit, unknown fields dropped) is answered
    from the cache without a job."""
    server, client = served
    ran = []
    real = server.servicer._job
    server.servicer._job = lambda *a: ran.append(a[0]) or real(*a)
    try:
        layers = chain(4, 21)
        first = client.search(layers, CLUSTER, 8, time_limit=60)
        again = client.search(layers, CLUSTER, 8, time_limit=30)
        assert ran == ["Search"] and again == first
        client.search(layers, CLUSTER, 8, schedule="eager-1f1b")
        assert ran == ["Search", "Search"]
    finally:
        del server.servicer._job


@pytest.mark.timeout(180)
def test_the_search_load_of_the_benchmark_reports_what_it_promises():
    """service_many's ``search`` load runs (briefly) and reports the numbers it prints;
    speed is the benchmark's to measure, not this test's."""
    from reshard.microbench.service_many import contended

    r = contended("search", seconds=4.0, hostile=2, size=1, devices=0, deadline=1.0,
                  quiet=1.0, candidates=4)
    assert r["good_ok"] > 0 and r["good_p99_ms"] >= r["good_p50_ms"] > 0
    assert set(r["hostile_outcomes"]) <= {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}
    assert r["hostile_outcomes"].get("DEADLINE_EXCEEDED", 0) >= 1
    assert r["late_max_ms"] >= r["late_p99_ms"] >= r["late_p50_ms"]
