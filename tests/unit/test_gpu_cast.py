"""microbench/gpu_cast without a GPU: its cases and goals, the plain torch recipe it
times beside reshard (the same cast: on the CPU, where torch divides exactly, equal to
reference_cast), and its refusal without a usable GPU."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.casting import reference_cast
from reshard.dtypes import Cast, ScaleMode
from reshard.microbench import gpu_cast


def test_the_cases_and_their_goals(capsys):
    assert gpu_cast.main(["--dry-run", "--shape", "256,512", "--boxes", "10"]) == 0
    out = capsys.readouterr().out
    assert "bfloat16 (256, 512) -> float8_e4m3fn/block128" in out and "10 boxes" in out
    goals = {str(c): gpu_cast.goal(c) for _, c in gpu_cast.CASTS}
    assert goals["float8_e4m3fn/block128"] == 2.5 and goals["bfloat16"] == 1.5
    assert goals["float8_e4m3fn/mx32"] == 3.0
    assert gpu_cast.CASTS[0] == ("bfloat16", Cast("float8_e4m3fn", ScaleMode.BLOCK128))


@pytest.mark.parametrize("mode", [ScaleMode.TENSOR, ScaleMode.BLOCK128])
def test_the_plain_recipe_is_the_same_cast(mode):
    torch = pytest.importorskip("torch")
    cast = Cast("float8_e4m3fn", mode)
    x = np.random.default_rng(0).standard_normal((256, 384)).astype(np.float32)
    q, s = gpu_cast._torch_recipe(cast, torch)(torch.from_numpy(x))
    want, want_s = reference_cast(x, cast)
    assert q.view(torch.uint8).numpy().tobytes() == want.view(np.uint8).tobytes()
    assert np.array_equal(s.numpy().reshape(want_s.shape), want_s)
    plain = gpu_cast._torch_recipe(Cast("bfloat16"), torch)(torch.from_numpy(x))
    assert plain.view(torch.int16).numpy().tobytes() == \
        reference_cast(x, Cast("bfloat16"))[0].tobytes()


def test_without_a_gpu_it_says_so(capsys):
    cupy = pytest.importorskip("cupy")
    try:
        here = cupy.is_available()
    except Exception:  # noqa: BLE001
        here = False
    if here:
        pytest.skip("a GPU is here: the benchmark would run")
    assert gpu_cast.main([]) == 2
    assert "needs cupy and a CUDA GPU" in capsys.readouterr().err
