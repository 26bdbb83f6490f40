"""The nixl backend held to the real NIXL package (the ``nixl`` extra), on CPU.

- every method the backend calls on a NIXL agent is collected from its sources (their
  AST, not a hand list) and checked against the real ``nixl_agent``: the method exists
  and takes the keyword arguments and as many positional ones as the call passes;
- both CUDA variants the meta package installs (``nixl_cu12``, ``nixl_cu13``) have that
  same surface, so the one the meta package picks on a GPU machine is the one tested
  here; and NIXL knows the memory kinds a GPU run registers (``VRAM`` beside ``DRAM``),
  also through the UCX plug-in the backend creates;
- the protocol's assumptions about NIXL hold: memory registered *after* two agents
  exchanged metadata becomes writable by loading the partial metadata of that
  registration alone, a WRITE's notification arrives with its bytes already in place,
  and a transfer's states are the strings the backend compares (``DONE``, ``PROC``,
  ``ERR``).
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu_contract,
              pytest.mark.skipif(importlib.util.find_spec("nixl") is None,
                                 reason="the nixl extra is not installed")]

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "comm" / "backends" / f"{name}.py"
           for name in ("nixl", "nixl_agent", "nixl_memory")]


def _agent_calls() -> dict[str, list[ast.Call]]:
    """Calls of the form ``<...>.agent.<method>(...)`` or ``agent.<method>(...)``."""
    out: dict[str, list[ast.Call]] = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            named = (isinstance(owner, ast.Name) and owner.id == "agent") or (
                isinstance(owner, ast.Attribute) and owner.attr == "agent")
            if named:
                out.setdefault(node.func.attr, []).append(node)
    return out


def _surface(module: str) -> dict[str, tuple[list[str], int, set[str]]]:
    """``nixl_agent``'s methods in ``module``'s source, without importing it (the two
    CUDA variants cannot both load in one process: their bindings register one type
    name): per method its positional parameters (after self), how many of them are
    required, and every name it takes by keyword."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.submodule_search_locations, module
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "_api.py"
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "nixl_agent")
    out = {}
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef):
            args = fn.args
            positional = [a.arg for a in [*args.posonlyargs, *args.args]][1:]
            required = len(positional) - len(args.defaults)
            out[fn.name] = (positional, required,
                            {*positional, *(a.arg for a in args.kwonlyargs)})
    return out


@pytest.mark.parametrize("module", ["nixl_cu12", "nixl_cu13"])
def test_every_agent_call_matches_the_real_signature(module):
    surface = _surface(module)
    calls = _agent_calls()
    assert {"register_memory", "initialize_xfer", "transfer", "check_xfer_state",
            "get_new_notifs", "send_notif", "add_remote_agent",
            "get_partial_agent_metadata"} <= set(calls), sorted(calls)
    for name, nodes in calls.items():
        assert name in surface, f"{module}'s nixl_agent has no {name}"
        positional, required, names = surface[name]
        for call in nodes:
            assert required <= len(call.args) <= len(positional), \
                (module, name, ast.unparse(call))
            for kw in call.keywords:
                assert kw.arg in names, (module, name, kw.arg)


def test_the_memory_kinds_of_a_gpu_run_are_known():
    from nixl._api import nixl_agent, nixl_agent_config

    agent = nixl_agent("contract-kinds", nixl_agent_config(backends=["UCX"]))
    assert {"DRAM", "VRAM"} <= set(agent.nixl_mems)
    assert {"DRAM_SEG", "VRAM_SEG"} <= set(agent.get_backend_mem_types("UCX"))


def _wait(agent, handle) -> str:
    deadline = time.monotonic() + 10
    while True:
        state = agent.check_xfer_state(handle)
        assert state in ("DONE", "PROC", "ERR"), state
        if state != "PROC" or time.monotonic() > deadline:
            return str(state)
        time.sleep(1e-3)


def test_late_registrations_travel_as_partial_metadata_and_notes_follow_the_bytes():
    from nixl._api import nixl_agent, nixl_agent_config

    config = nixl_agent_config(enable_prog_thread=True, backends=["UCX"])
    a = nixl_agent("contract-a", config)
    b = nixl_agent("contract-b", config)
    assert a.add_remote_agent(b.get_agent_metadata()) in ("contract-b", b"contract-b")
    assert b.add_remote_agent(a.get_agent_metadata()) in ("contract-a", b"contract-a")
    # registered only now, after the full metadata went
    src = np.arange(1 << 16, dtype=np.uint8)
    dst = np.zeros(1 << 17, dtype=np.uint8)
    a.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    regs = b.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    a.add_remote_agent(b.get_partial_agent_metadata(regs, False))
    local = a.get_xfer_descs([(src.ctypes.data, 4096, 0), (src.ctypes.data + 8192, 4096, 0)],
                             "DRAM")
    remote = a.get_xfer_descs([(dst.ctypes.data + 64, 4096, 0),
                               (dst.ctypes.data + 20000, 4096, 0)], "DRAM")
    handle = a.initialize_xfer("WRITE", local, remote, "contract-b", b"landed")
    assert a.transfer(handle) in ("DONE", "PROC")
    # the writer polls its transfer to completion (NIXL sends the note from that poll:
    # the backend's group loop polls every write it has in flight)
    assert _wait(a, handle) == "DONE"
    notes: dict = {}
    deadline = time.monotonic() + 10
    while not notes and time.monotonic() < deadline:
        notes = b.get_new_notifs()
        time.sleep(1e-3)
    # the note arrives once its bytes are in place
    assert notes == {"contract-a": [b"landed"]}
    assert dst[64:64 + 4096].tobytes() == src[:4096].tobytes()
    assert dst[20000:24096].tobytes() == src[8192:12288].tobytes()
    assert not dst[:64].any() and not dst[64 + 4096:20000].any() and not dst[24096:].any()
    a.release_xfer_handle(handle)
