"""The GPU data plane's own floor: packing and unpacking strided boxes against a plain
device-to-device copy of the same bytes.

Every box a reshard moves that is not one run of its shard is copied twice on the GPU:
packed from the source shard into a contiguous buffer by the root, unpacked into the
destination shard by a receiver (comm/steps.py through comm/packing.py). This measures
those copies for the paper's n-to-m cases (Zhuang et al., section 5.1): for each case,
the largest strided box of a source shard (pack) and of a destination shard (unpack),
the tensor scaled so that box holds 1 MiB ... 1 GiB. Per box, each timed with CUDA
events (median of ``-n`` after ``-w`` warm-ups):

* ``floor``: ``cudaMemcpyAsync`` of the box's bytes between two contiguous buffers;
* ``kernel``: cupy's assignment of the strided view (an elementwise kernel: what
  packing did before pitched copies);
* ``2D``: the box as ``cudaMemcpy2DAsync`` calls (the same rows and pitches; shown as
  its ratio to ``floor``);
* ``reshard``: what comm/packing.py issues now (:mod:`reshard.comm.engine.pitched`: its own
  copy kernel, or cupy's where the geometry does not apply), checked byte for byte
  against cupy's result first.

Rates count the box's bytes once (a copy reads and writes them: HBM traffic is twice
that) and are the device's: five calls captured in a CUDA graph, the graph timed (the
floor: the faster of that and five copies queued, since a graph's copy node ran up to
1.5x slower than the same copy queued). ``q
x`` is reshard's ratio when the same five calls are issued from Python back to back
(what a caller sees when the host, not the GPU, is the bottleneck), and the ``us``
columns the host's microseconds to issue one call of floor, kernel and reshard. The goal: ``reshard`` >= 0.8x ``floor`` for boxes of 16 MiB and more.

Needs cupy and a GPU. ``--dry-run`` lists the boxes it would measure, without cupy.

Example::

    python -m reshard.microbench.gpu_pack -J gpu_pack.json
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from reshard.cliargs import natural_int, positive_int
from reshard.comm.engine.packing import is_contiguous, pack, region, unpack
from reshard.comm.engine.pitched import launch, pitched_copies
from reshard.dtypes import itemsize
from reshard.layout import Box, box_size
from reshard.microbench import flags
from reshard.microbench.report import machine, write_json
from reshard.microbench.suites.paper import Case, n_to_m_cases

MIB = 1 << 20
SIZES = tuple(MIB << k for k in range(0, 11, 2))  # 1 MiB, 4, 16, 64, 256 MiB, 1 GiB
GOAL, GOAL_FROM = 0.8, 16 * MIB


@dataclass(frozen=True)
class PackBox:
    """One strided box of one case: which side copies it, the box and the shard that
    holds it (global coordinates), and the tensor's dtype."""

    case: str
    side: str  # "pack" (a source shard) or "unpack" (a destination shard)
    box: Box
    shard: Box
    dtype: str

    @property
    def nbytes(self) -> int:
        return box_size(self.box) * itemsize(self.dtype)

    @property
    def box_shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.box)

    @property
    def shard_shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.shard)


def _strided(box: Box, shard: Box) -> bool:
    """True if ``box`` is not one run of a C-contiguous shard holding ``shard``."""
    ext = [b - a for a, b in box]
    whole = [b - a for a, b in shard]
    first = next((d for d, e in enumerate(ext) if e > 1), len(ext))
    return any(ext[d] != whole[d] for d in range(first + 1, len(ext)))


def _intersect(a: Box, b: Box) -> Box | None:
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return out if all(hi > lo for lo, hi in out) else None


def strided_boxes(case: Case) -> dict[str, PackBox]:
    """The case's largest strided box per side: each source shard's box that a
    destination shard needs (what a root packs), and the same box in the destination
    shard (what a receiver unpacks)."""
    src, dst, _ = case.build()
    shape = case.shape
    sboxes, dboxes = src.boxes(shape), dst.boxes(shape)
    best: dict[str, PackBox] = {}
    for s in dict.fromkeys(sboxes.values()):
        for d in dict.fromkeys(dboxes.values()):
            box = _intersect(s, d)
            if box is None:
                continue
            for side, shard in (("pack", s), ("unpack", d)):
                if not _strided(box, shard):
                    continue
                cand = PackBox(case.name, side, box, shard, case.dtype)
                if side not in best or cand.nbytes > best[side].nbytes:
                    best[side] = cand
    return best


def boxes(sizes: tuple[int, ...] = SIZES, cases: tuple[Case, ...] | None = None
          ) -> Iterator[PackBox]:
    """Every case's largest strided box per side, the case scaled for each size."""
    for case in cases or n_to_m_cases():
        full = strided_boxes(case)
        for side in ("pack", "unpack"):
            if side not in full:
                continue
            for size in sizes:
                scaled = strided_boxes(case.with_bytes(round(case.nbytes * size
                                                             / full[side].nbytes)))
                if side in scaled:
                    yield scaled[side]


