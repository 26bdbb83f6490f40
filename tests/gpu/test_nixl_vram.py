"""NIXL on GPU memory, the primitive a VRAM path of the nixl backend stands on: two
agents (the UCX plug-in, as the backend creates them) register cupy buffers as
``VRAM`` (with their device's id), and one-sided WRITEs of descriptor lists of strided
rows land exactly those rows, GPU to GPU and between host and GPU memory, with the
notification arriving after the bytes and the memory around every row untouched.

The CPU contract (tests/contract/test_nixl_contract.py) holds the calls and memory kinds
to both CUDA variants of the package; this runs them. Skipped without cupy and a GPU,
or without NIXL: the GPU image has none and cannot fetch it, so scripts/gpu_wheels.sh
downloads the wheels for its Python and CUDA into ``.whl/`` to carry there, and
scripts/gpu_check.sh installs them.
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("nixl") is None,
                                 reason="NIXL is not installed (scripts/gpu_wheels.sh "
                                        "fetches wheels to carry to a GPU machine)")]

ROW = 4096
ROWS = 256


def _agents() -> tuple[Any, Any]:
    from nixl._api import nixl_agent, nixl_agent_config

    config = nixl_agent_config(enable_prog_thread=True, backends=["UCX"])
    a = nixl_agent("vram-a", config)
    b = nixl_agent("vram-b", config)
    a.add_remote_agent(b.get_agent_metadata())
    b.add_remote_agent(a.get_agent_metadata())
    return a, b


def _place(array: Any) -> tuple[int, int, int, str]:
    """(address, bytes, device id, kind) of a numpy or cupy array."""
    import cupy

    if isinstance(array, cupy.ndarray):
        return array.data.ptr, array.nbytes, array.device.id, "VRAM"
    return array.ctypes.data, array.nbytes, 0, "DRAM"


def _register(agent: Any, array: Any) -> Any:
    address, nbytes, dev, kind = _place(array)
    return agent.register_memory([(address, nbytes, dev, "")], kind)


def _rows(agent: Any, array: Any, first: int, stride: int) -> Any:
    """Descriptors of ROWS rows of ROW bytes, the i-th at ``first + i * stride``."""
    address, _, dev, kind = _place(array)
    return agent.get_xfer_descs(
        [(address + first + i * stride, ROW, dev) for i in range(ROWS)], kind)


def _write_rows(src: Any, dst: Any) -> None:
    """WRITE every other row of ``src`` into ``dst`` at rows of a wider stride, behind
    a 64-byte offset; check the note follows the bytes and nothing else changed."""
    import cupy

    a, b = _agents()
    _register(a, src)
    regs = _register(b, dst)
    a.add_remote_agent(b.get_partial_agent_metadata(regs, False))
    if isinstance(src, cupy.ndarray) or isinstance(dst, cupy.ndarray):
        cupy.cuda.runtime.deviceSynchronize()  # both buffers' bytes are in place
    handle = a.initialize_xfer("WRITE", _rows(a, src, 0, 2 * ROW),
                               _rows(a, dst, 64, 3 * ROW), "vram-b", b"landed")
    assert a.transfer(handle) in ("DONE", "PROC")
    deadline = time.monotonic() + 30
    while (state := a.check_xfer_state(handle)) == "PROC" and time.monotonic() < deadline:
        time.sleep(1e-4)
    assert state == "DONE", state
    notes: dict = {}
    while not notes and time.monotonic() < deadline:
        notes = b.get_new_notifs()
        time.sleep(1e-4)
    assert notes == {"vram-a": [b"landed"]}
    got = cupy.asnumpy(dst) if isinstance(dst, cupy.ndarray) else dst
    want = np.zeros(got.shape, np.uint8)
    sent = cupy.asnumpy(src) if isinstance(src, cupy.ndarray) else src
    for i in range(ROWS):
        want[64 + 3 * ROW * i:64 + 3 * ROW * i + ROW] = sent[2 * ROW * i:2 * ROW * i + ROW]
    assert got.tobytes() == want.tobytes()  # the rows, and zeros around every one
    a.release_xfer_handle(handle)


def _source(on_gpu: bool) -> Any:
    import cupy

    data = np.random.default_rng(5).integers(1, 256, 2 * ROW * ROWS, dtype=np.uint8)
    return cupy.asarray(data) if on_gpu else data


def _target(on_gpu: bool) -> Any:
    import cupy

    return (cupy.zeros if on_gpu else np.zeros)(64 + 3 * ROW * ROWS, np.uint8)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("src_gpu, dst_gpu", [(True, True), (False, True), (True, False)],
                         ids=["vram-to-vram", "dram-to-vram", "vram-to-dram"])
def test_strided_rows_land_in_gpu_memory(gpus, src_gpu, dst_gpu):
    _write_rows(_source(src_gpu), _target(dst_gpu))


@pytest.mark.timeout(120)
def test_vram_is_a_memory_kind_of_the_ucx_plugin(gpus):
    a, _ = _agents()
    assert "VRAM_SEG" in a.get_backend_mem_types("UCX")
