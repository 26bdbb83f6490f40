"""SPMD on the emulated multi-host testbed: 8 torch.distributed gloo ranks, two in each
of four hosts' network namespaces (rate-limited NICs), with no driver. Every rank plans
``redistribute_many`` of a 50-tensor state dict itself, the ranks compare digests, and
every rank's pieces are DTensor's own slices of the values; a rank given another shape
makes every rank refuse, naming it, within the timeout."""

from __future__ import annotations

import datetime
import functools
import os
import traceback

import pytest

from reshard.testbed import Testbed, available

from ._helpers import rank_results

pytestmark = pytest.mark.cpu

torch = pytest.importorskip("torch")

AVAILABLE = available()
HOSTS, PER_HOST = 4, 2
WORLD = HOSTS * PER_HOST
STORE_PORT = 29511
"""Rank 0's TCPStore port in host 0's namespace (a namespace this test made: free)."""


def _rank(where: dict, device: int, address, results, done) -> None:
    del address  # the ranks meet at rank 0's store inside the testbed
    try:
        from reshard.comm.launchers.netns import enter_netns

        host = device // PER_HOST
        enter_netns(where["netns"][host])  # before any thread or socket exists
        os.environ["GLOO_SOCKET_IFNAME"] = where["ifname"]
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh

        from reshard.adapters.dtensor_redistribute import Redistributor

        from .test_dtensor_redistribute import refuses_another_shape, state_dict_50

        td = datetime.timedelta(seconds=60)
        store = dist.TCPStore(where["address0"], STORE_PORT, WORLD, device == 0, timeout=td)
        dist.init_process_group("gloo", store=store, rank=device, world_size=WORLD,
                                timeout=td)
        # the source on hosts 0-1, the destination on hosts 2-3: every byte crosses a NIC
        a = DeviceMesh("cpu", torch.tensor([0, 1, 2, 3]))
        b = DeviceMesh("cpu", torch.tensor([4, 5, 6, 7]).reshape(2, 2))
        rd = Redistributor()
        checked = state_dict_50(a, b, rd, device)
        refused = refuses_another_shape(a, b, rd, device, odd=6)
        rd.close()
        results.put((device, {"checked": checked, "refused": refused,
                              "netns": os.stat("/proc/self/ns/net").st_ino}))
        done.wait(60)  # rank 0 hosts the store: it stays until every rank is done
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((device, traceback.format_exc()))


@pytest.mark.netns
@pytest.mark.skipif(not AVAILABLE, reason=f"no netns testbed: {AVAILABLE.reason}")
@pytest.mark.timeout(240)
def test_spmd_redistribute_many_on_the_testbed():
    with Testbed(HOSTS, 1.0) as tb:
        where = {"netns": [tb.netns(h) for h in range(HOSTS)], "ifname": tb.ifname,
                 "address0": tb.address(0)}
        got = rank_results(functools.partial(_rank, where), range(WORLD), wait=200)
        inodes = {h: os.stat(f"/var/run/netns/{tb.netns(h)}").st_ino for h in range(HOSTS)}
    for d, r in got.items():
        assert r["netns"] == inodes[d // PER_HOST], d  # each rank in its host's namespace
        assert r["refused"], f"device {d} was not refused"
    # destination ranks hold every tensor's piece: 4 ranks x 50 tensors
    assert sum(r["checked"] for r in got.values()) == 4 * 50
