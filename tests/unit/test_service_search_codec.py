"""The Search call's pure parts: the search's values round-trip through their messages,
the schedule / moves / method enums pair by name with the search's choices (a tuple of
names or an enum), bad input is refused naming where it is, and a request is sized and
counted off its message before any work (reshard.service.search_codec,
reshard.service.searches, reshard.service.wire)."""

from __future__ import annotations

import enum
import random
import time

import grpc
import pytest

from reshard import Cluster, SearchError
from reshard.planner.estimates import CostCache
from reshard.search import (
    METHODS,
    MOVES,
    SCHEDULES,
    Candidate,
    Graph,
    Layer,
    search_chain,
    search_replicated,
)
from reshard.search.model import Budget
from reshard.service import ServiceError, searches, wire
from reshard.service import search_codec as sc
from reshard.service.budget import OverBudget, check_search_wire
from reshard.service.enums import ChoicePair
from reshard.service.v1 import reshard_pb2 as pb

CLUSTER = Cluster.regular(2, 2)


def _layers(n: int, seed: int = 0, grads: int = 0) -> list[Layer]:
    rng = random.Random(seed)
    specs = ["RR", "S0R", "RS1", "S01R"]
    return [Layer(f"l{k}", (rng.choice([64, 4096]), 256), "float32", {
        s: tuple(Candidate(f"c{j}", rng.uniform(1e-4, 3e-3), rng.choice(specs),
                           rng.choice(specs), rng.randrange(1 << 20), grads)
                 for j in range(rng.randint(1, 3)))
        for s in ((1, 1), (1, 2), (2, 2))}) for k in range(n)]


def test_every_choice_of_the_search_has_its_enum_value():
    """A schedule, moves or method the search takes and the .proto lacks would be
    refused in requests: add its value to reshard.proto (SCHEDULE_<NAME>, ...)."""
    for pair, choices in ((sc.SCHEDULE, SCHEDULES), (sc.MOVE_PRICING, MOVES),
                          (sc.METHOD, METHODS)):
        assert pair.unpaired == (), f"{pair.what}: no enum value for {pair.unpaired}"
        assert set(pair.to_pb) == set(choices)
        for c in choices:
            assert pair.decode(pair.encode(c)) == c
    assert sc.SCHEDULE.to_pb["eager-1f1b"] == pb.SCHEDULE_EAGER_1F1B


def test_choices_pair_by_name_whether_names_or_an_enum():
    """If the search's choices become an enum (by text value, or by member name), they
    pair with the same protobuf values; one the .proto lacks is listed, not fatal."""
    class Schedule(enum.Enum):
        ONE_F_ONE_B = "1f1b"
        EAGER_1F1B = "eager-1f1b"
        INTERLEAVED = "interleaved-1f1b"
        ZERO_BUBBLE_H2 = "zb-h2"

    pair = ChoicePair(Schedule, pb.Schedule, "SCHEDULE_", "schedule")
    assert pair.to_pb == {Schedule.ONE_F_ONE_B: pb.SCHEDULE_1F1B,
                          Schedule.EAGER_1F1B: pb.SCHEDULE_EAGER_1F1B,
                          Schedule.INTERLEAVED: pb.SCHEDULE_INTERLEAVED_1F1B}
    assert pair.unpaired == (Schedule.ZERO_BUBBLE_H2,)
    assert pair.decode(pb.SCHEDULE_EAGER_1F1B) is Schedule.EAGER_1F1B
    assert pair.encode("eager-1f1b") == pair.encode(Schedule.EAGER_1F1B)

    class Method(enum.Enum):
        DESCENT = 1
        MCMC = 2

    assert ChoicePair(Method, pb.SearchMethod, "SEARCH_METHOD_", "method").to_pb == {
        Method.DESCENT: pb.SEARCH_METHOD_DESCENT, Method.MCMC: pb.SEARCH_METHOD_MCMC}
    with pytest.raises(SearchError, match=r"unknown schedule 'gpipe'; valid: 1f1b, eager-1f1b, "
                                          r"interleaved-1f1b, zb-v, dualpipe-v"):
        sc.SCHEDULE.encode("gpipe", SearchError)
    with pytest.raises(SearchError, match=r"schedule 9 is not known here; valid: "
                                          r"\['SCHEDULE_1F1B', 'SCHEDULE_EAGER_1F1B', "
                                          r"'SCHEDULE_INTERLEAVED_1F1B'"):
        sc.SCHEDULE.decode(9, SearchError)


