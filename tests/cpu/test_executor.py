"""The embeddable executor inside processes that own their world, and backends
registered by name.

The multi-process tests start plain torch.distributed ranks that initialise gloo
themselves (their own TCPStore, no reshard Runtime anywhere) and run random plans
through :class:`reshard.comm.executor.Executor` on the ``torch`` backend, both kinds of
rank (numpy buffers; torch tensors, the CUDA path's code on CPU), each destination
shard compared with its slice of the global value (partial sources summed from
random addends). The registry tests run in-process on the local backend.
"""

from __future__ import annotations

import datetime
import functools
import traceback
import zlib

import numpy as np
import pytest
from hypothesis import given

import reshard
from reshard import Cluster, DeviceMesh, Layout
from reshard.comm.backend import (
    BackendRegistry,
    Capabilities,
    builtin_backends,
    register_backend,
)
from reshard.comm.executor import Executor
from reshard.comm.program import WorkerProgram
from reshard.dtypes import numpy_of_torch, torch_of_numpy

from ..common import STRATEGIES, addends, in_threads, sample
from ._helpers import problem_settings, problems, rank_results

pytestmark = pytest.mark.cpu

RANKS = (0, 1, 2, 3)
CLUSTER = Cluster.regular(2, 2)


# ----- ranks that own their world -------------------------------------------------------
def init_gloo(device: int, address, world: int, timeout: float = 60.0) -> None:
    """What a training script does: its own TCPStore (port published through the test's
    rendezvous), then ``init_process_group("gloo")``."""
    import torch.distributed as dist

    td = datetime.timedelta(seconds=timeout)
    rdv = address.connect(timeout)
    if device == 0:
        store = dist.TCPStore("127.0.0.1", 0, world, True, timeout=td, wait_for_workers=False)
        rdv.set("port", str(store.port).encode())
    else:
        port = int(rdv.get("port", timeout).decode())
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout=td)
    dist.init_process_group("gloo", store=store, rank=device, world_size=world, timeout=td)
    rdv.close()


def expected(value: np.ndarray, layout: Layout, device: int) -> np.ndarray:
    """``device``'s shard of ``value`` on ``layout`` (zeros for a non-leading addend)."""
    sl = layout.index_map(value.shape)[device]
    part = value[sl]
    return np.ascontiguousarray(part if device in layout.partial_leaders()
                                else np.zeros_like(part))


def _run_problems(problem_list, buffers: str, device: int, address, results, done) -> None:
    try:
        import torch.distributed as dist

        from reshard.comm.backends.torch_dist import torch_backend

        init_gloo(device, address, len(RANKS))
        ex = Executor(torch_backend(buffers=buffers), owns_backend=True)
        checked = runs = 0
        for k, (shape, dtype, src, dst) in enumerate(problem_list):
            strategy = STRATEGIES[k % len(STRATEGIES)]
            plan = reshard.plan(shape, dtype, src, dst, cluster=CLUSTER, strategy=strategy)
            # every rank loads every program (new_group needs the whole world); half of
            # them arrive as a program's JSON, as a driver would ship them
            what = WorkerProgram.of(plan, device).to_json() if k % 2 else plan
            loaded = ex.load(what)
            for again in range(1 + (k % 3 == 0)):  # a loaded program runs again
                runs += 1
                checked += _run_once(ex, loaded, k, again, (shape, dtype, src, dst), buffers,
                                     device, strategy)
        checked += _scaled_cast(ex, buffers, device)
        # a user error leaves the executor usable
        shape, dtype, src, dst = problem_list[0]
        plan = reshard.plan(shape, dtype, src, dst, cluster=CLUSTER)
        loaded = ex.load(plan)
        if device in src.devices:
            wrong = np.zeros(tuple(n + 1 for n in src.shard_shape(shape, device)), dtype)
            try:
                ex.run(loaded, [wrong])
                raise AssertionError("a wrong source shape was accepted")
            except reshard.ShapeError:
                pass
        assert ex.failed is None
        ex.close()
        results.put((device, {"checked": checked, "runs": runs}))
        done.wait(60)  # rank 0 hosts the store: it stays until every rank is done
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((device, traceback.format_exc()))


def _run_once(ex, loaded, k: int, again: int, problem, buffers: str, device: int,
              strategy: str) -> int:
    """One run of problem ``k``'s loaded program, this rank's shard checked byte for
    byte (1: checked; 0: this rank holds no destination shard)."""
    import torch

    from reshard.comm.engine.packing import data_address

    shape, dtype, src, dst = problem
    rng = np.random.default_rng(zlib.crc32(repr((k, again)).encode()))
    value = sample(rng, shape, dtype)
    shards = addends(rng, value, src)
    sources = [shards.get(device)]
    if buffers == "tensor" and sources[0] is not None:
        sources = [torch_of_numpy(sources[0])]
    out = None
    if device in dst.devices and k % 2 == 0:  # the caller's own buffer
        out = [torch.full(dst.shard_shape(shape, device), 1).to(
            getattr(torch, np.dtype(dtype).name))]
    got = ex.run(loaded, sources, out, blocking=bool(k % 4)).wait()
    if device not in dst.devices:
        assert got == {}, got
        return 0
    shard = got[0]
    if out is not None:
        if out[0].numel():  # written in place
            assert data_address(shard) == data_address(out[0])
        shard = out[0]
    arr = numpy_of_torch(shard) if isinstance(shard, torch.Tensor) else shard
    want = expected(value, dst, device)
    assert arr.shape == want.shape and arr.dtype == want.dtype, \
        (k, arr.shape, want.shape, arr.dtype)
    assert arr.tobytes() == want.tobytes(), \
        f"problem {k} {shape} {dtype} {src} -> {dst} ({strategy}): device {device}"
    return 1


