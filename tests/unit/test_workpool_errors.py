"""How a service job worker reports a failure (reshard.service.workpool._serve): a
MemoryError, or an allocation refused under the address-space cap inside a C extension
that returned without raising (CPython's SystemError "error return without exception
set"), is "memory"; any other SystemError, and a refused allocation in a worker without
a cap, is a bug."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from reshard.service.workpool import _serve


def _unset() -> None:
    raise SystemError("error return without exception set")


def _other() -> None:
    raise SystemError("something else")


def _oom() -> None:
    raise MemoryError


def _ask(fn, cap: int) -> tuple:
    ctx = mp.get_context("spawn")  # not fork: the test process may run threads (JAX)
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, cap), daemon=True)
    proc.start()
    child.close()
    try:
        parent.send((fn, ()))
        assert parent.poll(30), "the worker did not answer"
        return parent.recv()
    finally:  # killed: nothing more to ask it
        parent.close()
        proc.kill()
        proc.join(10)


@pytest.mark.parametrize("fn,cap,want", [
    (_unset, 1 << 40, "memory"),  # a cap (1 TiB: nothing is refused by it here)
    (_unset, 0, "bug"),           # no cap: not the cap's doing
    (_other, 1 << 40, "bug"),
    (_oom, 0, "memory"),
])
def test_failures_are_classified(fn, cap, want):
    status, _ = _ask(fn, cap)
    assert status == want