class GpuTimer:
    """Median milliseconds of a GPU operation on the current stream: CUDA events
    around ``batch`` calls queued back to back (the device's time, as copies queued
    behind other work run; the host's own time per call is :meth:`host_us`)."""

    def __init__(self, cupy: Any, runs: int, warmup: int, batch: int = 5) -> None:
        self.cp, self.runs, self.warmup, self.batch = cupy, runs, warmup, batch

    def ms(self, fn: Callable[[], None]) -> float:
        cp = self.cp
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.runs):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            for _ in range(self.batch):
                fn()
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) / self.batch)
        return statistics.median(times)

    def graph_ms(self, fn: Callable[[], None]) -> float:
        """Median milliseconds per call of the device alone: ``batch`` calls captured
        in a CUDA graph, the graph launched between events (no host work between the
        copies). NaN where the capture fails."""
        cp = self.cp
        side = cp.cuda.Stream(non_blocking=True)
        try:
            with side:
                fn()  # anything lazy (a kernel's first load) before the capture
                side.synchronize()
                side.begin_capture()
                for _ in range(self.batch):
                    fn()
                graph = side.end_capture()
        except Exception:  # noqa: BLE001 - reported as NaN: the queued rate remains
            return math.nan
        times = []
        for i in range(self.warmup + self.runs):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record(side)
            graph.launch(side)
            stop.record(side)
            stop.synchronize()
            if i >= self.warmup:
                times.append(cp.cuda.get_elapsed_time(start, stop) / self.batch)
        return statistics.median(times)

    def host_us(self, fn: Callable[[], None]) -> float:
        """Median microseconds the host spends issuing one call (the device idle)."""
        stream = self.cp.cuda.get_current_stream()
        times = []
        for _ in range(self.runs):
            stream.synchronize()
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        stream.synchronize()
        return statistics.median(times)


def _timed(timer: GpuTimer, timed: list[tuple[str, Any]], n: int
           ) -> tuple[dict[str, float], str, dict[str, float], dict[str, float]]:
    """Each copy's milliseconds (captured in a graph where it can, else queued), how
    they were timed, its host microseconds, and its rate in GB/s of ``n`` bytes; plus
    the queued rate of ``reshard``'s."""
    fns = dict(timed)
    ms = {name: timer.graph_ms(fn) for name, fn in timed}
    queued = timer.ms(fns["reshard"])
    timing = "graph"
    if any(math.isnan(v) for v in ms.values()):  # no capture: the queued rates instead
        ms, timing = {name: timer.ms(fn) for name, fn in timed}, "queued"
    else:  # a copy node of a graph can run slower than the same copy queued: the floor
        ms["floor"] = min(ms["floor"], timer.ms(fns["floor"]))  # is the faster of the two
    host = {f"{name}_host_us": timer.host_us(fn) for name, fn in timed}
    rate = {k: n / (v * 1e-3) / 1e9 for k, v in ms.items()}
    rate["queued"] = n / (queued * 1e-3) / 1e9
    return ms, timing, host, rate


def measure(pb: PackBox, cupy: Any, timer: GpuTimer) -> dict[str, Any]:
    """One box's floor, kernel and reshard rates (GB/s of the box's bytes), the
    reshard copy checked byte for byte against the kernel's."""
    cp = cupy
    dt = pb.dtype
    bits = {1: cp.uint8, 2: cp.uint16, 4: cp.uint32, 8: cp.uint64}[itemsize(dt)]
    shard = cp.arange(math.prod(pb.shard_shape), dtype=bits).view(dt).reshape(pb.shard_shape)
    view = region(shard, pb.box, pb.shard)
    flat = cp.empty(math.prod(pb.box_shape), dtype=dt)
    other = cp.empty_like(flat)
    n = pb.nbytes
    runtime = cp.cuda.runtime

    def floor() -> None:
        runtime.memcpyAsync(other.data.ptr, flat.data.ptr, n, runtime.memcpyDeviceToDevice,
                            cp.cuda.get_current_stream().ptr)

    packed = flat.reshape(view.shape)
    if pb.side == "unpack":
        flat[...] = cp.arange(flat.size, dtype=bits).view(dt) * 7 + 3
    # pack: the box into the flat buffer; unpack: the flat buffer into the box
    to, fro, whole = (packed, view, flat) if pb.side == "pack" else (view, packed, shard)
    copy = pack if pb.side == "pack" else unpack

    def kernel() -> None:
        to[...] = fro

    def ours() -> None:
        copy(shard, pb.box, pb.shard, flat)

    kernel()
    want = whole.copy()
    to.fill(0)
    ours()
    exact = bool(cp.array_equal(whole.view(bits), want.view(bits)))
    del want
    assert not is_contiguous(view)
    copies, forced = (pitched_copies(tuple(to.shape), tuple(to.strides), tuple(fro.strides),
                                     view.itemsize, **rows) for rows in ({}, {"min_row": 1}))

    def pitched() -> None:  # cudaMemcpy2DAsync, every row length
        for c in forced or ():
            runtime.memcpy2DAsync(to.data.ptr + c.dst, c.dpitch, fro.data.ptr + c.src,
                                  c.spitch, c.width, c.height, runtime.memcpyDeviceToDevice,
                                  cp.cuda.get_current_stream().ptr)

    timed = [("floor", floor), ("kernel", kernel), ("reshard", ours)]
    if forced is not None:
        timed.append(("2D", pitched))
    ms, timing, host, rate = _timed(timer, timed, n)
    return {"case": pb.case, "side": pb.side, "box": pb.box_shape, "shard": pb.shard_shape,
            "MiB": n / MIB, "timing": timing,
            "path": "cupy" if copies is None else launch(copies[0], to.data.ptr,
                                                          fro.data.ptr).kernel[8:],
            "exact": exact, **{f"{k}_ms": v for k, v in ms.items()}, **host,
            **{f"{k}_GBs": r for k, r in rate.items()},
            "kernel_vs_floor": rate["kernel"] / rate["floor"],
            "memcpy2d_vs_floor": rate.get("2D", math.nan) / rate["floor"],
            "reshard_vs_floor": rate["reshard"] / rate["floor"],
            "queued_vs_floor": rate["queued"] / rate["floor"]}