def test_layers_choices_and_replicated_answers_round_trip():
    layers = _layers(5, 3, grads=1 << 20)
    back = [sc.layer_from_pb(sc.layer_to_pb(layer), k) for k, layer in enumerate(layers)]
    assert back == layers
    choice = search_chain(layers, CLUSTER, 8, schedule="eager-1f1b")
    assert choice.simulated is not None
    assert sc.choice_from_pb(pb.SearchChoice.FromString(
        sc.choice_to_pb(choice).SerializeToString())) == choice
    exact = search_chain(layers, CLUSTER, 8, rerank=0)
    assert exact.simulated is None and sc.choice_from_pb(sc.choice_to_pb(exact)) == exact
    rep = search_replicated(layers, Cluster.regular(4, 2), 8, replicas=(1, 2))
    msg = pb.SearchReplicated()
    sc.replicated_to_pb(rep, msg)
    assert sc.replicated_from_pb(msg, rep.choice) == rep


@pytest.mark.parametrize("schedule, chunks", [("interleaved-1f1b", 3), ("zb-v", None),
                                               ("dualpipe-v", None)])
def test_virtual_stages_and_activations_round_trip(schedule, chunks):
    """A virtual-stage search's request (schedule, chunks) and answer (its pieces and
    their count per submesh), and candidates' activations, come back as they went."""
    rng = random.Random(7)
    layers = [Layer(f"l{k}", (64, 256), "float32", {(1, 1): (
        Candidate("c", rng.uniform(1e-4, 1e-3), "RR", "RR", 1 << 10, 0, 1 << (10 + k)),)})
        for k in range(6)]
    back = [sc.layer_from_pb(sc.layer_to_pb(layer), k) for k, layer in enumerate(layers)]
    assert back == layers and back[5].candidates[(1, 1)][0].activations == 1 << 15
    m = sc.search_request(layers, CLUSTER, 8, schedule=schedule, chunks=chunks)
    ask = sc.request_from_pb(pb.SearchRequest.FromString(m.SerializeToString()), None)
    assert ask.options == {"schedule": schedule, **({"chunks": chunks} if chunks else {})}
    choice = search_chain(layers, Cluster.regular(1, 2), 8, **ask.options)
    assert choice.chunks == (chunks or 2) and len(choice.stages) == 2 * choice.chunks
    assert sc.choice_from_pb(pb.SearchChoice.FromString(
        sc.choice_to_pb(choice).SerializeToString())) == choice
    old = pb.SearchChoice(microbatches=8, schedule=pb.SCHEDULE_1F1B)  # chunks unset
    assert sc.choice_from_pb(old).chunks == 1


def test_a_request_decodes_to_the_search_it_stands_for():
    layers = _layers(4)
    graph = Graph(tuple(layers), ((0, 1), (1, 2), (2, 3), (0, 2)))
    m = sc.search_request(graph, CLUSTER, 8, method="mcmc", steps=10, seed=-3, beta=0.5,
                          rerank=False, memory_limit=1 << 30, time_limit=5)
    ask = sc.request_from_pb(pb.SearchRequest.FromString(m.SerializeToString()), None)
    assert ask.kind == "graph" and ask.graph == graph and ask.cluster == CLUSTER
    assert ask.options == {"method": "mcmc", "steps": 10, "seed": -3, "beta": 0.5,
                           "rerank": False, "memory_limit": 1 << 30}
    assert ask.time_limit == 5
    m = sc.search_request(layers, None, 4, replicas=True)
    ask = sc.request_from_pb(m, CLUSTER)  # the server's cluster
    assert ask.kind == "replicated" and ask.options == {"replicas": None}
    assert ask.cluster == CLUSTER and ask.layers == tuple(layers)
    m = sc.search_request(layers, CLUSTER, 4, replicas=[1, 2], moves=None, block=2)
    assert sc.request_from_pb(m, None).options == {"replicas": (1, 2), "block": 2}


