"""The adapters' one shape (issue 46): every adapter module offers ``to_layout`` (its
system's sharding to a reshard Layout) and ``from_layout`` (back), the native names
kept as aliases; alpa's pair round-trips (the others' are exercised by their own
tests under the native names)."""

from __future__ import annotations

import importlib

import pytest

import reshard

NATIVE = {"reshard.adapters.alpa": None, "reshard.adapters.jax": "to_sharding",
          "reshard.adapters.dtensor": "to_placements"}


@pytest.mark.parametrize("name", sorted(NATIVE))
def test_each_adapter_has_to_layout_and_from_layout(name):
    needs = {"reshard.adapters.jax": "jax", "reshard.adapters.dtensor": "torch"}.get(name)
    if needs:
        pytest.importorskip(needs)
    mod = importlib.import_module(name)
    assert callable(mod.to_layout) and callable(mod.from_layout)
    assert {"to_layout", "from_layout"} <= set(mod.__all__)
    if NATIVE[name]:
        assert mod.from_layout is getattr(mod, NATIVE[name])


def test_alpa_round_trips_through_the_common_names():
    from reshard.adapters import alpa

    layout = reshard.Layout(reshard.DeviceMesh((2, 2), range(4)), "S0S1")
    spec = alpa.from_layout(layout)
    back = alpa.to_layout(spec.sharding, spec.mesh_mapping, range(4))
    assert back.boxes((8, 6)) == layout.boxes((8, 6))
