"""The EstimateMany answers cache weighs what it holds: its keys, tuples and floats and
each error's text as Python stores it (measured with tracemalloc), never less."""

from __future__ import annotations

import hashlib
import sys
import tracemalloc

import pytest

from reshard.lru import LruCache
from reshard.service.servicer import answer_bytes


def _held(text_chars: int, char: str, n: int = 5000) -> tuple[float, float]:
    """Bytes per entry of ``n`` answers with error texts of ``text_chars`` characters
    of ``char`` (none: a success), as measured and as weighed."""
    cache: LruCache = LruCache(1 << 40, weigh=answer_bytes)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(n):
            key = hashlib.sha256(str(k).encode()).digest()
            text = f"{k}" + char * text_chars if text_chars else ""
            cache.put(key, (k + 0.5, text, sys.intern("SpecError") if text_chars else ""))
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return used / n, cache._weight / n


@pytest.mark.parametrize(("chars", "char"), [(0, ""), (100, "a"), (4000, "a"), (4000, "€"),
                                             (1000, "\U0001f600")])
def test_answers_are_weighed_at_what_they_hold(chars, char):
    measured, weighed = _held(chars, char)
    assert weighed >= measured, f"under-weighed: {weighed:.0f} < {measured:.0f} bytes"
    assert weighed <= 1.4 * measured + 128, f"over-weighed: {weighed:.0f} vs {measured:.0f}"


def test_a_byte_bound_keeps_few_long_errors():
    """A 1 MiB cache keeps about 1 MiB of 4 KB error answers (the count bound kept
    262,144 of them: over 1 GiB)."""
    cache: LruCache = LruCache(1 << 20, weigh=answer_bytes)
    for k in range(2000):
        cache.put(hashlib.sha256(str(k).encode()).digest(), (0.0, f"{k}" + "x" * 4000, "E"))
    assert cache._weight <= 1 << 20
    assert 200 <= len(cache) <= 260
