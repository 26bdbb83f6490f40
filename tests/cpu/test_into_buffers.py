"""Into the engine's buffers: ``LoadedProgram.destinations()`` names every buffer a rank
receives into (its request, value or scales, shape, dtype), ``Executor.run(..., out=)``
writes them in place, and results come back as the caller holds arrays (torch in,
torch out, fp8 as torch's float8 dtypes). The real-shaped case: Qwen3-0.6B's state dict
(shapes from its config) synced bf16 -> fp8 with 128 x 128 block scales on matrices,
bf16 on the rest, in one plan, every shard and scale exact against the reference."""

from __future__ import annotations

import time

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.casting import reference_cast
from reshard.comm.backends.tcp import TcpBackend
from reshard.comm.executor import Executor
from reshard.comm.program import WorkerProgram
from reshard.dtypes import Cast, ScaleMode, numpy_of_torch
from reshard.microbench.suites.production import QWEN3_0_6B
from reshard.planner.plan import plan_many

from .test_tcp_backend import _ok, _ranks

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.cpu

FP8 = Cast("float8_e4m3fn", ScaleMode.BLOCK128)
ENGINE_SPEC = {"column": "S0R", "row": "RS0", "vocab": "S0R"}  # Megatron's TP on a 1-d mesh


def _requests(shapes: list[tuple[tuple[int, ...], str]], trainer: DeviceMesh,
              engine: DeviceMesh) -> list[tuple]:
    """FSDP rows on the trainer to the engine's tensor parallelism; fp8 with block
    scales for matrices, bf16 for the rest."""
    return [(shape, "bfloat16", Layout(trainer, "S0" + "R" * (len(shape) - 1)),
             Layout(engine, ENGINE_SPEC.get(kind, "R" * len(shape))),
             FP8 if len(shape) >= 2 else None)
            for shape, kind in shapes]


def _sync(requests: list[tuple], weights: list, world: tuple[int, ...], cluster: Cluster,
          torch_out: bool) -> dict[int, tuple]:
    """Every rank: load the request, allocate its buffers from destinations() (torch or
    none), run with its trainer shards; per rank (destinations, results, buffers)."""
    def body(b: TcpBackend) -> tuple:
        ex = Executor(b, arrays="torch")  # a rank that only receives gives no torch
        loaded, _ = ex.load_request(requests, cluster)
        dests = loaded.destinations()
        bufs = {d.tensor: d.empty("torch") for d in dests} if torch_out else None
        mine = [r[2].index_map(r[0]).get(b.device) for r in requests]
        shards = [None if ix is None else w[ix].contiguous() for w, ix in zip(weights, mine)]
        got = ex.run(loaded, shards, out=bufs).wait()
        return dests, got, bufs

    return _ok(_ranks(body, world=world, timeout=120, join=600))


def _check(requests: list[tuple], weights: list, results: dict[int, tuple]) -> int:
    """Every destination of every rank against the reference cast of the whole
    weight, bit for bit; the count checked."""
    refs: dict[int, tuple] = {}
    checked = 0
    for _rank, (dests, got, bufs) in sorted(results.items()):
        for d in dests:
            if d.request not in refs:
                refs[d.request] = reference_cast(numpy_of_torch(weights[d.request]),
                                                 requests[d.request][4] or Cast("bfloat16"))
            value, scales = refs[d.request]
            want = (value if d.kind == "value" else scales)[tuple(slice(a, b) for a, b in d.box)]
            out = got[d.tensor]
            assert isinstance(out, torch.Tensor), type(out)
            assert str(out.dtype) == f"torch.{d.dtype}"
            assert tuple(out.shape) == d.shape == want.shape
            if bufs is not None:
                assert out is bufs[d.tensor]
            assert numpy_of_torch(out).tobytes() == want.tobytes(), (d, _rank)
            checked += 1
    return checked


