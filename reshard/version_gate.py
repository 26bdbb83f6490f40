"""The version protocol of one engine rank's weight buffers: which set a reader gets
and under which version, when a sync may write, and what a failed write leaves.

:class:`reshard.model_sync.ModelSync` holds one or two *sets* of destination buffers
(one per mode's :class:`Policy`) and one writer (its sync thread); any number of reader
threads. Each set is in one of three states, kept under one lock:

* *whole at version v* (``v = -1``: nothing synced yet): readers may take it and are
  told ``v``;
* *being written* by the one sync in flight;
* *torn*: a write into it failed part way (a peer died, a timeout), so it may hold
  bytes of two versions (or one version that not every rank landed). It stays torn
  until a later sync lands whole in it.

Every change a reader can observe is made in one critical section: a sync's landing
marks its set whole, makes it the set readers get (``live``), records the version and
ends the write together, so a reader's label is always the version of the set it
holds (two critical sections let a reader slip between "the write ended" and "the new
version is recorded" and be told v-1 while holding v).

Per mode (:data:`POLICIES`):

* ``"double"``: a sync writes the set no reader is given and waits for the readers
  still holding it; a failed write leaves that set torn and the live set as it was, so
  readers keep reading the last whole version and never wait.
* ``"lock"``: one set, written in place; a sync waits for the readers to leave and new
  readers wait while it waits or writes. A failed write leaves the set torn: readers
  are refused (:class:`reshard.core.errors.ExecutionError` naming the failed version) until
  a later sync lands, never handed a torn set under the old version's label.
* ``"none"``: one set written in place with no coordination: a reader during a write
  may see two versions (told the last one that landed); after a failed write readers
  are refused as in ``"lock"``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from reshard.core.errors import ExecutionError, ReshardError


@dataclass(frozen=True)
class Policy:
    """How one mode keeps reads whole.

    Attributes:
        in_place: a sync writes the set readers are given (one set); else the other of
            two, swapped in when it lands.
        readers_wait: new readers wait while a sync waits or writes.
        writer_waits: a sync waits for the readers of the set it writes to leave.
    """

    in_place: bool
    readers_wait: bool
    writer_waits: bool

    @property
    def sets(self) -> int:
        """Buffer sets an engine rank holds."""
        return 1 if self.in_place else 2


POLICIES: dict[str, Policy] = {
    "double": Policy(in_place=False, readers_wait=False, writer_waits=True),
    "lock": Policy(in_place=True, readers_wait=True, writer_waits=True),
    "none": Policy(in_place=True, readers_wait=False, writer_waits=False),
}
"""Each mode's policy (module docstring), in the order the docs list them."""


@dataclass(frozen=True)
class Failure:
    """A sync that failed on this rank and that no later landed sync superseded.

    Attributes:
        version: the version it was writing.
        reason: what it raised (type and message).
    """

    version: int
    reason: str


class VersionGate:
    """The state of one rank's buffer sets (module docstring); one writer at a time.

    Args:
        mode: a key of :data:`POLICIES`.
        where: the rank, as messages name it (``"device 2"``).
    """

    def __init__(self, mode: str, where: str) -> None:
        policy = POLICIES.get(mode)
        if policy is None:
            raise ReshardError(f"mode={mode!r}; valid: {list(POLICIES)}")
        self.mode = mode
        self.policy = policy
        self.where = where
        self._cond = threading.Condition()
        self._held: list[int | None] = [-1] * policy.sets  # None: being written or torn
        self._readers = [0] * policy.sets
        self._live = 0  # the set readers are given
        self._writing = False
        self._landed = -1  # the newest version that landed whole
        self._failure: Failure | None = None

    @property
    def landed(self) -> int:
        """The newest version that landed whole here (-1: none yet)."""
        with self._cond:
            return self._landed

    @property
    def failure(self) -> Failure | None:
        """The last failed sync, until a later one lands (None: none failed since)."""
        with self._cond:
            return self._failure

    # ----- readers ----------------------------------------------------------------------
    def enter(self) -> tuple[int, int]:
        """A reader takes the live set: ``(set index, the version it holds)``; give the
        index back with :meth:`leave`.

        Raises:
            ExecutionError: the set readers would get is torn (a failed in-place write).
        """
        with self._cond:
            if self.policy.readers_wait:
                self._cond.wait_for(lambda: not self._writing)
            i = self._live
            held = self._held[i]
            if held is None and not self._writing:
                raise self._torn()
            self._readers[i] += 1
            # being written ("none" only): the version that landed last, maybe mixed
            return i, self._landed if held is None else held

    def leave(self, index: int) -> None:
        """A reader of set ``index`` is done with it."""
        with self._cond:
            self._readers[index] -= 1
            self._cond.notify_all()

    def _torn(self) -> ExecutionError:
        f = self._failure
        why = (f"the sync of version {f.version} failed while writing them in place "
               f"({f.reason})") if f is not None else "a write into them did not finish"
        return ExecutionError(
            f"{self.where}: the weights hold no whole version in mode {self.mode!r}: {why}; "
            f"the last whole version was {self._landed}. Readers are refused until a later "
            f"sync lands (wait_version); mode 'double' keeps the last whole version readable")

    # ----- the writer -------------------------------------------------------------------
    def begin(self) -> int:
        """The writer starts a sync: waits as its mode says, marks the set it writes as
        being written, and returns that set's index."""
        with self._cond:
            if self._writing:
                raise ReshardError(f"{self.where}: a sync began while another was writing; "
                                   f"the version gate takes one writer at a time")
            self._writing = True  # new readers wait from now ("lock"): no writer starves
            target = self._live if self.policy.in_place else 1 - self._live
            if self.policy.writer_waits:
                self._cond.wait_for(lambda: self._readers[target] == 0)
            self._held[target] = None
            return target

    def publish(self, index: int, version: int) -> None:
        """The write into set ``index`` landed whole: it becomes the live set at
        ``version``, in one step with the end of the write."""
        with self._cond:
            self._held[index] = version
            self._live = index
            self._landed = version
            self._failure = None
            self._writing = False
            self._cond.notify_all()

    def fail(self, index: int, version: int, reason: str) -> None:
        """The write of ``version`` into set ``index`` failed: that set stays torn (the
        live one too when written in place)."""
        with self._cond:
            self._held[index] = None
            self._failure = Failure(version, reason[:400])
            self._writing = False
            self._cond.notify_all()

    def wait_landed(self, version: int, timeout: float | None = None) -> int:
        """Block until ``version`` or a newer one has landed; returns the newest.

        Raises:
            ExecutionError: the sync of ``version`` or of a newer one failed here (at
                once), or none landed within ``timeout`` seconds.
        """
        def settled() -> bool:
            f = self._failure
            return self._landed >= version or (f is not None and f.version >= version)

        with self._cond:
            self._cond.wait_for(settled, timeout)
            if self._landed >= version:
                return self._landed
            f = self._failure
            if f is not None and f.version >= version:
                raise ExecutionError(
                    f"{self.where}: version {version} will not land: the sync of version "
                    f"{f.version} failed here ({f.reason}); the last whole version: "
                    f"{self._landed}")
            raise ExecutionError(
                f"{self.where}: version {version} did not land within {timeout:g}s; the "
                f"last one that did: {self._landed}")


__all__ = ["POLICIES", "Failure", "Policy", "VersionGate"]
