"""Core value types: meshes, specs, layouts, clusters."""

from __future__ import annotations

import numpy as np
import pytest

import reshard
from reshard import Cluster, DeviceMesh, Layout, ShardingSpec
from reshard.layout import chunk_bounds
from reshard.spec import Partial, Replicate, Shard


def test_mesh_defaults_and_coords():
    m = DeviceMesh((2, 4), devices=range(8, 16))
    assert m.devices == tuple(range(8, 16))
    assert m.axis_names == ("x0", "x1")
    assert m.coords(13) == (1, 1)
    assert DeviceMesh((2, 4)).devices == tuple(range(8))
    assert repr(m) == "DeviceMesh((2, 4), devices=[8, 9, 10, 11, 12, 13, 14, 15], axis_names=('x0', 'x1'))"
    assert eval(repr(m), {"DeviceMesh": DeviceMesh}) == m


@pytest.mark.parametrize("text,dims,partial", [
    ("S0RR", ((0,), (), ()), ()),
    ("RS01R", ((), (0, 1), ()), ()),
    ("S10", ((1, 0),), ()),
    ("S1S0", ((1,), (0,)), ()),
    ("S0R+P1", ((0,), ()), (1,)),
    ("RR+P01", ((), ()), (0, 1)),
])
def test_spec_parse_str(text, dims, partial):
    s = ShardingSpec.parse(text)
    assert s.dims == dims and s.partial == partial
    assert str(s) == text
    assert ShardingSpec.parse(str(s)) == s
    assert hash(ShardingSpec.parse(text)) == hash(s)
    assert eval(repr(s), {"ShardingSpec": ShardingSpec}) == s


def test_from_placements_matches_text():
    s = ShardingSpec.from_placements([Shard(1), Replicate()], ndim=3)
    assert str(s) == "RS0R"
    s = ShardingSpec.from_placements([Shard(0), Shard(0)], ndim=2)
    assert str(s) == "S01R:nested"  # placements split nested, as DTensor does
    s = ShardingSpec.from_placements(["S(0)", "P"], ndim=2)
    assert str(s) == "S0R+P1"
    assert s.to_placements(2) == (Shard(0), Partial())


def test_chunk_rule_matches_torch_chunk():
    # torch.chunk(10 elements, 4) -> sizes 3,3,3,1; 5 elements in 4 -> 2,2,1,0
    assert [chunk_bounds(10, 4, i) for i in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [chunk_bounds(5, 4, i) for i in range(4)] == [(0, 2), (2, 4), (4, 5), (5, 5)]
    assert [chunk_bounds(0, 3, i) for i in range(3)] == [(0, 0)] * 3


def test_index_map_major_minor_order():
    mesh = DeviceMesh((2, 2))
    s01 = Layout(mesh, "S01").index_map((8,))
    s10 = Layout(mesh, "S10").index_map((8,))
    # S01: device (a, b) holds chunk 2a+b; S10: chunk 2b+a
    assert s01[1] == (slice(2, 4),) and s10[1] == (slice(4, 6),)
    assert s01[2] == (slice(4, 6),) and s10[2] == (slice(2, 4),)


def test_index_map_replicas_equal_and_cover():
    lay = Layout(DeviceMesh((2, 4)), "RS0R")
    im = lay.index_map((6, 10, 3))
    assert im[0] == im[1] == im[2] == im[3] == (slice(0, 6), slice(0, 5), slice(0, 3))
    assert im[4] == (slice(0, 6), slice(5, 10), slice(0, 3))
    x = np.zeros((6, 10, 3), int)
    for sl in im.values():
        x[sl] += 1
    assert (x == 4).all()  # each element held by the 4 devices of a host


def test_cluster_presets_and_paper_figures():
    c = Cluster.regular(4, 4)
    assert c.nic_bandwidth == pytest.approx(10e9 / 8)  # the paper's 10 Gbit/s network
    assert c.host_of(5) == 1 and c.num_hosts == 4
    for name in reshard.preset_names():
        p = Cluster.preset(name, 2)
        assert p.num_hosts == 2 and p.nic_bandwidth > 0
    assert "p3.8xlarge" in reshard.PRESETS["aws-p3.8xlarge"].source
    assert Cluster.from_dict(c.to_dict()) == c


def test_frozen_values():
    m = DeviceMesh((2,))
    with pytest.raises(AttributeError):
        m.shape = (3,)  # type: ignore[misc]
    assert {Layout(m, "S0"), Layout(DeviceMesh((2,)), ShardingSpec.parse("S0"))} == {Layout(m, "S0")}
