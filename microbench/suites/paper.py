"""The microbenchmark suites of the cross-mesh resharding paper (Zhuang et al., MLSys
2023, section 5.1): nine n-to-m cases and the 1-to-m broadcast.

Mesh shapes are (hosts, devices per host); source and destination meshes sit on
distinct devices and hosts unless a case says otherwise. The published suite's case 8
repeats case 7 and is left out; the published numbering is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from reshard.cluster import Cluster
from reshard.layout import Layout
from reshard.mesh import DeviceMesh

FULL_SHAPE = (1024, 1024, 512)
CASE6_SHAPE = (3072, 1024, 170)
ONE_TO_M_ELEMENTS = 2 ** 28


@dataclass(frozen=True)
class Case:
    """One benchmark case.

    Attributes:
        name: case label (``"1"`` .. ``"9"``, ``"1-to-m (n,g)"``).
        shape: global tensor shape at full size.
        dtype: element type.
        src_mesh: source mesh shape (hosts, devices per host).
        src_spec: source sharding spec.
        dst_mesh: destination mesh shape.
        dst_spec: destination sharding spec.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    src_mesh: tuple[int, ...]
    src_spec: str
    dst_mesh: tuple[int, ...]
    dst_spec: str

    def scaled(self, factor: float) -> Case:
        """The case with every dim's size multiplied by ``factor`` (at least 1)."""
        shape = tuple(max(1, int(round(s * factor))) for s in self.shape)
        return Case(self.name, shape, self.dtype, self.src_mesh, self.src_spec,
                    self.dst_mesh, self.dst_spec)

    def with_shape(self, shape: tuple[int, ...]) -> Case:
        """The case with another global shape (same rank)."""
        return Case(self.name, tuple(shape), self.dtype, self.src_mesh, self.src_spec,
                    self.dst_mesh, self.dst_spec)

    def with_bytes(self, nbytes: int) -> Case:
        """The case scaled so the tensor has about ``nbytes`` bytes (dims scaled alike)."""
        factor = (nbytes / max(1, self.nbytes)) ** (1 / len(self.shape))
        return self.scaled(factor)

    def narrowed(self, devices_per_host: int) -> Case:
        """The case with every mesh's devices-per-host axis capped at ``devices_per_host``
        (for machines with fewer cores than the paper's 4 GPUs per host)."""
        def cap(mesh: tuple[int, ...]) -> tuple[int, ...]:
            return mesh[:-1] + (min(mesh[-1], devices_per_host),)
        return Case(self.name, self.shape, self.dtype, cap(self.src_mesh), self.src_spec,
                    cap(self.dst_mesh), self.dst_spec)

    @property
    def nbytes(self) -> int:
        """Bytes of the global tensor."""
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    def layouts_on(self, cluster: Cluster,
                   dst_first_host: int | None = None) -> tuple[Layout, Layout]:
        """Source and destination layouts placed on ``cluster``'s hosts.

        A mesh of shape (n, g) takes the first g devices of each of n consecutive
        hosts. The source starts on host 0; the destination on ``dst_first_host``, by
        default the host after the source's, or the last hosts when the cluster is too
        small for both (then the meshes overlap).
        """
        ns, nd = self.src_mesh[0], self.dst_mesh[0]
        if max(ns, nd) > cluster.num_hosts:
            raise ValueError(f"case {self.name} needs {max(ns, nd)} hosts, the cluster has "
                             f"{cluster.num_hosts}")
        if dst_first_host is None:
            dst_first_host = ns if ns + nd <= cluster.num_hosts else cluster.num_hosts - nd

        def place(mesh_shape: tuple[int, ...], first: int) -> DeviceMesh:
            n, g = mesh_shape
            devs: list[int] = []
            for h in range(first, first + n):
                if g > len(cluster.hosts[h]):
                    raise ValueError(f"mesh {mesh_shape} needs {g} devices per host, host "
                                     f"{h} has {len(cluster.hosts[h])}")
                devs.extend(cluster.hosts[h][:g])
            return DeviceMesh(mesh_shape, devices=devs)

        return (Layout(place(self.src_mesh, 0), self.src_spec),
                Layout(place(self.dst_mesh, dst_first_host), self.dst_spec))

    def build(self, devices_per_host: int = 4, preset: str = "paper",
              **overrides: float) -> tuple[Layout, Layout, Cluster]:
        """Source layout, destination layout and a cluster just large enough for the
        two on distinct hosts (see :meth:`layouts_on`)."""
        hosts = self.src_mesh[0] + self.dst_mesh[0]
        cluster = Cluster.regular(hosts, devices_per_host, preset=preset, **overrides)
        return (*self.layouts_on(cluster), cluster)


def n_to_m_cases() -> tuple[Case, ...]:
    """The paper's n-to-m cases 1-7 and 9 at full size (int32)."""
    c = FULL_SHAPE
    return (
        Case("1", c, "int32", (2, 4), "S0RR", (2, 4), "S0RR"),
        Case("2", c, "int32", (2, 4), "RRR", (2, 4), "S0RR"),
        Case("3", c, "int32", (2, 4), "RS0R", (2, 4), "S0RR"),
        Case("4", c, "int32", (2, 4), "RS01R", (2, 4), "S01RR"),
        Case("5", c, "int32", (2, 4), "S1RR", (2, 4), "S0RR"),
        Case("6", CASE6_SHAPE, "int32", (2, 4), "S0RR", (3, 4), "S0RR"),
        Case("7", c, "int32", (1, 4), "S1RR", (2, 4), "RRR"),
        Case("9", c, "int32", (2, 4), "RS0R", (2, 4), "RRS0"),
    )


ONE_TO_M_MESHES = ((1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (3, 2), (4, 2))


def one_to_m_cases(elements: int = ONE_TO_M_ELEMENTS) -> tuple[Case, ...]:
    """One device holding an int32 vector -> fully replicated on an (n, g) mesh."""
    return tuple(
        Case(f"1-to-m {n}x{g}", (elements,), "int32", (1, 1), "R", (n, g), "R")
        for n, g in ONE_TO_M_MESHES
    )


def all_cases() -> tuple[Case, ...]:
    """Every case of both suites."""
    return n_to_m_cases() + one_to_m_cases()


SUITES = {"n-to-m": n_to_m_cases, "1-to-m": one_to_m_cases, "paper": all_cases}
