"""What reshard computes on a GPU itself, against references: bfloat16 / float8 bits
converted by reshard.bits on cupy arrays equal the numpy results (which
tests/unit/test_bits.py holds to ml_dtypes), and comm.pitched's cudaMemcpy2DAsync
copies of boxes equal cupy's own assignment. Skipped without cupy or a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.bits import decode, encode_into
from reshard.comm.pitched import copy_into, pitched_copies
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
