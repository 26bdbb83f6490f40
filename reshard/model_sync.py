"""A model's weights from trainer ranks to engine ranks: planned once, run every step,
in versions a reader never sees torn.

RL frameworks sync the trainer's weights into the inference engine after every
training step. :class:`ModelSync` is that loop on one rank: built once from the model's
parameters (:class:`Param`: a name, its shape and dtype, its layout on the trainer and
on the engine, an optional cast; packed parts are parameters of their own, see
:mod:`reshard.core.packed`), it plans every tensor in one plan (SPMD: every rank plans the
same request and the digests are compared, :meth:`reshard.comm.executor.Executor.
load_request`) and loads it; :meth:`ModelSync.sync` then only moves bytes.

A sync lands while the engine may be generating. Three ways to keep its reads whole
(``mode``; the protocol is :mod:`reshard.version_gate`'s):

* ``"double"`` (default): an engine rank holds two sets of destination buffers; a
  sync writes the set no reader holds, and swaps when every tensor of its version has
  landed on the rank. Readers (:meth:`ModelSync.reading`) never wait; a sync waits for
  the readers still holding the set it is about to overwrite (those that began before
  the last swap). A sync that fails part way (a peer died) leaves readers on the last
  whole version. Costs a second copy of the rank's destination shards.
* ``"lock"``: one set; a sync waits for the readers to leave and readers wait while a
  sync waits or writes (no memory beside the buffers; reads and syncs take turns, and a
  sync is never starved by readers that keep coming). A sync that fails part way leaves
  the set torn: readers are refused (:class:`reshard.core.errors.ExecutionError` naming the
  failed version) until a later sync lands whole, never told the old version.
* ``"none"``: one set, written in place, no coordination (a reader during a sync may
  see two versions: for engines that pause themselves); after a failed sync readers are
  refused as in ``"lock"``.

In every mode the version a reader is told is the version of the buffers it holds (the
end of a write, the swap and the new version are one step), and
:meth:`ModelSync.wait_version` is the "version ready" point an engine may wait on (the
version has landed on the rank and readers see it; a failed sync of it raises at once).

A sync ends with a confirmation: every rank of the executor's world (trainer and
engine) all-gathers the version it landed (8 bytes a rank), so a :meth:`ModelSync.sync`
(or its handle's ``wait``) returns on any rank, a trainer's included, only once every
rank has landed the version, and an engine rank's readers are given it only from then
(so no engine rank reads a version another failed to land). A rank given another
version than its peers raises naming them; a destination that never takes the version
makes the sources' sync raise at the backend's timeout instead of returning. Either way
the version is not published and counts as a failed sync.

On the trainer side ``snapshot=True`` copies this rank's source shards when the sync
begins (a copy of the rank's shards, which must fit its ``memory_budget`` if it has
one), so that with ``blocking=False`` the optimizer may write its weights as soon as
:meth:`ModelSync.sync` returns while the bytes move from the copy.

Versions are integers that only increase: a sync of a version not newer than the last
one given is refused before anything moves. Every rank must sync the same versions in
the same order (each rank checks its own order before anything moves; the confirmation
refuses a disagreement after the bytes moved).

Failures: a sync that fails while communicating leaves its executor refusing every
later run (:class:`reshard.comm.executor.Executor`): build a new executor and a new
``ModelSync`` (over the engine's own ``buffers``) to go on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from reshard.comm.executor import Executor
from reshard.comm.program import Destination
from reshard.comm.spmd import world_of
from reshard.core.cluster import Cluster
from reshard.core.dtypes import Cast, dtype_name, itemsize, storage
from reshard.core.errors import ExecutionError, ReshardError
from reshard.core.layout import Layout
from reshard.version_gate import POLICIES, Failure, VersionGate

MODES = tuple(POLICIES)
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
    has landed on every rank (on an engine rank, it is the one readers see)."""

    def __init__(self, future: Future, version: int) -> None:
        self._future = future
        self.version = version

    def done(self) -> bool:
        """True once it landed everywhere (or failed)."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> int:
        """Its version, once landed on every rank; raises what the transfer or the
        confirmation raised."""
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
            :meth:`destinations` (the engine's own, packed views included), each of its
            shard's shape and dtype (checked here); a callable makes a set (called
            twice in ``"double"`` mode); None: allocated (numpy, or torch with an
            executor whose ``arrays`` is ``"torch"``).
        strategy: the plan's strategy.

    Raises:
        ReshardError: an unknown mode, a parameter named twice, or a buffer this rank
            does not receive or of another shape or dtype than its shard (naming it).
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
        self._gate = VersionGate(mode, f"device {executor.device}")
        self._sets = [self._buffers(buffers, library) for _ in range(self._gate.policy.sets)]
        self._issued: int | None = None  # the last version given to sync
        self._world = world_of(self.loaded.backend, None)  # load_request's world
        with executor.communicating():  # the confirmation's group
            self.loaded.backend.prepare(_Group(self._world))
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
            else:
                self._check_dtype(key, got[key], d)
        return got

    def _check_dtype(self, key: str, buf: Any, d: Destination) -> None:
        """Refuse a buffer whose dtype the run would refuse (the executor's rule: the
        shard's dtype, or its bits as unsigned integers where the backend holds them so)."""
        try:
            held = dtype_name(buf.dtype)
        except (ReshardError, TypeError, ValueError, AttributeError):
            held = str(getattr(buf, "dtype", type(buf).__name__))
        bits = d.dtype in self.executor.capabilities.bits
        if held == d.dtype or (bits and held == storage(d.dtype)):
            return
        also = f" (or {storage(d.dtype)}, its bits)" if bits else ""
        raise ReshardError(f"buffer {key!r} has dtype {held}; this rank's shard of {key!r} "
                           f"is {d.dtype}, shape {d.shape}: pass a {d.dtype}{also} buffer")

    def destinations(self) -> dict[str, Destination]:
        """What this rank receives, by key (a parameter's name; its scales as
        ``name + ".scales"``)."""
        return dict(self._dests)

    @property
    def version(self) -> int:
        """The newest version that landed whole on this rank (-1 before the first): the
        one readers see, unless :attr:`failure` says a later sync tore their buffers."""
        return self._gate.landed

    @property
    def failure(self) -> Failure | None:
        """The last sync that failed on this rank, until a later one lands (None: none
        since). In ``"lock"`` and ``"none"`` mode readers are refused meanwhile."""
        return self._gate.failure

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
                one that did), or the sync of it (or of a newer one) failed here (at
                once, naming why).
        """
        return self._gate.wait_landed(version, timeout)

    @contextmanager
    def reading(self) -> Iterator[tuple[int, Mapping[str, Any]]]:
        """``(version, {key: shard})``: one whole version of this rank's weights, held
        until the block ends (``"lock"`` mode: waits while a sync writes); ``version`` is
        the version those buffers hold (-1: nothing synced yet)::

            with sync.reading() as (version, weights):
                ...  # generate with weights["layers.0.q_proj"], ...

        Raises:
            ExecutionError: ``"lock"`` / ``"none"`` mode, after a sync failed part way:
                the buffers hold no whole version (naming the failed one) until a later
                sync lands.
        """
        i, version = self._gate.enter()
        try:
            yield version, self._sets[i]
        finally:
            self._gate.leave(i)

    # ----- a step ---------------------------------------------------------------------
    def sync(self, sources: Mapping[str, Any] | None, version: int, *,
             blocking: bool = True) -> SyncHandle:
        """Move ``version`` of the weights: ``sources`` is this rank's shard of each
        parameter it holds on the trainer (``{name: array}``; None or missing where it
        holds none). With ``blocking``, returns once it landed on every rank of the
        world (the confirmation, module docstring), a trainer rank's too; else at once
        (after the snapshot, with ``snapshot``), the transfer running on this object's
        thread, one sync after another, and the handle's ``wait`` says when.

        Raises:
            ReshardError: ``version`` is not newer than the last one given (before
                anything moves), or a source of a name that is not a parameter.
            ExecutionError: (blocking) the transfer failed, or a rank did not confirm
                the version within the backend's timeout or confirmed another one.
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
        """Run the plan into the set the gate gives and confirm the version with every
        rank; then publish the set, or (either failed) leave it torn."""
        target = self._gate.begin()
        try:
            self.executor.run(self.loaded, shards, out=self._outs[target]).wait()
            self._confirm(version)
        except BaseException as e:
            self._gate.fail(target, version, f"{type(e).__name__}: {e}")
            raise
        self._gate.publish(target, version)

    def _confirm(self, version: int) -> None:
        """Every rank of the world landed ``version``: one all-gather of it (8 bytes a
        rank) after this rank's part; raises if a rank does not take part within the
        backend's timeout, or took part with another version."""
        b, group = self.loaded.backend, self._world
        try:
            with self.executor.communicating():
                mine = b.asarray(np.array([version], np.int64).view(np.uint8))
                out = b.empty(8 * len(group), np.uint8).reshape(len(group), 8)
                b.all_gather(out, mine, group)
                b.synchronize()
                got = np.ascontiguousarray(b.to_host(out)).view(np.int64).ravel()
        except ReshardError:
            raise
        except Exception as e:
            raise ExecutionError(
                f"device {self.executor.device}: version {version} is done on this rank "
                f"but not every rank of {list(group)} confirmed it (one failed, died or "
                f"never took it), so this rank does not publish it: {e}") from e
        other = {d: int(v) for d, v in zip(group, got) if int(v) != version}
        if other:
            raise ExecutionError(
                f"device {self.executor.device}: ranks synced another version than "
                f"{version}: {other}; every rank must sync the same versions in one order")

    def close(self) -> None:
        """Wait for the syncs in flight and stop this object's thread (the executor
        stays the caller's)."""
        self._pool.shutdown(wait=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Group:
    """The confirmation's one communicator group, as ``Backend.prepare`` takes it."""

    def __init__(self, group: tuple[int, ...]) -> None:
        self._group = group

    def communicator_groups(self) -> tuple[tuple[int, ...], ...]:
        return (self._group,)


def _copy(array: Any) -> Any:
    """A private copy of a source shard (numpy or torch)."""
    if hasattr(array, "clone"):
        return array.clone()
    return np.array(array, copy=True)


__all__ = ["MODES", "Failure", "ModelSync", "Param", "SyncHandle"]
