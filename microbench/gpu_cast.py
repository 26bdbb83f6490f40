"""The weight-sync cast on a GPU against the memory's floor, and a step's many small
boxes against one copy of their bytes.

Casts: one DeepSeek-V3 FFN weight (``--shape``, default [7168, 18432]) cast as the nccl
backend casts it (:mod:`reshard.casting` on cupy arrays, the fused kernels of
:mod:`reshard.kernels`: block amax, scales, quantize + encode), for bf16 -> fp8 e4m3
with ``block128`` scales (the RL weight sync's), ``tensor``, ``block128-ue8m0``,
``mx32``, e5m2 block128, e4m3 unscaled, and fp32 -> bf16. Per cast, times in ms
(CUDA events, median of ``-n`` after ``-w``): ``queued``, five casts issued from Python
back to back (the device's time where it, not the host, is the bottleneck: ``host us``
is the host's time to issue one, the device idle; no CUDA graph, whose capture would
meet the casts' allocations); ``bound``, ``cudaMemcpyAsync`` moving the bytes the cast
must read and write (a copy of half their sum: it reads and writes); then
``queued / bound`` against issue 60's goal, the source's GB/s, and ``exact``: the
result and its scales byte for byte against
:func:`reshard.casting.reference_cast` on the CPU. With torch on CUDA, beside it (block
scales, tensor scales and fp32 -> bf16): ``torch.compile`` of the plain recipe (amax per
block, divide, clamp, ``.to``), the same recipe eager, and reshard.casting on torch
tensors (the same kernels on torch's stream); each with how many codes differ from the
reference.

Boxes (``--boxes``, default 1,000 of 16 KiB: 16 rows of 1 KiB of a 4 KiB-wide int32
shard each) packed into one buffer: one ``copy_into`` per box (one launch each, before
issue 60), a :class:`reshard.comm.engine.box_batch.BoxBatch` (the table built and uploaded,
one launch: what a step does now), the batch's kernel alone on a prepared table, and
one copy of all their bytes.

``cast_bandwidth``: the block128 cast's rate (bytes/s of source data one GPU converts,
what ``Cluster.cast_bandwidth`` charges) as the line to put in ``reshard/core/presets.toml``
(:func:`reshard.microbench.calibrate.gpu_cast_bandwidth` measures the same).

Needs cupy and a GPU (exit code 2 without: ``--dry-run`` lists the cases)::

    python -m reshard.microbench.gpu_cast -J gpu_cast.json
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from reshard import casting
from reshard.cliargs import natural_int, positive_int
from reshard.dtypes import Cast, ScaleMode, itemsize, parse_dtype
from reshard.microbench import flags
from reshard.microbench.gpu_pack import GpuTimer, usable_cupy
from reshard.microbench.report import machine, write_json

FFN = (7168, 18432)
"""A DeepSeek-V3 FFN weight's shape (its up / gate projections)."""

CASTS: tuple[tuple[str, Cast], ...] = (
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.BLOCK128)),
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.TENSOR)),
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.BLOCK128_UE8M0)),
    ("bfloat16", Cast("float8_e4m3fn", ScaleMode.MX32)),
    ("bfloat16", Cast("float8_e5m2", ScaleMode.BLOCK128)),
    ("bfloat16", Cast("float8_e4m3fn")),
    ("float32", Cast("bfloat16")),
)
"""(source dtype, cast) of each row; the first is the headline (``cast_bandwidth``)."""

def goal(cast: Cast) -> float:
    """Issue 60's goal, device / bound: fp32 -> bf16 1.5x, block128 2.5x, others 3x."""
    if cast.dtype == "bfloat16":
        return 1.5
    return 2.5 if cast.scale is ScaleMode.BLOCK128 else 3.0


def run_cast(x: Any, source: str, cast: Cast) -> tuple[Any, Any]:
    """The cast of ``x`` (a whole tensor on the device: cupy bits or a torch tensor) as
    the nccl backend runs it (:func:`reshard.casting.cast_whole`; E8M0 codes for the
    power-of-two formats). Returns values and scales."""
    return casting.cast_whole(x, cast, lambda shape, name: _empty_like(x, shape, name), source)


def _empty_like(x: Any, shape: tuple[int, ...], name: str) -> Any:
    if type(x).__module__.startswith("torch"):
        import torch

        return torch.empty(shape, dtype=getattr(torch, name), device=x.device)
    import cupy

    return cupy.empty(shape, dtype=np.uint8 if itemsize(name) == 1 else np.uint16)


