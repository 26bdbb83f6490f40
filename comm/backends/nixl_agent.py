"""One rank's NIXL agent, shared by its channels (:mod:`reshard.comm.backends.nixl`):
the agent (UCX plug-in, no progress thread of NIXL's own: the backend's group loop
progresses it), its registered memory, the peers whose metadata it loaded (each checked
to name an agent of the device it was published for), and the notifications it
received, by channel.

With the run's :class:`~reshard.comm.bootstrap.link_key.LinkKey` (reshard's launchers hand every
worker one), the metadata a rank publishes is signed (``HMAC(key, device | metadata)``
before it) and every notification carries a tag (``HMAC(key, sender | receiver |
notification)``, 16 bytes, after it): metadata a writer of the rendezvous forged, and
notifications from an agent that took a worker's name (the name is in the published
metadata: any reader of the rendezvous can take it), are refused naming the device.
Without a key, only the agents' names are checked."""

from __future__ import annotations

import collections
import contextlib
import hmac
import logging
import os
import struct
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from reshard.comm.backends.nixl_memory import Reg, Registrations, Run
from reshard.comm.bootstrap.link_key import LinkKey, mac
from reshard.core.errors import ExecutionError

HEAD = struct.Struct("<cHqQ")
"""A notification's header: kind, the channel name's bytes (which follow), tag, number."""
READY = b"R"
LANDED = b"L"
RANGE = struct.Struct("<QQ")
_READY_HEAD = struct.Struct("<I?II")
_REG = struct.Struct("<QQQ?")
SIGNATURE = 32
"""Bytes of the signature before a keyed rank's published metadata."""
NOTE_TAG = 16
"""Bytes of the tag after a keyed rank's notifications."""


@dataclass(frozen=True)
class Ready:
    """A receiver's *ready* notification's body: its places (``(address, bytes)``
    runs in stream order), whether it acts on each piece as it lands (if not, the
    sender writes what it holds in as few WRITEs as it can), the registrations the
    places lie in (each with whether this message carries its metadata) and that
    partial metadata, and the registrations told of before that are gone since
    (``dropped``: the sender forgets them).

    Metadata is loaded when the notification arrives, in arrival order, whichever
    channel it is for; a sender writes only once every registration its target
    names is loaded (a ready may overtake the one that carried a registration's
    metadata: UCX orders no large message before a small one, and channels take
    their notifications in their own time)."""

    places: list[Run]
    pieces: bool
    regs: list[tuple[Reg, bool]]
    meta: bytes
    dropped: list[Reg] = field(default_factory=list)

    def pack(self) -> bytes:
        return (_READY_HEAD.pack(len(self.places), self.pieces, len(self.regs),
                                 len(self.dropped))
                + b"".join(RANGE.pack(a, n) for a, n in self.places)
                + b"".join(_REG.pack(a, n, g, told) for ((a, n), g), told in self.regs)
                + b"".join(_REG.pack(a, n, g, False) for (a, n), g in self.dropped)
                + self.meta)

    @classmethod
    def unpack(cls, body: memoryview) -> Ready:
        count, pieces, nregs, ndropped = _READY_HEAD.unpack_from(body)
        at = _READY_HEAD.size
        places = [RANGE.unpack_from(body, at + RANGE.size * i) for i in range(count)]
        at += RANGE.size * count
        regs = _regs(body, at, nregs)
        at += _REG.size * nregs
        dropped = [reg for reg, _ in _regs(body, at, ndropped)]
        return cls(places, pieces, regs, bytes(body[at + _REG.size * ndropped:]), dropped)


def _regs(body: memoryview, at: int, count: int) -> list[tuple[Reg, bool]]:
    """``count`` registration records from ``body[at:]``: each with its told flag."""
    out = []
    for i in range(count):
        a, n, g, told = _REG.unpack_from(body, at + _REG.size * i)
        out.append((((a, n), g), told))
    return out


