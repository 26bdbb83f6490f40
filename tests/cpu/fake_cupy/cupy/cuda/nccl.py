"""Fake ``cupy.cuda.nccl`` on gloo: a unique id is the address of a TCPStore held by
the process that made it (in the tuple-of-signed-chars form of older cupy); a
communicator is a gloo process group over that store. Operations run at once."""

from __future__ import annotations

import ctypes
import datetime

import numpy as np

available = True
(NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64, NCCL_FLOAT16,
 NCCL_FLOAT32, NCCL_FLOAT64) = range(9)
NCCL_BFLOAT16 = 9  # cupy's value; the backend never asks NCCL to sum it
NCCL_SUM, NCCL_MAX = 0, 2
_NUMPY = {NCCL_INT8: np.int8, NCCL_UINT8: np.uint8, NCCL_INT32: np.int32,
          NCCL_UINT32: np.int32, NCCL_INT64: np.int64, NCCL_UINT64: np.int64,
          NCCL_FLOAT16: np.float16, NCCL_FLOAT32: np.float32, NCCL_FLOAT64: np.float64}
_STORES: list = []  # keep unique-id stores alive
_TIMEOUT = datetime.timedelta(seconds=30)
_groups = {"open": 0}


def get_unique_id() -> tuple:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=_TIMEOUT,
                          wait_for_workers=False)
    _STORES.append(store)
    text = f"127.0.0.1:{store.port}".encode().ljust(128, b"\0")
    return tuple(c - 256 if c > 127 else c for c in text)


def groupStart() -> None:
    _groups["open"] += 1


def groupEnd() -> None:
    _groups["open"] -= 1


def _view(ptr: int, count: int, datatype: int):
    import torch

    dt = np.dtype(_NUMPY[datatype])
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * (count * dt.itemsize)).from_address(ptr))
    return torch.from_numpy(raw.view(dt))


class NcclCommunicator:
    def __init__(self, ndev: int, commId: tuple, rank: int) -> None:
        import torch.distributed as dist

        assert isinstance(commId, tuple) and len(commId) == 128
        host, _, port = bytes(c & 0xFF for c in commId).rstrip(b"\0").decode().rpartition(":")
        store = dist.TCPStore(host, int(port), None, False, timeout=_TIMEOUT)
        self._pg = dist.ProcessGroupGloo(store, rank, ndev, _TIMEOUT)
        self._rank = rank

    def broadcast(self, sendbuf, recvbuf, count, datatype, root, stream) -> None:
        import torch.distributed as dist

        assert sendbuf == recvbuf
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        self._pg.broadcast([_view(recvbuf, count, datatype)], opts).wait()

    def send(self, sendbuf, count, datatype, peer, stream) -> None:
        self._pg.send([_view(sendbuf, count, datatype)], peer, 0).wait()

    def recv(self, recvbuf, count, datatype, peer, stream) -> None:
        self._pg.recv([_view(recvbuf, count, datatype)], peer, 0).wait()

    def allGather(self, sendbuf, recvbuf, count, datatype, stream) -> None:
        n = self._pg.size()
        out = _view(recvbuf, count * n, datatype)
        self._pg.allgather([list(out.chunk(n))], [_view(sendbuf, count, datatype)]).wait()

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream) -> None:
        import torch.distributed as dist

        assert sendbuf == recvbuf and op in (NCCL_SUM, NCCL_MAX)
        opts = dist.ReduceOptions()
        opts.rootRank = root
        opts.reduceOp = dist.ReduceOp.SUM if op == NCCL_SUM else dist.ReduceOp.MAX
        self._pg.reduce([_view(recvbuf, count, datatype)], opts).wait()

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream) -> None:
        import torch.distributed as dist

        assert sendbuf == recvbuf and op in (NCCL_SUM, NCCL_MAX)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM if op == NCCL_SUM else dist.ReduceOp.MAX
        self._pg.allreduce([_view(recvbuf, count, datatype)], opts).wait()

    def check_async_error(self) -> None:
        pass

    def abort(self) -> None:
        self._pg = None

    def destroy(self) -> None:
        self._pg = None
