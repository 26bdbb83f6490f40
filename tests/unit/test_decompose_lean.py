"""The grid's volumes a column at a time (issue 62, round eighteen): the same products
as :func:`_volumes` of every row's extents laid out at once, held to it and to
``np.prod`` on corners of one to four dims."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.planner.cells import decompose as dec


@pytest.mark.parametrize("seed", range(6))
def test_volumes_between_are_the_volumes_of_the_extents(seed):
    rng = np.random.default_rng(seed)
    for ndim in (1, 2, 3, 4):
        lo = rng.integers(0, 1 << 12, (57, ndim))
        hi = lo + rng.integers(0, 1 << 12, (57, ndim))
        got = dec._volumes_between(lo, hi)
        want = dec._volumes(hi - lo)
        assert got.dtype == want.dtype and got.tolist() == want.tolist()
        assert got.tolist() == np.prod(hi - lo, axis=1).tolist()
        assert not np.shares_memory(got, lo) and not np.shares_memory(got, hi)
