"""comm/box_batch: a step's box copies as one kernel launch. The kernel's per-thread
work (its ``__host__ __device__`` source) is compiled for the CPU and run over every
thread of the launch's grid on numpy memory, for many boxes of many shapes, dtypes and
alignments at once, against numpy's own assignment; nvcc compiles it for sm_90."""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
from typing import ClassVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshard.comm.engine.box_batch import BOX_COMMON, SOURCE, boxes_grid, table_rows

CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler for the twin")

HARNESS = BOX_COMMON + r"""
extern "C" void reshard_boxes(i64 gx, i64 gy, i64 bx, const i64* table, i64 count) {
  for (i64 y = 0; y < gy; ++y)
    for (i64 k = y; k < count; k += gy)
      for (i64 t = 0; t < gx * bx; ++t) copy_box_part(table + 6 * k, t, gx * bx);
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    folder = tmp_path_factory.mktemp("boxes")
    tag = hashlib.sha256(HARNESS.encode()).hexdigest()[:12]
    src, so = folder / f"boxes_{tag}.cpp", folder / f"boxes_{tag}.so"
    src.write_text(HARNESS)
    subprocess.run([CXX, "-std=c++17", "-O2", "-shared", "-fPIC", "-o", str(so), str(src)],
                   check=True, timeout=300)
    return ctypes.CDLL(str(so))


def run(lib, rows):
    """The launch boxes_grid plans, every thread in turn."""
    table = np.array(rows, dtype=np.int64)
    (gx, gy, _), (bx, _, _) = boxes_grid(rows)
    lib.reshard_boxes(ctypes.c_longlong(gx), ctypes.c_longlong(gy), ctypes.c_longlong(bx),
                      ctypes.c_void_p(table.ctypes.data), ctypes.c_longlong(len(rows)))


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@st.composite
def many_boxes(draw):
    """Up to 40 (shard shape, box, itemsize, offset, pack or unpack) cases."""
    cases = []
    for _ in range(draw(st.integers(1, 30))):
        ndim = draw(st.integers(1, 3))
        shape = tuple(draw(st.integers(1, 40)) for _ in range(ndim))
        box = []
        for n in shape:
            a = draw(st.integers(0, n - 1))
            box.append(slice(a, draw(st.integers(a + 1, n))))
        cases.append((shape, tuple(box), draw(st.sampled_from([1, 2, 4, 8, 16])),
                      draw(st.integers(0, 3)), draw(st.booleans())))
    return cases


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(cases=many_boxes())
def test_one_launch_copies_every_box(lib, cases):
    rng = np.random.default_rng(len(cases))
    rows, checks, kept = [], [], []
    for shape, box, item, off, packing in cases:
        n = int(np.prod(shape))
        raw = rng.integers(0, 256, (n + 4) * item, dtype=np.uint8)
        shard = raw[off * item: off * item + n * item].view(f"V{item}").reshape(shape)
        view = shard[box]
        dense_raw = np.zeros(view.size * item + 16, np.uint8)
        dense = dense_raw[off: off + view.size * item].view(f"V{item}").reshape(view.shape)
        dst, src = (dense, view) if packing else (view, dense)
        if not packing:
            dense[...] = np.ascontiguousarray(
                rng.integers(0, 256, view.size * item, dtype=np.uint8).view(f"V{item}")
                .reshape(view.shape))
        want = np.array(src, copy=True)
        before = shard.copy()
        got = table_rows(_ptr(dst), dst.strides, _ptr(src), src.strides, dst.shape, item)
        if got is None:
            continue
        rows += got
        checks.append((dst, want, None if packing else (shard, before, box)))
        kept += [raw, dense_raw]
    if not rows:
        return
    run(lib, rows)
    for dst, want, around in checks:
        assert dst.tobytes() == want.tobytes()
        if around is not None:  # unpacking wrote the box only
            shard, before, box = around
            mask = np.ones(shard.shape, bool)
            mask[box] = False
            assert shard[mask].tobytes() == before[mask].tobytes()


def test_a_thousand_16k_boxes_in_one_table(lib):
    """The benchmark's case: 1,000 boxes of 16 KiB (rows of 1 KiB of a wider shard)."""
    shard = np.random.default_rng(0).integers(0, 1 << 30, (1000 * 16, 1024), np.int32)
    out = np.zeros((1000, 16, 256), np.int32)
    rows = []
    for k in range(1000):
        view = shard[16 * k:16 * (k + 1), 256:512]
        rows += table_rows(_ptr(out[k]), out[k].strides, _ptr(view), view.strides, view.shape,
                           4)
    assert len(rows) == 1000 and all(r[4] * r[5] == 16 << 10 for r in rows)
    run(lib, rows)
    assert np.array_equal(out, shard.reshape(1000, 16, 1024)[:, :, 256:512])


