"""One table of backends (comm/backend.py's built-ins): every list of backend names and
every per-backend fact (launchers, fork-server preloads, advertising, requirements)
derives from it; a backend registered with ``register_backend`` runs embedded
(Executor) and is refused by a Runtime and by reshard's launchers with the rule."""

from __future__ import annotations

import numpy as np
import pytest

import reshard
from reshard.comm.backend import BackendKind, builtin_backends, register_backend
from reshard.comm.backends.local import LocalBackend, LocalFabric
from reshard.comm.backends.requirements import backend_problem
from reshard.comm.executor import Executor
from reshard.errors import ReshardError


def test_every_list_of_backends_is_the_registry():
    from reshard.microbench import flags
    from reshard.service import serve_cli

    reg = builtin_backends()
    started = tuple(e.name for e in reg.entries if e.launchers)
    assert tuple(k.value for k in BackendKind) == started
    assert (*started, "none") == serve_cli.BACKENDS
    assert started == flags.BACKENDS
    assert flags.CPU_PLANES == tuple(e.name for e in reg.entries if e.capabilities.device == "cpu"
                                     and "process" in e.launchers) == ("gloo", "tcp", "nixl")
    for e in reg.entries:
        if e.launchers:
            assert BackendKind(e.name).advertises == e.advertises
        # a process launcher forks ranks from a server that preloaded the worker loop
        assert ("process" not in e.launchers) or "reshard.comm.launchers.worker_loop" in e.preload
        assert backend_problem(e.name) == e.problem()
    assert backend_problem("no-such-backend") is None
    assert {e.name for e in reg.entries if e.advertises} == {"gloo", "tcp", "nixl"}


def _mine(device: int, fabric: LocalFabric) -> LocalBackend:
    """A third party's backend (here a local rank under another name)."""
    return LocalBackend(device, fabric)


def test_a_registered_backend_runs_embedded_and_a_runtime_says_the_rule():
    reg = register_backend("mine", _mine, LocalBackend.capabilities)
    assert "mine" in reg and "mine" not in [k.value for k in BackendKind]
    fabric = LocalFabric(timeout=10)
    plan = reshard.plan((8,), "float32", reshard.Layout(reshard.DeviceMesh((1,), [0]), "R"),
                        reshard.Layout(reshard.DeviceMesh((1,), [0]), "S0"))
    with Executor.create("mine", 0, fabric, registry=reg) as ex:
        got = ex.execute(plan, [np.arange(8, dtype=np.float32)])
    assert got[0].tolist() == list(range(8))
    with pytest.raises(ReshardError, match="runs inside processes that already exist"):
        reshard.Runtime(backend="mine", registry=reg)
    with pytest.raises(ReshardError, match="register it without launchers"):
        reg.register("mine2", _mine, LocalBackend.capabilities, launchers=("process",))