def _row(r: dict[str, Any]) -> str:
    return (f"{r['case']:>4} {r['side']:>6} {r['MiB']:>8.1f} {r['box']!s:>18} "
            f"{r['shard']!s:>18} {r['path']:>11} {r['floor_GBs']:>7.0f} "
            f"{r['kernel_GBs']:>7.0f} {r['kernel_vs_floor']:>5.2f} "
            f"{r['memcpy2d_vs_floor']:>5.2f} {r['reshard_GBs']:>7.0f} "
            f"{r['reshard_vs_floor']:>5.2f} {r['queued_vs_floor']:>5.2f} {r['floor_host_us']:>5.0f} {r['kernel_host_us']:>5.0f} "
            f"{r['reshard_host_us']:>5.0f} {'yes' if r['exact'] else 'NO'}")


HEADER = (f"{'case':>4} {'side':>6} {'MiB':>8} {'box':>18} {'shard':>18} {'path':>11} "
          f"{'floor':>7} {'kernel':>7} {'x':>5} {'2D x':>5} {'reshard':>7} {'x':>5} {'q x':>5} "
          f"{'us:fl':>5} {'kern':>5} {'resh':>5} exact")



def usable_cupy(tool: str, listed: str) -> Any:
    """cupy if it sees a CUDA GPU; else None, after saying so on stderr (``tool``'s
    ``--dry-run`` lists its ``listed`` without one)."""
    try:
        import cupy

        usable = bool(cupy.is_available())
    except Exception:  # noqa: BLE001 - no cupy, or a cupy without a usable driver
        usable = False
    if usable:
        return cupy
    print(f"{tool} needs cupy and a CUDA GPU; none is usable here (--dry-run lists the "
          f"{listed})", file=sys.stderr)
    return None


def main(argv: list[str] | None = None) -> int:
    p = flags.parser("python -m reshard.microbench.gpu_pack", __doc__ or "")
    p.add_argument("-n", "--runs", type=positive_int, default=10, help="timed runs per copy")
    p.add_argument("-w", "--warmup", type=natural_int, default=2, help="untimed runs first")
    p.add_argument("-e", "--max-bytes", type=flags.parse_size, default=SIZES[-1],
                   help="largest box (bytes, or with K/M/G; sizes are 1 MiB x 4^k up to it)")
    p.add_argument("-J", "--json", help="write the rows to this file")
    p.add_argument("--dry-run", action="store_true", help="list the boxes; needs no GPU")
    args = p.parse_args(argv)
    sizes = tuple(s for s in SIZES if s <= args.max_bytes)
    if args.dry_run:
        for pb in boxes(sizes):
            print(f"case {pb.case} {pb.side}: box {pb.box_shape} of shard {pb.shard_shape}"
                  f" ({pb.nbytes / MIB:.1f} MiB)")
        return 0
    cupy = usable_cupy("gpu_pack", "boxes")
    if cupy is None:
        return 2
    timer = GpuTimer(cupy, args.runs, args.warmup)
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    print(f"device: {name.decode() if isinstance(name, bytes) else name}; GB/s of box bytes")
    print(HEADER, flush=True)
    rows = []
    for pb in boxes(sizes):
        r = measure(pb, cupy, timer)
        cupy.get_default_memory_pool().free_all_blocks()  # the box's arrays are gone
        rows.append(r)
        print(_row(r), flush=True)
    big = [r for r in rows if r["MiB"] * MIB >= GOAL_FROM]
    worst = min((r["reshard_vs_floor"] for r in big), default=float("nan"))
    met = sum(r["reshard_vs_floor"] >= GOAL for r in big)
    print(f"goal reshard >= {GOAL}x floor for boxes >= {GOAL_FROM // MIB} MiB: "
          f"{met}/{len(big)} rows, worst {worst:.2f}x; "
          f"{'all exact' if all(r['exact'] for r in rows) else 'NOT EXACT'}")
    if args.json:
        write_json(args.json, {"device": str(name), "machine": machine(), "rows": rows,
                               "goal": GOAL, "goal_from_bytes": GOAL_FROM})
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
