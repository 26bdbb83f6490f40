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


def test_a_keyed_backends_run_gets_one_link_key():
    from reshard.comm.launchers.host import make_specs

    reg = builtin_backends()
    assert {e.name for e in reg.entries if e.keyed} == {"tcp", "nixl"}
    for e in reg.entries:
        if e.launchers:
            specs = make_specs(e.name, [0, 1], None, 1.0, None, None)
            keys = {id(s.options.get("link_key")) for s in specs}
            assert ("link_key" in specs[0].options) == e.keyed and len(keys) == 1, e.name


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


def test_each_row_says_what_it_is_and_the_command_lines_show_it():
    import argparse

    from reshard.microbench import dataplane, flags
    from reshard.pipeline.examples import mlp

    reg = builtin_backends()
    for e in reg.entries:
        assert e.summary and "\n" not in e.summary and len(e.summary) < 80, e
    options = {a.dest: a for a in mlp._parser("interleaved-1f1b")._actions}
    assert tuple(options["backend"].choices) == tuple(k.value for k in BackendKind)
    for b in options["backend"].choices:
        assert f"{b} ({reg.entry(b).summary})" in options["backend"].help
    bench = {a.dest: a for a in dataplane.build_parser()._actions}
    assert tuple(bench["backend"].choices) == flags.PROCESS_PLANES == tuple(
        e.name for e in reg.entries if "process" in e.launchers)
    assert "tcp (CPU processes, scatter / gather sockets)" in bench["backend"].help
    assert isinstance(bench["backend"], argparse.Action)


def _literal_backend_lists(tree) -> list[str]:
    """Tuples, lists and sets of two or more literal strings, all of them backend names."""
    import ast

    names = set(builtin_backends().names)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2:
            values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if len(values) == len(node.elts) and all(
                    isinstance(v, str) and v in names for v in values):
                found.append(f"line {node.lineno}: {values}")
    return found


def test_no_module_spells_a_list_of_backends_itself():
    """Lists of backend names come from the registry, not from literals in the code
    (the planted source shows the reader finds one)."""
    import ast

    from .test_layers import modules

    assert _literal_backend_lists(ast.parse("x = ('local', 'gloo', 'nccl')\ny = ('gloo',)\n")) \
        == ["line 1: ['local', 'gloo', 'nccl']"]
    found = []
    for name, path in modules().items():
        found += [f"{name} {hit}" for hit in _literal_backend_lists(ast.parse(path.read_text()))]
    assert not found, "derive these from reshard.comm.backend.builtin_backends():\n" + \
        "\n".join(found)
