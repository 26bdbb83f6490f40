"""The paper's microbenchmark cases, named, at small size through the local runtime,
and the cost model's verdict on them at full size."""

from __future__ import annotations

import numpy as np
import pytest

import reshard
from reshard.microbench.suites.paper import n_to_m_cases, one_to_m_cases

from ..common import check_shards, wire_bytes

SMALL = {3: (16, 12, 6)}
CASES = {c.name: c for c in n_to_m_cases() + one_to_m_cases(elements=1 << 10)}


def small(case):
    if len(case.shape) == 1:
        return case
    return case.with_shape((24, 12, 5) if case.name == "6" else (16, 12, 6))


@pytest.mark.parametrize("strategy", ["send_recv", "allgather", "broadcast"])
@pytest.mark.parametrize("name", list(CASES))
def test_case_moves_every_shard(name, strategy):
    case = small(CASES[name])
    src, dst, cluster = case.build()
    value = np.arange(np.prod(case.shape), dtype=case.dtype).reshape(case.shape)
    with reshard.Runtime(backend="local", cluster=cluster) as rt:
        x = rt.put(value, src)
        p = rt.plan(x, dst, strategy)
        y = rt.execute(p, [x])[0]
        check_shards(rt, y, value)
        assert rt.group.fabric.total_bytes() == wire_bytes(p)


@pytest.mark.parametrize("name", list(CASES))
def test_broadcast_model_near_lower_bound_full_size(name):
    case = CASES[name]
    if len(case.shape) == 1:
        case = case.with_shape((1 << 28,))
    src, dst, cluster = case.build()
    p = reshard.plan(case.shape, case.dtype, src, dst, cluster=cluster, strategy="broadcast")
    assert p.estimate() <= 1.10 * p.lower_bound()


def test_broadcast_beats_send_recv_where_destinations_replicate():
    # Case 1: each destination host needs one half, replicated over 4 devices.
    src, dst, cluster = CASES["1"].build()
    est = {s: reshard.plan(CASES["1"].shape, "int32", src, dst, cluster=cluster,
                           strategy=s).estimate() for s in ("send_recv", "broadcast")}
    assert est["send_recv"] > 3.5 * est["broadcast"]
    # each destination host receives its half once (1 GiB over a 10 Gbit/s NIC)
    assert est["broadcast"] == pytest.approx(2 ** 30 / (10e9 / 8), rel=0.01)
