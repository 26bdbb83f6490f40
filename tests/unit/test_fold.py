"""Folded scale blocks (``Cast(..., fold=True)``): 128 x 128 blocks of a tensor's 2-D
projection, checked, planned, executed, serialised and refused where they cannot go."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import reshard
from reshard.casting import reference_cast
from reshard.dtypes import Cast, ScaleMode, projection_block, scale_grid
from reshard.errors import DTypeError, ReshardError

FOLD = Cast("float8_e4m3fn", ScaleMode.BLOCK128, fold=True)


@pytest.mark.parametrize("shape,block", [
    ((8, 64, 512), (2, 64, 128)), ((8, 128, 512), (1, 128, 128)),
    ((8, 512, 300), (1, 128, 128)), ((3, 64, 300), (2, 64, 128)),
    ((4, 2, 32, 256), (2, 2, 32, 128)), ((4, 8, 32, 256), (1, 4, 32, 128)),
    ((2, 16, 8, 256), (1, 16, 8, 128)), ((700, 256), (128, 128))])
def test_projection_block_is_128_rows_of_the_projection(shape, block):
    assert projection_block(shape) == block
    x = np.random.default_rng(0).standard_normal(shape).astype(ml_dtypes.bfloat16)
    values, scales = reference_cast(x, FOLD)
    flat_values, flat_scales = reference_cast(x.reshape(-1, shape[-1]),
                                              Cast("float8_e4m3fn", ScaleMode.BLOCK128))
    assert scales.shape == scale_grid(shape, ScaleMode.BLOCK128, fold=True)
    assert scales.tobytes() == flat_scales.tobytes()
    assert values.tobytes() == flat_values.tobytes()


@pytest.mark.parametrize("shape", [(8, 96, 512), (8, 192, 512), (3, 3, 50, 64)])
def test_shapes_whose_projection_blocks_are_no_boxes_are_refused(shape):
    with pytest.raises(DTypeError, match="no box of it"):
        projection_block(shape)


def test_fold_is_refused_where_the_mode_has_no_row_blocks():
    lay = reshard.Layout(reshard.DeviceMesh((2,)), "S0RR")
    with pytest.raises(DTypeError, match=r"fold=True folds the 128 x 128 blocks.*'mx32'"):
        reshard.plan((8, 64, 256), "bfloat16", lay, lay,
                     cast=Cast("float8_e4m3fn", ScaleMode.MX32, fold=True))
    with pytest.raises(DTypeError, match="no box"):
        reshard.plan((8, 96, 256), "bfloat16", lay, lay, cast=FOLD)


def test_a_folded_cast_runs_plans_and_round_trips():
    """k of a head_dim-64 model, 4 kv-head groups a rank -> 2 a rank: the delivered
    scales are the 2-D projection's, and the plan's JSON carries ``fold`` (a plan
    without it writes none)."""
    shape = (8, 64, 256)
    src = reshard.Layout(reshard.DeviceMesh((2,)), "S0RR")
    dst = reshard.Layout(reshard.DeviceMesh((4,), devices=range(2, 6)), "S0RR")
    x = np.random.default_rng(1).standard_normal(shape).astype(ml_dtypes.bfloat16)
    with reshard.Runtime(backend="local") as rt:
        y = rt.reshard(rt.put(x, src), dst, cast=FOLD)
        values, scales = rt.get(y), rt.get(y.scales)
    want, want_scales = reference_cast(x.reshape(512, 256),
                                       Cast("float8_e4m3fn", ScaleMode.BLOCK128))
    assert scales.shape == (4, 1, 2) and scales.tobytes() == want_scales.tobytes()
    assert values.tobytes() == want.tobytes()
    p = reshard.plan(shape, "bfloat16", src, dst, cast=FOLD)
    assert '"fold": true' in p.to_json() and reshard.ReshardPlan.from_json(p.to_json()) == p
    assert "/fold" in str(p.tensors[0])
    from reshard.comm.program import WorkerProgram, programs

    for prog in programs(p, [0, 1, 2, 3, 4, 5]).values():  # what a worker process loads
        again = WorkerProgram.from_json(prog.to_json())
        assert again == prog and again.tensors[0].fold
    plain = reshard.plan(shape, "bfloat16", src, dst, cast="float8_e4m3fn", scale="block128")
    assert '"fold"' not in plain.to_json() and p.digest() != plain.digest()


def test_the_service_refuses_a_folded_cast_instead_of_dropping_it():
    pytest.importorskip("grpc")
    from reshard.service.convert import tensor_spec_to_pb, tensor_to_pb

    lay = reshard.Layout(reshard.DeviceMesh((2,)), "S0RR")
    with pytest.raises(ReshardError, match="carries no folded scale blocks"):
        tensor_to_pb((8, 64, 256), "bfloat16", lay, lay, FOLD)
    p = reshard.plan((8, 64, 256), "bfloat16", lay, lay, cast=FOLD)
    with pytest.raises(ReshardError, match="carries no folded scale blocks"):
        tensor_spec_to_pb(p.tensors[0])
