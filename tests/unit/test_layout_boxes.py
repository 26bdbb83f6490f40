"""Layout.boxes (reshard/core/layout.py): each dim's bounds split once per distinct
combination of its axes' coordinates, equal to splitting per device."""

from __future__ import annotations

import random

import pytest

from reshard import DeviceMesh, Layout
from reshard.core.errors import ReshardError
from reshard.core.layout import flat_bounds, nested_bounds
from reshard.core.spec import SplitRule


def _per_device(layout: Layout, shape: tuple[int, ...]) -> dict[int, tuple]:
    split = flat_bounds if layout.spec.rule is SplitRule.FLAT else nested_bounds
    return {dev: tuple(split(n, tuple((layout.mesh.shape[a], coords[a]) for a in axes))
                       for n, axes in zip(shape, layout.spec.dims))
            for coords, dev in layout.mesh.iter_coords()}


SPECS = ["R", "S0", "S01", "S10", "RR", "S0R", "RS1", "S0S1", "S1S0", "S01R", "RS10",
         "S01R:nested", "RS10:nested", "S012", "S210:nested", "S2R", "S0S2", "RR+P0",
         "S0R+P1", "RRR", "S0S1S2", "S01S2:nested"]


@pytest.mark.parametrize("mesh_shape", [(8,), (2, 4), (3, 3), (1, 5), (2, 2, 2), (3, 1, 2)])
def test_boxes_equal_splitting_per_device(mesh_shape):
    rng = random.Random(hash(mesh_shape) & 0xFFFF)
    ndev = 1
    for x in mesh_shape:
        ndev *= x
    mesh = DeviceMesh(mesh_shape, rng.sample(range(100), ndev))
    checked = 0
    for spec in SPECS:
        try:
            layout = Layout(mesh, spec)
        except ReshardError:
            continue  # the spec names an axis this mesh lacks
        for _ in range(6):
            shape = tuple(rng.randint(0, 23) for _ in layout.spec.dims)
            got, want = layout.boxes(shape), _per_device(layout, shape)
            assert got == want and list(got) == list(want)
            checked += 1
    assert checked >= 30


def test_boxes_meet_equals_the_overlap_of_every_dim():
    from reshard.core.layout import boxes_meet

    rng = random.Random(3)
    for _ in range(3000):
        ndim = rng.randint(0, 3)
        a = tuple(tuple(sorted(rng.choices(range(6), k=2))) for _ in range(ndim))
        b = tuple(tuple(sorted(rng.choices(range(6), k=2))) for _ in range(ndim))
        want = all(max(p, r) < min(q, s) for (p, q), (r, s) in zip(a, b))
        assert boxes_meet(a, b) == want
