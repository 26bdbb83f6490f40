"""Cluster: which host each device sits on, and the link model between them.

The cost model is alpha-beta: a transfer of ``n`` bytes costs a latency plus ``n``
over the bandwidth of the narrowest resource it crosses, where concurrent transfers
share a resource. The resources are the NICs (one direction each way; a host has
``nics_per_host`` of them and each device uses one, as on rail-optimised GPU machines
with one NIC per GPU; ``nic_bandwidth`` is the host's total over all its NICs) and,
per device, its intra-host link (one direction each way) and its local copy engine.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from reshard.core.errors import ClusterError
from reshard.core.presets import (  # LinkFigures, preset_names: their old import path
    GBIT,
    GBYTE,
    PAPER_PRESET,
    PRESETS,
    LinkFigures,  # noqa: F401
    lookup,
    preset_names,  # noqa: F401
)
from reshard.core.unique_ids import group_of_each

MIN_PIECE = 1 << 18
"""The smallest piece :func:`pipeline_piece` cuts a box into below the cluster's own
(gloo's default piece: on a slow network the fill of a relay costs most)."""


def pipeline_piece(relay_piece: int, nbytes: int) -> int:
    """Bytes a relay holds before it passes a transfer of ``nbytes`` on, on a cluster
    whose ``relay_piece`` is given: that piece, but a quarter of the transfer where
    that is smaller (at least :data:`MIN_PIECE`), so a box a few pieces long still
    pipelines; 0 (no such piece: relays pass bytes on as they arrive) for 0. The cost
    model charges it and the backends that take a piece size cut their buffers so."""
    if not relay_piece:
        return 0
    return min(relay_piece, max(MIN_PIECE, nbytes // 4), nbytes)


_FIGURE_RULES: tuple[tuple[tuple[str, ...], bool, str], ...] = (
    (("intra_bandwidth", "nic_bandwidth", "copy_bandwidth"), False, "> 0 bytes/s"),
    (("latency", "intra_latency"), True, ">= 0 seconds"),
    (("shared_bandwidth", "cast_bandwidth"), True, ">= 0 bytes/s (0: none)"),
    (("message_cost", "part_cost"), True, ">= 0 seconds (0: none)"),
)
"""The Cluster's number figures: which, whether 0 is allowed, and what they are."""


@dataclass(frozen=True)
class Cluster:
    """Hosts, their devices, and the link model.

    Attributes:
        hosts: ``hosts[h]`` is the tuple of global device ids on host ``h``.
        intra_bandwidth: bytes/s per device and direction inside a host.
        nic_bandwidth: bytes/s per host and direction to the network, over all its NICs.
        latency: seconds per inter-host transfer.
        intra_latency: seconds per intra-host transfer.
        copy_bandwidth: bytes/s of a device-local copy.
        name: a label (the preset's name for presets).
        nics_per_host: NICs per host, each with ``nic_bandwidth / nics_per_host``; a
            device uses NIC ``i * nics_per_host // g`` of its host (``i``: its position
            among the host's ``g`` devices). 1: one NIC shared by every device.
        relay_piece: bytes a relay of a broadcast chain or tree receives before it
            passes them on (the backend's pipelining piece); each relay hop then adds
            that piece's time to the chain's fill (for each child it feeds). A backend
            that takes a piece size (``Capabilities.sized_pieces``: gloo) pipelines in
            pieces of it. 0: relays pass bytes on as they arrive (the presets, a model
            of NCCL's fine-grained pipelining; gloo then uses its own 256 KiB).
        shared_bandwidth: bytes/s that every transfer between devices shares, whatever
            hosts or links it uses: one machine whose cores move every byte of its
            workers' loopback links (``reshard-bench --cluster local``), or a switch all
            links pass through. Each byte a device receives from another crosses it
            once. 0: no such resource (the presets).
        message_cost: seconds of the shared bandwidth's resource (the machine's cores,
            all of them) that each end of one message takes whatever its size: the
            sender's and the receiver's work to post, match and complete it (a piece of
            a pipelined transfer is a message; an all-gather sends each member's piece
            to each other member). Charged with ``shared_bandwidth`` only, and with it
            the copies those cores make to stage an all-gather's rows (each member
            copies the box once, at ``copy_bandwidth``). 0: none (the presets;
            ``reshard-bench --cluster local`` measures it through the run's backend).
        part_cost: seconds of the shared bandwidth's resource that each end of a
            coalesced message spends on each part it carries beyond its first (a box
            that rides in another task's message: a descriptor of a one-sided WRITE, an
            iovec of a scatter / gather send, where one message of a thousand boxes
            costs a thousand of them however few bytes each holds). Charged with
            ``shared_bandwidth`` only. 0: none (the presets; the small-tensor benchmark
            measures it through each backend's runtime on the testbed,
            ``calibrate.runtime_part_cost``).
        cast_bandwidth: bytes/s of source data one device converts for a cast on the
            wire (reads a box in its dtype, derives its scales, writes the wire's
            dtype), while the other devices of the plan convert theirs. A device
            converts what it sends in a step before that step's transfers start (the
            executor prepares a step's payloads, then issues them), so a task waits for
            the conversions of each of its devices in its step. 0: free (the presets: a
            GPU converts at its memory's speed, far above its links; the testbed
            measures it on the devices that convert, ``calibrate.runtime_cast_bandwidth``).
    """

    hosts: tuple[tuple[int, ...], ...]
    intra_bandwidth: float = PRESETS[PAPER_PRESET].intra_bandwidth
    nic_bandwidth: float = PRESETS[PAPER_PRESET].nic_bandwidth
    latency: float = PRESETS[PAPER_PRESET].latency
    intra_latency: float = PRESETS[PAPER_PRESET].intra_latency
    copy_bandwidth: float = PRESETS[PAPER_PRESET].copy_bandwidth
    name: str = "custom"
    nics_per_host: int = 1
    relay_piece: int = 0
    shared_bandwidth: float = 0.0
    message_cost: float = 0.0
    part_cost: float = 0.0
    cast_bandwidth: float = 0.0

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled by its fields (the device index built from them is not picklable;
        the constructor builds it again)."""
        return (Cluster, (self.hosts, self.intra_bandwidth, self.nic_bandwidth, self.latency,
                          self.intra_latency, self.copy_bandwidth, self.name,
                          self.nics_per_host, self.relay_piece, self.shared_bandwidth,
                          self.message_cost, self.part_cost, self.cast_bandwidth))

    def __post_init__(self) -> None:
        hosts = tuple(tuple(int(d) for d in h) for h in self.hosts)
        object.__setattr__(self, "hosts", hosts)
        seen = group_of_each(
            hosts, lambda d, h: ClusterError(f"device ids must be >= 0, got {d} on host {h}"),
            lambda d, first, h: ClusterError(f"device {d} is listed on host {first} and host "
                                             f"{h}; a device belongs to exactly one host"))
        for attrs, zero, what in _FIGURE_RULES:
            for attr in attrs:
                v = float(getattr(self, attr))
                if not ((v >= 0) if zero else (v > 0)) or not v < math.inf:
                    raise ClusterError(f"{attr} must be a finite number {what}, got {v}")
                object.__setattr__(self, attr, v)
        piece = self.relay_piece
        if isinstance(piece, bool) or not isinstance(piece, int) or piece < 0:
            raise ClusterError(f"relay_piece must be an integer >= 0 bytes, got {piece!r}")
        object.__setattr__(self, "_host_of", MappingProxyType(seen))
        nics = self.nics_per_host
        if isinstance(nics, bool) or not isinstance(nics, int) or nics < 1:
            raise ClusterError(f"nics_per_host must be an integer >= 1, got {nics!r}")
        nic_of = {}
        for h, devs in enumerate(hosts):
            for i, d in enumerate(devs):
                nic_of[d] = h * nics + i * nics // len(devs)
        object.__setattr__(self, "_nic_of", MappingProxyType(nic_of))

    # ----- constructors ----------------------------------------------------------------
    @classmethod
    def regular(
        cls,
        num_hosts: int,
        devices_per_host: int,
        *,
        preset: str = PAPER_PRESET,
        **overrides: float,
    ) -> Cluster:
        """``num_hosts`` hosts of ``devices_per_host`` devices, ids host-major.

        Link figures default to ``preset`` (the paper's p3.8xlarge cluster); keyword
        overrides replace single figures (``nic_bandwidth=...`` etc.).
        """
        if num_hosts < 1 or devices_per_host < 1:
            raise ClusterError(
                f"need num_hosts >= 1 and devices_per_host >= 1, got {num_hosts}, "
                f"{devices_per_host}"
            )
        hosts = [range(h * devices_per_host, (h + 1) * devices_per_host)
                 for h in range(num_hosts)]
        return cls.from_hosts(hosts, preset=preset, **overrides)

    @classmethod
    def from_hosts(
        cls, hosts: Iterable[Iterable[int]], *, preset: str = PAPER_PRESET, **overrides: float
    ) -> Cluster:
        """Hosts given as lists of device ids, link figures from ``preset``."""
        fig = lookup(preset)
        figures = {
            "intra_bandwidth": fig.intra_bandwidth, "nic_bandwidth": fig.nic_bandwidth,
            "latency": fig.latency, "intra_latency": fig.intra_latency,
            "copy_bandwidth": fig.copy_bandwidth, "nics_per_host": fig.nics_per_host,
            "relay_piece": 0, "shared_bandwidth": 0.0, "message_cost": 0.0,
            "part_cost": 0.0, "cast_bandwidth": fig.cast_bandwidth,
        }
        unknown = set(overrides) - set(figures) - {"name"}
        if unknown:
            raise ClusterError(
                f"unknown cluster figure(s) {sorted(unknown)}; valid: {sorted(figures)}"
            )
        figures.update(overrides)
        name = str(figures.pop("name", fig.name if not overrides else "custom"))
        return cls(tuple(tuple(h) for h in hosts), name=name, **figures)  # type: ignore

    @classmethod
    def preset(cls, name: str, num_hosts: int, devices_per_host: int | None = None) -> Cluster:
        """A cluster of ``num_hosts`` machines of a named type (see :data:`PRESETS`)."""
        fig = lookup(name)
        return cls.regular(num_hosts, devices_per_host or fig.devices_per_host, preset=fig.name)

    # ----- queries ------------------------------------------------------------------------
    @property
    def num_hosts(self) -> int:
        """Number of hosts."""
        return len(self.hosts)

    @property
    def devices(self) -> tuple[int, ...]:
        """All devices, host-major."""
        return tuple(d for h in self.hosts for d in h)

    @property
    def footprint(self) -> int:
        """About the bytes this object holds (its name, its hosts' device ids and the
        map from device to host): what a cache keyed or valued by it pays to keep it."""
        return 512 + len(self.name.encode(errors="replace")) + 120 * len(self._host_of)  # type: ignore[attr-defined]

    def host_of(self, device: int) -> int:
        """Host index of ``device``."""
        try:
            return self._host_of[device]  # type: ignore[attr-defined,no-any-return]
        except KeyError:
            raise ClusterError(
                f"device {device} is not in the cluster {self.name!r} (devices "
                f"{_span(self.devices)}); add it to a host or use a larger cluster"
            ) from None

    @property
    def host_map(self) -> Mapping[int, int]:
        """Every device's host index (read only; :meth:`host_of` names a missing
        device in its error)."""
        return self._host_of  # type: ignore[attr-defined,no-any-return]

    @property
    def nic_map(self) -> Mapping[int, int]:
        """Every device's global NIC index (read only; see :meth:`nic_of`)."""
        return self._nic_of  # type: ignore[attr-defined,no-any-return]

    def nic_of(self, device: int) -> int:
        """Global index of the NIC ``device`` uses (host ``h``'s NICs are
        ``h * nics_per_host ...``)."""
        try:
            return self._nic_of[device]  # type: ignore[attr-defined,no-any-return]
        except KeyError:
            self.host_of(device)  # raises the helpful error
            raise

    @property
    def nic_capacity(self) -> float:
        """Bytes/s of one NIC, per direction."""
        return self.nic_bandwidth / self.nics_per_host

    def check_devices(self, devices: Iterable[int], what: str) -> None:
        """Raise :class:`ClusterError` naming every device of ``what`` absent from the
        cluster."""
        missing = sorted(set(devices) - set(self._host_of))  # type: ignore[attr-defined]
        if missing:
            raise ClusterError(
                f"{what} uses device(s) {missing} that the cluster {self.name!r} does not "
                f"have (it has {_span(self.devices)}); build the cluster with "
                f"Cluster.regular(num_hosts, devices_per_host) large enough, or "
                f"Cluster.from_hosts([...])"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``relay_piece``, ``shared_bandwidth``, ``message_cost``,
        ``part_cost`` and ``cast_bandwidth`` only when set)."""
        return {
            "hosts": [list(h) for h in self.hosts], "intra_bandwidth": self.intra_bandwidth,
            "nic_bandwidth": self.nic_bandwidth, "latency": self.latency,
            "intra_latency": self.intra_latency, "copy_bandwidth": self.copy_bandwidth,
            "name": self.name, "nics_per_host": self.nics_per_host,
            **({"relay_piece": self.relay_piece} if self.relay_piece else {}),
            **({"shared_bandwidth": self.shared_bandwidth} if self.shared_bandwidth else {}),
            **({"message_cost": self.message_cost} if self.message_cost else {}),
            **({"part_cost": self.part_cost} if self.part_cost else {}),
            **({"cast_bandwidth": self.cast_bandwidth} if self.cast_bandwidth else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cluster:
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        return cls(tuple(tuple(h) for h in d.pop("hosts")), **d)

    def __str__(self) -> str:
        return (f"Cluster({self.name}: {self.num_hosts} hosts x "
                f"{'/'.join(sorted({str(len(h)) for h in self.hosts}))} devices, "
                f"NIC {self.nic_bandwidth / GBIT:g} Gbit/s"
                f"{f' over {self.nics_per_host} NICs' if self.nics_per_host > 1 else ''}, intra "
                f"{self.intra_bandwidth / GBYTE:g} GB/s)")


def _span(devs: Sequence[int]) -> str:
    devs = sorted(devs)
    if devs and devs == list(range(devs[0], devs[0] + len(devs))):
        return f"{devs[0]}..{devs[-1]}"
    return str(devs)
