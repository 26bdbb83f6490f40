"""Plan verification: tampered or malformed plans are refused before any byte moves,
with a PlanError naming the task and the rule; every plan the planner makes passes; and
any plan that passes executes exactly (a fuzzer mutates real plans and runs the
survivors on the reference backend)."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import time
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster, DeviceMesh, Layout, PlanError, ReshardPlan
from reshard.planner.plan import make_tensor_spec, plan_tasks
from reshard.planner.values.strategy import Strategy

from ..common import STRATEGIES, addends, check_shards, problems, sample

CL = Cluster.regular(4, 2)
A = DeviceMesh((2,), [0, 1])
B = DeviceMesh((2,), [2, 3])
AB = DeviceMesh((2, 2), [0, 1, 2, 3])
C = DeviceMesh((2, 2), [4, 5, 6, 7])


def _plan(shape, dtype, src, dst, strategy):
    return reshard.plan(shape, dtype, src, dst, cluster=CL, strategy=strategy)


def _stepped(shape, dtype, src, dst):
    """A broadcast plan whose partial sums reduce in their own steps (never fused)."""
    tensors = (make_tensor_spec(shape, dtype, src, dst, CL),)
    tasks, _ = plan_tasks(tensors, CL, Strategy.BROADCAST, fan_out=False)
    return ReshardPlan(tensors, tasks, Strategy.BROADCAST, CL)


BASE = {
    "send_recv": _plan((6, 4), "int32", Layout(A, "S0R"), Layout(B, "RS0"), "send_recv"),
    # large enough that chains beat point-to-point sends (smaller: latency-bound, sends)
    "broadcast": _plan((256, 256), "int32", Layout(A, "S0R"), Layout(C, "RR"), "broadcast"),
    "allgather": _plan((6, 4), "int32", Layout(A, "S0R"), Layout(C, "RR"), "allgather"),
    "partial": _stepped((6, 4), "float32", Layout(AB, "S0R+P1"), Layout(C, "RS0")),
    "fused": _plan((64, 64), "float32", Layout(AB, "S0R+P1"), Layout(C, "RS0"), "broadcast"),
    "partial_dst": _plan((6, 4), "int64", Layout(A, "S0R"), Layout(C, "RR+P0"), "send_recv"),
    "copy": _plan((6, 4), "int32", Layout(A, "S0R"), Layout(A, "RS0"), "send_recv"),
}


def _first(d: dict, kind: str) -> int:
    return next(i for i, t in enumerate(d["tasks"]) if t["kind"] == kind)


def _refused(text_or_dict, *needles: str) -> str:
    t0 = time.perf_counter()
    with pytest.raises(PlanError) as info:
        if isinstance(text_or_dict, dict):
            ReshardPlan.from_dict(text_or_dict)
        else:
            ReshardPlan.from_json(text_or_dict)
    # milliseconds in practice; the bound only catches a hang or a runaway replay on a
    # loaded machine (speed is measured in the README, not asserted here)
    assert time.perf_counter() - t0 < 3.0, "verification should not hang"
    msg = str(info.value)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


def test_every_base_plan_passes():
    for name, p in BASE.items():
        p.verify()
        assert ReshardPlan.from_json(p.to_json()) == p, name
    kinds = {t.kind.value for p in BASE.values() for t in p.tasks}
    assert kinds == {"copy", "send", "broadcast", "reduce", "allgather"}


# ----- malformed JSON ---------------------------------------------------------------------
@pytest.mark.parametrize("text,needles", [
    ("[]", ["plan must be a JSON object", "list"]),
    ("7", ["JSON object"]),
    ("{", ["not valid JSON"]),
    ("[" * 100_000 + "]" * 100_000, ["nests too deeply"]),
    ('{"format": 1}', ["no field"]),
    ('{"format": 99}', ["format 99"]),
])
def test_malformed_json(text, needles):
    _refused(text, *needles)


def test_not_text():
    with pytest.raises(PlanError, match="JSON text"):
        ReshardPlan.from_json(None)  # type: ignore[arg-type]


# ----- tampered fields --------------------------------------------------------------------
def _edit(base: str, edit, *needles: str) -> str:
    d = BASE[base].to_dict()
    edit(d)
    return _refused(d, *needles)


def _set(path, value):
    def edit(d):
        obj = d
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return edit


@pytest.mark.parametrize("base,edit,needles", [
    # types and ranges
    ("send_recv", _set(["tensors", 0, "shape"], [8.7, 4]), ["tensor shape must be an integer", "8.7"]),
    ("send_recv", _set(["tensors", 0, "shape"], [-6, 4]), ["plan tensor 0", ">= 0"]),
    ("send_recv", _set(["tensors", 0, "dtype"], "object"), ["plan tensor 0", "object"]),
    ("send_recv", _set(["tensors", 0, "dtype"], "V1000000000"), ["plan tensor 0", "not supported"]),
    ("send_recv", _set(["tensors", 0, "dtype"], ">i4"), ["plan tensor 0"]),
    ("send_recv", _set(["tasks", 0, "box"], [[-2, 2], [0, 4]]), ["task #0", "outside 0:6"]),
    ("send_recv", _set(["tasks", 0, "box"], [[0, 3], [0, 5]]), ["task #0", "outside 0:4"]),
    ("send_recv", _set(["tasks", 0, "box"], [[3, 1], [0, 2]]), ["task #0", "reversed"]),
    ("send_recv", _set(["tasks", 0, "box"], [[0, 3]]), ["task #0", "1 dims"]),
    ("send_recv", _set(["tasks", 0, "tensor"], 3), ["task #0", "tensor index 3 is out of range"]),
    ("send_recv", _set(["tasks", 0, "tensor"], -1), ["task #0", "out of range"]),
    ("send_recv", _set(["tasks", 0, "receivers"], []), ["task #0", "at least one receiver"]),
    ("send_recv", _set(["tasks", 0, "receivers"], [2, 3]), ["task #0", "exactly one receiver"]),
    ("send_recv", _set(["tasks", 0, "receivers"], ["2"]), ["task #0", "integer"]),
    ("send_recv", _set(["tasks", 0, "nbytes"], 5), ["task #0", "nbytes is 5"]),
    ("send_recv", _set(["tasks", 0, "nbytes"], 2.5), ["task #0", "integer"]),
    ("send_recv", _set(["tasks", 0, "step"], -1), ["task #0", "step"]),
    ("send_recv", _set(["tasks", 0, "kind"], "teleport"), ["task #0", "teleport"]),
    ("send_recv", _set(["tasks", 0, "source"], "elsewhere"), ["task #0", "elsewhere"]),
    ("send_recv", _set(["tasks", 0, "root"], True), ["task #0", "integer"]),
    ("send_recv", _set(["tasks", 0], "send"), ["task #0", "JSON object"]),
    ("send_recv", _set(["tasks"], {}), ["plan tasks must be a JSON list"]),
    ("send_recv", _set(["strategy"], "telepathy"), ["telepathy"]),
    # who holds what
    ("send_recv", _set(["tasks", 0, "root"], 5), ["task #0", "device 5 holds no source shard"]),
    ("send_recv", _set(["tasks", 0, "receivers"], [1]), ["task #0", "device 1 holds no destination"]),
    ("send_recv", _set(["tasks", 0, "receivers"], [0]), ["task #0", "root is also a receiver"]),
    ("broadcast", _set(["tasks", 0, "receivers"], [4, 4]), ["task #0", "listed twice"]),
    ("broadcast", _set(["tasks", 0, "source"], "dst"), ["task #0", "destination shard does not hold"]),
    ("copy", _set(["tasks", _first(BASE["copy"].to_dict(), "copy"), "receivers"], [1]),
     ["copy's receivers"]),
    ("partial", _set(["tasks", _first(BASE["partial"].to_dict(), "reduce"), "receivers"], []),
     ["at least one receiver"]),
    ("partial", _set(["tasks", _first(BASE["partial"].to_dict(), "reduce"), "root"], 4),
     ["not one"]),
])
def test_tampered_field(base, edit, needles):
    _edit(base, edit, *needles)


def test_missing_task_of_every_kind():
    """Dropping any one task is caught: an element undelivered, or a later task that
    reads what never arrived."""
    for name, p in BASE.items():
        for i in range(len(p.tasks)):
            if not p.tasks[i].nbytes:
                continue
            d = p.to_dict()
            del d["tasks"][i]
            msg = _refused(d)
            assert "undelivered" in msg or "task #" in msg, (name, i, msg)


def test_duplicate_task_is_refused():
    for p in BASE.values():
        i = next(k for k, t in enumerate(p.tasks) if t.nbytes)
        d = p.to_dict()
        d["tasks"].insert(i, copy.deepcopy(d["tasks"][i]))
        _refused(d)


def test_order_matters_for_relays_and_reductions():
    d = BASE["allgather"].to_dict()
    g = _first(d, "allgather")
    d["tasks"].insert(0, d["tasks"].pop(g))  # all-gather before its pieces arrive
    _refused(d, "task #0", "before it received")
    d = BASE["partial"].to_dict()
    r = _first(d, "reduce")
    last_read = max(i for i, t in enumerate(d["tasks"]) if t["kind"] != "reduce")
    d["tasks"].insert(last_read, d["tasks"].pop(r))  # a send before its reduce
    _refused(d, "partial sum", "has not reduced")


def test_a_step_sees_only_earlier_steps():
    """Tasks of one step run concurrently: a relay or a send of a reduced box in the
    same step as what feeds it is refused; one step later it passes; steps never
    decrease."""
    for base, _kind, needle in (("allgather", "allgather", "before it received"),
                               ("partial", "reduce", "has not reduced")):
        d = BASE[base].to_dict()
        ReshardPlan.from_dict(d)
        last = max(t["step"] for t in d["tasks"])
        for t in d["tasks"]:
            t["step"] = 0  # everything in one group
        _refused(d, needle, "earlier step")
    d = BASE["partial"].to_dict()
    for t in d["tasks"]:
        t["step"] = 0 if t["kind"] == "reduce" else 1
    ReshardPlan.from_dict(d)  # several tasks per device and step are fine
    d = BASE["send_recv"].to_dict()
    for k, t in enumerate(d["tasks"]):
        t["step"] = 1 if k == 0 else 0
    _refused(d, "task #1", "steps never decrease")
    assert last >= 1


def test_relay_only_receivers():
    """``through``: relay-only receivers of a broadcast, never its last, nothing
    written to them; anything else is refused."""
    d = BASE["broadcast"].to_dict()
    b = _first(d, "broadcast")
    task = d["tasks"][b]
    task.pop("parents", None)  # the planner may have made it a tree: edit it as a chain
    task["receivers"] = [1, *task["receivers"]]
    task["through"] = [1]  # device 1 (on the root's host) only passes the box on
    p = ReshardPlan.from_dict(d)
    assert 1 in p.devices and p.tasks[b].through == (1,)
    assert ReshardPlan.from_json(p.to_json()) == p
    for edit, needle in (
        (lambda t: t.update(through=[t["receivers"][-1]]), "last receiver"),
        (lambda t: t.update(through=[3]), "distinct receivers"),
        (lambda t: t.update(through=[1, 1]), "distinct receivers"),
    ):
        e = copy.deepcopy(d)
        edit(e["tasks"][b])
        _refused(e, needle)
    e = copy.deepcopy(BASE["send_recv"].to_dict())
    e["tasks"][_first(e, "send")]["through"] = [e["tasks"][_first(e, "send")]["receivers"][0]]
    _refused(e, "only a broadcast")
    e = copy.deepcopy(d)
    e["tasks"][b]["through"] = []  # device 1 then receives into a shard it does not have
    _refused(e, "device 1 holds no destination shard")


def test_reduce_twice_and_partial_destination_addend():
    d = BASE["partial"].to_dict()
    r = _first(d, "reduce")
    d["tasks"].insert(r + 1, copy.deepcopy(d["tasks"][r]))
    _refused(d, f"task #{r + 1}", "already holds a reduced sum")
    d = BASE["partial_dst"].to_dict()
    i = next(k for k, t in enumerate(d["tasks"]) if t["receivers"] == [4])
    d["tasks"][i]["receivers"] = [6]  # device 6 is a non-leading addend
    _refused(d, f"task #{i}", "non-leading addend")


def test_fused_sums():
    """A broadcast summing addends: the root and its addends one whole partial group,
    each once, reduced before any later reader; the sum delivered in the same task."""
    d = BASE["fused"].to_dict()
    f = next(i for i, t in enumerate(d["tasks"]) if t.get("addends"))
    task = d["tasks"][f]
    assert ReshardPlan.from_dict(d).tasks[f].addends == tuple(task["addends"])
    for edit, needle in (
        (lambda t: t.update(addends=[]), "has not reduced"),
        (lambda t: t.update(addends=[t["root"]]), "distinct devices other than its root"),
        (lambda t: t.update(addends=[*t["addends"], *t["addends"]]), "distinct devices"),
        (lambda t: t.update(addends=[*t["addends"], t["receivers"][0]]), "distinct devices"),
        (lambda t: t.update(addends=[6]), "not one"),
        (lambda t: t.update(source="dst"), "reads source shards"),
        (lambda t: t.update(kind="send", receivers=t["receivers"][:1]), "only a broadcast sums"),
    ):
        e = copy.deepcopy(d)
        edit(e["tasks"][f])
        _refused(e, f"task #{f}", needle)
    e = copy.deepcopy(d)
    e["tasks"].insert(f + 1, copy.deepcopy(task))
    _refused(e, "already holds a reduced sum")
    # the root keeps the sum: a later step may send it on, the same step may not
    e = copy.deepcopy(d)
    extra = {**copy.deepcopy(task), "addends": [], "receivers": [task["receivers"][0]],
             "kind": "send"}
    e["tasks"].append({**extra, "step": task["step"]})
    _refused(e, "has not reduced")


def test_sum_trees():
    """A fused sum's addend parents: one per addend, each the root or another addend,
    every running sum reaching the root; a chain, a star and a binary tree verify."""
    from reshard.planner.cells.fuse import SumShape, fuse_reductions

    src = Layout(DeviceMesh((1, 4), [0, 1, 2, 3]), "RR+P1")  # four addends on CL's hosts 0-1
    tensors = (make_tensor_spec((8, 4), "int32", src, Layout(C, "RS0"), CL),)
    tasks, _ = plan_tasks(tensors, CL, Strategy.BROADCAST, fan_out=False, fuse=True)
    for shape in SumShape:
        p = ReshardPlan(tensors, fuse_reductions(tasks, shape=shape), Strategy.BROADCAST, CL)
        p.verify()
        assert ReshardPlan.from_json(p.to_json()) == p
    d = p.to_dict()  # the binary tree's
    f = next(i for i, t in enumerate(d["tasks"]) if t.get("addend_parents"))
    task = d["tasks"][f]
    a0, a1, a2 = task["addends"]
    assert task["addend_parents"] == [task["root"], task["root"], a0]
    for edit, needle in (
        (lambda t: t.update(addend_parents=t["addend_parents"][:2]), "one parent per addend"),
        (lambda t: t.update(addend_parents=[t["root"], t["receivers"][0], a0]),
         f"addend {a1}'s parent {task['receivers'][0]} is neither"),
        (lambda t: t.update(addend_parents=[t["root"], a1, a0]), f"addend {a1}'s parent {a1}"),
        (lambda t: t.update(addend_parents=[t["root"], a2, a1]), "never reaches the root"),
        (lambda t: t.update(addends=[], addend_parents=[t["root"]]), "without addends"),
    ):
        e = copy.deepcopy(d)
        edit(e["tasks"][f])
        _refused(e, f"task #{f}", needle)


def test_foreign_device_and_cluster():
    d = BASE["send_recv"].to_dict()
    d["cluster"]["hosts"] = [[0, 1]]
    _refused(d, "plan tensor 0", "does not have")


# ----- what passes runs exactly -------------------------------------------------------------
@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(problems(tuple(range(8))), st.sampled_from(STRATEGIES))
def test_every_planner_plan_verifies(problem, strategy):
    shape, dtype, src, dst = problem
    p = reshard.plan(shape, dtype, src, dst, cluster=CL, strategy=strategy)
    p.verify()
    again = ReshardPlan.from_json(p.to_json())
    assert again == p


_MUTATIONS = ("drop", "duplicate", "swap", "int", "root", "receiver", "source", "box")


@st.composite
def mutated(draw):
    name = draw(st.sampled_from(sorted(BASE)))
    d = BASE[name].to_dict()
    tasks = d["tasks"]
    what = draw(st.sampled_from(_MUTATIONS))
    i = draw(st.integers(0, len(tasks) - 1))
    t = tasks[i]
    if what == "drop":
        del tasks[i]
    elif what == "duplicate":
        tasks.insert(draw(st.integers(0, len(tasks))), copy.deepcopy(t))
    elif what == "swap":
        j = draw(st.integers(0, len(tasks) - 1))
        tasks[i], tasks[j] = tasks[j], tasks[i]
    elif what == "int":
        key = draw(st.sampled_from(["tensor", "root", "nbytes", "step"]))
        t[key] += draw(st.sampled_from([-1, 1]))
    elif what == "root":
        t["root"] = draw(st.integers(-1, 8))
    elif what == "receiver":
        if t["receivers"]:
            t["receivers"][draw(st.integers(0, len(t["receivers"]) - 1))] = draw(
                st.integers(0, 8))
    elif what == "source":
        t["source"] = "dst" if t["source"] == "src" else "src"
    else:
        dim = draw(st.integers(0, len(t["box"]) - 1))
        t["box"][dim][draw(st.integers(0, 1))] += draw(st.sampled_from([-1, 1]))
    return name, d


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_plans_are_refused_or_exact(case):
    """The verifier's promise: a plan it accepts moves every byte right."""
    name, d = case
    try:
        p = ReshardPlan.from_dict(d)
    except PlanError as e:
        assert "task #" in str(e) or "plan" in str(e)
        return
    base = BASE[name]
    rng = np.random.default_rng(zlib.crc32(json.dumps(d).encode()))
    with reshard.Runtime(backend="local", timeout=5.0) as rt:
        xs = []
        for t in p.tensors:
            value = sample(rng, t.shape, t.dtype)
            xs.append((rt.put_shards(addends(rng, value, t.src), t.src, t.shape, t.dtype),
                       value))
        ys = rt.execute(p, [x for x, _ in xs])
        for y, (_, value) in zip(ys, xs):
            check_shards(rt, y, value)
    assert base.tensors == p.tensors