@pytest.mark.parametrize("change, match", [
    (lambda m: m.layers[2].submeshes[0].candidates[0].__setattr__("compute", float("nan")),
     (r"layers\[2\] \('l2'\) on \(1, 1\): candidate 'c0': compute \(seconds\) must be a "
     r"finite number >= 0, got nan")),
    (lambda m: m.layers[1].submeshes[1].candidates[0].__setattr__("output", "S7RR"),
     r"layers\[1\]: layer 'l1' candidate 'c0' on \(1, 2\): its output layout"),
    (lambda m: m.layers[3].submeshes.add().CopyFrom(m.layers[3].submeshes[0]),
     r"layers\[3\] \('l3'\) gives candidates on submesh shape \(1, 1\) twice"),
    (lambda m: m.layers[0].submeshes[0].candidates.add().CopyFrom(
        m.layers[0].submeshes[0].candidates[0]),
     r"layers\[0\]: layer 'l0' has two candidates named 'c0' on \(1, 1\)"),
    (lambda m: m.layers[0].__setattr__("dtype", "float33"), r"layers\[0\]: layer 'l0': "),
    (lambda m: m.__setattr__("moves", pb.MOVES_FREE) or m.graph.SetInParent(),
     r"moves is a chain search's option"),
    (lambda m: m.__setattr__("steps", 5), r"steps: only a graph search takes them"),
    (lambda m: m.graph.SetInParent() or m.replicas.SetInParent(),
     r"replicas takes a chain of layers, not a graph"),
    (lambda m: m.__setattr__("time_limit", float("inf")), r"time_limit \(seconds\) must be"),
    (lambda m: m.__setattr__("schedule", 9), r"schedule 9 is not known here"),
    (lambda m: m.ClearField("cluster"), r"names no cluster and the server has none"),
])
def test_bad_requests_are_refused_naming_where(change, match):
    m = sc.search_request(_layers(4), CLUSTER, 8)
    for layer in m.layers:  # every layer on every shape, so each index above exists
        assert [s.shape.devices for s in layer.submeshes] == [1, 2, 2]
    change(m)
    with pytest.raises(SearchError, match=match):
        sc.request_from_pb(m, None)


def test_the_client_side_refuses_what_a_message_cannot_carry():
    layers = _layers(2)
    with pytest.raises(SearchError, match="a function building layers runs only in process"):
        sc.search_request(lambda c: layers, CLUSTER, 8)  # type: ignore[arg-type]
    with pytest.raises(SearchError, match="microbatches must be an integer >= 1, got True"):
        sc.search_request(layers, CLUSTER, True)
    with pytest.raises(SearchError, match="steps -1 does not fit the request"):
        sc.search_request(layers, CLUSTER, 8, steps=-1)
    with pytest.raises(SearchError, match="unknown method 'anneal'; valid: descent, mcmc"):
        sc.search_request(layers, CLUSTER, 8, method="anneal")


def test_a_search_is_sized_with_its_virtual_stages():
    """Virtual stages multiply the cells by the stages per submesh (the DP places every
    stage option at each piece): interleaved 1F1B by its chunks (default 2), ZB-V and
    DualPipeV by 2; a one-chunk schedule by 1. The budget refuses what only the pieces
    push over it."""
    shapes = [(1, 1), (1, 2), (1, 4), (2, 4)]  # 4 + 3 + 1 + 1 classes
    layers = [Layer(f"l{k}", (8, 8), "float32", {
        s: tuple(Candidate(f"c{j}", 1e-3, "RR", "RR") for j in range(8)) for s in shapes})
        for k in range(16)]
    one = 16 * 16 * 8 * 9
    cluster = Cluster.regular(2, 4)
    for name, kw, want in (("1f1b", {}, 1), ("eager-1f1b", {}, 1),
                           ("interleaved-1f1b", {}, 2), ("interleaved-1f1b", {"chunks": 3}, 3),
                           ("zb-v", {}, 2), ("dualpipe-v", {}, 2)):
        m = sc.search_request(layers, cluster, 8, schedule=name, **kw)
        assert searches.pieces(m) == want, name
        assert searches.cells(m, 2, 4) == want * one, name
        m.replicas.degrees.extend([1, 2])
        assert searches.cells(m, 2, 4) == 2 * want * one, name
    plain = sc.search_request(layers, cluster, 8)
    assert searches.check_search(plain, None, 64, one) == one
    v = sc.search_request(layers, cluster, 8, schedule="zb-v")
    with pytest.raises(OverBudget, match=rf"about {2 * one} cells .* over the server's "
                                         rf"budget of {one} \(--max-search-cells\)"):
        searches.check_search(v, None, 64, one)