def test_destinations_name_each_buffer_by_request_and_kind():
    """A rank's destinations: one value per request it receives, one scales per scaled
    request, none for a plan-internal amax, in request order, with the shapes its
    layouts give."""
    trainer, engine = DeviceMesh((2,), [0, 1]), DeviceMesh((2,), [2, 3])
    # 300 rows over 2 trainer ranks: blocks of 128 rows straddle ranks (an amax moves)
    reqs = _requests([((300, 256), "column"), ((256,), "norm"), ((256, 384), "row")],
                     trainer, engine)
    plan = plan_many(reqs, cluster=Cluster.regular(2, 2))
    assert any(t.derive.value == "amax" for t in plan.tensors)
    for device in (2, 3):
        dests = WorkerProgram.of(plan, device).destinations()
        assert [(d.request, d.kind) for d in dests] == [
            (0, "value"), (0, "scales"), (1, "value"), (2, "value"), (2, "scales")]
        for d in dests:
            r = reqs[d.request]
            if d.kind == "value":
                box = r[3].index_map(r[0])[device]
                assert d.shape == tuple(len(range(*s.indices(n))) for s, n in zip(box, r[0]))
                assert d.dtype == ("float8_e4m3fn" if r[4] else "bfloat16")
            else:
                assert d.dtype == "float32"
            assert d.empty().shape == d.shape and str(d.empty().dtype) == d.dtype
    assert WorkerProgram.of(plan, 0).destinations() == ()  # a trainer rank receives nothing


@pytest.mark.timeout(300)
@pytest.mark.parametrize("torch_out", [True, False], ids=["into-buffers", "allocated"])
def test_torch_in_torch_out_with_fp8_dtypes(torch_out):
    """Torch sources: the results are torch tensors (torch's float8_e4m3fn, float32
    scales, bfloat16), the caller's own buffers where it gave them, else views of what
    the run allocated; exact."""
    trainer, engine = DeviceMesh((2,), [0, 1]), DeviceMesh((2,), [2, 3])
    shapes = [((300, 256), "column"), ((256,), "norm"), ((256, 384), "row"), ((64,), "norm")]
    reqs = _requests(shapes, trainer, engine)
    gen = torch.Generator().manual_seed(3)
    weights = [torch.randn(s, generator=gen).to(torch.bfloat16) for s, _ in shapes]
    results = _sync(reqs, weights, (0, 1, 2, 3), Cluster.regular(2, 2), torch_out)
    assert _check(reqs, weights, results) == 2 * 6


@pytest.mark.timeout(900)
def test_a_qwen3_0_6b_state_dict_syncs_bf16_to_fp8_in_one_plan():
    """Qwen3-0.6B's 310 parameters (596M elements, 1.19 GB in bf16; shapes from its
    config.json: tied embedding, q / k norms, no biases) from 4 FSDP trainer ranks to 4
    tensor-parallel engine ranks: the matrices to fp8 with 128 x 128 block scales, the
    norms bf16, in one plan, into torch buffers the engine allocated once; every shard
    and every scale exact."""
    model = QWEN3_0_6B
    params = model.parameters()
    assert len(params) == 310 and model.num_parameters == 596_049_920
    trainer, engine = DeviceMesh((4,), range(4)), DeviceMesh((4,), range(4, 8))
    shapes = [(shape, kind) for _, _, shape, kind in params]
    reqs = _requests(shapes, trainer, engine)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(s, generator=gen, dtype=torch.bfloat16) for s in (x for x, _ in shapes)]
    t0 = time.perf_counter()
    results = _sync(reqs, weights, tuple(range(8)), Cluster.regular(2, 4), True)
    took = time.perf_counter() - t0
    matrices = sum(len(s) >= 2 for s, _ in shapes)
    # each engine rank: every request's value, every matrix's scales
    assert _check(reqs, weights, results) == 4 * (len(shapes) + matrices)
    print(f"Qwen3-0.6B bf16 -> fp8 over tcp, 4 -> 4 ranks on threads: {took:.1f} s")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("given", ["torch", "numpy"])
def test_the_results_follow_the_sources_array_type(given):
    """No ``arrays=`` and no buffers: a rank that gave torch sources gets torch
    results (bfloat16 as torch's), one that gave numpy gets numpy."""
    mesh = DeviceMesh((2,), [0, 1])
    reqs = [((64, 32), "bfloat16", Layout(mesh, "S0R"), Layout(mesh, "RS0"))]
    full = torch.randn(64, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)

    def body(b: TcpBackend) -> object:
        ex = Executor(b)
        loaded, _ = ex.load_request(reqs, Cluster.regular(1, 2))
        mine = full[reqs[0][2].index_map((64, 32))[b.device]].contiguous()
        got = ex.run(loaded, [mine if given == "torch" else numpy_of_torch(mine)]).wait()[0]
        want = numpy_of_torch(full)[reqs[0][3].index_map((64, 32))[b.device]]
        as_numpy = numpy_of_torch(got) if isinstance(got, torch.Tensor) else got
        assert as_numpy.tobytes() == np.ascontiguousarray(want).tobytes()
        return type(got)

    kinds = _ok(_ranks(body, world=(0, 1)))
    assert set(kinds.values()) == {torch.Tensor if given == "torch" else np.ndarray}