def sample(cupy: Any, shape: tuple[int, ...], source: str, seed: int = 0) -> Any:
    """Normal values with a magnitude of their own per row (2^-8 .. 2^8) on the
    device, as ``source`` (bfloat16: its bits, truncated from float32)."""
    rng = cupy.random.default_rng(seed)
    x = rng.standard_normal(shape, dtype=cupy.float32)
    x *= cupy.exp2(rng.integers(-8, 9, (*shape[:-1], 1)).astype(cupy.float32))
    return (x.view(cupy.uint32) >> 16).astype(cupy.uint16) if source == "bfloat16" else x


def _host(a: Any) -> np.ndarray:
    if type(a).__module__.startswith("torch"):
        import torch

        if a.dtype != torch.float32:
            a = a.view(torch.int16 if a.element_size() == 2 else torch.uint8)
        return a.cpu().numpy()
    import cupy

    return cupy.asnumpy(a)


def reference(x_host: np.ndarray, source: str, cast: Cast) -> tuple[np.ndarray, Any]:
    """reference_cast of the device's input (held as ``source``'s bits)."""
    true = x_host.view(parse_dtype("bfloat16")) if source == "bfloat16" else x_host
    with np.errstate(all="ignore"):
        return casting.reference_cast(true, cast)


def differing(got: Any, want: np.ndarray) -> int:
    """Codes of ``got`` (on the device) that differ from ``want``'s."""
    g = _host(got)
    return int((g.reshape(-1).view(np.uint8 if g.itemsize == 1 else np.uint16)
                != want.reshape(-1).view(np.uint8 if want.itemsize == 1 else np.uint16)).sum())


def bound_ms(cupy: Any, timer: GpuTimer, nbytes: int) -> float:
    """cudaMemcpyAsync of ``nbytes // 2`` bytes (it reads and writes them: ``nbytes``
    of traffic), the faster of graph and queued."""
    half = nbytes // 2
    a, b = cupy.empty(half, cupy.uint8), cupy.empty(half, cupy.uint8)
    rt = cupy.cuda.runtime

    def copy() -> None:
        rt.memcpyAsync(b.data.ptr, a.data.ptr, half, rt.memcpyDeviceToDevice,
                       cupy.cuda.get_current_stream().ptr)

    got = timer.graph_ms(copy)
    return min(timer.ms(copy), got) if not math.isnan(got) else timer.ms(copy)


