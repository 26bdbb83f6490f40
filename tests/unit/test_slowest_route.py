"""A route's seconds a byte over its slowest resource, read from its arrays (issue 62,
round eighteen): :func:`serial_floor._slowest` takes ``1 / least capacity`` where every
fraction is 1.0 and no capacity below 0; the same float as the quotient's most over
the edges (the old expression, here as the oracle), with capacities of 0, -0.0,
below 0, NaN and infinity,
fractions below 1.0 or 0, arrays shared and empty routes."""

from __future__ import annotations

import numpy as np
import pytest

from reshard.planner.passes.serial_floor import _kind_caps, _slowest


def _old(codes: np.ndarray, frac: np.ndarray, kind_cap: np.ndarray) -> float:
    on = frac > 0
    return float((frac[on] / kind_cap[codes[on] % 8]).max(initial=0.0))


@pytest.mark.parametrize("seed", range(30))
def test_the_least_capacity_is_the_quotients_most(seed):
    rng = np.random.default_rng(seed)
    kind_cap = rng.choice([1e9, 12.5e9, 3e10 / 7, 4.9e11, 0.3, np.inf], size=8)
    if seed % 3 == 0:
        kind_cap[int(rng.integers(8))] = 0.0  # a kind of no capacity: infinity
    if seed % 10 == 1:
        kind_cap[int(rng.integers(8))] = rng.choice([-0.0, -2e9, np.nan])  # the old way
    caps, ones = _kind_caps(kind_cap), {}
    shared = np.ones(int(rng.integers(0, 300)))
    shared.flags.writeable = False
    for _ in range(6):
        n = len(shared) if rng.random() < 0.6 else int(rng.integers(0, 300))
        codes = rng.integers(0, 5000, size=n)
        frac = shared if len(shared) == n else np.ones(n)
        if rng.random() < 0.3 and n:
            frac = rng.choice([0.0, 0.25, 1.0, 1 / 3], size=n)
        with np.errstate(divide="ignore", invalid="ignore"):
            want = _old(codes, frac, kind_cap)
            got = _slowest((codes, frac), caps, ones)
        assert got == want or (np.isnan(got) and np.isnan(want))
