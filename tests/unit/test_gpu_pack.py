"""microbench/gpu_pack's choice of boxes (no GPU needed): each is a strided box of the
shard it names, inside it, at about the asked size; without a usable GPU it stops
with exit code 2."""

from __future__ import annotations

import math

import pytest

from reshard.comm.engine.packing import byte_span
from reshard.microbench import gpu_pack


def test_boxes_are_strided_boxes_of_their_shards_at_each_size():
    got = list(gpu_pack.boxes())
    assert {(b.case, b.side) for b in got} == {("3", "unpack"), ("4", "unpack"),
                                                 ("9", "pack"), ("9", "unpack")}
    for b in got:
        assert all(s0 <= a < c <= s1 for (a, c), (s0, s1) in zip(b.box, b.shard))
        assert byte_span(b.box, b.shard, 4) is None  # not one run of the shard
        assert b.nbytes == math.prod(b.box_shape) * 4
    for side in ("pack", "unpack"):
        sizes = sorted(b.nbytes for b in got if b.case == "9" and b.side == side)
        assert len(sizes) == len(gpu_pack.SIZES)
        for want, have in zip(gpu_pack.SIZES, sizes):
            assert 0.9 < have / want < 1.1


def test_without_a_gpu_it_says_so(capsys):
    cupy = pytest.importorskip("cupy")
    if cupy.is_available():
        pytest.skip("a GPU is here: the benchmark would run")
    assert gpu_pack.main([]) == 2
    assert "needs cupy and a CUDA GPU" in capsys.readouterr().err
