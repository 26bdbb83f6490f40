"""DTensor adapter: layouts exact against DTensor's own index computations.

The oracle is torch's ``compute_local_shape_and_global_offset`` called on a real torch
``DeviceMesh`` made for each rank in turn (``_init_backend=False, _rank=r``: no process
group, the coordinate comes from the mesh tensor exactly as in a running job).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.tensor")

from torch.distributed.device_mesh import DeviceMesh as TorchMesh
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor._utils import (
    compute_local_shape_and_global_offset,
)
from torch.distributed.tensor.placement_types import _StridedShard

import reshard
from reshard.adapters import dtensor
from reshard.spec import SplitRule


def _mesh(ranks: np.ndarray, rank: int, names=None) -> TorchMesh:
    return TorchMesh("cpu", torch.tensor(ranks), mesh_dim_names=names,
                     _init_backend=False, _rank=rank)


def _check_against_dtensor(ranks: np.ndarray, placements, shape) -> None:
    layout = dtensor.to_layout(_mesh(ranks, int(ranks.flat[0])), placements, shape)
    im = layout.index_map(shape)
    assert set(im) == set(ranks.ravel().tolist())
    for r in ranks.flat:
        size, offset = compute_local_shape_and_global_offset(shape, _mesh(ranks, int(r)),
                                                             placements)
        got = im[int(r)]
        assert tuple(s.stop - s.start for s in got) == tuple(size), (placements, shape, r)
        for d, s in enumerate(got):
            if size[d]:  # DTensor reports an empty shard's offset as the dim's end
                assert s.start == offset[d], (placements, shape, r, d)


def _random_case(rng: np.random.Generator):
    mesh_shape = tuple(int(rng.integers(1, 5)) for _ in range(rng.integers(1, 4)))
    n = int(np.prod(mesh_shape))
    pool = rng.permutation(64)[:n] if rng.random() < 0.5 else np.arange(n)  # any ranks
    ranks = pool.reshape(mesh_shape)
    rank = int(rng.integers(1, 4))
    kinds = [lambda: Shard(int(rng.integers(0, rank))), Replicate, Partial]
    placements = [kinds[int(rng.choice(3, p=[0.6, 0.25, 0.15]))]() for _ in mesh_shape]
    shape = tuple(int(rng.integers(0, 14)) for _ in range(rank))
    return ranks, placements, shape


def test_random_layouts_match_dtensor():
    rng = np.random.default_rng(2013)
    uneven_nested = 0
    for _ in range(400):
        ranks, placements, shape = _random_case(rng)
        _check_against_dtensor(ranks, placements, shape)
        dims = [p.dim for p in placements if isinstance(p, Shard)]
        for d in set(dims):
            k = int(np.prod([ranks.shape[a] for a, p in enumerate(placements)
                             if isinstance(p, Shard) and p.dim == d]))
            if dims.count(d) > 1 and shape[d] % k:
                uneven_nested += 1
    assert uneven_nested >= 40  # the cases where the nested rule matters are covered


@pytest.mark.parametrize("mesh_shape,placements,shape", [
    ((2, 2), [Shard(1), Shard(1)], (2, 5)),  # the issue's example: columns 0:2 2:3 3:4 4:5
    ((2, 3), [Shard(0), Shard(0)], (7,)),
    ((3, 2, 2), [Shard(0), Shard(0), Shard(0)], (10, 3)),
    ((2, 4), [Shard(0), Partial()], (5, 3)),
    ((4,), [Shard(0)], (3,)),  # empty trailing shard
])
def test_uneven_nested_cases(mesh_shape, placements, shape):
    _check_against_dtensor(np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape),
                           placements, shape)


def test_issue_example_columns_and_rule():
    lay = dtensor.to_layout(_mesh(np.arange(4).reshape(2, 2), 0), [Shard(1), Shard(1)])
    assert lay.spec.rule is SplitRule.NESTED and str(lay.spec) == "RS01:nested"
    cols = [lay.index_map((2, 5))[r][1] for r in range(4)]
    assert [(c.start, c.stop) for c in cols] == [(0, 2), (2, 3), (3, 4), (4, 5)]


def test_mesh_ranks_names_and_partial():
    ranks = np.array([[7, 3], [5, 1]])
    lay = dtensor.to_layout(_mesh(ranks, 7, ("dp", "tp")), [Partial(), Shard(0)], (4, 4))
    assert lay.mesh.devices == (7, 3, 5, 1) and lay.mesh.axis_names == ("dp", "tp")
    assert lay.spec.partial == (0,) and str(lay.spec) == "S1R+P0"
    assert len(dtensor.to_layout(_mesh(ranks, 7), [Shard(-1), Replicate()], 3).spec.dims) == 3


def test_placements_round_trip():
    rng = np.random.default_rng(7)
    for _ in range(100):
        ranks, placements, shape = _random_case(rng)
        lay = dtensor.to_layout(_mesh(ranks, int(ranks.flat[0])), placements, shape)
        assert dtensor.to_placements(lay) == tuple(placements)


def test_flat_layout_has_no_placements_unless_nested():
    lay = reshard.Layout(reshard.DeviceMesh((2, 2)), "S01")
    with pytest.raises(reshard.SpecError, match="S01:nested"):
        dtensor.to_placements(lay)
    nested = reshard.Layout(lay.mesh, lay.spec.with_rule("nested"))
    assert dtensor.to_placements(nested) == (Shard(0), Shard(0))


@pytest.mark.parametrize("make,needles", [
    (lambda m: dtensor.to_layout(m, [Shard(0)]), ["needs 2 placements", "got 1"]),
    (lambda m: dtensor.to_layout(m, [Partial("avg"), Replicate()]), ["'avg'", "sum"]),
    (lambda m: dtensor.to_layout(m, [Shard(3), Replicate()], (4, 4)), ["dim 3", "rank-2"]),
    (lambda m: dtensor.to_layout(m, [_StridedShard(0, split_factor=2), Shard(0)]),
     ["shape="]),
    (lambda m: dtensor.to_layout(m, [_StridedShard(0, split_factor=2), Shard(0)], (6,)),
     ["divisible by 4", "equal to 6"]),
    (lambda m: dtensor.to_layout(m, [_StridedShard(0, split_factor=3), Shard(0)], (8,)),
     ["split_factor", "here 2"]),
    (lambda m: dtensor.to_layout(object(), [Shard(0)]), ["DeviceMesh", "object"]),
])
def test_errors(make, needles):
    with pytest.raises(reshard.SpecError) as e:
        make(_mesh(np.arange(4).reshape(2, 2), 0))
    for n in needles:
        assert n in str(e.value)


def _dtensor_split(shape, ranks, placements, rank):
    """The block of a global arange that ``rank`` holds, by DTensor's own splitting
    (each placement's ``_split_tensor`` left to right, as distribute_tensor does)."""
    coord = [int(c[0]) for c in np.nonzero(ranks == rank)]
    t = torch.arange(int(np.prod(shape))).reshape(shape)
    for size, p, c in zip(ranks.shape, placements, coord):
        if isinstance(p, (Shard, _StridedShard)):
            pieces, _ = p._split_tensor(t, size, with_padding=False)
            t = pieces[c] if c < len(pieces) else t.narrow(p.dim, 0, 0)
    return t


@pytest.mark.parametrize("mesh_shape,placements,shape", [
    ((2, 2), [_StridedShard(0, split_factor=2), Shard(0)], (8, 3)),  # FSDP2 + TP
    ((2, 3), [_StridedShard(1, split_factor=3), Shard(1)], (2, 12)),
    ((2, 2, 2), [Shard(0), _StridedShard(0, split_factor=2), Shard(0)], (16,)),
    ((3, 2), [_StridedShard(0, split_factor=2), Shard(0)], (6, 4)),
])
def test_strided_shard_as_reordering(mesh_shape, placements, shape):
    ranks = np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape)
    lay = dtensor.to_layout(_mesh(ranks, 0), placements, shape)
    values = torch.arange(int(np.prod(shape))).reshape(shape)
    for r, sl in lay.index_map(shape).items():
        assert torch.equal(values[sl], _dtensor_split(shape, ranks, placements, r)), r
