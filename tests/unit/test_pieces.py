"""A plan's relay piece (``Cluster.relay_piece``, which the cost model charges each
relay for) reaches the backends that pipeline in pieces of a size they are told
(``Capabilities.sized_pieces``): carried in every device's program, set by the
executor before the program runs."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

import reshard
from reshard import Cluster, DeviceMesh, Layout, PlanError
from reshard.comm.backend import builtin_backends
from reshard.comm.backends.local import LocalBackend, LocalFabric
from reshard.comm.executor import Executor
from reshard.comm.program import WorkerProgram, programs

from ..common import in_threads

SRC = Layout(DeviceMesh((1,), [0]), "R")
DST = Layout(DeviceMesh((2, 2), [2, 3, 4, 5]), "R")


def _plan(piece: int) -> reshard.ReshardPlan:
    cluster = Cluster.regular(3, 2, relay_piece=piece)
    return reshard.plan((1000,), "float32", SRC, DST, cluster=cluster, strategy="broadcast")


def test_every_program_carries_its_plans_piece():
    plan = _plan(99_999)
    progs = programs(plan)
    assert {p.piece for p in progs.values()} == {99_999}
    for prog in progs.values():
        assert WorkerProgram.from_json(prog.to_json()) == prog
        assert pickle.loads(pickle.dumps(prog)) == prog
    assert {p.piece for p in programs(_plan(0)).values()} == {0}
    bad = dataclasses.replace(progs[2], piece=-1)
    with pytest.raises(PlanError, match="piece must be an integer >= 0"):
        bad.check()
    # a program written before the field reads as the backend's own piece
    old = progs[2].to_dict()
    del old["piece"]
    assert WorkerProgram.from_dict(old).piece == 0


class _Sized(LocalBackend):
    """The local backend, declaring that it takes a piece size, and keeping it."""

    capabilities = dataclasses.replace(LocalBackend.capabilities, sized_pieces=True)

    def __init__(self, device: int, fabric: LocalFabric, told: list[int]) -> None:
        super().__init__(device, fabric)
        self.told = told

    def use_piece(self, nbytes: int) -> None:
        self.told.append(nbytes)


def test_the_executor_tells_a_sized_backend_its_programs_piece():
    reg = builtin_backends()
    entry = reg.entry("local")
    caps = dataclasses.replace(entry.capabilities, sized_pieces=True)
    told: list[int] = []
    reg = reg.register("local", lambda d, fabric: _Sized(d, fabric, told), caps,
                       launchers=entry.launchers, replace=True)
    plan = _plan(123_456)
    value = np.arange(1000, dtype=np.float32)
    fabric, out = LocalFabric(20.0), {}
    devices = plan.devices

    def rank(k: int) -> None:
        d = devices[k]
        ex = Executor.create("local", d, fabric, registry=reg)
        assert ex.capabilities.sized_pieces
        out[d] = ex.execute(plan, [value if d == 0 else None])

    errors = in_threads(rank, len(devices), 30)
    assert not errors, errors
    assert told == [123_456] * len(devices)
    assert all(out[d][0].tobytes() == value.tobytes() for d in DST.devices)
    # the built-in local backend takes no size: the executor never asks it
    assert not builtin_backends().entry("local").capabilities.sized_pieces


def test_a_box_a_few_pieces_long_still_pipelines():
    """The cluster's piece, but a quarter of the transfer where that is smaller (at
    least 256 KiB): with 1 MiB pieces a 1 MiB box would cross each relay whole. The
    model charges each relay that piece's time (the backends cut their buffers so)."""
    from reshard.cluster import MIN_PIECE, pipeline_piece
    from reshard.planner.costing.cost import task_path
    from reshard.planner.values.tasks import Task, TaskKind

    mib = 1 << 20
    assert pipeline_piece(0, 8 * mib) == 0
    assert pipeline_piece(mib, 8 * mib) == mib
    assert pipeline_piece(mib, 2 * mib) == mib // 2
    assert pipeline_piece(mib, mib) == MIN_PIECE == pipeline_piece(mib, 3 * MIN_PIECE)
    assert pipeline_piece(mib, 1000) == 1000
    assert pipeline_piece(99_999, 8 * mib) == 99_999  # a smaller piece of its own stays
    cluster = Cluster.regular(3, 1, relay_piece=mib, nic_bandwidth=1e9, latency=1e-5)
    for nbytes, piece in ((mib, MIN_PIECE), (8 * mib, mib)):
        chain = Task(TaskKind.BROADCAST, 0, ((0, nbytes // 4),), 0, (1, 2), nbytes)
        _, lat = task_path(chain, cluster)
        assert lat == pytest.approx(2e-5 + piece / cluster.nic_capacity)  # one relay
