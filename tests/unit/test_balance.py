"""NIC balance with relays (planner/cells/balance.py): a transfer leaves (or enters) a host
through another device's NIC only where that evens the host's NICs out."""

from __future__ import annotations

import collections

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.planner.cells.balance import Loads
from reshard.planner.costing.cost import task_path
from reshard.planner.values.resources import NIC_OUT


def test_a_relay_must_leave_its_nic_no_more_loaded_than_the_one_it_relieves():
    cluster = Cluster.preset("aws-p4d.24xlarge", 2)  # 4 NICs per host, 2 devices each
    loads = Loads(cluster)
    nic = loads.nic
    loads.expected[(NIC_OUT, nic(0))] = 1000.0
    loads.nic_out[nic(0)] = 600.0  # what was charged to it so far
    for d in (2, 4, 6):
        loads.expected[(NIC_OUT, nic(d))] = 990.0
    # a 500-byte slice of device 0: any other NIC would carry 1,490, more than NIC 0's
    assert loads._relay(NIC_OUT, 0, 0, {0, 8}, 500) is None
    assert not any(loads.moved.values())
    loads.expected[(NIC_OUT, nic(6))] = 100.0  # now one NIC is far below
    via = loads._relay(NIC_OUT, 0, 0, {0, 8}, 500)
    assert via is not None and nic(via) == nic(6)
    assert loads.moved[(NIC_OUT, nic(6))] == 500 and loads.moved[(NIC_OUT, nic(0))] == -500
    # the next 500 bytes would leave NIC 3 at 1,100 against NIC 0's 500: refused
    assert loads._relay(NIC_OUT, 0, 0, {0, 8}, 500) is None


def test_shards_a_row_apart_keep_every_nic_of_a_host_even():
    """S0RS1 (2, 8) -> S0RR (2, 8) on p4d hosts, shape 3 x 3018 x 3772: the first host's
    eight shards are 472 or 471 columns wide, so its NICs are expected to carry a few
    KB apart; every relay once went through the least expected NIC, whose own shards
    came on top (18.5 MB against 7-10 on the others: 1.62x the bound)."""
    cluster = Cluster.preset("aws-p4d.24xlarge", 4)
    src = Layout(DeviceMesh((2, 8), range(16)), "S0RS1")
    dst = Layout(DeviceMesh((2, 8), range(16, 32)), "S0RR")
    p = reshard.plan((3, 3018, 3772), "bfloat16", src, dst, cluster=cluster,
                     strategy="broadcast")
    out: collections.Counter = collections.Counter()
    for t in p.tasks:
        for (kind, n), f in task_path(t, cluster)[0]:
            if kind == NIC_OUT and cluster.host_of(n * 2) == 0:
                out[n] += f * t.nbytes
    assert len(out) == 4 and max(out.values()) <= 1.02 * min(out.values())
    assert p.estimate() <= 1.01 * p.lower_bound()


def test_no_relay_where_a_shared_bandwidth_binds():
    """One device to three of another host, each device its own NIC: the root's NIC
    carries the whole box while its neighbours' idle, so the planner relays through
    them, unless every received byte crosses a shared bandwidth that binds first
    (``--cluster local``: one machine's cores), where a relay's receipt is one more
    byte for it and evens out no NIC that matters (1.22x the bound, now 1.005x)."""
    figures = {"nic_bandwidth": 4 * 4.83e9, "nics_per_host": 4, "intra_bandwidth": 4.83e9,
               "latency": 22e-6, "intra_latency": 22e-6, "copy_bandwidth": 12.6e9}
    src = Layout(DeviceMesh((1,), [0]), "R")
    dst = Layout(DeviceMesh((3,), [4, 5, 6]), "R")
    for shared, relays in ((0.0, True), (6.25e9, False)):
        cluster = Cluster.regular(2, 4, shared_bandwidth=shared, **figures)
        p = reshard.plan((2_097_152,), "float32", src, dst, cluster=cluster,
                         strategy="broadcast")
        assert any(t.through for t in p.tasks) is relays
        if shared:
            assert p.estimate() <= 1.01 * p.lower_bound()
