"""The GPU tier: nccl on real GPUs, skipped cleanly without cupy or a GPU."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def gpus() -> int:
    """Number of visible GPUs (skips the test without cupy or a GPU)."""
    cupy = pytest.importorskip("cupy")
    if not cupy.is_available():
        pytest.skip("cupy sees no CUDA GPU")
    from reshard.comm.backends.nccl import available

    if not available():
        pytest.skip("cupy has no NCCL")
    return int(cupy.cuda.runtime.getDeviceCount())


def nccl_env(ranks: int, gpus: int) -> dict[str, str]:
    """Worker environment for ``ranks`` NCCL ranks on ``gpus`` GPUs of this machine.

    With fewer GPUs than ranks, ranks share GPUs (correctness only): each gets its
    own ``NCCL_HOSTID`` so that NCCL treats it as another host and talks to it over
    loopback sockets instead of refusing a duplicate GPU.
    """
    env = {"NCCL_IB_DISABLE": "1"}
    if gpus < ranks:
        env.update({"NCCL_HOSTID": "reshard-rank-{device}", "NCCL_SOCKET_IFNAME": "lo",
                    "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"})
    return env