def _scaled_cast(ex, buffers: str, device: int) -> int:
    """A scaled cast (bf16 -> block fp8) on this kind of buffer: the reference's bits;
    how many of this rank's shards were checked."""
    import torch

    from reshard.casting import reference_cast
    from reshard.dtypes import Cast, ScaleMode

    src = Layout(DeviceMesh((2, 2), RANKS), "S0S1")
    dst = Layout(DeviceMesh((2,), (1, 3)), "RS0")
    value = (np.random.default_rng(11).standard_normal((300, 260)) * 5).astype("bfloat16")
    plan = reshard.plan(value.shape, "bfloat16", src, dst, cluster=CLUSTER,
                        cast="float8_e4m3fn", scale="block128")
    want, want_scales = reference_cast(value, Cast("float8_e4m3fn", ScaleMode.BLOCK128))
    mine = expected(value, src, device)
    got = ex.execute(plan, [torch_of_numpy(mine) if buffers == "tensor" else mine])
    checked = 0
    for k, ref in zip(plan.outputs, (want, want_scales)):
        lay = plan.tensors[k].dst
        if device in lay.devices:
            arr = numpy_of_torch(got[k]) if isinstance(got[k], torch.Tensor) else got[k]
            assert arr.tobytes() == expected(ref, lay, device).tobytes(), (buffers, k)
            checked += 1
    return checked


def _run_through_store(problem_list, device: int, address, results, done) -> None:
    """A process with a torch Store but no process group (a Ray actor, say): reshard's
    gloo backend bootstraps its world through that store."""
    try:
        import torch.distributed as dist

        from reshard.comm.bootstrap.store_rendezvous import StoreRendezvous

        td = datetime.timedelta(seconds=60)
        rdv = address.connect(60)
        if device == 0:
            store = dist.TCPStore("127.0.0.1", 0, len(RANKS), True, timeout=td,
                                  wait_for_workers=False)
            rdv.set("port", str(store.port).encode())
        else:
            port = int(rdv.get("port", 60).decode())
            store = dist.TCPStore("127.0.0.1", port, len(RANKS), False, timeout=td)
        with Executor.create("gloo", device, RANKS, StoreRendezvous(store), 60.0) as ex:
            assert ex.capabilities.groups_need_world
            checked = 0
            for k, (shape, dtype, src, dst) in enumerate(problem_list):
                rng = np.random.default_rng(k)
                value = sample(rng, shape, dtype)
                shards = addends(rng, value, src)
                plan = reshard.plan(shape, dtype, src, dst, cluster=CLUSTER)
                got = ex.execute(plan, [shards.get(device)])
                if device in dst.devices:
                    assert got[0].tobytes() == expected(value, dst, device).tobytes(), k
                    checked += 1
            results.put((device, {"checked": checked}))
            done.wait(60)
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((device, traceback.format_exc()))


@pytest.mark.timeout(180)
def test_gloo_ranks_bootstrap_through_the_hosts_torch_store():
    plist = _problem_list(6)
    got = rank_results(functools.partial(_run_through_store, plist), RANKS, wait=150)
    assert sum(r["checked"] for r in got.values()) >= len(plist)


def _problem_list(count: int):
    found = []

    @problem_settings(count)
    @given(problems(RANKS))
    def collect(problem) -> None:
        found.append(problem)

    collect()
    return found


@pytest.mark.timeout(240)
@pytest.mark.parametrize("buffers", ["numpy", "tensor"])
def test_executor_in_torch_ranks_that_initialised_gloo(buffers):
    plist = _problem_list(24)
    got = rank_results(functools.partial(_run_problems, plist, buffers), RANKS, wait=200)
    assert sum(r["checked"] for r in got.values()) > len(plist)  # most have destinations
    assert all(r["runs"] >= len(plist) for r in got.values())