def _torch_recipe(cast: Cast, torch: Any) -> Callable[[Any], Any] | None:
    """The plain recipe a user writes (block amax, divide, clamp, ``.to``)."""
    target = getattr(torch, cast.dtype)
    if cast.scale is ScaleMode.NONE and cast.dtype == "bfloat16":
        return lambda x: x.to(torch.bfloat16)
    top = float(torch.finfo(target).max) if cast.dtype != "bfloat16" else 0.0
    if cast.scale is ScaleMode.TENSOR:
        def tensor(x: Any) -> Any:
            a = x.float().abs().amax()
            s = torch.where(a > 0, a / top, torch.ones_like(a))
            return (x.float() / s).clamp(-top, top).to(target), s
        return tensor
    if cast.scale is ScaleMode.BLOCK128:
        def block(x: Any) -> Any:
            m, n = x.shape
            xb = x.float().view(m // 128, 128, n // 128, 128)
            a = xb.abs().amax(dim=(1, 3), keepdim=True)
            s = torch.where(a > 0, a / top, torch.ones_like(a))
            return (xb / s).clamp(-top, top).to(target).view(m, n), s.reshape(m // 128, n // 128)
        return block
    return None


def torch_rows(x_host: np.ndarray, source: str, cast: Cast, want: np.ndarray, runs: int,
               warmup: int, compile_it: bool) -> dict[str, Any]:
    """torch.compile (where ``compile_it``: its first compile takes tens of seconds) and
    eager of the recipe, and reshard.casting on torch tensors: ms and differing codes
    each (empty without torch on CUDA)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
    except ImportError:
        return {}
    t = torch.from_numpy(x_host.copy()).cuda()
    x = t.view(torch.bfloat16) if source == "bfloat16" else t
    out: dict[str, Any] = {}
    fns: dict[str, Callable[[], Any]] = {"reshard_torch": lambda: run_cast(x, source, cast)[0]}
    recipe = _torch_recipe(cast, torch)
    if recipe is not None:
        fns["eager"] = lambda: recipe(x)
    if recipe is not None and compile_it:
        try:
            compiled = torch.compile(recipe)
            fns["compile"] = lambda: compiled(x)
        except Exception as e:  # noqa: BLE001 - reported, the others still run
            out["compile_error"] = repr(e)[:200]
    for name, fn in fns.items():
        try:
            got = fn()
            got = got[0] if isinstance(got, tuple) else got
            out[f"{name}_differ"] = differing(got, want)
            out[f"{name}_ms"] = _torch_ms(torch, fn, runs, warmup)
        except Exception as e:  # noqa: BLE001
            out[f"{name}_error"] = repr(e)[:200]
    return out


def _torch_ms(torch: Any, fn: Callable[[], Any], runs: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 5)
    return float(np.median(times))


def cast_row(cupy: Any, timer: GpuTimer, shape: tuple[int, ...], source: str, cast: Cast,
             with_torch: bool, compile_it: bool = False) -> dict[str, Any]:
    """One cast: its times, its ratio to the bound, exactness, torch beside it."""
    x = sample(cupy, shape, source)
    got, scales = run_cast(x, source, cast)
    n = math.prod(shape)
    moved = n * (itemsize(source) + itemsize(cast.dtype))
    def go() -> None:
        run_cast(x, source, cast)

    row: dict[str, Any] = {"source": source, "cast": str(cast), "shape": shape,
                           "bound_ms": bound_ms(cupy, timer, moved),
                           "queued_ms": timer.ms(go), "host_us": timer.host_us(go)}
    best = row["queued_ms"]
    row["ratio"] = best / row["bound_ms"]
    row["goal"] = goal(cast)
    row["source_GBs"] = n * itemsize(source) / (best * 1e-3) / 1e9
    x_host = cupy.asnumpy(x)
    want, want_scales = reference(x_host, source, cast)
    row["differ"] = differing(got, want)
    row["exact"] = row["differ"] == 0 and (want_scales is None or _host(scales).tobytes()
                                           == np.asarray(want_scales).view(
                                               _host(scales).dtype).tobytes())
    if with_torch:
        row.update(torch_rows(x_host, source, cast, want, timer.runs, timer.warmup,
                              compile_it))
    return row


def boxes_row(cupy: Any, timer: GpuTimer, count: int) -> dict[str, Any]:
    """``count`` boxes of 16 KiB packed: per-box launches, a BoxBatch, its kernel
    alone, and one copy of their bytes."""
    from reshard.comm.engine.box_batch import BoxBatch, _kernel, boxes_grid
    from reshard.comm.engine.pitched import copy_into

    shard = cupy.arange(count * 16 * 1024, dtype=cupy.int32).reshape(count * 16, 1024)
    out = cupy.zeros((count, 16, 256), cupy.int32)
    views = [(out[k], shard[16 * k:16 * (k + 1), 256:512]) for k in range(count)]

    def per_box() -> None:
        for d, s in views:
            copy_into(d, s)

    def batched() -> None:
        b = BoxBatch()
        for d, s in views:
            b.add(d, s)
        b.flush()

    prepared = BoxBatch()
    for d, s in views:
        prepared.add(d, s)
    rows = list(prepared.rows)
    table = cupy.asarray(np.array(rows, dtype=np.int64))
    go = boxes_grid(rows)

    def kernel_only() -> None:
        _kernel()(go.grid, go.block, (table, np.int64(len(rows))))

    batched()
    cupy.cuda.get_current_stream().synchronize()
    exact = bool(cupy.array_equal(out, shard.reshape(count, 16, 1024)[:, :, 256:512]))
    nbytes = count * 16 * 1024
    row: dict[str, Any] = {"boxes": count, "box_bytes": 16 * 1024, "exact": exact,
                           "bound_ms": bound_ms(cupy, timer, 2 * nbytes)}
    for name, fn in (("per_box", per_box), ("batched", batched), ("kernel", kernel_only)):
        row[f"{name}_ms"] = timer.ms(fn)
        row[f"{name}_ratio"] = row[f"{name}_ms"] / row["bound_ms"]
    t0 = time.perf_counter()
    batched()
    row["batched_host_us"] = (time.perf_counter() - t0) * 1e6
    return row


def _fmt(r: dict[str, Any]) -> str:
    torch_part = " ".join(f"{k[:-3]} {r[k]:.3f} ms ({r[k] / r['bound_ms']:.1f}x, "
                          f"{r.get(k[:-3] + '_differ', '?')} differ)"
                          for k in ("compile_ms", "eager_ms", "reshard_torch_ms") if k in r)
    return (f"{r['source']:>8} -> {r['cast']:<28} {r['bound_ms']:>7.3f} {r['queued_ms']:>8.3f} "
            f"{r['host_us']:>7.0f} {r['ratio']:>6.2f}x {r['goal']:>5.1f}x {r['source_GBs']:>7.0f} "
            f"{'yes' if r['exact'] else 'NO (' + str(r['differ']) + ')'}  {torch_part}")


def _boxes(cupy: Any, timer: GpuTimer, count: int) -> dict[str, Any] | None:
    """:func:`boxes_row`, printed (None when it failed)."""
    try:
        boxes = boxes_row(cupy, timer, count)
    except Exception as e:  # noqa: BLE001 - a failing row must not stop the summary
        print(f"boxes: FAILED {e!r}", flush=True)
        return None
    print(f"{boxes['boxes']} x 16 KiB boxes: bound {boxes['bound_ms']:.4f} ms; per box "
          f"{boxes['per_box_ms']:.3f} ms ({boxes['per_box_ratio']:.1f}x), batched "
          f"{boxes['batched_ms']:.3f} ms ({boxes['batched_ratio']:.1f}x; host "
          f"{boxes['batched_host_us']:.0f} us), kernel alone {boxes['kernel_ms']:.4f} "
          f"ms ({boxes['kernel_ratio']:.1f}x); exact {boxes['exact']}", flush=True)
    return boxes


def main(argv: list[str] | None = None) -> int:
    p = flags.parser("python -m reshard.microbench.gpu_cast", __doc__ or "")
    p.add_argument("-n", "--runs", type=positive_int, default=10, help="timed runs per case")
    p.add_argument("-w", "--warmup", type=natural_int, default=2, help="untimed runs first")
    p.add_argument("--shape", default="7168,18432", help="the weight's shape (rows,cols)")
    p.add_argument("--boxes", type=natural_int, default=1000, help="16 KiB boxes (0: none)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch rows")
    p.add_argument("-J", "--json", help="write the rows to this file")
    p.add_argument("--dry-run", action="store_true", help="list the cases; needs no GPU")
    args = p.parse_args(argv)
    shape = tuple(int(v) for v in args.shape.split(","))
    if args.dry_run:
        for source, cast in CASTS:
            print(f"{source} {shape} -> {cast}")
        print(f"{args.boxes} boxes of 16 KiB")
        return 0
    cupy = usable_cupy("gpu_cast", "cases")
    if cupy is None:
        return 2
    timer = GpuTimer(cupy, args.runs, args.warmup)
    print(f"{'source':>8}    {'cast':<28} {'bound':>7} {'queued':>8} {'host us':>7} "
          f"{'/bound':>7} {'goal':>6} {'GB/s':>7} exact   (ms; torch beside)", flush=True)
    rows, ok = [], True
    for k, (source, cast) in enumerate(CASTS):
        try:
            r = cast_row(cupy, timer, shape, source, cast, not args.no_torch, k == 0)
        except Exception as e:  # noqa: BLE001 - one failing case must not stop the others
            print(f"{source} -> {cast}: FAILED {e!r}", flush=True)
            ok = False
            continue
        rows.append(r)
        ok &= r["exact"]
        print(_fmt(r), flush=True)
        cupy.get_default_memory_pool().free_all_blocks()
    boxes = _boxes(cupy, timer, args.boxes) if args.boxes else None
    ok &= not args.boxes or (boxes is not None and bool(boxes["exact"]))
    met = sum(r["ratio"] <= r["goal"] for r in rows)
    print(f"goals met: {met}/{len(rows)} casts; "
          f"{'all exact' if all(r['exact'] for r in rows) else 'NOT ALL EXACT'}", flush=True)
    if rows and rows[0]["cast"] == str(CASTS[0][1]):
        print(f'cast_bandwidth = "{rows[0]["source_GBs"]:.0f} GB/s"   # reshard/core/presets.toml, '
              f"bf16 -> fp8 block128 on this GPU", flush=True)
    if args.json:
        write_json(args.json, {"machine": machine(), "rows": rows, "boxes": boxes,
                               "shape": shape})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
