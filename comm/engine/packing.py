"""Packing global boxes of a local shard into contiguous buffers and back.

Shards and buffers are numpy or cupy arrays, or torch tensors (the ``torch`` backend on
a GPU): only slicing, ``reshape`` and assignment are used (a strided box of cupy arrays
as pitched copies, :mod:`reshard.comm.engine.pitched`), plus the two questions below whose
answer each library spells its own way.
"""

from __future__ import annotations

import math
from typing import Any

from reshard.comm.engine.pitched import CopySink, copy_into
from reshard.core.dtypes import is_torch
from reshard.core.layout import Box


def local_slices(box: Box, shard_box: Box) -> tuple[slice, ...]:
    """Slices of ``box`` (global) inside a shard that holds ``shard_box`` (global)."""
    return tuple(slice(a - s, b - s) for (a, b), (s, _) in zip(box, shard_box))


def region(shard: Any, box: Box, shard_box: Box) -> Any:
    """The view of ``shard`` holding global ``box``."""
    return shard[local_slices(box, shard_box)]


def byte_span(box: Box, shard_box: Box, itemsize: int) -> tuple[int, int] | None:
    """Bytes ``[a, b)`` of global ``box`` in a C-contiguous shard holding ``shard_box``
    (elements of ``itemsize`` bytes) when the box is one run of the shard's memory
    (every dimension after its first longer than 1 whole); None when it is strided
    there, or empty."""
    ext = [b - a for a, b in box]
    n = math.prod(ext)
    if not n:
        return None
    shape = [b - a for a, b in shard_box]
    first = next((d for d, e in enumerate(ext) if e > 1), len(ext))
    if any(ext[d] != shape[d] for d in range(first + 1, len(ext))):
        return None
    at = 0
    for (lo, _), (s, _), size in zip(box, shard_box, shape):
        at = at * size + (lo - s)
    return at * itemsize, (at + n) * itemsize


def row_runs(box: Box, shard_box: Box, itemsize: int
             ) -> tuple[tuple[int, ...], int, int, tuple[int, ...]] | None:
    """``box`` in a C-contiguous shard holding ``shard_box`` as runs of contiguous
    bytes (its rows): ``(shape, run, offset, strides)``, the runs indexed by the box's
    leading dimensions (``shape``, ``strides`` in bytes), each ``run`` bytes from
    ``offset`` plus their stride; the dimensions from the last one the box cuts are in
    every run (the ones after it are whole). Copying runs as single elements of
    ``run`` bytes is one loop over rows where numpy would loop over each row's elements
    (4x faster for 32-byte rows of int8). None when the box is empty or one run."""
    ext = [b - a for a, b in box]
    shape = [b - a for a, b in shard_box]
    if not math.prod(ext) or byte_span(box, shard_box, itemsize) is not None:
        return None
    cut = max(d for d in range(len(ext)) if ext[d] != shape[d])
    run = ext[cut] * math.prod(shape[cut + 1:]) * itemsize
    strides, step = [], itemsize
    for size in reversed(shape):
        strides.append(step)
        step *= size
    strides.reverse()
    offset = sum((lo - s) * st for (lo, _), (s, _), st in zip(box, shard_box, strides))
    return tuple(ext[:cut]), run, offset, tuple(strides[:cut])


def is_contiguous(view: Any) -> bool:
    """True if ``view`` is one C-contiguous run of memory."""
    if is_torch(view):
        return bool(view.is_contiguous())
    return bool(view.flags.c_contiguous)


def pack(shard: Any, box: Box, shard_box: Box, out: Any | None = None,
         sink: CopySink | None = None) -> Any:
    """A 1-d contiguous buffer with the elements of ``box``.

    Zero-copy (a view of the shard) when the box is already contiguous in the shard;
    otherwise copied into ``out`` (or a new buffer; into ``out`` queued in ``sink``
    where it takes the copy: the caller flushes it before the buffer is read).
    """
    view = region(shard, box, shard_box)
    if is_contiguous(view):
        return view.reshape(-1)
    if out is None:
        return view.reshape(-1)  # a copy: the view is not contiguous
    copy_into(out.reshape(view.shape), view, sink)
    return out


def unpack(shard: Any, box: Box, shard_box: Box, buf: Any,
           sink: CopySink | None = None) -> None:
    """Write a 1-d buffer holding ``box`` into the shard (no-op if ``buf`` already is
    the shard's own memory; queued in ``sink`` where it takes the copy)."""
    view = region(shard, box, shard_box)
    n = math.prod(view.shape)
    if n == 0:
        return
    flat = buf[:n]
    if is_contiguous(view) and same_memory(view, flat):
        return
    copy_into(view, flat.reshape(view.shape), sink)


class Unpacker:
    """Writes a 1-d buffer holding ``box`` into the shard while the buffer fills from
    its start: :meth:`upto` copies the outermost slices (of the box's first dim longer
    than 1) that the first ``nbytes`` complete, :meth:`finish` the rest. A backend
    that receives in pieces reports each arrival, so the copy out of scratch memory
    overlaps the transfer instead of following it (on the testbed the copies of
    strided boxes after the transfer added up to 19% to a 1 s reshard).
    """

    def __init__(self, shard: Any, box: Box, shard_box: Box, buf: Any) -> None:
        self.view = region(shard, box, shard_box)
        shape = tuple(self.view.shape)
        self.n = math.prod(shape)
        self.packed = buf[:self.n].reshape(shape)
        self.dim = next((d for d, e in enumerate(shape) if e > 1), 0)
        self.lead = tuple(slice(None) for _ in range(self.dim))
        self.slice_bytes = math.prod(shape[self.dim + 1:]) * buf.itemsize
        self.slices = shape[self.dim] if shape else 0
        self.done = 0

    def upto(self, nbytes: int) -> None:
        """Copy the slices the buffer's first ``nbytes`` complete (not copied yet)."""
        if not self.n or not self.slice_bytes:
            return
        k = min(self.slices, int(nbytes) // self.slice_bytes)
        if k > self.done:
            part = (*self.lead, slice(self.done, k))
            self.view[part] = self.packed[part]
            self.done = k

    def finish(self) -> None:
        """Copy whatever :meth:`upto` has not."""
        if self.n and self.done < self.slices:
            part = (*self.lead, slice(self.done, self.slices))
            self.view[part] = self.packed[part]
            self.done = self.slices


def recv_target(shard: Any, box: Box, shard_box: Box, scratch: Any) -> Any:
    """Where to receive ``box``: the shard's own memory when contiguous, else
    ``scratch`` (to be unpacked)."""
    view = region(shard, box, shard_box)
    if is_contiguous(view):
        return view.reshape(-1)
    return scratch[: math.prod(view.shape)]


def data_address(a: Any) -> int:
    """Address of an array's first element (numpy, cupy or torch)."""
    if is_torch(a):
        return int(a.data_ptr())
    try:
        return int(a.__array_interface__["data"][0])
    except AttributeError:  # cupy
        return int(a.data.ptr)


def same_memory(a: Any, b: Any) -> bool:
    """True if ``a`` and ``b`` start at the same address (``b`` is ``a`` or a view of it
    from its start). Arrays of different libraries compare by address too, so a numpy
    view of a CPU torch tensor is the tensor's memory."""
    try:
        return data_address(a) == data_address(b)
    except (AttributeError, TypeError):
        return False


__all__ = ["Unpacker", "byte_span", "data_address", "is_contiguous", "local_slices", "pack",
           "recv_target", "region", "row_runs", "same_memory", "unpack"]
