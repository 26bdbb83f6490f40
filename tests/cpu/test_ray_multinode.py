"""A real multi-node Ray cluster on the emulated testbed (issue 11): three Ray nodes,
each in its host's network namespace, token authentication on; reshard's Ray launcher
places every device's actor on its host's node, a paper case is exact over the
tc-limited veths, a raylet killed mid-reshard gives an ExecutionError naming the
devices, and after SIGTERM to the driver nothing is left: no Ray process, namespace,
link or file.

The driver runs in a child process (the pytest process may hold a local Ray of its
own, and a process is the driver of one cluster at a time); it reports what it saw as
one JSON line, then waits to be sent SIGTERM.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ._helpers import check_paper_case, paper_cases, pid_alive, wait_gone
from .test_testbed import netns, present

pytestmark = pytest.mark.cpu
ray = pytest.importorskip("ray")

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOSTS, PER_HOST = 3, 2
NIC_GBIT = 0.05  # slow enough that the fault's reshard is still running seconds later
TIMEOUT = 10.0  # the Runtime's timeout
MARK = "REPORT "  # starts the driver's report line (Ray prints to stdout too)


def _in_netns(pid: int, netns_name: str) -> bool:
    return (os.stat(f"/proc/{pid}/ns/net").st_ino
            == os.stat(f"/var/run/netns/{netns_name}").st_ino)


def _fault(rt, rc, report: dict) -> None:
    """Reshard a 40 MB tensor from host 0 to hosts 1 and 2 (~6 s at the NIC rate) and
    SIGKILL host 2's raylet 0.5 s into it."""
    from reshard import DeviceMesh, ExecutionError, Layout

    value = np.arange(10 * 2**20, dtype=np.int32)
    src = Layout(DeviceMesh((1, PER_HOST), [0, 1]), "S0")
    dst = Layout(DeviceMesh((2, PER_HOST), [2, 3, 4, 5]), "R")
    x = rt.put(value, src)
    plan = rt.plan(x, dst, "broadcast")
    rt.load(plan)
    killed: list[float] = []

    def kill() -> None:
        time.sleep(0.5)
        pid = rc.raylet_pid(2)
        os.kill(pid, signal.SIGKILL)
        killed.append(time.monotonic())

    killer = threading.Thread(target=kill)
    t0 = time.monotonic()
    killer.start()
    try:
        rt.execute(plan, [x])
        report["fault_error"] = None
    except ExecutionError as e:
        report["fault_error"] = str(e)
    report["fault_error_after_kill_s"] = time.monotonic() - killed[0] if killed else None
    report["fault_total_s"] = time.monotonic() - t0
    report["fault_model_s"] = plan.estimate()
    killer.join()
    actors = dict(rt.group.pids)
    rt.close()
    report["actors_alive_after_close"] = sorted(p for p in actors.values() if pid_alive(p))


def driver() -> None:
    """The child: build everything, check, report, then wait for SIGTERM."""
    from reshard.microbench.infra.ray_cluster import RayCluster, join_as_stranger
    from reshard.runtime import Runtime
    from reshard.testbed import Testbed

    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    t0 = time.monotonic()
    with Testbed(HOSTS, NIC_GBIT) as tb, RayCluster(tb) as rc:
        report: dict = {"tag": tb.tag, "names": tb.names(), "directory": rc.directory,
                        "cluster_s": time.monotonic() - t0}
        stranger = join_as_stranger(rc, 1)
        report["stranger"] = [stranger.returncode, stranger.stderr[-2000:]]
        cluster = tb.cluster(PER_HOST)
        t1 = time.monotonic()
        rt = Runtime("gloo", cluster, "ray", address=rc.address, timeout=TIMEOUT)
        report["runtime_s"] = time.monotonic() - t1
        report["placement"] = {
            d: [info["node"] == rc.node_ids[cluster.host_of(d)],
                _in_netns(info["pid"], tb.netns(cluster.host_of(d)))]
            for d, info in rt.group.info.items()}
        case7 = next(c for c in paper_cases() if c.name == "7")  # (1,2) -> (2,2): 3 hosts
        check_paper_case(rt, case7, cluster)  # every strategy, byte for byte
        report["case"] = "7"
        _fault(rt, rc, report)
        report["pids"] = sorted(rc.pids())
        report["total_s"] = time.monotonic() - t0
        print(MARK + json.dumps(report), flush=True)
        time.sleep(600)  # until SIGTERM unwinds both with blocks


@netns
@pytest.mark.timeout(170)
def test_ray_cluster_on_the_testbed(tmp_path):
    with open(tmp_path / "driver.log", "w+") as log:  # Ray is chatty: never a full pipe
        child = subprocess.Popen(
            [sys.executable, "-c", "from tests.cpu.test_ray_multinode import driver; driver()"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            line = ""
            for line in child.stdout:
                if line.startswith(MARK):
                    break
            log.seek(0)
            assert line.startswith(MARK), f"the driver failed:\n{log.read()[-6000:]}"
            report = json.loads(line[len(MARK):])
        finally:  # SIGTERM: the driver unwinds and removes everything (checked below)
            child.send_signal(signal.SIGTERM)
            try:
                code = child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
                raise

    # a node without the token is refused by the cluster's GCS
    rc_code, said = report["stranger"]
    assert rc_code != 0 and "InvalidAuthToken" in said, said
    # every device's actor on its host's Ray node, inside its host's namespace
    assert len(report["placement"]) == HOSTS * PER_HOST
    assert all(node and ns for node, ns in report["placement"].values()), report["placement"]
    assert report["case"] == "7"
    # the raylet killed mid-reshard: an ExecutionError naming host 2's devices in time
    error = report["fault_error"]
    assert error is not None, f"the reshard survived its raylet: {report}"
    assert re.search(r"device(\(s\))? \[?[45]\b", error), error
    assert report["fault_error_after_kill_s"] < TIMEOUT, report
    assert report["fault_total_s"] < report["fault_model_s"] * 0.8, report  # mid-reshard
    assert report["actors_alive_after_close"] == [], report
    # SIGTERM: everything unwound and removed
    assert code == 128 + signal.SIGTERM, code
    assert wait_gone(report["pids"], 15.0) == []
    assert present(report["names"]) == []
    assert not os.path.exists(report["directory"])
    assert not os.path.exists(f"/run/reshard-testbed/{report['tag']}")



def test_hosts_map_to_nodes_by_address_and_gpus(monkeypatch):
    """Host i goes to the i-th node by IP address as a number (".10" after ".9", which
    text order gets wrong); nccl actors asking for a GPU skip nodes without GPUs."""
    from reshard import Cluster
    from reshard.comm.launchers import ray as ray_launcher

    nodes = [{"NodeID": f"n{i}", "Alive": True, "NodeManagerAddress": f"10.0.0.{i}",
              "Resources": {"GPU": 0.0 if i == 2 else 4.0}} for i in (10, 9, 2)]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    cluster = Cluster.regular(3, 1)
    assert ray_launcher._node_plan(cluster, [0, 1, 2]) == {0: "n2", 1: "n9", 2: "n10"}
    assert ray_launcher._node_plan(cluster, [0, 1, 2], gpus=True) == {0: "n9", 1: "n10",
                                                                      2: "n9"}
