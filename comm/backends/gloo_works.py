"""The ``gloo`` backend's posted operations: what one open group (a plan step on a
worker) has started, waited by :meth:`~reshard.comm.backends.gloo.GlooBackend.group_end`.

:class:`Posted` holds an operation's started Works (waited in order) and what must follow
them on this rank; :class:`Relay` is a broadcast member passing pieces on as they
arrive (a chain's middle, a tree's inner node, a summing root or addend), its receives
watched by one thread per stream, since a gloo receive's completion can only be learnt
by waiting for it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from reshard.core.errors import ExecutionError


class Host(Protocol):
    """What the operations use of the backend that posted them."""

    @property
    def device(self) -> int: ...

    @property
    def rank_of(self) -> Mapping[int, int]: ...

    @property
    def _dist(self) -> Any: ...

    @property
    def _p2p(self) -> Any: ...

    def piece_for(self, nbytes: int) -> int: ...

    def _call(self, what: str, peers: Sequence[int], fn: Any, *args: Any,
              **kwargs: Any) -> Any: ...


def gist(exc: BaseException) -> str:
    """The informative part of a gloo error: no source path, no advice, one line."""
    text = " ".join(str(exc).split())
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text)
    return text.split(". ")[0].rstrip(".")


def pieces_of(data: Any, piece: int) -> list[Any]:
    """A byte tensor as consecutive views of ``piece`` bytes."""
    return [data[a:a + piece] for a in range(0, data.numel(), piece)]


def filled(j: int, total: int, piece: int) -> int:
    """Bytes of a ``total``-byte buffer that its first ``j + 1`` pieces fill."""
    return min(total, (j + 1) * piece)


GATHER_TAG = 0x3FFF0000
"""The tag of all-gather pieces (tasks' tags are their indices in the plan, far below)."""


class Posted:
    """An operation of an open group: its started Works, waited in order by
    :meth:`finish`, and what must follow them on this rank (``after``)."""

    def __init__(self, backend: Host, what: str, peers: Sequence[int],
                 works: list[Any], after: Callable[[], None] | None = None,
                 landed: Callable[[int], None] | None = None, total: int = 0) -> None:
        self.backend, self.what, self.peers = backend, what, tuple(peers)
        self.works, self.after = works, after
        self.landed, self.total = landed, total
        # the pieces' size, for reporting what landed
        self.piece = backend.piece_for(total) if landed is not None else 0

    def finish(self) -> None:
        """Wait for every Work (raising the first error), then run ``after``. With
        ``landed`` (a leaf's receives of consecutive pieces), report each one's end."""
        for j, work in enumerate(self.works):
            self.backend._call(self.what, self.peers, work.wait)
            if self.landed is not None:
                self.landed(filled(j, self.total, self.piece))
        self.works = []
        if self.after is not None:
            self.after()


class Relay(Posted):
    """A broadcast member that passes pieces on (a chain's middle, a tree's inner
    node, a sum's root or inner addend): the receives of every piece from each peer
    of ``streams`` ((peer, receives) pairs; several for a member summing what several
    addends pass it) are posted at once; piece ``j`` goes on to each of ``nxts`` (same
    tag, so the pieces of one broadcast stay in order) once it arrived from every
    peer. ``works`` collects the forwarding sends. ``add`` (a member summing a partial
    sum on the way): called with ``j`` once piece ``j`` arrived (into buffers of their
    own), to add it into ``pieces[j]`` before that goes on. ``landed`` (kept as
    ``relayed``): told the bytes passed on so far."""

    def __init__(self, backend: Host, what: str, pieces: list[Any],
                 streams: Sequence[tuple[int, list[Any]]], nxts: Sequence[int], tag: int,
                 add: Callable[[int], None] | None = None,
                 landed: Callable[[int], None] | None = None, total: int = 0) -> None:
        super().__init__(backend, what, tuple(nxts), [], total=total)
        self.relayed = landed
        if landed is not None:  # the pieces' size, for reporting what was passed on
            self.piece = backend.piece_for(total)
        self.pieces, self.streams, self.add = pieces, tuple(streams), add
        self.prevs = tuple(peer for peer, _ in self.streams)
        self.nxts, self.tag = tuple(nxts), tag
        self.passed = 0  # pieces passed on to every next member
        # receives known to be complete, per stream (each written by its watcher only)
        self.arrived = [0] * len(self.streams)
        self.error: BaseException | None = None  # a watcher's
        self._watchers: list[threading.Thread] = []

    @property
    def pending(self) -> bool:
        """Pieces not passed on yet."""
        return self.passed < len(self.pieces)

    def behind(self) -> list[int]:
        """The peers whose next piece has not arrived yet."""
        return [peer for (peer, _), n in zip(self.streams, self.arrived) if n <= self.passed]

    def watch(self, wake: threading.Event) -> None:
        """Start a daemon thread per stream that waits for its receives in order,
        counts them in ``arrived`` (the only way to learn that a gloo receive
        completed) and sets ``wake`` after each (and on an error)."""
        for k, (peer, recvs) in enumerate(self.streams):
            w = threading.Thread(
                target=self._wait_recvs, args=(k, recvs, wake), daemon=True,
                name=f"reshard-gloo-relay-{self.backend.device}-{self.tag}-{peer}")
            w.start()
            self._watchers.append(w)

    def _wait_recvs(self, k: int, recvs: list[Any], wake: threading.Event) -> None:
        try:
            for work in recvs:
                work.wait()
                self.arrived[k] += 1
                wake.set()
        except BaseException as e:  # noqa: BLE001 - raised by poll
            self.error = e
            wake.set()

    def poll(self) -> bool:
        """Pass on every piece the watchers saw arrive from every peer; True if there
        was one."""
        if self.error is not None:
            raise ExecutionError(
                f"gloo {self.what} with device(s) {list(self.prevs)} failed: "
                f"{gist(self.error)}") from self.error
        start, ready = self.passed, min(self.arrived)
        for j in range(start, ready):
            self._pass_on(j)
        return ready > start

    def _pass_on(self, j: int) -> None:
        b = self.backend
        if self.add is not None:
            self.add(j)
        for nxt in self.nxts:
            self.works.append(b._call(self.what, (nxt,), b._dist.isend, self.pieces[j],
                                      dst=b.rank_of[nxt], group=b._p2p, tag=self.tag))
        self.passed = j + 1
        if self.relayed is not None:
            self.relayed(filled(j, self.total, self.piece))

    def finish(self) -> None:
        """Pass on what is left (unwatched: blocking on each piece in turn, from each
        peer), then wait for the forwarding sends."""
        if not self._watchers:
            for j in range(self.passed, len(self.pieces)):
                for peer, recvs in self.streams:
                    self.backend._call(self.what, (peer,), recvs[j].wait)
                self._pass_on(j)
        else:  # group_end polled until every piece arrived and was passed on
            for w in self._watchers:
                w.join()
            self.poll()
        super().finish()
