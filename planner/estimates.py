"""Costs at a compiler's rate: many estimates, each the planner's own, normalized and
remembered.

An auto-parallel compiler asks what thousands of moves cost while it chooses stages and
layouts. :func:`estimate_many` answers a batch: for each request ``(shape, dtype, src,
dst, cluster[, strategy])`` the model's seconds for the plan :func:`reshard.plan`
would build (``plan(...).estimate()``, exactly: the same planner runs, on the same
question put in a normal form). What makes a repeated or a similar question cheap:

* a request is first looked up as given (a hash of its values);
* else in its normal form: the hosts it touches kept in order and every other host
  dropped, their devices renumbered by rank (each keeps its host, its place on it: its
  NIC, and its order among the others), so the same move between other stages of a
  pipeline, other hosts of a cluster, is the same question (the planner's choices
  depend on the order of hosts and devices and on where a device sits on its host,
  never on their numbers: checked by a property test);
* else it is planned, on the normal form, and both keys remembered.

A :class:`CostCache` holds the answers, least recently used out first once its bytes
pass its bound (each entry weighed by what its key holds, counted deeply:
:func:`key_bytes`); a caller keeps one across batches.

A long batch answers as it goes: :func:`estimate_iter` yields each request's
:class:`Answer` as soon as it is known (a compiler's first pass, or a progress bar:
``estimate_many(..., on_answer=...)`` calls back with each).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from reshard.cluster import Cluster
from reshard.dtypes import Cast, ScaleMode, parse_dtype
from reshard.errors import ReshardBaseError, ReshardError
from reshard.layout import Layout, check_shape
from reshard.lru import LruCache
from reshard.mesh import DeviceMesh
from reshard.planner.plan import estimate_tensors, planned_tensors
from reshard.planner.values.request import default_cluster
from reshard.planner.values.strategy import Strategy

DEFAULT_CACHE_BYTES = 64 << 20
"""A :class:`CostCache`'s bound unless told otherwise."""

_ENTRY_BYTES = 240
"""Bytes one remembered estimate costs besides its key (the cache's slot and link, the
value's tuple, the float and the weight)."""

_SHARED_INTS = range(-5, 257)
"""Integers every Python process shares (one object each): a key naming them holds no
memory of its own for them."""


def key_bytes(key: Any, seen: set[int] | None = None) -> int:
    """Bytes a cache key holds, counted deeply (``sys.getsizeof`` of the key and of
    every object it reaches once each: tuples, strings, numbers; a layout's mesh and
    spec, a cast; a cluster as :meth:`reshard.Cluster.footprint` says), so that a
    1,000-dim shape weighs its thousand numbers and not a fixed guess. Enum members
    and the integers Python shares are free. An upper bound of what dropping the key
    frees (what other references share is counted too)."""
    seen = set() if seen is None else seen
    if id(key) in seen or key is None or isinstance(key, (bool, enum.Enum)) or \
            (type(key) is int and key in _SHARED_INTS):
        return 0
    seen.add(id(key))
    if isinstance(key, Cluster):
        return key.footprint
    size = sys.getsizeof(key)
    if isinstance(key, (tuple, list, frozenset, set)):
        return size + _items_bytes(key, seen)
    if isinstance(key, dict):
        return size + sum(key_bytes(k, seen) + key_bytes(v, seen) for k, v in key.items())
    if dataclasses.is_dataclass(key) and not isinstance(key, type):
        return size + sum(key_bytes(getattr(key, f.name), seen)
                          for f in dataclasses.fields(key))
    return size


def _items_bytes(items: Iterable[Any], seen: set[int]) -> int:
    """``sum(key_bytes(k, seen) for k in items)``, each plain int (most items: a
    shape's dims, a mesh's devices) counted in place, without a call: nothing if Python
    shares it or it was counted already, else its size, once."""
    total = 0
    for k in items:
        if type(k) is int:
            if k in _SHARED_INTS or id(k) in seen:
                continue
            seen.add(id(k))
            total += sys.getsizeof(k)
        else:
            total += key_bytes(k, seen)
    return total


class EstimateError(ReshardError):
    """Some requests of a batch could not be estimated; the others were.

    Attributes:
        estimates: every request's seconds, in order (NaN where it failed).
        failures: the failed requests' positions and their errors.
    """

    def __init__(self, estimates: list[float], failures: dict[int, ReshardBaseError]) -> None:
        self.estimates = estimates
        self.failures = failures
        shown = "; ".join(f"request {i}: {type(e).__name__}: {e}"
                          for i, e in list(failures.items())[:5])
        more = f"; and {len(failures) - 5} more" if len(failures) > 5 else ""
        super().__init__(f"{len(failures)} of {len(estimates)} requests could not be "
                         f"estimated (the others were: see .estimates): {shown}{more}")


