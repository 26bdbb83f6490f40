"""JAX adapter: layouts equal to ``NamedSharding.devices_indices_map``, and arrays moved
through a reshard plan equal to ``jax.device_put``. Skipped without jax."""

from __future__ import annotations

import os

import numpy as np
import pytest

# 8 host devices; read when JAX first initialises its CPU backend (jax.devices()).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
jax = pytest.importorskip("jax")

from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import reshard
from reshard.adapters import jax as rj
from reshard.spec import SplitRule

NAMES = ("a", "b", "c")


@pytest.fixture(scope="module")
def devices():
    devs = jax.devices()
    if len(devs) < 8:
        pytest.skip(f"needs 8 JAX CPU devices, got {len(devs)} (jax initialised before "
                    f"XLA_FLAGS was set)")
    return np.array(devs[:8], dtype=object)


def _random_sharding(rng: np.random.Generator, devices: np.ndarray, rank: int):
    """A random mesh over a random subset of the 8 devices and a random PartitionSpec:
    each mesh axis splits a random dim (random major/minor order) or none."""
    shape = [int(rng.choice([1, 2, 4])) for _ in range(rng.integers(1, 4))]
    while np.prod(shape) > 8:
        shape[int(rng.integers(len(shape)))] = 1
    n = int(np.prod(shape))
    mesh = Mesh(rng.permutation(devices)[:n].reshape(shape), NAMES[:len(shape)])
    entries: list[list[str]] = [[] for _ in range(rank)]
    for axis in rng.permutation(len(shape)):
        if rng.random() < 0.7:
            entries[int(rng.integers(rank))].append(NAMES[axis])
    spec = [None if not e else e[0] if len(e) == 1 and rng.random() < 0.5 else tuple(e)
            for e in entries]
    while spec and spec[-1] is None and rng.random() < 0.5:  # trailing dims implied
        spec.pop()
    return NamedSharding(mesh, P(*spec))


def _boxes_of(index_map, shape):
    """``{device id: ((start, stop), ...)}`` with JAX's ``slice(None)`` made explicit."""
    return {d.id: tuple(s.indices(n)[:2] for s, n in zip(sl, shape))
            for d, sl in index_map.items()}


def _layout_boxes(layout, shape):
    return {d: tuple((s.start, s.stop) for s in sl) for d, sl in layout.index_map(shape).items()}


def test_layouts_match_devices_indices_map(devices):
    rng = np.random.default_rng(9)
    even = uneven = 0
    for _ in range(300):
        rank = int(rng.integers(1, 4))
        s = _random_sharding(rng, devices, rank)
        shape = tuple(int(rng.integers(0, 4)) * int(rng.choice([1, 2, 4, 8]))
                      + int(rng.random() < 0.2) for _ in range(rank))
        try:
            want = _boxes_of(s.devices_indices_map(shape), shape)
        except ValueError as e:  # JAX refuses uneven tiles: so must we
            assert "divide" in str(e)
            with pytest.raises(reshard.ShapeError, match="divisible"):
                rj.to_layout(s, shape)
            uneven += 1
            continue
        layout = rj.to_layout(s, shape)
        assert layout.spec.rule is SplitRule.FLAT
        assert _layout_boxes(layout, shape) == want, (s, shape)
        even += 1
    assert even >= 200 and uneven >= 20


def test_to_sharding_round_trip(devices):
    rng = np.random.default_rng(11)
    for _ in range(150):
        rank = int(rng.integers(1, 4))
        s = _random_sharding(rng, devices, rank)
        shape = tuple(8 * int(rng.integers(1, 3)) for _ in range(rank))
        layout = rj.to_layout(s, shape)
        for back in (rj.to_sharding(layout, s.mesh), rj.to_sharding(layout)):
            assert _boxes_of(back.devices_indices_map(shape), shape) == _boxes_of(
                s.devices_indices_map(shape), shape)
            assert rj.to_layout(back, shape) == layout


def test_nested_layout_gives_the_same_even_tiles(devices):
    mesh = Mesh(devices.reshape(2, 4), ("a", "b"))
    layout = reshard.Layout(rj.mesh_of(mesh), "S10R:nested")
    s = rj.to_sharding(layout, mesh)
    assert s.spec == P(("b", "a"), None)
    assert _boxes_of(s.devices_indices_map((16, 3)), (16, 3)) == _layout_boxes(layout, (16, 3))


