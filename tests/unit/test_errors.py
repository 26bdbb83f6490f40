"""Every bad input raises a ReshardError subclass naming the rule, value and a fix."""

from __future__ import annotations

import numpy as np
import pytest

import reshard
from reshard import Cluster, DeviceMesh, Layout, ShardingSpec

MESH = DeviceMesh((2, 4))
DST = Layout(DeviceMesh((2, 4), devices=range(8, 16)), "S0RR")
CL = Cluster.regular(4, 4)


def _raises(exc, *needles):
    def check(excinfo):
        msg = str(excinfo.value)
        assert isinstance(excinfo.value, reshard.ReshardError)
        assert isinstance(excinfo.value, ValueError)
        for n in needles:
            assert n in msg, f"{n!r} not in {msg!r}"
    return pytest.raises(exc), check


@pytest.mark.parametrize("make,exc,needles", [
    (lambda: Layout(MESH, "S2RR"), reshard.SpecError, ["mesh axis 2", "2-axis mesh", "0..1"]),
    (lambda: ShardingSpec.parse("S0S0R"), reshard.SpecError, ["axis 0 is used twice", "'S0RR'"]),
    (lambda: ShardingSpec.parse("S00"), reshard.SpecError, ["used twice"]),
    (lambda: ShardingSpec.parse("S0X"), reshard.SpecError, ["'X'", "'R' or 'S'"]),
    (lambda: ShardingSpec.parse("S0R+P0"), reshard.SpecError, ["both splits", "partial"]),
    (lambda: DeviceMesh((2, 2), devices=[0, 1, 1, 2]), reshard.MeshError, ["[1]", "distinct"]),
    (lambda: DeviceMesh((2, 2), devices=[0, 1, 2]), reshard.MeshError, ["needs 4 devices", "got 3"]),
    (lambda: DeviceMesh((0, 2)), reshard.MeshError, [">= 1"]),
    (lambda: reshard.plan((8, 8), np.float32, Layout(MESH, "S0RR"), DST, cluster=CL),
     reshard.SpecError, ["rank-3", "rank 2", "'RR'"]),
    (lambda: reshard.plan((8, -1, 2), np.float32, Layout(MESH, "S0RR"), DST, cluster=CL),
     reshard.ShapeError, [">= 0", "-1"]),
    (lambda: reshard.plan((2 ** 64 - 1, 8, 2), "int8", Layout(MESH, "S0RR"), DST, cluster=CL),
     reshard.ShapeError, ["at most 2**56 elements", "18446744073709551615"]),
    (lambda: reshard.plan((2 ** 30, 2 ** 30, 2 ** 30), "int8", Layout(MESH, "S0RR"), DST,
                          cluster=CL),
     reshard.ShapeError, ["at most 2**56 elements", "1073741824"]),
    (lambda: Cluster.regular(2, 2, nic_bandwidth=float("inf")), reshard.ClusterError,
     ["nic_bandwidth", "finite", "inf"]),
    (lambda: Cluster.regular(2, 2, latency=float("nan")), reshard.ClusterError,
     ["latency", "finite", "nan"]),
    (lambda: reshard.ShardingSpec.parse("S0" * 5000), reshard.SpecError,
     ["10000 characters", "4096"]),
    (lambda: reshard.plan((8, 8, 2), "float99", Layout(MESH, "S0RR"), DST, cluster=CL),
     reshard.DTypeError, ["float99", "float32"]),
    (lambda: reshard.plan((8, 8, 2), object, Layout(MESH, "S0RR"), DST, cluster=CL),
     reshard.DTypeError, ["object", "bfloat16", "float8_e4m3fn"]),
    (lambda: reshard.plan((8, 8, 2), "bfloat16", Layout(MESH, "S0RR"), DST, cluster=CL,
                          cast="int8"),
     reshard.DTypeError, ["int8", "valid targets", "float8_e4m3fn"]),
    (lambda: reshard.plan((8, 8, 2), "int32", Layout(MESH, "S0RR"), DST, cluster=CL,
                          cast="bfloat16"),
     reshard.DTypeError, ["cannot cast from int32", "valid sources"]),
    (lambda: reshard.plan((8,), "bfloat16", Layout(MESH, "S0"), Layout(MESH, "R"),
                          cluster=CL, cast="float8_e4m3fn", scale="block128"),
     reshard.DTypeError, ["block128", "rank 1", "scale='tensor'"]),
    (lambda: reshard.plan((8, 8, 2), "bfloat16", Layout(MESH, "S0RR"), DST, cluster=CL,
                          cast="float16", scale="tensor"),
     reshard.DTypeError, ["float8", "float16", "scale='none'"]),
    (lambda: reshard.plan((8, 8, 2), "float32", Layout(MESH, "S0RR"), DST, cluster=CL,
                          cast="float8_e4m3fn", scale="block64"),
     reshard.DTypeError, ["block64", "block128", "tensor"]),
    (lambda: reshard.plan((8, 8, 2), "float32", Layout(MESH, "S0RR"), DST, cluster=CL,
                          scale="tensor"),
     reshard.DTypeError, ["needs a float8 cast", "float8_e4m3fn"]),
    (lambda: reshard.plan((8, 8, 2), np.int32, Layout(MESH, "S0RR"), DST, cluster=CL,
                          strategy="multicast"),
     reshard.StrategyError, ["multicast", "broadcast", "send_recv", "allgather"]),
    (lambda: reshard.plan((8, 8, 2), np.int32, Layout(MESH, "S0RR"), DST,
                          cluster=Cluster.regular(2, 4)),
     reshard.ClusterError, ["[8, 9, 10, 11, 12, 13, 14, 15]", "Cluster.regular"]),
    (lambda: reshard.plan((8, 8, 2), np.bool_, Layout(MESH, "S0RR"),
                          Layout(DST.mesh, "S0RR+P1"), cluster=CL),
     reshard.PartialError, ["partial sum", "bool", "'S0RR'"]),
    (lambda: Cluster.preset("dgx-z100", 2), reshard.ClusterError, ["dgx-z100", "dgx-h100"]),
    (lambda: Cluster(((0, 1), (1, 2))), reshard.ClusterError, ["device 1", "host 0", "host 1"]),
    (lambda: reshard.ReshardPlan.from_json("{"), reshard.PlanError, ["JSON"]),
])
def test_bad_input(make, exc, needles):
    ctx, check = _raises(exc, *needles)
    with ctx as excinfo:
        make()
    check(excinfo)