# ----- what a backend can do ----------------------------------------------------------------
def test_backend_dtypes():
    """The dtype policy applied to each backend's declared capabilities: every backend
    moves every dtype; nccl (cupy: no bfloat16 / float8 type) converts them as bits
    (reshard.bits); a backend converting only cupy's own floats cannot accumulate a bf16
    partial sum in float32 nor cast to float8; a registered backend's narrower sums and
    moves are refused by name."""
    from reshard.comm.backend import Capabilities, check_dtypes
    from reshard.comm.backends.gloo import GlooBackend
    from reshard.comm.backends.nccl import NcclBackend

    mesh = DeviceMesh((2,), [0, 1])
    gloo, nccl = GlooBackend.capabilities, NcclBackend.capabilities
    floats = dataclasses.replace(nccl, converts=frozenset({"float16", "float32", "float64"}))
    part = reshard.plan((4, 4), "bfloat16", Layout(mesh, "RR+P0"), Layout(B, "RR"), cluster=CL)
    check_dtypes(part.tensors, part.tasks, gloo, "gloo")  # summed in float32
    check_dtypes(part.tensors, part.tasks, nccl, "nccl")  # as bits through float32
    with pytest.raises(reshard.DTypeError,
                       match=r"floats backend cannot convert \['bfloat16'\].*summed in float32"):
        check_dtypes(part.tensors, part.tasks, floats, "floats")
    moved = reshard.plan((4, 4), "float8_e4m3fn", Layout(mesh, "RR"), Layout(B, "S0R"),
                         cluster=CL)
    check_dtypes(moved.tensors, moved.tasks, floats, "floats")  # bits move anywhere
    cast = reshard.plan((4, 4), "bfloat16", Layout(mesh, "RR"), Layout(B, "S0R"), cluster=CL,
                        cast="float8_e4m3fn")
    check_dtypes(cast.tensors, cast.tasks, gloo, "gloo")
    check_dtypes(cast.tensors, cast.tasks, nccl, "nccl")
    with pytest.raises(reshard.DTypeError, match="floats backend cannot convert"):
        check_dtypes(cast.tensors, cast.tasks, floats, "floats")
    half = reshard.plan((4, 4), "float16", Layout(mesh, "RR+P0"), Layout(B, "RR"), cluster=CL)
    check_dtypes(half.tensors, half.tasks, nccl, "nccl")  # cupy converts float16
    narrow = Capabilities(moves=frozenset({"float16", "float32"}), sums=frozenset({"int32"}),
                          groups_need_world=False, device="cpu")
    with pytest.raises(reshard.DTypeError, match=r"cannot sum float32 .*float16 partial"):
        check_dtypes(half.tensors, half.tasks, narrow, "mine")
    with pytest.raises(reshard.DTypeError, match="cannot move dtype bfloat16"):
        check_dtypes(cast.tensors, cast.tasks, narrow, "mine")