def test_source_compiles_for_hopper(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc")
    cu = tmp_path / "boxes.cu"
    cu.write_text(SOURCE)
    done = subprocess.run([nvcc, "--std=c++17", "-arch=sm_90", "--cubin", "-Xptxas", "-v",
                           "-o", str(tmp_path / "boxes.cubin"), str(cu)], capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reshard_boxes" in done.stderr
    assert set(re.findall(r"(\d+) bytes spill stores", done.stderr)) == {"0"}


class Deferred:
    """A BoxBatch on host memory for the execution's tests: every copy it takes waits
    for :meth:`flush`, as a GPU's queued launch would (its source read then)."""

    made: ClassVar[list[Deferred]] = []

    def __init__(self) -> None:
        self.rows: list[tuple[np.ndarray, np.ndarray]] = []
        self.queued = 0
        Deferred.made.append(self)

    def add(self, dst, src) -> bool:
        if not (isinstance(dst, np.ndarray) and isinstance(src, np.ndarray)):
            return False
        self.rows.append((dst, src))
        self.queued += 1
        return True

    def flush(self) -> None:
        for dst, src in self.rows:
            dst[...] = src
        self.rows = []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["broadcast", "send_recv", "allgather"])
def test_the_execution_flushes_before_anything_reads(monkeypatch, strategy):
    """Every copy the execution queues (packs, unpacks, relays, gathers, local copies)
    waits until a flush; the results stay exact, so each is flushed before it is read."""
    import reshard
    from reshard import Cluster, DeviceMesh, Layout
    from reshard.casting import reference_cast
    from reshard.comm.engine import execution
    from reshard.dtypes import Cast, ScaleMode
    from reshard.microbench.small_tensors import requests

    from ..common import check_shards, sample

    monkeypatch.setattr(execution, "BoxBatch", Deferred)
    Deferred.made = []
    rng = np.random.default_rng(3)
    cases = [((9, 14), "float32", "S0S1", "RS0", (2, 2), (2,)),
             ((130, 70), "float32", "RS0", "S0S1", (4,), (2, 2)),
             ((7, 5, 6), "int32", "RS0S1", "S1RS0", (2, 2), (2, 2))]
    with reshard.Runtime("local", Cluster.regular(2, 4)) as rt:
        for shape, dtype, s, d, sm, dm in cases:
            src = Layout(DeviceMesh(sm, list(range(int(np.prod(sm))))), s)
            dst = Layout(DeviceMesh(dm, list(range(4, 4 + int(np.prod(dm))))), d)
            value = sample(rng, shape, dtype)
            x = rt.put(value, src)
            check_shards(rt, rt.reshard(x, dst, strategy=strategy), value)
        reqs = requests(40, seed=1, low=1 << 10, high=8 << 10)
        values = [sample(rng, shape, dt) for shape, dt, _, _ in reqs]
        xs = [rt.put(v, a) for v, (_, _, a, _) in zip(values, reqs)]
        ys = rt.execute(rt.plan(xs, [b for *_, b in reqs], strategy), xs)
        for y, v in zip(ys, values):
            check_shards(rt, y, v)
        value = rng.standard_normal((256, 300)).astype(np.float32)
        src = Layout(DeviceMesh((2,), [0, 1]), "RS0")
        dst = Layout(DeviceMesh((2,), [2, 3]), "S0R")
        y = rt.reshard(rt.put(value, src), dst, strategy=strategy,
                       cast=Cast("float8_e4m3fn", ScaleMode.BLOCK128))
        want, _ = reference_cast(value, Cast("float8_e4m3fn", ScaleMode.BLOCK128))
        check_shards(rt, y, want)
    assert sum(b.queued for b in Deferred.made) > 50
