"""The machine types reshard knows by name: their published link figures, read from the
data file beside this module (``presets.toml``: one table a type, each figure with its
unit and the datasheets it comes from), so that a figure is changed or a machine added
without touching code. :meth:`reshard.Cluster.preset` builds a cluster of one.
"""

from __future__ import annotations

import decimal
import importlib.resources
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from reshard.core.errors import ClusterError

GBIT = 1e9 / 8  # bytes/s in one Gbit/s
GBYTE = 1e9

PAPER_PRESET = "aws-p3.8xlarge"
"""The cluster of Zhuang et al. (MLSys 2023), whose cases the paper suite replays."""

_UNITS = {"GB/s": decimal.Decimal(10) ** 9, "Gbit/s": decimal.Decimal(10) ** 9 / 8}
_MICRO = decimal.Decimal(10) ** -6


@dataclass(frozen=True)
class LinkFigures:
    """The published figures of one machine type, and where they come from.

    Attributes:
        name: preset name.
        devices_per_host: accelerators per host.
        intra_bandwidth: bytes/s a device can send (and, separately, receive) to other
            devices of its host.
        nic_bandwidth: bytes/s a host can send (and, separately, receive) to the network.
        latency: seconds of fixed cost of an inter-host transfer.
        intra_latency: seconds of fixed cost of an intra-host transfer.
        copy_bandwidth: bytes/s of a device-local copy.
        source: where the figures come from.
        nics_per_host: network interfaces per host sharing ``nic_bandwidth`` equally;
            device ``i`` of a host with ``g`` devices uses NIC ``i * nics_per_host // g``.
        cast_bandwidth: bytes/s of source data one device converts for a cast on the
            wire (``Cluster.cast_bandwidth``; 0: not measured, a cast is free).
    """

    name: str
    devices_per_host: int
    intra_bandwidth: float
    nic_bandwidth: float
    latency: float
    intra_latency: float
    copy_bandwidth: float
    source: str
    nics_per_host: int = 1
    cast_bandwidth: float = 0.0


def bandwidth(text: str) -> float:
    """Bytes/s of ``"N GB/s"`` or ``"N Gbit/s"`` (computed in decimal, then rounded once:
    ``"10 Gbit/s"`` is exactly ``10 * GBIT``)."""
    number, _, unit = str(text).strip().partition(" ")
    if unit not in _UNITS:
        raise ClusterError(f"bandwidth {text!r}: use 'N GB/s' or 'N Gbit/s'")
    try:
        return float(decimal.Decimal(number) * _UNITS[unit])
    except decimal.InvalidOperation:
        raise ClusterError(f"bandwidth {text!r}: {number!r} is not a number") from None


def _seconds(microseconds: Any) -> float:
    """Seconds of a number of microseconds (in decimal, rounded once: ``30`` is exactly
    ``30e-6``)."""
    try:
        return float(decimal.Decimal(str(microseconds)) * _MICRO)
    except decimal.InvalidOperation:
        raise ClusterError(f"latency {microseconds!r}: not a number of microseconds") from None


def _figures(name: str, table: Mapping[str, Any]) -> LinkFigures:
    try:
        return LinkFigures(
            name=name,
            devices_per_host=int(table["devices_per_host"]),
            intra_bandwidth=bandwidth(table["intra_bandwidth"]),
            nic_bandwidth=bandwidth(table["nic_bandwidth"]),
            latency=_seconds(table["latency_us"]),
            intra_latency=_seconds(table["intra_latency_us"]),
            copy_bandwidth=bandwidth(table["copy_bandwidth"]),
            source=str(table["source"]),
            nics_per_host=int(table.get("nics_per_host", 1)),
            cast_bandwidth=bandwidth(table["cast_bandwidth"]) if "cast_bandwidth" in table
            else 0.0,
        )
    except KeyError as e:
        raise ClusterError(f"preset {name!r} has no {e.args[0]}") from None


def read(text: str) -> Mapping[str, LinkFigures]:
    """The presets a TOML text describes (the layout of ``presets.toml``), by name, in
    the text's order."""
    return MappingProxyType({name: _figures(name, table)
                             for name, table in tomllib.loads(text).items()})


PRESETS: Mapping[str, LinkFigures] = read(
    importlib.resources.files("reshard.core").joinpath("presets.toml").read_text(encoding="utf-8"))
"""Every machine type by name, read once from the package's ``presets.toml``."""


def preset_names() -> tuple[str, ...]:
    """Names accepted by :meth:`Cluster.preset` (``"paper"`` is an alias)."""
    return (*PRESETS, "paper")


def lookup(name: str) -> LinkFigures:
    """The figures of preset ``name`` (``"paper"``: :data:`PAPER_PRESET`)."""
    key = PAPER_PRESET if name == "paper" else name
    if key not in PRESETS:
        raise ClusterError(f"unknown cluster preset {name!r}; valid: {list(preset_names())}")
    return PRESETS[key]
