"""The cost in the forms compilers hold: DTensor specs (a callable of two DTensorSpecs,
as torch's redistribute_cost, in microseconds) and JAX shardings, each equal to the
estimate of the same move as reshard layouts; the same move twice costs one plan."""

from __future__ import annotations

import os

import numpy as np
import pytest

import reshard
from reshard import Cluster, DeviceMesh, Layout

CLUSTER = Cluster.preset("dgx-h100", 2, 4)


def test_dtensor_specs_cost_as_their_layouts():
    torch = pytest.importorskip("torch")
    from torch.distributed.device_mesh import DeviceMesh as TorchMesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    from reshard.adapters.dtensor_cost import CrossMeshCost, request

    def mesh(ranks):
        return TorchMesh("cpu", torch.tensor(ranks), _init_backend=False, _rank=ranks[0])

    shape = (4096, 1024)
    meta = TensorMeta(torch.Size(shape), (1024, 1), torch.bfloat16)
    a = DTensorSpec(mesh([0, 1, 2, 3]), (Shard(0),), tensor_meta=meta)
    b = DTensorSpec(mesh([4, 5, 6, 7]), (Shard(1),), tensor_meta=meta)
    c = DTensorSpec(mesh([4, 5, 6, 7]), (Replicate(),), tensor_meta=meta)
    cost = CrossMeshCost(CLUSTER)
    got = cost.many([(a, b), (a, c), (a, b)])
    want = [1e6 * reshard.plan(shape, "bfloat16", Layout(DeviceMesh((4,), range(4)), "S0R"),
                               Layout(DeviceMesh((4,), range(4, 8)), dst),
                               cluster=CLUSTER).estimate() for dst in ("RS0", "RR", "RS0")]
    assert got == pytest.approx(want, rel=1e-9)
    assert got[1] > got[0]  # replicating moves four times the bytes
    assert cost(a, b) == got[0] and cost.cache.misses == 4  # two plans, no more
    req = request(shape, torch.bfloat16, (a.mesh, a.placements), (b.mesh, b.placements),
                  CLUSTER)
    assert reshard.estimate_many([req])[0] * 1e6 == pytest.approx(got[0], rel=1e-9)
    with pytest.raises(reshard.SpecError, match="tensor_meta"):
        cost(DTensorSpec(a.mesh, a.placements), DTensorSpec(b.mesh, b.placements))


def test_jax_shardings_cost_as_their_layouts():
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()
    jax = pytest.importorskip("jax")
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from reshard.adapters import jax as rj

    devs = jax.devices()
    if len(devs) < 8:
        pytest.skip(f"needs 8 JAX CPU devices, got {len(devs)}")
    ids = np.array([d.id for d in devs[:8]])
    m1 = Mesh(np.array(devs[:4]).reshape(2, 2), ("x", "y"))
    m2 = Mesh(np.array(devs[4:8]).reshape(2, 2), ("x", "y"))
    src, dst = NamedSharding(m1, P("x", "y")), NamedSharding(m2, P("y", None))
    req = rj.cost_request((1024, 512), "float32", src, dst, CLUSTER)
    got = reshard.estimate_many([req])[0]
    lay_src = Layout(DeviceMesh((2, 2), ids[:4]), "S0S1")
    lay_dst = Layout(DeviceMesh((2, 2), ids[4:]), "S1R")
    want = reshard.plan((1024, 512), "float32", lay_src, lay_dst, cluster=CLUSTER).estimate()
    assert got == pytest.approx(want, rel=1e-9)
