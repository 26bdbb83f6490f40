"""DTensor redistribute across meshes, on 8 gloo ranks, against torch's own placement.

Every case draws a global tensor, a source mesh and placements (Shard / Replicate /
Partial, uneven nested splits included) and a destination mesh (disjoint from or
overlapping the source) with placements. Source shards come from DTensor's own
``compute_local_shape_and_global_offset`` (Partial: random addends summing to the
value); every result is checked against the global value the same way, the result's
full_tensor() (DTensor's own all-gather) on some cases, and the non-members' empty
local tensors.
"""

from __future__ import annotations

import functools
import traceback

import numpy as np
import pytest

from reshard.dtypes import summable, torch_of_numpy

from ..common import sample
from ._helpers import rank_results
from .test_executor import init_gloo

pytestmark = pytest.mark.cpu

torch = pytest.importorskip("torch")

WORLD = 8
DTYPES = ("float32", "int64", "float64", "int32", "bfloat16", "float8_e4m3fn")
NARROW = ("bfloat16", "float8_e4m3fn")


def _placements(rng: np.random.Generator, mesh_ndim: int, ndim: int, partial: bool) -> list:
    out = []
    for _ in range(mesh_ndim):
        kinds = ["S", "S", "R"] + (["P"] if partial else [])
        k = kinds[rng.integers(len(kinds))] if ndim else "R"
        out.append(("S", int(rng.integers(ndim))) if k == "S" else (k,))
    return out


