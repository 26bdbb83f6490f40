"""The gloo backend's operations against the reference semantics of the local backend:
three ranks in their own processes, every dtype through broadcast / send / recv /
all-gather / reduce, the pipelined chain broadcast, and the barrier."""

from __future__ import annotations

import os
import traceback

import numpy as np
import pytest

from ._helpers import rank_results

pytestmark = pytest.mark.cpu

WORLD = (0, 3, 5)  # sparse device ids: ranks are positions
DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128")


class _Plan:
    """What GlooBackend.prepare reads from a plan."""

    def communicator_groups(self):
        return ((0, 3, 5), (0, 5), (3, 5))


def _values(device: int, dtype: str, n: int = 5) -> np.ndarray:
    dt = np.dtype(dtype)
    base = np.arange(n) * 37 + device * 101  # wraps for narrow types: sums must too
    out = base.astype(np.int64).astype(dt) if dt.kind in "iu" else base.astype(dt)
    if dt.kind == "c":
        out = out + 1j * dt.type(device)
    return out


def _rank_main(device: int, address, results, done) -> None:
    try:
        from reshard.comm.backends.gloo import GlooBackend

        b = GlooBackend(device, WORLD, address.connect(10), 10.0)
        b.prepare(_Plan())
        b.prepare(_Plan())  # cached: no second set of groups
        out = {"ifname": os.environ.get("GLOO_SOCKET_IFNAME", "unset")}
        for dt in DTYPES:
            buf = _values(device, dt) if device == 5 else np.zeros(5, dt)
            b.broadcast(buf, 5, (0, 3, 5))
            out[("bcast", dt)] = buf
            if device in (0, 5):
                gathered = np.zeros((2, 5), dt)
                b.all_gather(gathered, _values(device, dt), (0, 5))
                out[("gather", dt)] = gathered
            red = _values(device, dt)
            b.reduce(red, 0, (0, 3, 5))
            out[("reduce", dt)] = red
        if device == 3:
            b.send(np.arange(7, dtype=np.int64), 5)
        if device == 5:
            got = np.zeros(7, np.int64)
            b.recv(got, 3)
            out["p2p"] = got
        # the pipelined chain: 5 -> 0 -> 3 in several pieces (a ragged last one)
        from reshard.comm.backends.gloo import CHAIN_PIECE

        n = (3 * CHAIN_PIECE) // 8 + 3
        big = np.arange(n, dtype=np.float64) if device == 5 else np.zeros(n)
        b.broadcast(big, 5, (0, 3, 5), chain=(0, 3))
        out["chain"] = big
        empty = np.zeros(0, np.float32)
        b.broadcast(empty, 0, (0, 3, 5))  # zero bytes: a no-op everywhere
        b.barrier((0, 3, 5))
        if device in (3, 5):
            b.barrier((3, 5))
        b.close()
        results.put((device, out))
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((device, traceback.format_exc()))


@pytest.mark.timeout(120)
def test_gloo_ops_match_reference_semantics():
    got = rank_results(_rank_main, WORLD, wait=90, join=10)
    for dt in DTYPES:
        want = _values(5, dt)
        for d in WORLD:
            assert got[d][("bcast", dt)].tobytes() == want.tobytes(), (dt, d)
        rows = np.stack([_values(0, dt), _values(5, dt)])
        for d in (0, 5):
            assert got[d][("gather", dt)].tobytes() == rows.tobytes(), (dt, d)
        total = _values(0, dt).copy()
        total += _values(3, dt)
        total += _values(5, dt)
        assert got[0][("reduce", dt)].tobytes() == total.tobytes(), dt
    assert np.array_equal(got[5]["p2p"], np.arange(7))
    # the interface is set only while groups are made: a worker's later children (and
    # a test runner that made a backend in its own process) never inherit it
    assert {got[d]["ifname"] for d in WORLD} == {os.environ.get("GLOO_SOCKET_IFNAME", "unset")}
    n = len(got[5]["chain"])
    for d in WORLD:
        assert np.array_equal(got[d]["chain"], np.arange(n, dtype=np.float64)), d
