"""A model's weights from trainer ranks to engine ranks: planned once, run every step,
in versions a reader never sees torn.

RL frameworks sync the trainer's weights into the inference engine after every
training step. :class:`ModelSync` is that loop on one rank: built once from the model's
parameters (:class:`Param`: a name, its shape and dtype, its layout on the trainer and
on the engine, an optional cast; packed parts are parameters of their own, see
:mod:`reshard.packed`), it plans every tensor in one plan (SPMD: every rank plans the
same request and the digests are compared, :meth:`reshard.comm.executor.Executor.
load_request`) and loads it; :meth:`ModelSync.sync` then only moves bytes.

A sync lands while the engine may be generating. Three ways to keep its reads whole
(``mode``):

* ``"double"`` (default): an engine rank holds two sets of destination buffers; a
  sync writes the set no reader holds, and swaps when every tensor of its version has
  landed on the rank. Readers (:meth:`ModelSync.reading`) never wait; a sync waits for
  the readers still holding the set it is about to overwrite (those that began before
  the last swap). Costs a second copy of the rank's destination shards.
* ``"lock"``: one set; a sync waits for the readers to leave and readers wait while a
  sync waits or writes (no memory beside the buffers; reads and syncs take turns, and a
  sync is never starved by readers that keep coming).
* ``"none"``: one set, written in place, no coordination (a reader may see two
  versions: for engines that pause themselves).

In every mode :meth:`ModelSync.wait_version` is the "version ready" point an engine
may wait on (the version has landed on the rank and readers see it).

On the trainer side ``snapshot=True`` copies this rank's source shards when the sync
begins (a copy of the rank's shards, which must fit its ``memory_budget`` if it has
one), so that with ``blocking=False`` the optimizer may write its weights as soon as
:meth:`ModelSync.sync` returns while the bytes move from the copy.

Versions are integers that only increase: a sync of a version not newer than the last
one given is refused before anything moves. Every rank must sync the same versions in
the same order (each rank checks its own order; a rank given another version is not
detected across ranks).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from reshard.cluster import Cluster
from reshard.comm.executor import Executor
from reshard.comm.program import Destination
from reshard.dtypes import Cast, itemsize
from reshard.errors import ExecutionError, ReshardError
from reshard.layout import Layout

MODES = ("double", "lock", "none")
"""How a sync keeps an engine rank's reads whole (module docstring)."""


@dataclass(frozen=True)
class Param:
    """One tensor of the model as both sides hold it.

    Attributes:
        name: its name (a state dict's key; a packed part's own name).
        shape: the global shape.
        dtype: the trainer's dtype.
        src: its layout on the trainer's devices.
        dst: its layout on the engine's devices.
        cast: what the engine takes, if not ``dtype`` (fp8 with scales: the scales are
            delivered as ``name + ".scales"``).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    src: Layout
    dst: Layout
    cast: Cast | None = None

    @property
    def request(self) -> tuple:
        """As :func:`reshard.plan_many` takes it."""
        return (tuple(self.shape), self.dtype, self.src, self.dst, self.cast)


def _key(params: Sequence[Param], d: Destination) -> str:
    name = params[d.request].name
    return name if d.kind == "value" else f"{name}.scales"


class SyncHandle:
    """One :meth:`ModelSync.sync` in flight; :meth:`wait` returns its version once it
    has landed on this rank (and, on an engine rank, been made the one readers see)."""

    def __init__(self, future: Future, version: int) -> None:
        self._future = future
        self.version = version

    def done(self) -> bool:
        """True once it landed (or failed)."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> int:
        """Its version, once landed; raises what the transfer raised."""
        self._future.result(timeout)
        return self.version