def _mesh(rng: np.random.Generator, pool: list[int]) -> tuple[list[int], tuple[int, ...]]:
    size = int(rng.integers(1, min(4, len(pool)) + 1))
    ranks = [int(r) for r in rng.permutation(pool)[:size]]
    shape = (size,) if size in (1, 3) or rng.random() < 0.5 else (2, size // 2)
    return ranks, shape


def make_cases(count: int, seed: int = 7) -> list[dict]:
    """Random cases, the same on every rank (drawn once by the test)."""
    rng = np.random.default_rng(seed)
    cases = [  # DTensor's documented uneven nested split, and a Partial source
        {"shape": (2, 5), "dtype": "float32", "src": ([0, 1, 2, 3], (2, 2)),
         "src_pl": [("S", 1), ("S", 1)], "dst": ([4, 5, 6], (3,)), "dst_pl": [("S", 1)]},
        {"shape": (7, 3), "dtype": "int64", "src": ([0, 1, 2, 3], (2, 2)),
         "src_pl": [("P",), ("S", 0)], "dst": ([2, 3, 4, 5], (2, 2)),
         "dst_pl": [("S", 0), ("S", 0)]},
    ]
    while len(cases) < count:
        ndim = int(rng.integers(1, 4))
        shape = tuple(int(n) for n in rng.integers(0, 10, size=ndim))
        dtype = DTYPES[rng.integers(len(DTYPES))]
        src = _mesh(rng, list(range(WORLD)))
        overlap = rng.random() < 0.5
        rest = [r for r in range(WORLD) if r not in src[0]]
        dst = _mesh(rng, list(range(WORLD)) if overlap or not rest else rest)
        cases.append({"shape": shape, "dtype": dtype, "src": src, "dst": dst,
                      "src_pl": _placements(rng, len(src[1]), ndim, summable(dtype)),
                      "dst_pl": _placements(rng, len(dst[1]), ndim, False)})
    return cases


def _torch_placements(spec: list) -> list:
    from torch.distributed.tensor import Partial, Replicate, Shard

    return [Shard(p[1]) if p[0] == "S" else Replicate() if p[0] == "R" else Partial()
            for p in spec]


def _value(k: int, shape: tuple[int, ...], dtype: str):
    rng = np.random.default_rng(1000 + k)
    if dtype in NARROW:  # small integers, exact in bfloat16 (rounded in float8)
        return torch.from_numpy(sample(rng, shape, "float32")).to(getattr(torch, dtype))
    return torch.from_numpy(sample(rng, shape, dtype))


def _same(a, b) -> bool:
    """Equal bits (float8 has no torch.equal on CPU; NaNs compare by bits)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return not a.numel() or torch.equal(a.contiguous().view(torch.uint8),
                                        b.contiguous().view(torch.uint8))


def _dtensor_of(full, mesh, placements, rank: int):
    """A DTensor of ``full`` (this rank's piece by DTensor's rule)."""
    from torch.distributed.tensor import DTensor

    local = _slice(full, mesh, placements, rank)
    return DTensor.from_local(full.new_empty(0) if local is None else local.clone(), mesh,
                              placements, run_check=False, shape=full.shape,
                              stride=full.stride())


def _slice(full, mesh, placements, rank: int):
    """``rank``'s local piece by DTensor's own rule (None off the mesh)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if rank not in mesh.mesh.flatten().tolist():
        return None
    shape, offset = compute_local_shape_and_global_offset(full.shape, mesh, placements)
    return full[tuple(slice(o, o + n) for o, n in zip(offset, shape))]


def state_dict_50(a, b, rd, device: int) -> int:
    """SPMD ``redistribute_many`` of a 50-tensor state dict from mesh ``a`` (Shard on
    alternating dims) to ``b`` (Shard(1), Replicate()), every piece checked against
    DTensor's own slice; returns how many pieces this rank holds."""
    from torch.distributed.tensor import Replicate, Shard

    from reshard.adapters.dtensor_redistribute import redistribute_many

    fulls = [_value(500 + i, (4 + i % 7, 3 + i % 5), "float32") for i in range(50)]
    state = {f"t{i}": _dtensor_of(f, a, [Shard(i % 2)], device) for i, f in enumerate(fulls)}
    out = redistribute_many(state, b, [Shard(1), Replicate()], redistributor=rd)
    checked = 0
    for i, f in enumerate(fulls):
        want = _slice(f, b, [Shard(1), Replicate()], device)
        got = out[f"t{i}"].to_local()
        assert (got.numel() == 0) if want is None else torch.equal(got, want), i
        checked += want is not None
    return checked


def refuses_another_shape(a, b, rd, device: int, odd: int) -> bool:
    """Rank ``odd`` gives ``redistribute`` another shape than its peers: whether this
    rank's call was refused with the PlanError naming it (every rank's is)."""
    from torch.distributed.tensor import Replicate, Shard

    import reshard
    from reshard.adapters.dtensor_redistribute import redistribute

    wrong = (13 if device == odd else 12, 8)
    x = _dtensor_of(_value(600, wrong, "float32"), a, [Shard(0)], device)
    try:
        redistribute(x, b, [Shard(1), Replicate()], redistributor=rd)
    except reshard.PlanError as e:
        text = str(e)
        assert "ranks disagree" in text and f"devices [{odd}]" in text, text
        assert "requests differ" in text, text
        return True
    return False


def _source_local(k: int, full, mesh, placements, rank: int):
    """The source local tensor: DTensor's piece; on Partial mesh dims random addends
    (every member but the one at coordinate 0 adds noise, which it subtracts)."""
    piece = _slice(full, mesh, placements, rank)
    if piece is None:
        return full.new_empty(0)
    partial = [i for i, p in enumerate(placements) if p.is_partial()]
    if not partial:
        return piece.clone()
    coord = mesh.get_coordinate()
    ranks = mesh.mesh.numpy()
    members = [int(ranks[idx]) for idx in np.ndindex(ranks.shape)  # differ on Partial dims only
               if all(idx[i] == coord[i] for i in range(ranks.ndim) if i not in partial)]

    def noise(r: int):
        g = np.random.default_rng(10_000 * k + r)
        return torch_of_numpy(sample(g, tuple(piece.shape), str(full.dtype)[6:]))

    if rank != members[0]:
        return noise(rank)
    out = piece.clone()
    for r in members[1:]:
        out -= noise(r)
    return out


def _rank_main(cases: list[dict], device: int, address, results, done) -> None:
    try:
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh

        from reshard.adapters.dtensor_redistribute import Redistributor

        init_gloo(device, address, WORLD)
        meshes: dict = {}

        def mesh(spec):
            key = (tuple(spec[0]), spec[1])
            if key not in meshes:  # every rank makes every mesh (new_group is world-wide)
                meshes[key] = DeviceMesh("cpu", torch.tensor(spec[0]).reshape(spec[1]))
            return meshes[key]

        checked = _check_cases(cases, mesh, device)
        rd = Redistributor()
        a = mesh(([0, 1, 2, 3], (4,)))
        b = mesh(([4, 5, 6, 7], (2, 2)))
        _check_state_dict(a, b, rd, device)
        _check_narrow_dtypes(a, rd, device)
        _check_fp8_engine(a, b, rd, device)
        _check_mixed_rules(a, b, rd, device)
        # SPMD: a 50-tensor state dict, planned on every rank (digests compared), exact
        checked += state_dict_50(a, b, rd, device)
        _check_refusal(a, b, rd, device)
        rd.close()
        results.put((device, {"checked": checked}))
        done.wait(60)  # rank 0 hosts the store: it stays until every rank is done
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((device, traceback.format_exc()))


def _check_cases(cases: list[dict], mesh, device: int) -> int:
    """Every random case moved by redistribute, each rank's shard exact; how many
    shards were checked."""
    from torch.distributed.tensor import DTensor

    from reshard.adapters.dtensor_redistribute import redistribute

    checked = 0
    for k, c in enumerate(cases):
        src, dst = mesh(c["src"]), mesh(c["dst"])
        spl, dpl = _torch_placements(c["src_pl"]), _torch_placements(c["dst_pl"])
        full = _value(k, c["shape"], c["dtype"])
        x = DTensor.from_local(_source_local(k, full, src, spl, device), src, spl,
                               run_check=False, shape=full.shape, stride=full.stride())
        y = redistribute(x, dst, dpl, strategy=("broadcast", "send_recv", "allgather")[k % 3])
        assert y.device_mesh is dst and tuple(y.placements) == tuple(dpl), k
        assert y.shape == full.shape and y.dtype == full.dtype, k
        want = _slice(full, dst, dpl, device)
        got = y.to_local()
        if want is None:
            assert got.numel() == 0, (k, got.shape)
            continue
        assert _same(got, want), f"case {k} {c}: rank {device}\n{got}\n!=\n{want}"
        checked += 1
        if k % 4 == 0 and c["dst"][0] == sorted(c["dst"][0]):
            # DTensor's own all-gather agrees (a collective of dst's ranks; torch 2.13
            # gathers wrong on meshes whose ranks are not in ascending order)
            assert _same(y.full_tensor(), full), k
    return checked


def _check_state_dict(a, b, rd, device: int) -> None:
    """A state dict as one plan; the repeated call reuses the loaded plan."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from reshard.adapters.dtensor_redistribute import redistribute_many

    state = {}
    fulls = {}
    for i, (name, shape, dt) in enumerate([("w1", (9, 6), torch.float32),
                                           ("w2", (6, 9), torch.bfloat16),
                                           ("b", (5,), torch.float64)]):
        fulls[name] = _value(100 + i, shape, "float32").to(dt)
        local = _slice(fulls[name], a, [Shard(0)], device)
        state[name] = DTensor.from_local(
            fulls[name].new_empty(0) if local is None else local.clone(), a, [Shard(0)],
            run_check=False, shape=fulls[name].shape, stride=fulls[name].stride())
    place = {"w1": [Replicate(), Shard(0)], "w2": [Replicate(), Shard(1)],
             "b": [Replicate(), Replicate()]}
    for _ in range(2):
        out = redistribute_many(state, b, place, redistributor=rd)
        assert set(out) == set(state)
        for name, y in out.items():
            want = _slice(fulls[name], b, place[name], device)
            if want is None:
                assert y.to_local().numel() == 0
            else:
                assert torch.equal(y.to_local(), want), name
    assert (rd.misses, rd.hits) == (1, 1), (rd.misses, rd.hits)


def _check_narrow_dtypes(a, rd, device: int) -> None:
    """bf16 / fp8 on one mesh: what DTensor's own redistribute gives (its gloo
    all-to-all refuses float8, "Invalid scalar type": it moves fp8's bytes there)."""
    from torch.distributed.tensor import Shard

    from reshard.adapters.dtensor_redistribute import redistribute

    for k, tdt in enumerate((torch.bfloat16, torch.float8_e4m3fn)):
        full = _value(300 + k, (12, 8), "float32").to(tdt)
        x = _dtensor_of(full, a, [Shard(0)], device)
        ours = redistribute(x, a, [Shard(1)], redistributor=rd)
        if tdt == torch.bfloat16:
            theirs = x.redistribute(a, [Shard(1)]).to_local()
        else:
            as_bytes = _dtensor_of(full.view(torch.uint8), a, [Shard(0)], device)
            theirs = as_bytes.redistribute(a, [Shard(1)]).to_local().view(tdt)
        assert ours.dtype == tdt and _same(ours.to_local(), theirs), tdt


def _check_fp8_engine(a, b, rd, device: int) -> None:
    """A bf16 trainer to an fp8 engine: values and 128 x 128 block scales, the
    reference's."""
    from torch.distributed.tensor import Replicate, Shard

    from reshard.adapters.dtensor_redistribute import redistribute_many
    from reshard.casting import reference_cast
    from reshard.dtypes import Cast, ScaleMode, numpy_of_torch

    weights = {"w": _value(400, (300, 260), "float32").to(torch.bfloat16),
               "v": _value(401, (256, 512), "float32").to(torch.bfloat16)}
    state = {n: _dtensor_of(w, a, [Shard(0)], device) for n, w in weights.items()}
    out = redistribute_many(state, b, [Replicate(), Shard(1)], cast="float8_e4m3fn",
                            scale="block128", redistributor=rd)
    for n, (q, sc) in out.items():
        ref_q, ref_s = reference_cast(numpy_of_torch(weights[n]),
                                      Cast("float8_e4m3fn", ScaleMode.BLOCK128))
        assert q.dtype == torch.float8_e4m3fn and sc.dtype == torch.float32, n
        assert sc.device_mesh is b and sc.shape == ref_s.shape, n
        for got, ref, pl in ((q, ref_q, [Replicate(), Shard(1)]),
                             (sc, ref_s, list(sc.placements))):
            want = _slice(torch_of_numpy(ref), b, pl, device)
            if want is None:
                assert got.to_local().numel() == 0, n
            else:
                assert _same(got.to_local(), want), (n, pl)


def _check_mixed_rules(a, b, rd, device: int) -> None:
    """A real state dict's mix in one plan (issue 44): matrices to fp8 with block
    scales, biases and norms (rank 1) as bf16, by a rule per tensor; a blanket
    block128 on the rank-1 ones is refused naming the tensor and the rule."""
    from torch.distributed.tensor import Replicate, Shard

    from reshard import DTypeError
    from reshard.adapters.dtensor_redistribute import redistribute_many
    from reshard.casting import reference_cast
    from reshard.dtypes import Cast, ScaleMode, numpy_of_torch

    mixed = {"w": _value(410, (300, 260), "float32").to(torch.bfloat16),
             "bias": _value(411, (300,), "float32").to(torch.bfloat16),
             "norm": _value(412, (260,), "float32").to(torch.bfloat16)}
    mixed_d = {n: _dtensor_of(w, a, [Shard(0)], device) for n, w in mixed.items()}
    with pytest.raises(DTypeError, match=r"bias: scale='block128' .* rank 1 .* "
                                         r"give a rule per tensor"):
        redistribute_many(mixed_d, b, [Replicate(), Shard(0)], cast="float8_e4m3fn",
                          scale="block128", redistributor=rd)
    got = redistribute_many(
        mixed_d, b, [Replicate(), Shard(0)], redistributor=rd,
        cast=lambda n, t: "float8_e4m3fn" if t.ndim >= 2 else None,
        scale=lambda n, t: "block128" if t.ndim >= 2 else None)
    q, sc = got["w"]
    ref_q, ref_s = reference_cast(numpy_of_torch(mixed["w"]),
                                  Cast("float8_e4m3fn", ScaleMode.BLOCK128))
    want = _slice(torch_of_numpy(ref_q), b, [Replicate(), Shard(0)], device)
    assert q.dtype == torch.float8_e4m3fn and sc.shape == ref_s.shape
    assert (q.to_local().numel() == 0) if want is None else _same(q.to_local(), want)
    for n in ("bias", "norm"):
        assert got[n].dtype == torch.bfloat16 and not isinstance(got[n], tuple), n
        want = _slice(mixed[n], b, [Replicate(), Shard(0)], device)
        assert (got[n].to_local().numel() == 0) if want is None else \
            _same(got[n].to_local(), want), n


def _check_refusal(a, b, rd, device: int) -> None:
    """A rank given another shape: every rank refuses (naming it) instead of hanging,
    and the Redistributor stays usable."""
    from torch.distributed.tensor import Replicate, Shard

    from reshard.adapters.dtensor_redistribute import redistribute

    assert refuses_another_shape(a, b, rd, device, odd=3), "not refused"
    right = _value(601, (12, 8), "float32")
    y = redistribute(_dtensor_of(right, a, [Shard(0)], device), b,
                     [Shard(1), Replicate()], redistributor=rd)
    want = _slice(right, b, [Shard(1), Replicate()], device)
    assert (y.to_local().numel() == 0) if want is None else torch.equal(y.to_local(), want)


@pytest.mark.timeout(300)
def test_redistribute_matches_dtensor_placement_on_random_meshes():
    cases = make_cases(16)
    got = rank_results(functools.partial(_rank_main, cases), range(WORLD), wait=260)
    assert sum(r["checked"] for r in got.values()) >= len(cases)