def test_unreduced_is_partial(devices):
    mesh = Mesh(devices.reshape(2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
    s = NamedSharding(mesh, P("a", None, unreduced={"b"}))
    layout = rj.to_layout(s, (4, 3))
    assert str(layout.spec) == "S0R+P1"
    assert rj.to_sharding(layout, mesh).spec == s.spec


@pytest.mark.parametrize("make,exc,needles", [
    (lambda m: rj.to_layout(NamedSharding(m, P(None, P.UNCONSTRAINED))), reshard.SpecError,
     ["UNCONSTRAINED"]),
    (lambda m: rj.to_layout(NamedSharding(m, P("a")), (5, 2)), reshard.ShapeError,
     ["divisible by 2", "equal to 5", "(5, 2)"]),
    (lambda m: rj.to_layout(object()), reshard.SpecError, ["object", "NamedSharding"]),
    (lambda m: rj.to_sharding(reshard.Layout(reshard.DeviceMesh((8,)), "S0"), m),
     reshard.SpecError, ["does not match"]),
    (lambda m: rj.to_sharding(reshard.Layout(reshard.DeviceMesh((2,), devices=[3, 99]), "S0")),
     reshard.SpecError, ["[99]"]),
])
def test_errors(devices, make, exc, needles):
    with pytest.raises(exc) as e:
        make(Mesh(devices.reshape(2, 4), ("a", "b")))
    for n in needles:
        assert n in str(e.value)


def test_reshard_array_equals_device_put(devices, local_runtime):
    rng = np.random.default_rng(5)
    for i in range(40):
        rank = int(rng.integers(1, 4))
        src = _random_sharding(rng, devices, rank)
        dst = _random_sharding(rng, devices, rank)
        shape = tuple(8 * int(rng.integers(1, 4)) for _ in range(rank))
        dtype = [np.float32, np.int32, np.float64][i % 3]
        x = jax.device_put(rng.integers(-99, 99, size=shape).astype(dtype), src)
        strategy = ("broadcast", "send_recv", "allgather")[i % 3]
        y = rj.reshard_array(x, dst, strategy=strategy, runtime=local_runtime)
        want = jax.device_put(x, dst)
        assert y.sharding == want.sharding and y.dtype == want.dtype
        got = {s.device.id: np.asarray(s.data) for s in y.addressable_shards}
        for s in want.addressable_shards:
            assert np.array_equal(got[s.device.id], np.asarray(s.data)), (src, dst, shape)
    assert local_runtime.loaded_plans >= 1


def test_reshard_array_own_runtime_other_devices(devices):
    first = Mesh(devices[:4].reshape(2, 2), ("a", "b"))
    second = Mesh(devices[4:].reshape(4,), ("x",))
    x = jax.device_put(np.arange(8 * 6, dtype=np.float32).reshape(8, 6),
                       NamedSharding(first, P(("b", "a"))))
    y = rj.reshard_array(x, NamedSharding(second, P(None, None)))
    assert {s.device.id for s in y.addressable_shards} == {4, 5, 6, 7}
    assert np.array_equal(np.asarray(y), np.asarray(x))


def test_reshard_array_is_device_put_where_jax_can(devices, monkeypatch):
    """Every device here and no reshard option: JAX moves it (no Runtime, no host
    copy); a reshard option (strategy, runtime, cast) or a partial source runs a plan."""
    import reshard.runtime

    first = Mesh(devices[:4].reshape(2, 2), ("a", "b"))
    second = Mesh(devices[2:6].reshape(2, 2), ("a", "b"))  # overlapping
    x = jax.device_put((np.arange(64 * 32) % 200).astype(np.float32).reshape(64, 32),
                       NamedSharding(first, P("a", "b")))  # bf16 holds these exactly
    dst = NamedSharding(second, P("b", "a"))
    made = []
    real = reshard.runtime.Runtime
    monkeypatch.setattr(reshard.runtime, "Runtime",
                        lambda *a, **k: made.append(1) or real(*a, **k))
    y = rj.reshard_array(x, dst)
    assert not made and y.sharding == dst
    assert np.array_equal(np.asarray(y), np.asarray(x))
    for options in ({"strategy": "broadcast"}, {"cast": "bfloat16"}):
        z = rj.reshard_array(x, dst, **options)
        assert np.array_equal(np.asarray(z).astype(np.float32), np.asarray(x))
    assert len(made) == 2
    unreduced = NamedSharding(Mesh(devices[:4].reshape(2, 2), ("a", "b"),
                                   axis_types=(AxisType.Explicit,) * 2),
                              P("a", None, unreduced={"b"}))
    assert not rj._jax_moves_it(x, unreduced) and not rj._jax_moves_it(
        jax.device_put(np.zeros((4, 4), np.float32), unreduced), dst)


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16"])
def test_reshard_array_narrow_dtypes_equal_device_put(devices, local_runtime, dtype):
    """JAX's default training dtype (bfloat16) and the float8 kinds: bit for bit what
    ``jax.device_put`` gives, over random shardings."""
    jnp = pytest.importorskip("jax.numpy")
    rng = np.random.default_rng(len(dtype))
    for i in range(12):
        rank = int(rng.integers(1, 4))
        src = _random_sharding(rng, devices, rank)
        dst = _random_sharding(rng, devices, rank)
        shape = tuple(8 * int(rng.integers(1, 4)) for _ in range(rank))
        x = jax.device_put(jnp.asarray(rng.standard_normal(shape) * 30, getattr(jnp, dtype)),
                           src)
        y = rj.reshard_array(x, dst, strategy=("broadcast", "send_recv", "allgather")[i % 3],
                             runtime=local_runtime)
        want = jax.device_put(x, dst)
        assert y.sharding == want.sharding and y.dtype == want.dtype == x.dtype
        got = {s.device.id: np.asarray(s.data) for s in y.addressable_shards}
        for s in want.addressable_shards:
            assert got[s.device.id].tobytes() == np.asarray(s.data).tobytes(), (src, dst)


@pytest.mark.parametrize("cast, scale", [("bfloat16", None), ("float8_e4m3fn", "tensor"),
                                         ("float8_e4m3fn", "block128")])
def test_reshard_array_casts(devices, local_runtime, cast, scale):
    """A cast on the wire through the JAX adapter: the values (and scales, a float32
    array on the destination mesh) equal the numpy reference bit for bit."""
    jnp = pytest.importorskip("jax.numpy")
    from reshard.casting import reference_cast
    from reshard.dtypes import Cast, ScaleMode

    src = NamedSharding(Mesh(devices[:4].reshape(2, 2), ("a", "b")), P("a", "b"))
    dst = NamedSharding(Mesh(devices[4:].reshape(2, 2), ("x", "y")), P("y", None))
    base = jnp.float32 if cast == "bfloat16" else jnp.bfloat16
    x = jax.device_put(jnp.asarray(np.random.default_rng(2).standard_normal((384, 256)) * 9,
                                   base), src)
    out = rj.reshard_array(x, dst, runtime=local_runtime, cast=cast, scale=scale)
    want, want_scales = reference_cast(np.asarray(x), Cast(cast, ScaleMode.parse(scale)))
    values = out if scale is None else out[0]
    assert values.sharding == dst and str(values.dtype) == cast
    assert np.asarray(values).tobytes() == want.tobytes()
    if scale is not None:
        scales = out[1]
        assert scales.dtype == np.float32 and scales.sharding.mesh == dst.mesh
        assert np.array_equal(np.asarray(scales), want_scales)


def test_the_side_by_side_benchmark_runs(devices, capsys):
    """microbench/jax_side.py, shrunk: every case's results equal device_put's."""
    from reshard.microbench import jax_side

    assert jax_side.main(["--scale", "0.005", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count(" yes") == len(jax_side.CASES) and "worst ratio" in out


def test_a_process_move_refuses_a_process_of_several_devices(devices):
    """ProcessMove runs one reshard rank per JAX process: a process holding several of
    the shardings' devices is refused before any plan is exchanged."""
    class Rank:
        device = int(devices[0].id)

        def load_request(self, *args, **kwargs):
            raise AssertionError("refused before planning")

    mesh = Mesh(devices[:4].reshape(2, 2), ("a", "b"))
    src, dst = NamedSharding(mesh, P("a", "b")), NamedSharding(mesh, P("b", "a"))
    with pytest.raises(reshard.ReshardError, match="one reshard rank per JAX process"):
        rj.ProcessMove(Rank(), (8, 8), np.float32, src, dst)