def test_fanned_out_relays():
    """A broadcast of a pipelined partial-sum piece that fans out inside its last host
    (a relay from the entry device's destination shard, one step after the crossing)
    passes and executes exactly; the relay in the crossing's own step, or from a device
    that has not received the box, is refused."""
    from unittest import mock

    from reshard.planner.plan import make_tensor_spec, plan_tasks
    from reshard.planner.values.strategy import Strategy

    src, dst = Layout(AB, "RR+P1"), Layout(C, "RR")
    with mock.patch("reshard.planner.cells.reduce.reduce_pieces", lambda *_: 3):
        tensors = (make_tensor_spec((12, 4), "int32", src, dst, CL),)
        tasks, _ = plan_tasks(tensors, CL, Strategy.BROADCAST, fan_out=True)
    plan = ReshardPlan(tensors, tasks, Strategy.BROADCAST, CL)
    d = plan.to_dict()
    relays = [i for i, t in enumerate(d["tasks"]) if t["source"] == "dst"]
    assert relays
    ReshardPlan.from_dict(d)
    for i in relays:
        early = copy.deepcopy(d)
        early["tasks"][i]["step"] -= 1  # with the crossing that feeds it
        early["tasks"].sort(key=lambda t: t["step"])
        _refused(early, "relays the box before it received all of it in an earlier step")
        swapped = copy.deepcopy(d)
        t = swapped["tasks"][i]
        t["root"], t["receivers"][0] = t["receivers"][0], t["root"]  # the wrong device
        _refused(swapped, f"device {t['root']} relays the box before it received")
    rng = np.random.default_rng(3)
    value = sample(rng, (12, 4), "int32")
    with reshard.Runtime(backend="local", cluster=CL) as rt:
        x = rt.put_shards(addends(rng, value, src), src, value.shape, value.dtype)
        check_shards(rt, rt.execute(plan, [x])[0], value)


