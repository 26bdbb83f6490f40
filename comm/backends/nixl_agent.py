"""One rank's NIXL agent, shared by its channels (:mod:`reshard.comm.backends.nixl`):
the agent (UCX plug-in, no progress thread of NIXL's own: the backend's group loop
progresses it), its registered memory, the peers whose metadata it loaded (each checked
to name an agent of the device it was published for), and the notifications it
received, by channel."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import struct
import threading
import uuid
from typing import Any

from reshard.comm.backends.nixl_memory import Registrations, Run
from reshard.errors import ExecutionError

HEAD = struct.Struct("<cHqQ")
"""A notification's header: kind, the channel name's bytes (which follow), tag, number."""


def agent_prefix(device: int) -> str:
    """How the NIXL agent name of ``device``'s rank begins (``reshard-<device>-``, then
    a random part: agents of two runs in one process never share a name)."""
    return f"reshard-{device}-"


class Agent:
    """What every channel of one rank shares: the NIXL agent, its registrations, the
    peers loaded, and notifications by channel (a channel polls for all of them and
    keeps the others' for them)."""

    def __init__(self, device: int, world: tuple[int, ...], rendezvous: Any,
                 timeout: float) -> None:
        from nixl._api import nixl_agent, nixl_agent_config

        if not os.environ.get("NIXL_LOG_LEVEL"):  # a line per agent made is NIXL's INFO
            logging.getLogger("nixl").setLevel(logging.WARNING)
        self.name = agent_prefix(device) + uuid.uuid4().hex[:12]
        self.world = world
        self.rendezvous = rendezvous
        self.timeout = timeout
        self.agent = nixl_agent(self.name, nixl_agent_config(enable_prog_thread=False,
                                                             backends=["UCX"]))
        self.memory = Registrations(self.agent)
        self.lock = threading.RLock()  # channels on threads of their own share the agent
        self.loaded: set[int] = set()
        self.seen: set[tuple[int, Run, int]] = set()  # (peer, run, generation) told
        self.inbox: dict[str, collections.deque[tuple[int, bytes]]] = \
            collections.defaultdict(collections.deque)
        self.names: dict[str, int] = {}  # agent name -> device, of the peers loaded
        self.agents: dict[int, str] = {}  # device -> agent name
        rendezvous.set(f"nixl/{device}", bytes(self.agent.get_agent_metadata()))

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
                (n,) = struct.unpack_from("<H", m, 1)
                channel = m[HEAD.size:HEAD.size + n].decode()
                self.inbox[channel].append((peer, m))

    def close(self) -> None:
        self.memory.release()
        for peer in sorted(self.loaded):
            with contextlib.suppress(Exception):  # closing: the peer may be gone
                self.agent.remove_remote_agent(self.agents[peer])
        self.loaded.clear()


__all__ = ["HEAD", "Agent", "agent_prefix"]
