"""Worker processes of a backend that asks for it run under SCHED_BATCH
(:mod:`reshard.comm.launchers.scheduling`); the caller's own process never changes."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.comm.backend import builtin_backends
from reshard.comm.backends.gloo import GlooBackend
from reshard.comm.backends.local import LocalBackend
from reshard.comm.backends.torch_dist import TorchDistBackend
from reshard.comm.launchers import scheduling

from ._helpers import thread_policies

pytestmark = [pytest.mark.cpu,
              pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux policies")]


def test_which_policy_a_worker_wants():
    assert scheduling.wanted(True, {}) == "batch"
    assert scheduling.wanted(True, {scheduling.SCHED_ENV: "Batch"}) == "batch"
    assert scheduling.wanted(True, {scheduling.SCHED_ENV: "other"}) == "other"
    assert scheduling.wanted(False, {}) == "other"
    assert scheduling.wanted(False, {scheduling.SCHED_ENV: "batch"}) == "other"
    with pytest.raises(ValueError, match="RESHARD_WORKER_SCHED='fifo'"):
        scheduling.wanted(True, {scheduling.SCHED_ENV: "fifo"})
    # gloo asks (its progress thread spins on a lock a preempted writer holds); a
    # caller's process group, the local backend and the registrations' meet do not
    assert GlooBackend.capabilities.batch_scheduled
    assert not TorchDistBackend.capabilities.batch_scheduled
    assert not LocalBackend.capabilities.batch_scheduled
    gloo = GlooBackend.capabilities
    assert gloo.meet(gloo).batch_scheduled
    assert not gloo.meet(TorchDistBackend.capabilities).batch_scheduled
    assert builtin_backends().entry("gloo").capabilities.batch_scheduled


def test_apply_covers_every_thread_and_later_ones():
    # in a child process: this one's policy must not change
    code = (
        "import os, threading\n"
        "from reshard.comm.launchers import scheduling as s\n"
        "ev = threading.Event()\n"
        "before = threading.Thread(target=ev.wait); before.start()\n"
        "got = s.apply('batch')\n"
        "after = threading.Thread(target=ev.wait); after.start()\n"
        "pols = {s.policy_of(int(t)) for t in os.listdir('/proc/self/task')}\n"
        "n = len(os.listdir('/proc/self/task'))\n"
        "ev.set(); before.join(); after.join()\n"
        "print(got, n, ','.join(sorted(pols)), s.apply('other'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    got, threads, policies, other = out
    assert (got, policies, other) == ("batch", "batch", "other")
    assert int(threads) >= 3  # ours two, and any the imports started
    assert scheduling.policy_of(0) == "other"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env, want", [({}, "batch"),
                                       ({scheduling.SCHED_ENV: "other"}, "other")])
def test_gloo_workers_run_under_the_policy(env, want):
    from reshard.runtime import Runtime

    cl = Cluster.regular(1, 2)
    src, dst = Layout(DeviceMesh((1, 1), [0]), "R"), Layout(DeviceMesh((1, 1), [1]), "R")
    value = np.arange(1000, dtype=np.float32)
    with Runtime("gloo", cl, "process", timeout=30, env=env) as rt:
        x = rt.put(value, src)
        y = rt.reshard(x, dst, strategy="broadcast")
        np.testing.assert_array_equal(rt.get(y), value)
        pids = rt.group.pids
        assert sorted(pids) == [0, 1]
        for pid in pids.values():
            policies = thread_policies(pid)
            # gloo's progress thread was started after the policy was set
            assert "gloo_tcp_loop" in {name for name, _ in policies}
            assert set(policies.values()) == {want}
    assert scheduling.policy_of(0) == "other"  # the driver's own policy never changes


def test_the_bench_header_says_the_policy(monkeypatch):
    from reshard.microbench import cli

    monkeypatch.delenv(scheduling.SCHED_ENV, raising=False)
    assert cli._policy("gloo") == ", SCHED_BATCH"
    assert cli._policy("local") == ""
    assert cli._policy("no-such-backend") == ""
    monkeypatch.setenv(scheduling.SCHED_ENV, "other")
    assert cli._policy("gloo") == ""
