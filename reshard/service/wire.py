"""Counting a request's repeated messages on the wire, before it is parsed.

A parsed message holds far more than its bytes where they are many small messages: a
PlanRequest of 1.2 million tiny tensors (48 MB) takes about 560 MB once parsed, and
longer than a deadline to walk. The service therefore counts, in the raw bytes, the
entries a budget limits (a PlanRequest's tensors; an EstimateManyRequest's requests and
their tensors together) and refuses a request over its budget before parsing it. The
count stops one past the budget, and the scan visits at most :data:`FIELDS_PER_ENTRY`
fields a budgeted entry (and :data:`SPARE_FIELDS` more) before it calls the request too
long (:class:`TooLong`: padded with other fields), so that refusing costs at most the
budget's worth of scanning (about 0.4 us a field, nested ones included) whatever the
bytes hold. The service does not scan a message shorter than twice the budget (each
entry takes at least two bytes). Bytes that are no valid message are left to the parser,
which refuses them.
"""

from __future__ import annotations

from collections.abc import Callable

LEN = 2
"""The wire type of length-delimited fields (messages, bytes, strings, packed arrays)."""

_SKIP = {1: 8, 5: 4}
"""Bytes of the fixed-width wire types (64-bit, 32-bit)."""

FIELDS_PER_ENTRY = 4
"""Fields a scan visits per entry its budget allows (a request's tensor, an
EstimateMany's request: each with a few fields beside)."""

SPARE_FIELDS = 64
"""Fields a scan visits beyond those."""


class Malformed(Exception):
    """Bytes that are not a message (the parser says why)."""


class TooLong(Exception):
    """The bytes hold more fields than the scan visits (a request padded with them)."""


class _Over(Exception):
    """A count passed its limit (stops the scan)."""


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


def entries(raw: bytes, field: int, limit: int, start: int = 0, stop: int | None = None,
            each: Callable[[int, int], None] | None = None,
            visits: list[int] | None = None) -> int:
    """How many times length-delimited ``field`` occurs in the message ``raw[start:
    stop]``, counted up to ``limit + 1`` (where counting stops); ``each(start, stop)``
    is called with each occurrence's value (its bytes' range). Other fields are skipped.
    ``visits``: ``[the fields the scan may still visit]``, shared by nested scans
    (decremented here).

    Raises:
        Malformed: the bytes are not a message.
        TooLong: more fields than ``visits`` allows.
    """
    end = len(raw) if stop is None else stop
    i, n = start, 0
    try:
        while i < end:
            if visits is not None:
                visits[0] -= 1
                if visits[0] < 0:
                    raise TooLong
            tag = raw[i]  # one byte for fields 1-15, the common case
            i += 1
            if tag >= 0x80:
                tag, i = _varint(raw, i - 1)
            kind = tag & 7
            if kind == LEN:
                size = raw[i]
                i += 1
                if size >= 0x80:
                    size, i = _varint(raw, i - 1)
                if tag >> 3 == field:
                    n += 1
                    if n > limit:
                        return n
                    if each is not None:
                        each(i, i + size)
                i += size
            elif kind == 0:
                while raw[i] >= 0x80:
                    i += 1
                i += 1
            elif kind in _SKIP:
                i += _SKIP[kind]
            else:  # groups (deprecated) or garbage
                raise Malformed
    except IndexError:
        raise Malformed from None
    if i != end:
        raise Malformed
    return n


def first_entries(raw: bytes, field: int, k: int) -> list[tuple[int, int]]:
    """The byte ranges of the first ``k`` values of length-delimited ``field`` in the
    message ``raw`` (fewer where it has fewer; none where it is no valid message or
    they do not come within the first ``FIELDS_PER_ENTRY * k + SPARE_FIELDS``
    fields)."""
    out: list[tuple[int, int]] = []
    try:
        entries(raw, field, k, each=lambda start, stop: out.append((start, stop)),
                visits=[FIELDS_PER_ENTRY * k + SPARE_FIELDS])
    except (Malformed, TooLong):
        return []
    return out[:k]


def plan_request_tensors(raw: bytes, limit: int) -> int:
    """A PlanRequest's tensors (field 1) in its bytes, counted up to ``limit + 1``; 0
    when they are no valid message.

    Raises:
        TooLong: the bytes hold more than ``FIELDS_PER_ENTRY * limit + SPARE_FIELDS``
            fields.
    """
    try:
        return entries(raw, 1, limit, visits=[FIELDS_PER_ENTRY * limit + SPARE_FIELDS])
    except Malformed:
        return 0


def estimate_many_counts(raw: bytes, max_requests: int, max_tensors: int) -> tuple[int, int]:
    """``(requests, tensors)`` of an EstimateManyRequest's bytes: its requests (field
    1) and their tensors together (each request's field 1), each counted up to its
    limit + 1 (where counting stops: the other count is then short); zeros where the
    bytes are no valid message.

    Raises:
        TooLong: the bytes hold more than ``FIELDS_PER_ENTRY * (max_requests +
            max_tensors) + SPARE_FIELDS`` fields, nested ones included.
    """
    tensors = [0]
    visits = [FIELDS_PER_ENTRY * (max_requests + max_tensors) + SPARE_FIELDS]

    def each(start: int, stop: int) -> None:
        tensors[0] += entries(raw, 1, max_tensors - tensors[0], start, stop, visits=visits)
        if tensors[0] > max_tensors:
            raise _Over

    try:
        requests = entries(raw, 1, max_requests, each=each, visits=visits)
    except _Over:
        return 0, tensors[0]
    except Malformed:
        return 0, 0
    return requests, tensors[0]


SEARCH_FIELDS_PER_ENTRY = 16
"""Fields a Search's scan visits per entry its budget allows (a layer's name, dtype and
output shape, unpacked, are a few fields beside its submeshes)."""


def search_counts(raw: bytes, limit: int) -> int:
    """A SearchRequest's layers (field 1), their submeshes (a layer's field 4) and those's
    candidates (a submesh's field 2), and its graph's edges (field 2's field 1), together,
    counted until the count passes ``limit`` (where counting stops: a submesh and its
    candidates may go past it by one); 0 where the bytes are no valid message.

    Raises:
        TooLong: the bytes hold more than ``SEARCH_FIELDS_PER_ENTRY * limit +
            SPARE_FIELDS`` fields, nested ones included.
    """
    count = [0]
    visits = [SEARCH_FIELDS_PER_ENTRY * limit + SPARE_FIELDS]

    def add(n: int) -> None:
        count[0] += n
        if count[0] > limit:
            raise _Over

    def submesh(start: int, stop: int) -> None:
        add(1 + entries(raw, 2, limit - count[0], start, stop, visits=visits))

    def layer(start: int, stop: int) -> None:
        add(1)
        entries(raw, 4, limit, start, stop, each=submesh, visits=visits)

    def graph(start: int, stop: int) -> None:
        add(entries(raw, 1, limit - count[0], start, stop, visits=visits))

    try:
        entries(raw, 1, limit, each=layer, visits=visits)
        entries(raw, 2, limit, each=graph, visits=visits)
    except _Over:
        return count[0]
    except Malformed:
        return 0
    return count[0]


__all__ = ["FIELDS_PER_ENTRY", "SEARCH_FIELDS_PER_ENTRY", "SPARE_FIELDS", "Malformed",
           "TooLong", "entries", "estimate_many_counts", "first_entries",
           "plan_request_tensors", "search_counts"]
