"""Counting a request's repeated messages on the wire, before it is parsed.

A parsed message holds far more than its bytes where they are many small messages: a
PlanRequest of 1.2 million tiny tensors (48 MB) takes about 560 MB once parsed, and
longer than a deadline to walk. The service therefore counts, in the raw bytes, the
entries a budget limits (a PlanRequest's tensors; an EstimateManyRequest's requests and
their tensors together) and refuses a request over its budget before parsing it. The
count stops one past the budget, so that refusing costs at most the budget's worth of
scanning (about 0.6 us an entry); a message shorter than twice the budget (every entry
takes at least two bytes) is not scanned at all. Bytes that are no valid message are
left to the parser, which refuses them.
"""

from __future__ import annotations

from collections.abc import Iterator

LEN = 2
"""The wire type of length-delimited fields (messages, bytes, strings, packed arrays)."""

_SKIP = {1: 8, 5: 4}
"""Bytes of the fixed-width wire types (64-bit, 32-bit)."""


class Malformed(Exception):
    """Bytes that are not a message (the parser says why)."""


def _varint(raw: bytes, i: int) -> tuple[int, int]:
    """The varint at ``raw[i]`` and the position after it."""
    out = shift = 0
    while True:
        try:
            b = raw[i]
        except IndexError:
            raise Malformed from None
        out |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return out, i
        shift += 7
        if shift > 63:
            raise Malformed


def fields(raw: bytes, start: int = 0, stop: int | None = None
           ) -> Iterator[tuple[int, int, int]]:
    """``(field number, start, stop)`` of each length-delimited field of the message in
    ``raw[start:stop]`` (its value's bytes); other fields are skipped."""
    end = len(raw) if stop is None else stop
    i = start
    while i < end:
        tag, i = _varint(raw, i)
        kind = tag & 7
        if kind == LEN:
            n, i = _varint(raw, i)
            if i + n > end:
                raise Malformed
            yield tag >> 3, i, i + n
            i += n
        elif kind == 0:
            _, i = _varint(raw, i)
        elif kind in _SKIP:
            i += _SKIP[kind]
        else:  # groups (deprecated) or garbage
            raise Malformed
    if i != end:
        raise Malformed


def count(raw: bytes, field: int, limit: int, start: int = 0, stop: int | None = None) -> int:
    """How many times length-delimited ``field`` occurs in the message ``raw[start:
    stop]``, counted up to ``limit + 1`` (where counting stops)."""
    n = 0
    for number, _, _ in fields(raw, start, stop):
        if number == field:
            n += 1
            if n > limit:
                break
    return n


def plan_request_tensors(raw: bytes, limit: int) -> int:
    """A PlanRequest's tensors (field 1) in its bytes, counted up to ``limit + 1``; 0
    when it is too short to hold more than ``limit`` or is no valid message."""
    if len(raw) <= 2 * limit:
        return 0
    try:
        return count(raw, 1, limit)
    except Malformed:
        return 0


def estimate_many_counts(raw: bytes, max_requests: int, max_tensors: int) -> tuple[int, int]:
    """``(requests, tensors)`` of an EstimateManyRequest's bytes: its requests (field
    1) and their tensors together (each request's field 1), each counted up to its
    limit + 1; zeros where the bytes are too short to pass either or are no valid
    message."""
    if len(raw) <= 2 * min(max_requests, max_tensors):
        return 0, 0
    requests = tensors = 0
    try:
        for number, start, stop in fields(raw):
            if number != 1:
                continue
            requests += 1
            tensors += count(raw, 1, max_tensors - tensors, start, stop)
            if requests > max_requests or tensors > max_tensors:
                break
    except Malformed:
        return 0, 0
    return requests, tensors


__all__ = ["count", "estimate_many_counts", "fields", "plan_request_tensors"]
