"""Split rules: flat (Alpa / XLA / JAX) and nested (DTensor / OneFlow), their text form,
serialisation, and plans between layouts of either rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard
from reshard import Cluster, DeviceMesh, Layout, ShardingSpec
from reshard.errors import SpecError
from reshard.spec import Partial, Replicate, Shard, SplitRule

from ..common import meshes, specs


def _chunks(idx: list[int], k: int) -> list[list[int]]:
    """torch.chunk's rule on a list, from its documentation: chunks of ceil(n / k)
    elements; trailing chunks that would start past the end are empty."""
    c = -(-len(idx) // k)
    return [idx[i * c:(i + 1) * c] for i in range(k)]


def _oracle(n: int, rule: SplitRule, parts: list[tuple[int, int]]) -> list[int]:
    """The element indices a device holds of a dim of size ``n``, straight from each
    rule's definition, by list slicing (independent of reshard.layout)."""
    idx = list(range(n))
    if rule is SplitRule.FLAT:
        k = math.prod(size for size, _ in parts)
        flat = 0
        for size, coord in parts:
            flat = flat * size + coord
        return _chunks(idx, k)[flat]
    for size, coord in parts:
        idx = _chunks(idx, size)[coord]
    return idx


def test_issue_example_nested_vs_flat():
    mesh = DeviceMesh((2, 2))
    nested = Layout(mesh, ShardingSpec.from_placements([Shard(1), Shard(1)], 2))
    assert nested.spec.rule is SplitRule.NESTED
    cols = [nested.index_map((2, 5))[d][1] for d in range(4)]
    assert [(s.start, s.stop) for s in cols] == [(0, 2), (2, 3), (3, 4), (4, 5)]
    flat = Layout(mesh, "RS01")
    cols = [flat.index_map((2, 5))[d][1] for d in range(4)]
    assert [(s.start, s.stop) for s in cols] == [(0, 2), (2, 4), (4, 5), (5, 5)]


@st.composite
def _layouts(draw, rule: SplitRule | None = None):
    mesh = draw(meshes(tuple(range(16)), max_ndim=4))
    rank = draw(st.integers(1, 3))
    spec = draw(specs(mesh.ndim, rank, True))
    rule = rule or draw(st.sampled_from(list(SplitRule)))
    return Layout(mesh, spec.with_rule(rule)), rank


@settings(max_examples=300, deadline=None)
@given(_layouts(), st.data())
def test_index_map_follows_rule_definition(lay_rank, data):
    lay, rank = lay_rank
    shape = tuple(data.draw(st.lists(st.integers(0, 13), min_size=rank, max_size=rank)))
    im = lay.index_map(shape)
    for coords, dev in lay.mesh.iter_coords():
        for d, axes in enumerate(lay.spec.dims):
            want = _oracle(shape[d], lay.spec.rule, [(lay.mesh.shape[a], coords[a]) for a in axes])
            got = im[dev][d]
            assert list(range(shape[d]))[got] == want, (lay, shape, dev, d)
            assert got.stop - got.start == len(want)


@settings(max_examples=200, deadline=None)
@given(_layouts(SplitRule.FLAT), st.data())
def test_even_dims_same_boxes_under_both_rules(lay_rank, data):
    lay, rank = lay_rank
    shape = tuple(lay.num_chunks(d) * data.draw(st.integers(0, 4)) for d in range(rank))
    nested = Layout(lay.mesh, lay.spec.with_rule(SplitRule.NESTED))
    assert lay.index_map(shape) == nested.index_map(shape)


@settings(max_examples=200, deadline=None)
@given(_layouts())
def test_text_and_repr_round_trip(lay_rank):
    spec = lay_rank[0].spec
    assert ShardingSpec.parse(str(spec)) == spec
    assert eval(repr(spec), {"ShardingSpec": ShardingSpec}) == spec
    assert (":nested" in str(spec)) == (spec.rule is SplitRule.NESTED)
    lay = lay_rank[0]
    assert eval(repr(lay), {"Layout": Layout, "DeviceMesh": reshard.DeviceMesh}) == lay
    assert Layout.from_dict(lay.to_dict()) == lay


@pytest.mark.parametrize("text,dims,partial,rule", [
    ("S01R:nested", ((0, 1), ()), (), SplitRule.NESTED),
    ("RS10+P2:nested", ((), (1, 0)), (2,), SplitRule.NESTED),
    ("S[10]R", ((10,), ()), (), SplitRule.FLAT),
    ("S10R", ((1, 0), ()), (), SplitRule.FLAT),
    ("S0[12]R+P[11]3", ((0, 12), ()), (3, 11), SplitRule.FLAT),
    ("S[12]0:nested", ((12, 0),), (), SplitRule.NESTED),
])
def test_text_form(text, dims, partial, rule):
    s = ShardingSpec.parse(text)
    assert (s.dims, s.partial, s.rule) == (dims, partial, rule)
    assert ShardingSpec.parse(str(s)) == s


