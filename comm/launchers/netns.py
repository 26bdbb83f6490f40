"""Placing worker processes in Linux network namespaces (the emulated multi-host
testbed): which namespace each cluster host's workers live in, and entering one.

The process launcher applies a :class:`NetnsPlacement` to every worker it starts;
:class:`reshard.testbed.Testbed` builds one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from reshard.comm.launchers.host import WorkerSpec
from reshard.core.errors import ExecutionError

NETNS_DIR = "/var/run/netns"  # where ``ip netns add`` names namespaces
_log = logging.getLogger("reshard.netns")
_CLONE_NEWNET = 0x40000000  # <sched.h>
_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000  # <sys/mount.h>
_MS_SLAVE = 1 << 19
_MNT_DETACH = 2

WIRE_ENV = {"UCX_TLS": "tcp"}
"""What every worker in a namespace runs with whatever its interface: UCX (the nixl
backend's) on TCP only, so its bytes cross the shaped links (a calibration of the
testbed's transports runs with it too)."""


@dataclass(frozen=True)
class NetnsHost:
    """Where the workers of one cluster host live.

    Attributes:
        netns: the namespace's name under :data:`NETNS_DIR` (``ip netns`` names).
        address: the host's IPv4 address inside it (what gloo advertises).
        ifname: the interface holding ``address`` (``GLOO_SOCKET_IFNAME``).
    """

    netns: str
    address: str
    ifname: str


@dataclass(frozen=True)
class NetnsPlacement:
    """Cluster hosts mapped to network namespaces.

    Attributes:
        hosts: ``hosts[h]`` is where the workers of cluster host ``h`` run.
        driver_address: an address of the driver's (root) namespace that every
            namespace reaches; the rendezvous listens there.
    """

    hosts: tuple[NetnsHost, ...]
    driver_address: str

    def apply(self, spec: WorkerSpec) -> WorkerSpec:
        """``spec`` with gloo bound to and advertising its host's namespace address,
        and UCX (the nixl backend's) on TCP over that interface alone: the emulated
        hosts are processes of one machine, and UCX's shared-memory transports would
        carry their bytes past the shaped links (what the caller's ``env`` gives is
        kept)."""
        where = self.host(spec.host)
        env = {"GLOO_SOCKET_IFNAME": where.ifname, **WIRE_ENV,
               "UCX_NET_DEVICES": where.ifname, **spec.env}
        return dataclasses.replace(spec, env=env,
                                   options={**spec.options, "advertise": where.address})

    def host(self, host: int) -> NetnsHost:
        """The namespace of cluster host ``host``."""
        if not 0 <= host < len(self.hosts):
            raise ExecutionError(
                f"cluster host {host} has no network namespace: the placement has "
                f"{len(self.hosts)} (hosts 0..{len(self.hosts) - 1}); use a testbed with at "
                f"least as many hosts as the cluster")
        return self.hosts[host]


class PlacementSource(Protocol):
    """Anything that places cluster hosts in network namespaces (the testbed,
    :class:`reshard.testbed.Testbed`, which the library never imports)."""

    def netns_placement(self) -> NetnsPlacement:
        """Its hosts' namespaces."""
        ...


Placement: TypeAlias = NetnsPlacement | PlacementSource
"""What ``Runtime(..., netns=...)`` takes."""


def as_placement(netns: Placement | Any) -> NetnsPlacement:
    """A :class:`NetnsPlacement`, or what an object's ``netns_placement()`` returns
    (a :class:`~reshard.testbed.Testbed`)."""
    if isinstance(netns, NetnsPlacement):
        return netns
    get = getattr(netns, "netns_placement", None)
    if get is None:
        raise ExecutionError(
            f"netns must be a NetnsPlacement or have netns_placement() (a "
            f"reshard.testbed.Testbed), got {type(netns).__name__}")
    placement = get()
    if not isinstance(placement, NetnsPlacement):
        raise ExecutionError(f"{type(netns).__name__}.netns_placement() returned "
                             f"{type(placement).__name__}, not a NetnsPlacement")
    return placement


def enter_netns(name: str, *, sysfs: bool = False) -> None:
    """Move the calling thread into the network namespace ``name`` (``setns``).

    Only the calling thread moves; sockets it opens afterwards belong to that
    namespace. A worker calls it before any other thread exists, so the whole
    process (and every thread it starts later) lives there. Needs CAP_SYS_ADMIN.
    ``sysfs``: also give the process a /sys of that namespace (:func:`_own_sysfs`;
    only for a process that moves for good, never a thread that moves back: the
    mount namespace is the whole process's and stays).

    Raises:
        ExecutionError: the name is not a plain name, the namespace does not exist,
            or ``setns`` fails.
    """
    import ctypes

    if not name or "/" in name or name in (".", ".."):
        raise ExecutionError(f"network namespace name {name!r} is not a plain name")
    path = os.path.join(NETNS_DIR, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise ExecutionError(f"cannot open network namespace {path}: {e.strerror}") from e
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise ExecutionError(f"setns({path}, CLONE_NEWNET) failed: {os.strerror(err)}")
    finally:
        os.close(fd)
    if sysfs:
        _own_sysfs(libc)


def _own_sysfs(libc: Any) -> None:
    """Give the calling process a /sys of its network namespace, as ``ip netns exec``
    does (a mount namespace of its own, /sys mounted afresh): libraries that list
    interfaces from sysfs (UCX, the nixl backend's) then find the namespace's, not the
    root namespace's. Best effort: without it, only such libraries are affected."""
    if libc.unshare(_CLONE_NEWNS) != 0:
        _log.debug("unshare(CLONE_NEWNS) failed: %s", os.strerror(ctypes_errno()))
        return
    # nothing mounted here propagates back to the root mount namespace
    libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None)
    libc.umount2(b"/sys", _MNT_DETACH)
    if libc.mount(b"sysfs", b"/sys", b"sysfs", 0, None) != 0:
        _log.debug("mounting /sys failed: %s", os.strerror(ctypes_errno()))


def ctypes_errno() -> int:
    """The C library's errno of the last call made through ctypes with use_errno."""
    import ctypes

    return ctypes.get_errno()