def _tiles_exactly(boxes, box) -> bool:
    """Brute force: every element of ``box`` covered once, nothing outside it."""
    lo = [min(a for a, _ in [dim] + [b[k] for b in boxes]) for k, dim in enumerate(box)]
    hi = [max(b for _, b in [dim] + [b[k] for b in boxes]) for k, dim in enumerate(box)]
    count = np.zeros([h - low for low, h in zip(lo, hi)], np.int64)
    for b in boxes:
        count[tuple(slice(a - low, e - low) for (a, e), low in zip(b, lo))] += 1
    want = np.zeros_like(count)
    want[tuple(slice(a - low, e - low) for (a, e), low in zip(box, lo))] = 1
    return bool((count == want).all())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_tiling_check_matches_brute_force(data):
    """The verifier's exactly-once test of a destination shard (slabs along one dim,
    its fast path, and the general tests) against counting elements: slabs end to end,
    with a gap, overlapping, duplicated, sticking out, or not slabs at all."""
    from reshard.planner.costing.coverage import tiles as _tiles

    ndim = data.draw(st.integers(1, 3))
    box = tuple((lo, lo + data.draw(st.integers(1, 6)))
                for lo in data.draw(st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim)))
    k = data.draw(st.integers(0, ndim - 1))
    cuts = sorted(data.draw(st.sets(st.integers(box[k][0] + 1, box[k][1] - 1), max_size=4))
                  if box[k][1] - box[k][0] > 1 else set())
    edges = [box[k][0], *cuts, box[k][1]]
    boxes = [(*box[:k], (a, b), *box[k + 1:]) for a, b in itertools.pairwise(edges)]
    change = data.draw(st.sampled_from(["none", "drop", "dup", "shift", "grow", "random"]))
    if change == "drop" and len(boxes) > 1:
        boxes.pop(data.draw(st.integers(0, len(boxes) - 1)))
    elif change == "dup":
        boxes.append(boxes[data.draw(st.integers(0, len(boxes) - 1))])
    elif change in ("shift", "grow"):
        j = data.draw(st.integers(0, len(boxes) - 1))
        d = data.draw(st.integers(0, ndim - 1))
        a, b = boxes[j][d]
        by = data.draw(st.sampled_from([-1, 1]))
        moved = (a + by, b + by) if change == "shift" else (a, b + 1)
        boxes[j] = (*boxes[j][:d], moved, *boxes[j][d + 1:])
    elif change == "random":
        boxes = [tuple((a, a + data.draw(st.integers(0, 3)))
                       for a in data.draw(st.lists(st.integers(0, 6), min_size=ndim,
                                                   max_size=ndim)))
                 for _ in range(data.draw(st.integers(0, 5)))]
    boxes = [b for b in boxes if all(a < e for a, e in b)]  # empty boxes are ignored
    order = data.draw(st.permutations(boxes))
    assert _tiles(list(order), box, ndim) == _tiles_exactly(order, box)