def test_runtime_refuses_mismatched_shards():
    with reshard.Runtime() as rt:
        lay = Layout(MESH, "S0R")
        with pytest.raises(reshard.ShapeError, match="needs shape"):
            rt.put_shards({d: np.zeros((3, 3), np.float32) for d in MESH.devices}, lay,
                          (8, 3), np.float32)
        x = rt.put(np.ones((8, 3), np.float32), lay)
        p = reshard.plan((8, 3), np.float64, lay, Layout(MESH, "RR"))
        with pytest.raises(reshard.ShapeError, match="plan expects"):
            rt.execute(p, [x])


def test_unknown_backend_and_launcher():
    with pytest.raises(reshard.ReshardError, match="valid backends"):
        reshard.Runtime(backend="mpi")
    with pytest.raises(reshard.ReshardError, match="valid launchers"):
        reshard.Runtime(backend="local", launcher="slurm")
    with pytest.raises(reshard.ReshardError, match="needs cluster"):
        reshard.Runtime(backend="gloo")


def test_unknown_backend_or_launcher_is_an_option_error_not_a_strategy_error():
    from reshard.comm.backend import BackendKind
    from reshard.comm.launchers.base import LauncherKind

    for parse, bad in ((BackendKind.parse, "mpi"), (LauncherKind.parse, "slurm")):
        with pytest.raises(reshard.OptionError) as e:
            parse(bad)
        assert not isinstance(e.value, reshard.StrategyError)
        assert bad in str(e.value)
    with pytest.raises(reshard.StrategyError):  # a StrategyError is an OptionError
        reshard.Strategy.parse("multicast")
    assert issubclass(reshard.StrategyError, reshard.OptionError)