def agent_prefix(device: int) -> str:
    """How the NIXL agent name of ``device``'s rank begins (``reshard-<device>-``, then
    a random part: agents of two runs in one process never share a name)."""
    return f"reshard-{device}-"


class Agent:
    """What every channel of one rank shares: the NIXL agent, its registrations, the
    peers loaded, and notifications by channel (a channel polls for all of them and
    keeps the others' for them)."""

    def __init__(self, device: int, world: tuple[int, ...], rendezvous: Any,
                 timeout: float, key: LinkKey | None = None) -> None:
        from nixl._api import nixl_agent, nixl_agent_config

        if not os.environ.get("NIXL_LOG_LEVEL"):  # a line per agent made is NIXL's INFO
            logging.getLogger("nixl").setLevel(logging.WARNING)
        self.name = agent_prefix(device) + uuid.uuid4().hex[:12]
        self.device = device
        self.world = world
        self.key = key
        self.rendezvous = rendezvous
        self.timeout = timeout
        self.agent = nixl_agent(self.name, nixl_agent_config(enable_prog_thread=False,
                                                             backends=["UCX"]))
        self.memory = Registrations(self.agent, device=device)
        self.lock = threading.RLock()  # channels on threads of their own share the agent
        self.loaded: set[int] = set()
        self.seen: dict[int, set[Reg]] = collections.defaultdict(set)  # told, by peer
        self.known: dict[int, set[Reg]] = collections.defaultdict(set)  # peers' loaded
        # told of to a peer and deregistered since, not yet reported to it
        self.gone: dict[int, list[Reg]] = collections.defaultdict(list)
        # by channel: (peer, the notification, its ready parsed where it is one)
        self.inbox: dict[str, collections.deque[tuple[int, bytes, Ready | None]]] = \
            collections.defaultdict(collections.deque)
        self.names: dict[str, int] = {}  # agent name -> device, of the peers loaded
        self.agents: dict[int, str] = {}  # device -> agent name
        meta = bytes(self.agent.get_agent_metadata())
        if key is not None:
            meta = mac(key.secret, b"nixl-agent", (device,), meta) + meta
        rendezvous.set(f"nixl/{device}", meta)

    def load(self, me: int, peer: int) -> None:
        """Load ``peer``'s agent metadata (once), checking that it names that agent."""
        if peer in self.loaded:
            return
        if peer not in self.world or peer == me:
            raise ExecutionError(f"device {me}: no nixl peer {peer} (the world is "
                                 f"{list(self.world)})")
        try:
            meta = self.rendezvous.get(f"nixl/{peer}", self.timeout)
        except Exception as e:  # noqa: BLE001 - rendezvous errors vary by store
            raise ExecutionError(f"device {me}: nixl: no agent metadata from device {peer} "
                                 f"within {self.timeout:g}s ({e})") from None
        meta = self._signed(me, peer, bytes(meta))
        got = self.agent.add_remote_agent(meta)
        got = got.decode() if isinstance(got, bytes) else str(got)
        if not got.startswith(agent_prefix(peer)) or got in self.names:
            self.agent.remove_remote_agent(got)
            raise ExecutionError(f"device {me}: nixl metadata published for device {peer} "
                                 f"names agent {got!r}, not one of device {peer} "
                                 f"({agent_prefix(peer)}...): refused")
        self.loaded.add(peer)
        self.names[got] = peer
        self.agents[peer] = got

    def _signed(self, me: int, peer: int, meta: bytes) -> bytes:
        """``peer``'s published metadata without its signature, checked (a rank with
        the run's key); refused, naming the device, if forged."""
        if self.key is None:
            return meta
        sig, body = meta[:SIGNATURE], meta[SIGNATURE:]
        if not hmac.compare_digest(sig, mac(self.key.secret, b"nixl-agent", (peer,), body)):
            raise ExecutionError(
                f"device {me}: nixl metadata published for device {peer} is not signed with "
                f"the run's key: forged by a writer of the rendezvous (or device {peer} was "
                f"started without the key: give every rank the same link_key=): refused")
        return body

    def seal(self, peer: int, msg: bytes) -> bytes:
        """``msg`` for ``peer``, with its tag where this rank has the run's key."""
        if self.key is None:
            return msg
        return msg + mac(self.key.secret, b"nixl-note", (self.device, peer), msg)[:NOTE_TAG]

    def _opened(self, me: int, peer: int, sender: str, msg: bytes) -> bytes:
        """A notification from ``peer`` without its tag, checked."""
        if self.key is None:
            return msg
        body, tag = msg[:-NOTE_TAG], msg[-NOTE_TAG:]
        if len(msg) <= NOTE_TAG or not hmac.compare_digest(
                tag, mac(self.key.secret, b"nixl-note", (peer, me), body)[:NOTE_TAG]):
            raise ExecutionError(
                f"device {me}: nixl notification from agent {sender!r} (device {peer}'s name) "
                f"does not carry the run's key: another agent took device {peer}'s name: "
                f"refused")
        return body

    def poll(self, me: int) -> None:
        """Move new notifications into their channels' inboxes."""
        for sender, msgs in self.agent.get_new_notifs().items():
            peer = self.names.get(sender)
            if peer is None:  # a peer that wrote first: load it, if it is one
                claimed = sender.split("-")[1] if sender.count("-") == 2 else ""
                if claimed.isdigit() and int(claimed) in self.world and int(claimed) != me:
                    self.load(me, int(claimed))
                    peer = self.names.get(sender)
            if peer is None:
                raise ExecutionError(f"device {me}: nixl notification from agent {sender!r}, "
                                     f"which is no device's of this run (the world is "
                                     f"{list(self.world)}): refused")
            for m in msgs:
                m = self._opened(me, peer, sender, bytes(m))
                kind, n, _, _ = HEAD.unpack_from(m)
                ready = None
                if kind == READY:
                    ready = Ready.unpack(memoryview(m)[HEAD.size + n:])
                    self._learn(me, peer, ready)
                self.inbox[m[HEAD.size:HEAD.size + n].decode()].append((peer, m, ready))

    def _learn(self, me: int, peer: int, ready: Ready) -> None:
        """Load the registrations' metadata a ready carries (checked to be the peer's)
        and forget those it says are gone."""
        self.known[peer].difference_update(ready.dropped)
        if not ready.meta:
            return
        got = self.agent.add_remote_agent(ready.meta)
        got = got.decode() if isinstance(got, bytes) else str(got)
        if got != self.agents[peer]:
            raise ExecutionError(
                f"device {me}: nixl: device {peer} sent metadata of agent {got!r}, not its "
                f"own {self.agents[peer]!r}: refused")
        self.known[peer].update(reg for reg, told in ready.regs if told)

    def tell(self, peer: int, regs: list[Reg]) -> tuple[list[tuple[Reg, bool]], list[Reg]]:
        """Which of ``regs`` (a receive's registrations) ``peer`` is to be told of now,
        and which registrations told of to it before are gone since."""
        for reg in self.memory.dropped():
            for p, seen in self.seen.items():
                if reg in seen:
                    seen.remove(reg)
                    self.gone[p].append(reg)
        seen = self.seen[peer]
        told = [(reg, reg not in seen) for reg in dict.fromkeys(regs)]
        seen.update(reg for reg, _ in told)
        self.memory.told([reg for reg, new in told if new])
        return told, self.gone.pop(peer, [])

    def loaded_all(self, peer: int, ready: Ready) -> bool:
        """Whether the metadata of every registration ``ready`` names is loaded here."""
        known = self.known[peer]
        return all(reg in known for reg, _ in ready.regs)

    def close(self) -> None:
        self.memory.release()
        for peer in sorted(self.loaded):
            with contextlib.suppress(Exception):  # closing: the peer may be gone
                self.agent.remove_remote_agent(self.agents[peer])
        self.loaded.clear()


__all__ = ["HEAD", "LANDED", "RANGE", "READY", "Agent", "Ready", "Reg", "agent_prefix"]
