"""A fake ``cupy`` for testing the nccl backend's logic on CPU (tests only).

Arrays are numpy arrays (a subclass with cupy's ``.data.ptr``); the "GPU" is host
memory; streams complete at once; ``cupy.cuda.nccl`` runs on gloo process groups.
It checks the backend's control flow (communicator creation order, unique ids through
the rendezvous, ranks, counts, dtype handling), not cupy's API itself.
"""

from __future__ import annotations

import numpy as _np

from . import cuda  # noqa: F401


class _Pointer:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class ndarray(_np.ndarray):
    """numpy memory with cupy's ``.data.ptr``."""

    @property
    def data(self):  # type: ignore[override]
        return _Pointer(self.__array_interface__["data"][0])


def _wrap(a):
    return _np.ascontiguousarray(a).view(ndarray)


def is_available() -> bool:
    return True


def empty(shape, dtype=float):
    return _np.empty(shape, dtype=dtype).view(ndarray)


def zeros(shape, dtype=float):
    return _np.zeros(shape, dtype=dtype).view(ndarray)


def asarray(a, dtype=None):
    return a if isinstance(a, ndarray) and dtype is None else _wrap(_np.asarray(a, dtype))


def asnumpy(a):
    return _np.array(a, copy=True).view(_np.ndarray)
