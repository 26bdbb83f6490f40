"""Alpa adapter: layouts from Alpa's ShardingSpec, checked on tiles derived by hand from
pxla's documented semantics (sharded axes = chunk factors flattened in dim order, first
factor major; mesh_mapping per mesh dim; devices row-major over the mesh)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard
from reshard.adapters import alpa
from reshard.adapters.alpa import Chunked, NoSharding, Replicated, ShardedAxis

from ..common import meshes, specs


def _tiles(layout, shape):
    return {d: tuple((s.start, s.stop) for s in sl) for d, sl in layout.index_map(shape).items()}


# (sharding, mesh_mapping, devices, shape, expected tiles by device), each derived by hand
CASES = [
    # pxla's own example: [1, 2, 3, 4] split 4 ways, replication 2 as the inner mesh dim:
    # the 8 devices hold [1, 1], [2, 2], [3, 3], [4, 4]
    ([Chunked((4,))], [ShardedAxis(0), Replicated(2)], None, (4,),
     {d: ((d // 2, d // 2 + 1),) for d in range(8)}),
    # one dim cut 2 x 2; sharded axis 0 (major) on mesh dim 1, axis 1 on mesh dim 0:
    # device (m0, m1) holds chunk 2 * m1 + m0
    ([Chunked((2, 2))], [ShardedAxis(1), ShardedAxis(0)], None, (8,),
     {0: ((0, 2),), 1: ((4, 6),), 2: ((2, 4),), 3: ((6, 8),)}),
    # two dims; mesh (3, 2): mesh dim 0 carries dim 1's 3 chunks, mesh dim 1 dim 0's 2
    ([Chunked((2,)), Chunked((3,))], [ShardedAxis(1), ShardedAxis(0)], None, (4, 6),
     {2 * a + b: ((2 * b, 2 * b + 2), (2 * a, 2 * a + 2)) for a in range(3) for b in range(2)}),
    # replicated outer mesh dim, given device ids
    ([NoSharding(), Chunked((4,))], [Replicated(2), ShardedAxis(0)], range(10, 18), (3, 8),
     {10 + 4 * r + c: ((0, 3), (2 * c, 2 * c + 2)) for r in range(2) for c in range(4)}),
    # Alpa's "S01": dim 0 over both mesh dims, mesh dim 0 major
    ([Chunked((2, 4)), NoSharding()], [ShardedAxis(0), ShardedAxis(1)], None, (16, 5),
     {4 * a + b: ((2 * (4 * a + b), 2 * (4 * a + b) + 2), (0, 5))
      for a in range(2) for b in range(4)}),
    # fully replicated
    ([NoSharding(), NoSharding()], [Replicated(2), Replicated(2)], None, (3, 2),
     {d: ((0, 3), (0, 2)) for d in range(4)}),
]


def _as_dicts(sharding, mapping):
    def one(v):
        if isinstance(v, NoSharding):
            return {"NoSharding": None}
        if isinstance(v, Chunked):
            return {"Chunked": list(v.chunks)}
        if isinstance(v, ShardedAxis):
            return {"ShardedAxis": v.axis}
        return {"Replicated": v.replicas}
    return [one(s) for s in sharding], [one(m) for m in mapping]


def _as_foreign(sharding, mapping):
    """Objects that look like pxla's (same class names and attributes), not ours."""
    def one(v):
        cls = type(type(v).__name__, (), {})
        obj = cls()
        obj.__dict__.update(vars(v) if hasattr(v, "__dict__") else {})
        if isinstance(v, Chunked):
            obj.chunks = list(v.chunks)
        return obj
    return [one(s) for s in sharding], [one(m) for m in mapping]


@pytest.mark.parametrize("form", ["dataclasses", "dicts", "foreign"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_tiles_from_documented_semantics(case, form):
    sharding, mapping, devices, shape, want = CASES[case]
    if form == "dicts":
        sharding, mapping = _as_dicts(sharding, mapping)
    elif form == "foreign":
        sharding, mapping = _as_foreign(sharding, mapping)
    layout = alpa.to_layout(sharding, mapping, devices)
    assert _tiles(layout, shape) == want


def test_spec_text_and_shorthand():
    assert str(alpa.to_layout([[2, 2]], [ShardedAxis(1), ShardedAxis(0)]).spec) == "S10"
    lay = alpa.to_layout([None, [4]], [{"Replicated": 2}, {"ShardedAxis": 0}])
    assert str(lay.spec) == "RS1" and lay.mesh.shape == (2, 4)
    assert alpa.read_spec([[2], None], [ShardedAxis(0)]).mesh_shape == (2,)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_from_layout_round_trip(data):
    mesh = data.draw(meshes(tuple(range(16)), max_ndim=3))
    spec = data.draw(specs(mesh.ndim, data.draw(st.integers(1, 3)), False))
    layout = reshard.Layout(mesh, spec)
    a = alpa.from_layout(layout)
    assert a.mesh_shape == mesh.shape
    assert alpa.to_layout(a.sharding, a.mesh_mapping, mesh.devices) == layout


@pytest.mark.parametrize("sharding,mapping,needles", [
    ([{"Unstacked": 4}], [ShardedAxis(0)], ["Unstacked(4)", "Chunked([4])"]),
    ([Chunked((2,))], [ShardedAxis(0), ShardedAxis(0)], ["carries sharded axes [0, 0]"]),
    ([Chunked((2, 2))], [ShardedAxis(0)], ["[0, 1]", "exactly one mesh dim"]),
    ([{"Tiled": 2}], [], ["'Tiled'", "NoSharding", "Chunked"]),
    ([Chunked((0,))], [ShardedAxis(0)], ["chunk count", ">= 1", "0"]),
    ([NoSharding()], [{"Replicated": "2"}], ["replica count"]),
])
def test_errors(sharding, mapping, needles):
    with pytest.raises(reshard.SpecError) as e:
        alpa.to_layout(sharding, mapping)
    for n in needles:
        assert n in str(e.value)


def test_partial_layout_has_no_alpa_spec():
    with pytest.raises(reshard.SpecError, match=r"partial sum.*'S0R'"):
        alpa.from_layout(reshard.Layout(reshard.DeviceMesh((2, 2)), "S0R+P1"))


@pytest.mark.parametrize("dtype, cast, scale", [("bfloat16", None, None),
                                                ("float8_e4m3fn", None, None),
                                                ("bfloat16", "float8_e4m3fn", "block128")])
def test_alpa_layouts_move_llm_dtypes(dtype, cast, scale):
    """An Alpa stage boundary in bf16 / fp8 (and bf16 delivered as block-scaled fp8),
    with layouts read from Alpa's specs: the reference's bits on every device."""
    import numpy as np

    from reshard.casting import reference_cast
    from reshard.dtypes import Cast, ScaleMode, parse_dtype
    from reshard.runtime import Runtime

    src = alpa.to_layout([[2], [2]], [ShardedAxis(0), ShardedAxis(1)], devices=range(4))
    dst = alpa.to_layout([None, [4]], [Replicated(1), ShardedAxis(0)], devices=range(4, 8))
    x = (np.random.default_rng(1).standard_normal((256, 384)) * 20).astype(parse_dtype(dtype))
    want, want_scales = reference_cast(x, Cast(cast or dtype, ScaleMode.parse(scale)))
    with Runtime("local") as rt:
        y = rt.reshard(rt.put(x, src), dst, cast=cast, scale=scale)
        got = rt.get(y)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        if scale is not None:
            assert np.array_equal(rt.get(y.scales), want_scales)
