"""Packing global boxes of a local shard into contiguous buffers and back."""

from __future__ import annotations

from typing import Any

from reshard.layout import Box


def local_slices(box: Box, shard_box: Box) -> tuple[slice, ...]:
    """Slices of ``box`` (global) inside a shard that holds ``shard_box`` (global)."""
    return tuple(slice(a - s, b - s) for (a, b), (s, _) in zip(box, shard_box))


def region(shard: Any, box: Box, shard_box: Box) -> Any:
    """The view of ``shard`` holding global ``box``."""
    return shard[local_slices(box, shard_box)]


def is_contiguous(view: Any) -> bool:
    """True if ``view`` is one C-contiguous run of memory."""
    return bool(view.flags.c_contiguous)


def pack(shard: Any, box: Box, shard_box: Box, out: Any | None = None) -> Any:
    """A 1-d contiguous buffer with the elements of ``box``.

    Zero-copy (a view of the shard) when the box is already contiguous in the shard;
    otherwise copied into ``out`` (or a new buffer).
    """
    view = region(shard, box, shard_box)
    if is_contiguous(view):
        return view.reshape(-1)
    if out is None:
        return view.copy().reshape(-1)
    out.reshape(view.shape)[...] = view
    return out


def unpack(shard: Any, box: Box, shard_box: Box, buf: Any) -> None:
    """Write a 1-d buffer holding ``box`` into the shard (no-op if ``buf`` already is
    the shard's own memory)."""
    view = region(shard, box, shard_box)
    if view.size == 0:
        return
    flat = buf[: view.size]
    if is_contiguous(view) and _same_memory(view, flat):
        return
    view[...] = flat.reshape(view.shape)


def recv_target(shard: Any, box: Box, shard_box: Box, scratch: Any) -> Any:
    """Where to receive ``box``: the shard's own memory when contiguous, else
    ``scratch`` (to be unpacked)."""
    view = region(shard, box, shard_box)
    if is_contiguous(view):
        return view.reshape(-1)
    return scratch[: view.size]


def _same_memory(a: Any, b: Any) -> bool:
    try:
        return a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    except AttributeError:  # cupy
        return a.data.ptr == b.data.ptr
