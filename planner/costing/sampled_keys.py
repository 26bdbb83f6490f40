"""Memo keys of large tuples hashed by a sample of them (issue 62, round nine): a route
key of a task of a thousand receivers and as many parents takes some 16 us to hash as a
tuple, a form row of 16 KB some 10 us, and the planner looks up thousands of them a
call. A :class:`SampledKey` is the same tuple (equal where its items are equal), its
hash found once, from a sample of its items its maker picks (equal keys, equal samples:
the same dict answers; keys that differ only outside the sample share a hash and are
told apart by the tuple's equality, as any two keys whose hashes meet).

Every key of one memo that could equal a sampled one must itself be sampled the same
way (a plain tuple hashes otherwise): each memo's keys are made by one function."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence


class SampledKey(tuple):  # type: ignore[type-arg]
    """A tuple hashed once, by a sample of its items (:meth:`of`)."""

    sample: Hashable
    hashed: int

    @classmethod
    def of(cls, items: tuple[object, ...], sample: Hashable) -> SampledKey:
        """``items`` as a key hashed by ``sample`` (a function of ``items`` alone)."""
        key = cls(items)
        key.sample = sample
        key.hashed = hash(sample)
        return key

    @classmethod
    def many(cls, items: Iterable[tuple[object, ...]], samples: Iterable[Hashable]
             ) -> list[SampledKey]:
        """:meth:`of` of each of ``items`` and its sample in ``samples``, in one call
        (the same keys)."""
        keys = list(map(cls, items))
        for key, sample in zip(keys, samples, strict=True):
            key.sample = sample
            key.hashed = hash(sample)
        return keys

    def __hash__(self) -> int:
        return self.hashed

    def __reduce__(self) -> tuple[object, ...]:
        return SampledKey.of, (tuple(self), self.sample)  # hashed again where loaded


def every(items: tuple[object, ...] | bytes, stride: int) -> tuple[object, ...] | bytes:
    """A sample of ``items``: its length and every ``stride``-th item (from the first)
    and its last."""
    return (len(items), items[::stride], items[-1:])


def every_many(items: Sequence[tuple[object, ...] | bytes], stride: int
               ) -> list[tuple[object, ...]]:
    """:func:`every` of each of ``items``, in one call (the same samples)."""
    return [(len(x), x[::stride], x[-1:]) for x in items]


__all__ = ["SampledKey", "every", "every_many"]