def test_a_search_is_sized_off_its_message():
    """Cells: per layer and shape, candidates x submesh classes, times the blocks and
    the degrees (searches module docstring)."""
    assert [searches.classes(1, g, 2, 4) for g in (1, 2, 3, 4, 5)] == [4, 3, 2, 1, 0]
    assert [searches.classes(h, 4, 2, 4) for h in (2, 3)] == [1, 0]
    assert searches.classes(2, 2, 2, 4) == 0
    shapes = [(1, 1), (1, 2), (1, 4), (2, 4)]  # 4 + 3 + 1 + 1 classes
    layers = [Layer(f"l{k}", (8, 8), "float32", {
        s: tuple(Candidate(f"c{j}", 1e-3, "RR", "RR") for j in range(8)) for s in shapes})
        for k in range(16)]
    m = sc.search_request(layers, Cluster.regular(2, 4), 8)
    assert searches.cells(m, 2, 4) == 16 * 16 * 8 * 9
    m.block = 4
    assert searches.cells(m, 2, 4) == 4 * 16 * 8 * 9
    m.replicas.degrees.extend([1, 2])
    assert searches.cells(m, 2, 4) == 2 * 4 * 16 * 8 * 9
    m.ClearField("replicas")
    m.replicas.SetInParent()  # every divisor of 6 hosts: 1, 2, 3, 6
    assert searches.cells(m, 6, 4) == 4 * 4 * 16 * 8 * 9
    assert searches.grid(m, None) == (2, 4, 8)
    m.ClearField("cluster")
    assert searches.grid(m, Cluster.regular(3, 8)) == (3, 8, 24)
    m.cluster.preset.name, m.cluster.preset.num_hosts = "dgx-h100", 128
    assert searches.grid(m, None) == (128, 8, 1024)
    with pytest.raises(OverBudget, match=r"1024 devices, over the server's budget of 512 "
                                         r"\(--max-devices\)"):
        searches.check_search(m, None, 512, 1 << 30)
    with pytest.raises(OverBudget, match=r"about \d+ cells .* over the server's budget of "
                                         r"1000 \(--max-search-cells\)"):
        searches.check_search(m, None, 1 << 14, 1000)


def test_a_search_is_counted_on_the_wire_before_parsing():
    layers = [Layer(f"l{k}", (8, 8), "float32", {
        (1, 1): tuple(Candidate(f"c{j}", 1e-3, "RR", "RR") for j in range(5)),
        (1, 2): (Candidate("t", 1e-3, "RR", "RR"),)}) for k in range(10)]
    graph = Graph(tuple(layers), tuple((k, k + 1) for k in range(9)))
    raw = sc.search_request(graph, CLUSTER, 8).SerializeToString()
    want = 10 * (1 + 2 + 6) + 9  # layers, their submeshes and candidates, edges
    assert wire.search_counts(raw, 10_000) == want
    assert wire.search_counts(raw, want) == want
    assert 50 < wire.search_counts(raw, 50) <= 52  # stops once past the limit
    check_search_wire(raw, want)
    with pytest.raises(OverBudget, match=r"more than 50 layers, submeshes, candidates and "
                                         r"edges .* \(--max-search-candidates\)"):
        check_search_wire(raw, 50)
    padded = pb.SearchRequest.FromString(raw)
    padded.layers[0].output_shape.extend([1] * 5000)  # packed: one field, no padding
    assert wire.search_counts(padded.SerializeToString(), want) == want
    noise = b"".join(b"\x20\x01" for _ in range(20_000))  # field 4 (microbatches) again
    with pytest.raises(OverBudget, match="send it without padding"):
        check_search_wire(raw + noise, 100)


def test_a_job_answers_with_the_baselines_and_says_when_they_are_missing():
    """searches.run (what a job worker runs) answers as the search does; a baseline the
    time did not allow is reported missing and the answer is not complete (the server
    then does not cache it)."""
    layers = _layers(3, 8)
    raw = sc.search_request(layers, CLUSTER, 8).SerializeToString()
    encoded, complete = searches.run(raw, None, time.monotonic() + 60, 120)
    got = sc.reply_from_pb(pb.SearchReply.FromString(encoded))
    assert complete and got.choice == search_chain(layers, CLUSTER, 8)
    assert set(got.baselines) == {"alpa", "megatron"} and got.missing == {}
    ask = sc.request_from_pb(pb.SearchRequest.FromString(raw), None)
    spent = Budget(1e-3, start=time.monotonic() - 1)
    found, complete = searches.baselines(ask, got.choice, None, spent, CostCache())
    assert not complete
    assert [b.missing.startswith("the time ran out before") for b in found] == [True, True]
    with pytest.raises(ServiceError, match="no time was left") as e:
        searches.run(raw, None, time.monotonic() - 1, 120)
    assert e.value.code is grpc.StatusCode.DEADLINE_EXCEEDED


def test_the_search_budgets_come_from_their_flags():
    import argparse

    from reshard.errors import ReshardError
    from reshard.service import serve_cli
    from reshard.service.options import ServeOptions

    ap = argparse.ArgumentParser()
    serve_cli.add_arguments(ap)
    default = serve_cli.options_from(ap.parse_args([]))
    assert (default.max_search_candidates, default.max_search_cells,
            default.search_cache_bytes) == (100_000, 1 << 22, 16 << 20)
    o = serve_cli.options_from(ap.parse_args(["--max-search-cells", "99",
                                              "--max-search-candidates", "7",
                                              "--search-cache-mb", "2"]))
    assert (o.max_search_candidates, o.max_search_cells, o.search_cache_bytes) == (
        7, 99, 2 << 20)
    with pytest.raises(ReshardError, match="max_search_cells must be an integer >= 1"):
        ServeOptions(max_search_cells=0)
