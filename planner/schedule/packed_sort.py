"""An indirect stable sort on several integer keys, the keys packed into few words.

:func:`numpy.lexsort` sorts once per key. Where a key spans few values (a step, a
phase, a box's bound), several keys fit one 64-bit word: each key's value less its
least, in mixed radix (each key's range the radix of its digit), the first key the most
significant. Words compare exactly as the tuples of keys they pack, so a stable sort on
the words is :func:`numpy.lexsort`'s order, row for row (ties kept in index order).
A key with one value orders nothing and is left out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

PACK_FROM = 4096
"""Rows from which :func:`lexsort` packs the keys (below, numpy's own sort per key is
cheaper than finding each key's range)."""

SMALL = 2 ** 16
"""Values the leading keys span at most for :func:`lexsort` to sort them alone as
16-bit words (numpy's stable sort of those is a radix sort), the others in order."""

WORD = 2 ** 63
"""A packed word stays below this (a non-negative int64)."""


def lexsort(keys: Sequence[np.ndarray]) -> np.ndarray:
    """:func:`numpy.lexsort` of the int64 arrays ``keys`` (the last key the primary),
    the same indices. The later words are packed only where the first word ties."""
    if not keys or len(keys[0]) < PACK_FROM or \
            any(key.dtype != np.int64 or key.ndim != 1 for key in keys):
        return np.lexsort(keys)
    bounds = [(int(key.min()), int(key.max())) for key in keys]
    if any(most - least >= WORD - 1 for least, most in bounds):
        return np.lexsort(keys)  # a key alone spans a word or more
    split = _sorted_below(keys, bounds)
    if split is not None:
        return split
    words = _words(keys, bounds)
    head = next(words, None)
    if head is None:  # every key of one value
        return np.arange(len(keys[0]), dtype=np.intp)
    first = np.argsort(head, kind="stable")
    ordered = head[first]
    if not bool((ordered[1:] == ordered[:-1]).any()):
        return first  # every row's first word its own: the later words order nothing
    rest = list(words)
    return np.lexsort([*rest[::-1], head]) if rest else first


def _sorted_below(keys: Sequence[np.ndarray], bounds: Sequence[tuple[int, int]]
                  ) -> np.ndarray | None:
    """:func:`lexsort`'s order where the leading keys (the most significant, packed)
    span at most :data:`SMALL` values and the other keys are already in order row by
    row (their tuples never decrease from one row to the next): then it is a stable
    sort on the leading keys alone (ties keep the index order, in which the other keys
    never decrease), numpy's radix sort of a 16-bit word. None where it is not."""
    live = [(key, least, most) for key, (least, most) in zip(reversed(keys), reversed(bounds))
            if least != most]
    room, lead = 1, 0
    while lead < len(live) and room * (live[lead][2] - live[lead][1] + 1) <= SMALL:
        room *= live[lead][2] - live[lead][1] + 1
        lead += 1
    rest = live[lead:][::-1]  # as lexsort's keys: the last the primary
    if not lead or not _in_order(_words([k for k, _, _ in rest], [(lo, hi) for _, lo, hi in rest]),
                                 len(keys[0])):
        return None
    (word,) = _words([k for k, _, _ in live[:lead]][::-1],
                     [(lo, hi) for _, lo, hi in live[:lead]][::-1])
    return np.argsort(word.astype(np.uint16), kind="stable")


def _in_order(words: Iterator[np.ndarray], rows: int) -> bool:
    """Whether the ``rows`` rows' tuples of ``words`` (the first the most significant)
    never decrease from one row to the next (the later words packed only while they
    may)."""
    rising = np.zeros(max(0, rows - 1), dtype=bool)  # rows already above the previous
    for word in words:
        step = word[1:] - word[:-1]  # words are non-negative int64: no overflow
        if bool((step[~rising] < 0).any()):
            return False
        rising |= step > 0
    return True


def _words(keys: Sequence[np.ndarray], bounds: Sequence[tuple[int, int]]
           ) -> Iterator[np.ndarray]:
    """The int64 ``keys`` (the last key the primary, as :func:`numpy.lexsort`'s), each
    between its ``bounds`` (least, greatest), as words, the first word the primary:
    each word a mixed-radix number of consecutive keys' offsets from their least
    value, below :data:`WORD` (no key alone spans that many values); keys of one value
    left out."""
    word: np.ndarray | None = None
    room = 1  # the values the current word spans
    for key, (least, most) in zip(reversed(keys), reversed(bounds)):
        if least == most:
            continue
        radix = most - least + 1
        if word is not None and room * radix < WORD:
            # word * radix + (key - least), in place: int64 arithmetic wraps, so adding
            # key and then taking least off gives the same word (below WORD) without
            # the digits laid out (an array of every row per key)
            word *= radix
            word += key
            if least:
                word -= least
            room *= radix
            continue
        if word is not None:
            yield word
        word, room = key - least, radix
    if word is not None:
        yield word