@dataclass
class CostCache:
    """Estimates by request, exact and normalized (module docstring), bounded in bytes.

    Thread-safe. Args:
        max_bytes: the bytes its keys and answers may take (about).
    """

    max_bytes: int = DEFAULT_CACHE_BYTES
    _lru: LruCache[Any, tuple[float, int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) \
                or self.max_bytes < 0:
            raise ReshardError(f"max_bytes must be an integer >= 0, got {self.max_bytes!r}")
        self._lru = LruCache(self.max_bytes, weigh=lambda v: v[1])

    def _get(self, key: Any) -> float | None:
        got = self._lru.get(key)
        return None if got is None else got[0]

    def _put(self, key: Any, seconds: float) -> None:
        """Remember ``seconds`` under ``key``, weighed by what the key holds
        (:func:`key_bytes`) and the entry itself."""
        self._lru.put(key, (seconds, _ENTRY_BYTES + key_bytes(key)))

    @property
    def nbytes(self) -> int:
        """The bytes its entries are weighed at, together (at most ``max_bytes``)."""
        return self._lru.weight

    @property
    def hits(self) -> int:
        """Lookups answered from the cache."""
        return self._lru.hits

    @property
    def misses(self) -> int:
        """Lookups not answered from the cache (a miss of the exact key that the
        normal form answers counts as one miss and one hit)."""
        return self._lru.misses

    def __len__(self) -> int:
        return len(self._lru)


@dataclass(frozen=True)
class Normal:
    """A request in its normal form (module docstring)."""

    key: tuple[Any, ...]
    src: Layout
    dst: Layout
    cluster: Cluster


def _figures(cluster: Cluster) -> tuple[Any, ...]:
    return (cluster.intra_bandwidth, cluster.nic_bandwidth, cluster.latency,
            cluster.intra_latency, cluster.copy_bandwidth, cluster.nics_per_host,
            cluster.relay_piece, cluster.shared_bandwidth, cluster.message_cost,
            cluster.part_cost, cluster.cast_bandwidth)


def normal_form(shape: tuple[int, ...], dtype: str, src: Layout, dst: Layout,
                cluster: Cluster, strategy: Strategy, cast: Cast | None) -> Normal:
    """The request on the hosts it touches alone, their devices renumbered by rank
    (module docstring), and the key that names it."""
    host_of = cluster.host_map
    hosts = sorted({host_of[d] for d in (*src.devices, *dst.devices)})
    # each device of those hosts renumbered by its rank among them: membership, the
    # place on its host (its NIC) and the order of ids and hosts all kept
    rank = {d: i for i, d in enumerate(sorted(d for h in hosts for d in cluster.hosts[h]))}
    new_hosts = [tuple(rank[d] for d in cluster.hosts[h]) for h in hosts]

    def moved(lay: Layout) -> Layout:
        return Layout(DeviceMesh(lay.mesh.shape, tuple(rank[d] for d in lay.mesh.devices)),
                      lay.spec)

    a, b = moved(src), moved(dst)
    normal = dataclasses.replace(cluster, hosts=tuple(new_hosts))
    key = (shape, dtype, None if cast is None else (cast.dtype, cast.scale.value, cast.fold),
           strategy.value, a.mesh.shape, a.mesh.devices, str(a.spec), b.mesh.shape,
           b.mesh.devices, str(b.spec), tuple(new_hosts), _figures(cluster))
    return Normal(key, a, b, normal)


def request_parts(request: Any, strategy: str | Strategy
                  ) -> tuple[Any, Any, Any, Any, Any, Strategy]:
    """``(shape, dtype, src, dst, cluster, strategy)`` of an :func:`estimate_many`
    request (``strategy`` where it names none), unchecked but for its length and its
    strategy."""
    try:
        parts = tuple(request)
    except TypeError:
        parts = ()
    if len(parts) not in (5, 6):
        raise ReshardError(f"a request is (shape, dtype, src_layout, dst_layout, cluster) or "
                           f"(..., strategy), got {request!r:.200}")
    return (*parts[:5], Strategy.parse(parts[5] if len(parts) == 6 else strategy))


def _one(request: Any, strategy: Strategy, cast: Cast | None, cache: CostCache) -> float:
    """One request's seconds (from ``cache``, else planned and remembered)."""
    shape, dtype, src, dst, cluster, strat = request_parts(request, strategy)
    shape_t = check_shape(shape)
    name = parse_dtype(dtype).name
    for what, lay in (("source", src), ("destination", dst)):
        if not isinstance(lay, Layout):
            raise ReshardError(f"the {what} layout must be a reshard.Layout, got "
                               f"{type(lay).__name__}")
    if cluster is None:
        cluster = default_cluster((src, dst))
    elif not isinstance(cluster, Cluster):
        raise ReshardError(f"cluster must be a reshard.Cluster or None, got "
                           f"{type(cluster).__name__}")
    exact = (shape_t, name, src, dst, cluster, strat, cast)
    got = cache._get(exact)
    if got is not None:
        return got
    cluster.check_devices((*src.devices, *dst.devices), "the request")
    normal = normal_form(shape_t, name, src, dst, cluster, strat, cast)
    got = cache._get(normal.key)
    if got is None:
        tensors, planned_on = planned_tensors(
            [(shape_t, name, normal.src, normal.dst)], normal.cluster,
            None if cast is None else cast.dtype, None if cast is None else cast.scale)
        got = estimate_tensors(tensors, planned_on, strat)  # plan(...).estimate()
        cache._put(normal.key, got)
    cache._put(exact, got)
    return got


@dataclass(frozen=True)
class Answer:
    """One request's answer, as :func:`estimate_iter` yields it.

    Attributes:
        index: the request's position in the batch.
        seconds: the model's seconds (NaN where it failed).
        error: why it failed (None where it did not).
    """

    index: int
    seconds: float
    error: ReshardBaseError | None = None


def estimate_iter(requests: Iterable[Any], *, strategy: str | Strategy = Strategy.BROADCAST,
                  cast: object = None, scale: str | ScaleMode | None = None,
                  cache: CostCache | None = None) -> Iterator[Answer]:
    """:func:`estimate_many`'s answers one by one, each as soon as it is known (a long
    batch's first answers before its last are planned): an :class:`Answer` per request,
    in order, a failed one carrying its error (the others still come).

    Raises:
        OptionError: ``strategy``, ``cast`` or ``scale`` names nothing valid (at the
            call, before any request is read).
    """
    strat = Strategy.parse(strategy)
    the_cast = Cast.parse(cast, scale)
    return _answers(requests, strat, the_cast, CostCache() if cache is None else cache)


def _answers(requests: Iterable[Any], strat: Strategy, cast: Cast | None,
             cache: CostCache) -> Iterator[Answer]:
    for i, request in enumerate(requests):
        try:
            seconds = _one(request, strat, cast, cache)
        except ReshardBaseError as e:
            yield Answer(i, math.nan, e)
        else:
            yield Answer(i, seconds)


def estimate_many(requests: Iterable[Any], *, strategy: str | Strategy = Strategy.BROADCAST,
                  cast: object = None, scale: str | ScaleMode | None = None,
                  cache: CostCache | None = None,
                  on_answer: Callable[[Answer], None] | None = None) -> list[float]:
    """The model's seconds for each request, in order: what ``plan(shape, dtype, src,
    dst, cluster, strategy).estimate()`` returns (module docstring).

    Args:
        requests: ``(shape, dtype, src_layout, dst_layout, cluster)`` tuples, each
            optionally with a sixth item, its strategy; a cluster of None is one host
            holding every device (as :func:`reshard.plan`'s default).
        strategy: the strategy of requests that name none.
        cast: deliver this dtype (as :func:`reshard.plan`), for every request.
        scale: a float8 cast's scales (``"none"``, ``"tensor"``, ``"block128"``,
            ``"block128-ue8m0"``, ``"mx32"``).
        cache: answers kept across calls (default: a new one for this batch, which
            still answers a batch's repeated and similar requests once).
        on_answer: called with each request's :class:`Answer` as soon as it is known
            (progress of a long batch: a bar, a log line, partial results).

    Raises:
        EstimateError: some requests were malformed or could not be planned; it
            carries every other request's estimate and each failure's position.
    """
    strat = Strategy.parse(strategy)
    the_cast = Cast.parse(cast, scale)
    cache = CostCache() if cache is None else cache
    out: list[float] = []
    failures: dict[int, ReshardBaseError] = {}
    # estimate_iter's loop, with no Answer made where none is asked for (a cached
    # answer costs microseconds: a compiler's inner loop)
    for i, request in enumerate(requests):
        try:
            seconds = _one(request, strat, the_cast, cache)
        except ReshardBaseError as e:
            failures[i] = e
            seconds = math.nan
        out.append(seconds)
        if on_answer is not None:
            on_answer(Answer(i, seconds, failures.get(i)))
    if failures:
        raise EstimateError(out, failures)
    return out


def estimate(shape: Sequence[int], dtype: object, src: Layout, dst: Layout,
             cluster: Cluster | None = None, strategy: str | Strategy = Strategy.BROADCAST,
             *, cast: object = None, scale: str | ScaleMode | None = None,
             cache: CostCache | None = None) -> float:
    """One request's seconds (:func:`estimate_many` of one); its error as raised."""
    try:
        return estimate_many([(shape, dtype, src, dst, cluster)], strategy=strategy,
                             cast=cast, scale=scale, cache=cache)[0]
    except EstimateError as e:
        raise e.failures[0] from None


__all__ = ["DEFAULT_CACHE_BYTES", "Answer", "CostCache", "EstimateError", "Normal", "estimate",
           "estimate_iter", "estimate_many", "key_bytes", "normal_form", "request_parts"]