# ----- program values --------------------------------------------------------------------
def test_a_program_is_the_devices_slice_and_round_trips():
    src = Layout(DeviceMesh((2, 2), [0, 1, 2, 3]), "S0S1")
    dst = Layout(DeviceMesh((4,), [4, 5, 6, 7]), "RS0")
    plan = reshard.plan((64, 48), "float32", src, dst, cluster=Cluster.regular(2, 4))
    for d in plan.devices:
        prog = WorkerProgram.of(plan, d)
        assert [i for i, _ in prog.tasks] == [i for i, t in enumerate(plan.tasks)
                                             if d in t.devices]
        assert prog.groups == plan.communicator_groups()
        assert WorkerProgram.from_json(prog.to_json()) == prog
        assert len(prog.to_json()) < len(plan.to_json())
    outside = WorkerProgram.of(plan, 99)  # no task, but the plan's member sets
    assert outside.tasks == () and outside.groups == plan.communicator_groups()


def test_a_program_with_foreign_tasks_is_refused():
    src = Layout(DeviceMesh((2,), [0, 1]), "S0")
    dst = Layout(DeviceMesh((2,), [2, 3]), "R")
    plan = reshard.plan((8,), "int32", src, dst, cluster=Cluster.regular(2, 2))
    prog = WorkerProgram.of(plan, 2)
    bad = WorkerProgram.of(plan, 0).to_dict()
    bad["tasks"] = [list(x) for x in WorkerProgram.from_json(prog.to_json()).to_dict()["tasks"]]
    with pytest.raises(reshard.PlanError, match="does not involve device 0"):
        WorkerProgram.from_dict(bad)
    with pytest.raises(reshard.PlanError, match="format"):
        WorkerProgram.from_json('{"format": 9}')


# ----- registration by name --------------------------------------------------------------
def _local_factory(device, fabric, calls):
    from reshard.comm.backends.local import LocalBackend

    calls.append(device)
    return LocalBackend(device, fabric)


def test_register_backend_declares_capabilities_and_builds_ranks_by_name():
    from reshard.comm.backends.local import LocalFabric

    caps = Capabilities(moves=frozenset({"float32"}), sums=frozenset(),
                        groups_need_world=False, device="cpu")
    reg = register_backend("threads", _local_factory, caps)
    assert "threads" in reg and "threads" not in builtin_backends()  # nothing global
    assert reg.entry("THREADS").capabilities == caps
    assert reg.names[:4] == ("local", "gloo", "nccl", "torch")
    with pytest.raises(reshard.ReshardError, match="already registered"):
        reg.register("threads", _local_factory, caps)
    with pytest.raises(reshard.ReshardError, match=r"valid backends.*threads"):
        reg.entry("mpi")
    with pytest.raises(reshard.ReshardError, match="Capabilities"):
        reg.register("x", _local_factory, {"moves": None})  # type: ignore[arg-type]
    with pytest.raises(reshard.ReshardError, match="factory"):
        reg.register("x", "no_colon", caps)
    with pytest.raises(reshard.ReshardError, match="Backend protocol"):
        reg.register("odd", lambda: object(), caps).create("odd")

    # ranks built by name run a plan, one executor per device in its own thread
    src = Layout(DeviceMesh((2,), [0, 1]), "S0")
    dst = Layout(DeviceMesh((3,), [2, 3, 4]), "S0")
    value = np.arange(20, dtype=np.float32)
    plan = reshard.plan(value.shape, value.dtype, src, dst)
    fabric, calls, out = LocalFabric(10.0), [], {}
    devices = plan.devices

    def rank(k: int) -> None:
        d = devices[k]
        ex = Executor.create("threads", d, fabric, calls, registry=reg)
        shard = [value[src.index_map(value.shape)[d]]] if d in src.devices else [None]
        out[d] = ex.execute(plan, shard)

    errors = in_threads(rank, len(devices), 20)
    assert not errors, errors
    assert sorted(calls) == list(plan.devices)
    for d in dst.devices:
        assert np.array_equal(out[d][0], value[dst.index_map(value.shape)[d]])
    # the declared capabilities are enforced before anything moves
    with pytest.raises(reshard.DTypeError, match="cannot move dtype float64"):
        Executor.create("threads", 0, fabric, calls, registry=reg).load(
            reshard.plan((4,), "float64", src, dst))


def test_runtime_reads_capabilities_and_launchers_from_its_registry():
    narrow = Capabilities(moves=frozenset({"int32"}), sums=None, groups_need_world=False,
                          device="cpu")
    base = builtin_backends()
    reg = base.register("local", base.entry("local").factory, narrow,
                        launchers=("thread",), replace=True)
    src = Layout(DeviceMesh((2,), [0, 1]), "S0")
    dst = Layout(DeviceMesh((2,), [2, 3]), "R")
    with reshard.Runtime("local", registry=reg) as rt:
        x = rt.put(np.arange(6, dtype=np.int32), src)
        assert np.array_equal(rt.get(rt.reshard(x, dst)), np.arange(6))
        y = rt.put(np.arange(6.0), src)
        with pytest.raises(reshard.DTypeError, match="cannot move dtype float64"):
            rt.reshard(y, dst)
    with pytest.raises(reshard.ReshardError, match="Executor"):
        reshard.Runtime("torch", CLUSTER)
    with pytest.raises(reshard.ReshardError, match="launchers"):
        reshard.Runtime("local", launcher="process")
    assert isinstance(builtin_backends(), BackendRegistry)