def test_axes_from_ten_print_unambiguously():
    s = ShardingSpec(((10,), ()))
    assert str(s) == "S[10]R" and ShardingSpec.parse(str(s)) == s
    assert ShardingSpec.parse("S10R") != s
    assert str(ShardingSpec(((1, 0), ()))) == "S10R"


def test_rule_only_kept_where_it_matters():
    s = ShardingSpec.parse("S0S1:nested")  # one axis per dim: both rules agree
    assert s.rule is SplitRule.FLAT and s == ShardingSpec.parse("S0S1") and str(s) == "S0S1"
    assert ShardingSpec.from_placements([Shard(0), Replicate()], 2) == ShardingSpec.parse("S0R")
    assert ShardingSpec.parse("S01:flat") == ShardingSpec.parse("S01")
    assert ShardingSpec.parse("S01:nested") != ShardingSpec.parse("S01")
    assert hash(ShardingSpec.parse("S01:NESTED")) == hash(ShardingSpec.parse("S01:nested"))


@pytest.mark.parametrize("text,needles", [
    ("S01:chunky", ["'chunky'", "'flat'", "'nested'"]),
    ("S[1x]R", ["'R' or 'S'", "[n] from 10"]),
    ("S0R+P[", ["+P[", "e.g."]),
])
def test_bad_text_errors(text, needles):
    with pytest.raises(reshard.SpecError) as e:
        ShardingSpec.parse(text)
    for n in needles:
        assert n in str(e.value)


def test_placements_round_trip_and_flat_refused():
    s = ShardingSpec.from_placements([Shard(1), Partial(), Shard(1)], 2)
    assert str(s) == "RS02+P1:nested"
    assert s.to_placements(3) == (Shard(1), Partial(), Shard(1))
    with pytest.raises(reshard.SpecError, match=r"split flat.*'RS02\+P1:nested'"):
        ShardingSpec.parse("RS02+P1").to_placements(3)


def test_plan_json_carries_rule():
    src = Layout(DeviceMesh((2, 2)), "S01R:nested")
    dst = Layout(DeviceMesh((2, 2), devices=range(4, 8)), "RS10")
    p = reshard.plan((7, 5), np.float32, src, dst, cluster=Cluster.regular(2, 4))
    q = reshard.ReshardPlan.from_json(p.to_json())
    assert q == p and q.tensors[0].src.spec.rule is SplitRule.NESTED
    assert '"S01R:nested"' in p.to_json()


def test_nested_to_flat_moves_right_bytes(local_runtime):
    # the issue's uneven example both ways between the two rules, real bytes
    value = np.arange(2 * 5 * 3, dtype=np.int32).reshape(2, 5, 3)
    nested = Layout(DeviceMesh((2, 2)), "RS01R:nested")
    flat = Layout(DeviceMesh((2, 2), devices=range(4, 8)), "RS10R")
    x = local_runtime.put(value, nested)
    for d, sl in nested.index_map(value.shape).items():
        assert np.array_equal(local_runtime.shards(x)[d], value[sl])
    y = local_runtime.reshard(x, flat)
    z = local_runtime.reshard(y, nested)
    assert local_runtime.shards(z)[1].shape == (2, 1, 3)  # columns 2:3
    for d, sl in flat.index_map(value.shape).items():
        assert np.array_equal(local_runtime.shards(y)[d], value[sl])
    for d, sl in nested.index_map(value.shape).items():
        assert np.array_equal(local_runtime.shards(z)[d], value[sl])


def test_dtensor_placements_are_read_by_what_they_declare():
    """DTensor's own placement objects, read through their ``is_shard`` / ``is_replicate``
    / ``is_partial`` methods (not their class names); what a spec cannot say is refused."""
    tensor = pytest.importorskip("torch.distributed.tensor")
    from torch.distributed.tensor.placement_types import _StridedShard

    spec = ShardingSpec.from_placements([tensor.Shard(1), tensor.Replicate(), tensor.Partial()], 2)
    assert spec == ShardingSpec.parse("RS0+P2")

    class Renamed(tensor.Shard):  # a subclass under another name is still a shard
        pass

    assert ShardingSpec.from_placements([Renamed(0)], 1) == ShardingSpec.parse("S0")
    with pytest.raises(SpecError, match="strided shard"):
        ShardingSpec.from_placements([_StridedShard(0, split_factor=2)], 1)
    with pytest.raises(SpecError, match="reduces with 'max'"):
        ShardingSpec.from_placements([tensor.Partial("max")], 1)
