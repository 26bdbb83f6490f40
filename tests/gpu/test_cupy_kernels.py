"""What reshard computes on a GPU itself, against references: bfloat16 / float8 bits
converted by reshard.bits on cupy arrays equal the numpy results (which
tests/unit/test_bits.py holds to ml_dtypes), and comm.pitched's cudaMemcpy2DAsync
copies of boxes equal cupy's own assignment. Skipped without cupy or a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.bits import decode, encode_into
from reshard.comm.engine.pitched import copy_into, pitched_copies
from reshard.dtypes import parse_dtype, storage

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_bits_on_cupy_equal_numpy(gpus, name):
    import cupy

    rng = np.random.default_rng(11)
    patterns = rng.integers(0, 1 << 32, size=2_000_000, dtype=np.uint64).astype(np.uint32)
    values = np.concatenate([patterns.view(np.float32),
                             rng.standard_normal(1_000_000).astype(np.float32) * 100])
    want = np.empty(values.shape, storage(name))
    encode_into(want, values, name)
    got = cupy.empty(values.shape, storage(name))
    encode_into(got, cupy.asarray(values), name)
    assert cupy.asnumpy(got).tobytes() == want.tobytes()
    codes = np.arange(1 << (8 * parse_dtype(name).itemsize)).astype(storage(name))
    back = cupy.asnumpy(decode(cupy.asarray(codes), name))
    assert back.tobytes() == decode(codes, name).tobytes()


@pytest.mark.timeout(120)
def test_pitched_copies_match_assignment(gpus):
    """Boxes packed, unpacked and cut in one, two and three dimensions."""
    import cupy

    rng = np.random.default_rng(7)
    shard = cupy.asarray(rng.integers(0, 1 << 30, size=(24, 40, 96), dtype=np.int32))
    boxes = [np.s_[3:9, :, :], np.s_[:, 5:17, :], np.s_[2:7, 5:17, :],
             np.s_[2:7, 5:17, 0:80], np.s_[:, :, 16:96], np.s_[1:2, 3:4, :]]
    pitched = 0
    for box in boxes:
        view = shard[box]
        packed = cupy.zeros(view.shape, cupy.int32)
        pitched += pitched_copies(packed.shape, packed.strides, view.strides, 4) is not None
        copy_into(packed, view)
        assert cupy.asnumpy(packed).tobytes() == cupy.asnumpy(view).tobytes()
        back = cupy.zeros_like(shard)
        copy_into(back[box], packed)
        want = cupy.zeros_like(shard)
        want[box] = packed
        assert cupy.asnumpy(back).tobytes() == cupy.asnumpy(want).tobytes()
    assert pitched == len(boxes)  # every one of these took the pitched path


@pytest.mark.timeout(120)
def test_box_batch_equals_assignment(gpus):
    """comm.box_batch: boxes of many shapes, dtypes and alignments, packed and unpacked,
    in one launch each way, equal to cupy's assignment (and nothing else written)."""
    import cupy

    from reshard.comm.engine.box_batch import BoxBatch

    rng = np.random.default_rng(5)
    cases = []
    for k in range(200):
        dtype = [np.uint8, np.uint16, np.int32, np.float64][k % 4]
        shape = tuple(int(v) for v in rng.integers(1, 40, 3))
        shard = cupy.asarray(rng.integers(0, 100, shape).astype(dtype))
        starts = [int(rng.integers(0, n)) for n in shape]
        box = tuple(slice(a, a + int(rng.integers(1, n - a + 1))) for a, n in zip(starts, shape))
        cases.append((shard, box))
    batch = BoxBatch()
    packed = []
    for shard, box in cases:
        out = cupy.zeros(shard[box].shape, shard.dtype)
        assert batch.add(out, shard[box])
        packed.append(out)
    batch.flush()
    for (shard, box), out in zip(cases, packed):
        assert cupy.array_equal(out, shard[box])
    backs = [cupy.zeros_like(shard) for shard, _ in cases]
    for (_, box), out, back in zip(cases, packed, backs):
        assert batch.add(back[box], out)
    batch.flush()
    for (shard, box), back in zip(cases, backs):
        want = cupy.zeros_like(shard)
        want[box] = shard[box]
        assert cupy.array_equal(back, want)


@pytest.mark.timeout(120)
def test_a_thousand_16k_boxes_in_one_launch(gpus):
    import cupy

    from reshard.comm.engine.box_batch import BoxBatch

    shard = cupy.arange(1000 * 16 * 1024, dtype=cupy.int32).reshape(16000, 1024)
    out = cupy.zeros((1000, 16, 256), cupy.int32)
    batch = BoxBatch()
    for k in range(1000):
        assert batch.add(out[k], shard[16 * k:16 * (k + 1), 256:512])
    assert len(batch.rows) == 1000
    batch.flush()
    assert cupy.array_equal(out, shard.reshape(1000, 16, 1024)[:, :, 256:512])


@pytest.mark.timeout(120)
def test_gpu_cast_bandwidth_is_measured(gpus):
    from reshard.microbench.calibrate import gpu_cast_bandwidth

    rate = gpu_cast_bandwidth(shape=(1024, 4096), runs=3, warmup=1)
    assert 1e9 < rate < 1e14