class ModelSync:
    """This rank's part of a model's weight sync (module docstring).

    Args:
        executor: this rank's executor (its backend's world holds every rank of both
            sides).
        params: the model's tensors, the same on every rank, in one order.
        cluster: the hosts and links (planning and the cost model).
        mode: ``"double"``, ``"lock"`` or ``"none"`` (:data:`MODES`).
        snapshot: copy the sources when a sync begins (trainer side).
        buffers: this rank's destination buffers, ``{key: array}`` with the keys of
            :meth:`destinations` (the engine's own, packed views included); a callable
            makes a set (called twice in ``"double"`` mode); None: allocated (numpy, or
            torch with an executor whose ``arrays`` is ``"torch"``).
        strategy: the plan's strategy.
    """

    def __init__(self, executor: Executor, params: Sequence[Param], cluster: Cluster, *,
                 mode: str = "double", snapshot: bool = False,
                 buffers: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
                 strategy: str = "broadcast") -> None:
        if mode not in MODES:
            raise ReshardError(f"mode={mode!r}; valid: {list(MODES)}")
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ReshardError(f"parameter names {twice} appear more than once")
        self.executor = executor
        self.params = tuple(params)
        self.mode = mode
        self.snapshot = snapshot
        self.loaded, _ = executor.load_request([p.request for p in self.params], cluster,
                                               strategy=strategy)
        self._dests = {_key(self.params, d): d for d in self.loaded.destinations()}
        library = "torch" if executor.arrays == "torch" else "numpy"
        sets = 2 if mode == "double" else 1
        self._sets = [self._buffers(buffers, library) for _ in range(sets)]
        self._live = 0
        self._readers = [0] * sets
        self._writing = False
        self._landed = -1  # the version readers see (-1: none yet)
        self._issued: int | None = None  # the last version given to sync
        self._cond = threading.Condition()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="reshard-sync")
        self._inputs = names
        # each set as Executor.run's out= (tensor index -> buffer), made once
        self._outs = [{self._dests[k].tensor: buf for k, buf in bufs.items()}
                      for bufs in self._sets]

    def _buffers(self, given: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None,
                 library: str) -> dict[str, Any]:
        """One set of destination buffers, checked against :meth:`destinations`."""
        got = dict(given() if callable(given) else given or {})
        extra = sorted(set(got) - set(self._dests))
        if extra:
            raise ReshardError(f"buffers {extra}: this rank receives no such tensor; it "
                               f"receives {sorted(self._dests)}")
        for key, d in self._dests.items():
            if key not in got:
                got[key] = d.empty(library)
            elif tuple(got[key].shape) != d.shape:
                raise ReshardError(f"buffer {key!r} has shape {tuple(got[key].shape)}; this "
                                   f"rank's shard is {d.shape} ({d.dtype})")
        return got

    def destinations(self) -> dict[str, Destination]:
        """What this rank receives, by key (a parameter's name; its scales as
        ``name + ".scales"``)."""
        return dict(self._dests)

    @property
    def version(self) -> int:
        """The version readers on this rank see (-1 before the first sync landed)."""
        with self._cond:
            return self._landed

    @property
    def memory(self) -> int:
        """Bytes of destination buffers this rank holds (both sets in ``"double"``
        mode: the price of never waiting)."""
        one = sum(int(np.prod(d.shape)) * itemsize(d.dtype) for d in self._dests.values())
        return one * len(self._sets)

    # ----- the engine's side ----------------------------------------------------------
    def wait_version(self, version: int, timeout: float | None = None) -> int:
        """The "version ready" point: block until ``version`` (or a newer one) has
        landed on this rank and is the one readers see; returns that version.

        Raises:
            ExecutionError: it did not land within ``timeout`` seconds (naming the last
                one that did).
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self._landed >= version, timeout):
                raise ExecutionError(
                    f"version {version} did not land within {timeout:g}s on this rank; "
                    f"the last one that did: {self._landed}")
            return self._landed

    @contextmanager
    def reading(self) -> Iterator[tuple[int, Mapping[str, Any]]]:
        """``(version, {key: shard})``: one whole version of this rank's weights, held
        until the block ends (``"lock"`` mode: waits while a sync writes)::

            with sync.reading() as (version, weights):
                ...  # generate with weights["layers.0.q_proj"], ...
        """
        with self._cond:
            if self.mode == "lock":
                self._cond.wait_for(lambda: not self._writing)
            i = self._live
            self._readers[i] += 1
            version = self._landed
        try:
            yield version, self._sets[i]
        finally:
            with self._cond:
                self._readers[i] -= 1
                self._cond.notify_all()

    # ----- a step ---------------------------------------------------------------------
    def sync(self, sources: Mapping[str, Any] | None, version: int, *,
             blocking: bool = True) -> SyncHandle:
        """Move ``version`` of the weights: ``sources`` is this rank's shard of each
        parameter it holds on the trainer (``{name: array}``; None or missing where it
        holds none). With ``blocking``, returns once it landed here; else at once (after
        the snapshot, with ``snapshot``), the transfer running on this object's thread,
        one sync after another.

        Raises:
            ReshardError: ``version`` is not newer than the last one given (before
                anything moves), or a source of a name that is not a parameter.
        """
        if self._issued is not None and version <= self._issued:
            raise ReshardError(f"version {version} is not newer than {self._issued}, the "
                               f"last one synced; versions only increase")
        given = dict(sources or {})
        unknown = sorted(set(given) - set(self._inputs))
        if unknown:
            raise ReshardError(f"sources {unknown} are not parameters of this sync")
        shards = [given.get(n) for n in self._inputs]
        if self.snapshot:
            shards = [None if s is None else _copy(s) for s in shards]
        self._issued = version
        future = self._pool.submit(self._land, shards, version)
        handle = SyncHandle(future, version)
        if blocking:
            handle.wait()
        return handle

    def _land(self, shards: list[Any], version: int) -> None:
        """Run the plan into the set no reader can see, then publish it."""
        with self._cond:
            if self.mode == "double":
                target = 1 - self._live
                self._cond.wait_for(lambda: self._readers[target] == 0)
            else:
                target = self._live
                if self.mode == "lock":  # new readers wait from now (no writer starves)
                    self._writing = True
                    self._cond.wait_for(lambda: self._readers[target] == 0)
        try:
            self.executor.run(self.loaded, shards, out=self._outs[target]).wait()
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()
        with self._cond:
            self._live = target
            self._landed = version
            self._cond.notify_all()

    def close(self) -> None:
        """Wait for the syncs in flight and stop this object's thread (the executor
        stays the caller's)."""
        self._pool.shutdown(wait=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copy(array: Any) -> Any:
    """A private copy of a source shard (numpy or torch)."""
    if hasattr(array, "clone"):
        return array.clone()
    return np.array(array, copy=True)


__all__ = ["MODES", "ModelSync", "Param", "SyncHandle"]
