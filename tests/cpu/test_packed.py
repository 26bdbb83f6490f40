"""Packed parameters (reshard.packed): Megatron's interleaved ``linear_qkv`` on a TP4 x
PP4 trainer to vLLM's packed ``qkv_proj`` on TP8 and TP16 engines (kv heads replicated
at TP16), Qwen3-style shapes (64 q heads, 8 kv heads, head_dim 128, hidden 5120), and
``gate_up_proj``; one plan, every rank's views of its own fused buffers as sources and
destinations, every element checked against numpy slicing of the full weights."""

from __future__ import annotations

import functools
import threading
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

import reshard
from reshard import Cluster
from reshard.comm.backends.local import LocalBackend, LocalFabric
from reshard.comm.executor import Executor
from reshard.comm.program import programs
from reshard.errors import ReshardError
from reshard.packed import Attention, Packing, mlp_parts, shard_shapes

from ._helpers import rank_results

pytestmark = pytest.mark.cpu

QWEN = Attention(heads=64, kv_heads=8, head_dim=128, hidden=5120)
BF16 = ml_dtypes.bfloat16


PARTS = ("q", "k", "v")


def _weight(layer: int, part: str, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` of a layer's q, k or v as the checkpoint holds it ([out, hidden],
    heads in order): a function of the indices, so that a rank makes only its own rows
    and checks only its own; integers bf16 holds exactly (checked element by element)."""
    cols = np.arange(QWEN.hidden)
    k = PARTS.index(part)
    return ((rows[:, None] * 31 + cols[None, :] * 7 + layer * 13 + k * 5) % 509 - 254
            ).astype(BF16)


def _rows(start: int, count: int) -> np.ndarray:
    return np.arange(start, start + count)


def _megatron_shard(layer: int, rank: int, tp: int) -> np.ndarray:
    """Megatron's linear_qkv shard on TP rank ``rank``: per query group it holds, the
    group's q heads, its k head, its v head (by index arithmetic, independently of
    reshard.packed)."""
    a, d = QWEN, QWEN.head_dim
    per = a.kv_heads // tp
    rows = []
    for g in range(rank * per, (rank + 1) * per):
        rows += [_weight(layer, "q", _rows(g * a.per_group * d, a.per_group * d)),
                 _weight(layer, "k", _rows(g * d, d)), _weight(layer, "v", _rows(g * d, d))]
    return np.ascontiguousarray(np.concatenate(rows))


def _vllm_shard(layer: int, rank: int, tp: int) -> np.ndarray:
    """vLLM's qkv_proj on TP rank ``rank``: its q heads, then its kv heads (head
    ``rank // (tp / kv_heads)`` when tp > kv_heads)."""
    a, d = QWEN, QWEN.head_dim
    q = a.heads // tp * d
    kv_heads = max(1, a.kv_heads // tp)
    first = rank * kv_heads if tp <= a.kv_heads else rank // (tp // a.kv_heads)
    kv = _rows(first * d, kv_heads * d)
    return np.concatenate([_weight(layer, "q", _rows(rank * q, q)),
                           _weight(layer, "k", kv), _weight(layer, "v", kv)])


LAYERS, TRAIN_TP = 4, 4  # TP4 x PP4: layer s on stage s's four ranks
STAGES = [list(range(s * TRAIN_TP, (s + 1) * TRAIN_TP)) for s in range(LAYERS)]


def _qkv_requests(engine_tp: int) -> tuple[list[tuple], list[dict], dict]:
    engine = list(range(16, 16 + engine_tp))
    shapes = QWEN.shapes()
    train = [QWEN.layouts(devs) for devs in STAGES]
    infer = QWEN.layouts(engine)
    reqs = [(shapes[p], "bfloat16", train[layer][p], infer[p])
            for layer in range(LAYERS) for p in PARTS]
    return reqs, train, infer


def _qkv_rank(engine_tp: int, budget: int, device: int, address, results, done) -> None:
    """One process per rank on the tcp backend: plan (SPMD), view its own fused buffers
    as the parts, run, and (an engine rank) check its packed buffers."""
    import traceback

    try:
        world = list(range(16 + engine_tp))
        reqs, train, infer = _qkv_requests(engine_tp)
        shapes = QWEN.shapes()
        with Executor.create("tcp", device, world, address.connect(30), 120.0,
                             memory_budget=budget) as ex:
            loaded, _ = ex.load_request(reqs, Cluster.preset("dgx-h100", 4))
            sources: list = [None] * len(reqs)
            out: list = [None] * len(reqs)
            packed: dict[int, np.ndarray] = {}
            if device < 16:  # a trainer rank: its stage's layer, Megatron's fused shard
                s, r = divmod(device, TRAIN_TP)
                fused = _megatron_shard(s, r, TRAIN_TP)
                views = QWEN.megatron_packing(TRAIN_TP).views(
                    fused, shard_shapes(shapes, train[s], device))
                for k, p in enumerate(PARTS):
                    sources[s * 3 + k] = views[p]
                strided = not views["q"].flags.c_contiguous
            else:  # an engine rank: its qkv_proj of every layer, allocated once
                packing = QWEN.engine_packing(engine_tp)
                for layer in range(LAYERS):
                    packed[layer] = np.zeros(packing.shape((QWEN.hidden,)), BF16)
                    views = packing.views(packed[layer], shard_shapes(shapes, infer, device))
                    for k, p in enumerate(PARTS):
                        out[layer * 3 + k] = views[p]
                strided = False
            tracemalloc.start()
            ex.run(loaded, sources, out=out).wait()
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            exact = all(
                np.array_equal(packed[layer].view(np.uint16),
                               _vllm_shard(layer, device - 16, engine_tp).view(np.uint16))
                for layer in packed)
            peak += loaded.scratch.nbytes  # its staging, allocated once when loaded
            results.put((device, {"peak": peak, "exact": exact, "strided": strided,
                                  "packed": sum(b.nbytes for b in packed.values())}))
            done.wait(60)
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((device, traceback.format_exc()))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("engine_tp", [8, 16])
def test_megatron_linear_qkv_to_vllm_qkv_proj(engine_tp):
    """Processes of the tcp backend, one per rank (16 trainer, 8 or 16 engine): every
    engine rank's packed buffers exact, and no rank allocating more than its byte budget
    beside the buffers it owns (its staging, allocated when the program is loaded, plus
    tracemalloc's peak of what the run allocates)."""
    budget = 16 << 20
    got = rank_results(functools.partial(_qkv_rank, engine_tp, budget),
                       range(16 + engine_tp), wait=480, join=30)
    assert all(r["exact"] for r in got.values())
    assert all(got[d]["strided"] for d in range(16))  # Megatron's parts: strided views
    peaks = sorted(r["peak"] for r in got.values())
    total = sum(r["packed"] for r in got.values())
    print(f"TP4xPP4 -> TP{engine_tp}: {total / 2**20:.0f} MiB of packed buffers filled; "
          f"each rank's staging and run allocations at most {peaks[-1] / 2**20:.1f} MiB "
          f"(budget {budget / 2**20:.0f} MiB; median {peaks[len(peaks) // 2] / 2**20:.1f})")
    assert peaks[-1] <= budget


def _run(plan, world, sources, outs, timeout=300.0) -> None:
    """Every device of ``world`` a thread with its executor on one local fabric."""
    fabric = LocalFabric(timeout=120)
    progs = programs(plan, world)
    errors: list[BaseException] = []

    def rank(d: int) -> None:
        try:
            ex = Executor(LocalBackend(d, fabric))
            lp = ex.load(progs[d])
            ex.run(lp, sources.get(d), out=outs.get(d)).wait()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            fabric.closed.set()

    threads = [threading.Thread(target=rank, args=(d,)) for d in world]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert not errors, errors


@pytest.mark.timeout(300)
def test_gate_up_proj_packs_per_rank():
    """gate and up from Megatron's fc1 shards ([gate_r; up_r] per TP rank) to vLLM's
    gate_up_proj at another TP degree."""
    inter, hidden = 1024, 256
    src_shapes, src_layouts, src_pack = mlp_parts(inter, hidden, [0, 1])
    dst_shapes, dst_layouts, dst_pack = mlp_parts(inter, hidden, [2, 3, 4, 5])
    rng = np.random.default_rng(0)
    gate, up = (rng.standard_normal((inter, hidden)).astype(np.float32) for _ in range(2))
    fc1 = {r: np.concatenate([gate[r * 512:(r + 1) * 512], up[r * 512:(r + 1) * 512]])
           for r in range(2)}
    reqs = [(src_shapes[p], "float32", src_layouts[p], dst_layouts[p]) for p in ("gate", "up")]
    plan = reshard.plan_many(reqs, cluster=Cluster.regular(2, 4))
    sources = {r: [src_pack.views(fc1[r], shard_shapes(src_shapes, src_layouts, r))[p]
                   for p in ("gate", "up")] for r in range(2)}
    bufs = {d: np.zeros(dst_pack.shape((hidden,)), np.float32) for d in (2, 3, 4, 5)}
    outs = {d: [dst_pack.views(bufs[d], shard_shapes(dst_shapes, dst_layouts, d))[p]
                for p in ("gate", "up")] for d in bufs}
    _run(plan, [0, 1, 2, 3, 4, 5], sources, outs)
    for r, d in enumerate((2, 3, 4, 5)):
        want = np.concatenate([gate[r * 256:(r + 1) * 256], up[r * 256:(r + 1) * 256]])
        np.testing.assert_array_equal(bufs[d], want)


def test_bad_packings_are_refused_naming_the_numbers():
    with pytest.raises(ReshardError, match=r"valid: \[1, 2, 4, 8, 16, 32, 64\]"):
        QWEN.layouts(list(range(12)))  # 12 ranks: neither divides nor is divided by 8
    with pytest.raises(ReshardError, match="must divide the 8 kv heads"):
        QWEN.megatron_packing(16)
    with pytest.raises(ReshardError, match="positive multiple of the kv heads"):
        Attention(heads=12, kv_heads=8, head_dim=64, hidden=128)
    pack = Packing((("q", 4), ("k", 2)))
    with pytest.raises(ReshardError, match="take 1 x 6 = 6 rows"):
        pack.views(np.zeros((5, 3)), {"q": (4, 3), "k": (2, 3)})
    with pytest.raises(ReshardError, match="do not add up"):
        pack.views(np.zeros((6, 3)), {"q": (4, 3), "k": (3, 3)})
    with pytest.raises(ReshardError, match=r"parts \['o'\] are not in the packing"):
        pack.views(np.zeros((6, 3)), {"q": (4, 3), "o": (2, 3)})


def test_layouts_on_replicated_tp_groups():
    """(replicas, tp) meshes, replica-major: each replica holds the whole weight as one
    TP group does; with tp > kv heads the kv heads are replicated inside each group."""
    devs = list(range(32))
    for replicas, tp in ((2, 16), (4, 8)):
        lay = QWEN.layouts(devs, replicas=replicas)
        alone = QWEN.layouts(devs[:tp])
        for p, shape in QWEN.shapes().items():
            with_reps, one = lay[p].boxes(shape), alone[p].boxes(shape)
            for i in range(replicas):
                assert [with_reps[d] for d in devs[i * tp:(i + 1) * tp]] == \
                    [one[d] for d in devs[:tp]], (p, replicas)
    with pytest.raises(ReshardError, match="32 devices do not make 3 replicas"):
        QWEN.layouts(devs, replicas=3)
