"""The microbenchmark suites of the cross-mesh resharding paper (Zhuang et al., MLSys
2023, section 5.1): nine n-to-m cases and the 1-to-m broadcast; and :class:`Case`, the
benchmark case every suite is made of (see also ``realistic.py`` and
``weight_sync.py``).

Mesh shapes are (hosts, devices per host); source and destination meshes sit on
distinct devices and hosts unless a case says otherwise. The published suite's case 8
repeats case 7 and is left out; the published numbering is kept.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reshard.cluster import Cluster
from reshard.dtypes import Cast, ScaleMode, itemsize
from reshard.layout import Layout
from reshard.mesh import DeviceMesh
from reshard.presets import PAPER_PRESET, PRESETS

FULL_SHAPE = (1024, 1024, 512)
CASE6_SHAPE = (3072, 1024, 170)
ONE_TO_M_ELEMENTS = 2 ** 28

Request = tuple[tuple[int, ...], str, Layout, Layout, Cast | None]
"""One tensor to move: ``(shape, dtype, src_layout, dst_layout, cast)`` (what
:func:`reshard.plan_many` takes)."""


def preset_key(name: str | None) -> str:
    """The preset's full name (``None`` and ``"paper"`` mean the paper's cluster)."""
    key = PAPER_PRESET if name in (None, "paper") else str(name)
    if key not in PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; valid: {sorted(PRESETS)}")
    return key


def _scale_shape(shape: tuple[int, ...], factor: float) -> tuple[int, ...]:
    return tuple(max(1, round(s * factor)) for s in shape)


@dataclass(frozen=True)
class Tensor:
    """One tensor of a case: global shape, element type and its two sharding specs
    (the meshes are the case's).

    Attributes:
        shape: global shape at full size.
        dtype: element type (:mod:`reshard.dtypes`).
        src_spec: source sharding spec.
        dst_spec: destination sharding spec.
        name: what it is (``"layers.0.q_proj"``); empty for a case's single tensor.
        cast: the conversion on the way (None: it arrives in ``dtype``).
    """

    shape: tuple[int, ...]
    dtype: str
    src_spec: str
    dst_spec: str
    name: str = ""
    cast: Cast | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the global tensor (in its source dtype)."""
        return math.prod(self.shape) * itemsize(self.dtype)

    def scaled_bytes(self, ratio: float) -> Tensor:
        """The tensor with every dim scaled alike so its bytes scale by about ``ratio``."""
        factor = max(ratio, 0.0) ** (1 / len(self.shape))
        return dataclasses.replace(self, shape=_scale_shape(self.shape, factor))

    def at_most(self, elements: int) -> Tensor:
        """The tensor shrunk (never grown) to about ``elements`` elements."""
        n = math.prod(self.shape)
        return self if n <= elements else self.scaled_bytes(elements / n)


@dataclass(frozen=True)
class Case:
    """One benchmark case: one tensor (or several, moved together with
    :func:`reshard.plan_many`) from a source mesh to a destination mesh.

    Attributes:
        name: case label (``"1"`` .. ``"9"``, ``"1-to-m (n,g)"``, ``"a2a-16x8"``).
        shape: global tensor shape at full size (of the first tensor).
        dtype: element type (of the first tensor).
        src_mesh: source mesh shape (hosts, devices per host).
        src_spec: source sharding spec (of the first tensor).
        dst_mesh: destination mesh shape.
        dst_spec: destination sharding spec (of the first tensor).
        preset: the case's own cluster type (a :data:`reshard.PRESETS` name); ``None``
            is the paper's p3.8xlarge with 4 devices per host.
        dst_first_host: the host the destination mesh starts on; ``None``: right after
            the source's hosts (disjoint meshes). A smaller value makes the meshes share
            hosts (and devices: a mesh takes the first devices of each of its hosts).
        extra: more tensors moved together with the first, on the same meshes.
        labels: (source, destination) texts shown in place of the first tensor's specs
            when the tensors' specs differ (e.g. ``("fsdp:S01", "tp:S1/RS1/R")``).
        cast: the first tensor's conversion on the way (None: none).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    src_mesh: tuple[int, ...]
    src_spec: str
    dst_mesh: tuple[int, ...]
    dst_spec: str
    preset: str | None = None
    dst_first_host: int | None = None
    extra: tuple[Tensor, ...] = ()
    labels: tuple[str, str] | None = None
    cast: Cast | None = None

    @classmethod
    def many(cls, name: str, tensors: Sequence[Tensor], src_mesh: tuple[int, ...],
             dst_mesh: tuple[int, ...], **kwargs: Any) -> Case:
        """A case of several tensors on one pair of meshes."""
        if not tensors:
            raise ValueError(f"case {name}: needs at least one tensor")
        t0 = tensors[0]
        return cls(name, t0.shape, t0.dtype, src_mesh, t0.src_spec, dst_mesh, t0.dst_spec,
                   extra=tuple(tensors[1:]), cast=t0.cast, **kwargs)

    # ----- the tensors ---------------------------------------------------------------------
    @property
    def tensors(self) -> tuple[Tensor, ...]:
        """Every tensor of the case, the first one first."""
        return (Tensor(self.shape, self.dtype, self.src_spec, self.dst_spec, cast=self.cast),
                *self.extra)

    def _with_tensors(self, tensors: Sequence[Tensor]) -> Case:
        t0 = tensors[0]
        return dataclasses.replace(self, shape=tuple(t0.shape), dtype=t0.dtype,
                                   src_spec=t0.src_spec, dst_spec=t0.dst_spec,
                                   extra=tuple(tensors[1:]), cast=t0.cast)

    @property
    def nbytes(self) -> int:
        """Bytes of the global tensors, all together."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def dtype_text(self) -> str:
        """Its tensors' dtypes (``bfloat16->float8_e4m3fn/block128`` where cast)."""
        return "/".join(sorted({t.dtype if t.cast is None else f"{t.dtype}->{t.cast}"
                                for t in self.tensors}))

    def converted(self, dtype: str | None, cast: Cast | None) -> Case:
        """The case with every tensor in ``dtype`` (None: its own) and cast as ``cast``
        says (None: as the case says); block scales go to tensors of rank >= 2 only."""
        def one(t: Tensor) -> Tensor:
            c = t.cast if cast is None else cast
            if c is not None and c.scale is ScaleMode.BLOCK128 and len(t.shape) < 2:
                c = None
            return dataclasses.replace(t, dtype=dtype or t.dtype, cast=c)
        return self._with_tensors([one(t) for t in self.tensors])

    # ----- resized variants --------------------------------------------------------------
    def scaled(self, factor: float) -> Case:
        """The case with every dim's size multiplied by ``factor`` (at least 1)."""
        return self._with_tensors([dataclasses.replace(t, shape=_scale_shape(t.shape, factor))
                                   for t in self.tensors])

    def with_shape(self, shape: tuple[int, ...]) -> Case:
        """The case with another global shape (same rank) for its first tensor."""
        return dataclasses.replace(self, shape=tuple(shape))

    def with_bytes(self, nbytes: int) -> Case:
        """The case scaled so its tensors have about ``nbytes`` bytes together (each
        tensor's dims scaled alike, every tensor by the same byte ratio)."""
        ratio = nbytes / max(1, self.nbytes)
        return self._with_tensors([t.scaled_bytes(ratio) for t in self.tensors])

    def small(self, elements: int) -> Case:
        """The case at a checking size: a single tensor of about ``elements`` elements;
        several tensors each shrunk to at most about ``elements`` elements."""
        if not self.extra:
            return self.with_bytes(elements * itemsize(self.dtype))
        return self._with_tensors([t.at_most(elements) for t in self.tensors])

    def narrowed(self, devices_per_host: int) -> Case:
        """The case with every mesh's devices-per-host axis capped at ``devices_per_host``
        (for machines with fewer cores than the paper's 4 GPUs per host)."""
        def cap(mesh: tuple[int, ...]) -> tuple[int, ...]:
            return (*mesh[:-1], min(mesh[-1], devices_per_host))
        return dataclasses.replace(self, src_mesh=cap(self.src_mesh),
                                   dst_mesh=cap(self.dst_mesh))

    # ----- placement -------------------------------------------------------------------------
    def _dst_first(self, num_hosts: int, dst_first_host: int | None) -> int:
        if dst_first_host is None:
            dst_first_host = self.dst_first_host
        ns, nd = self.src_mesh[0], self.dst_mesh[0]
        if dst_first_host is None:
            dst_first_host = ns if ns + nd <= num_hosts else num_hosts - nd
        return dst_first_host

    @property
    def hosts_needed(self) -> int:
        """Hosts the two meshes span (the source starts on host 0)."""
        ns, nd = self.src_mesh[0], self.dst_mesh[0]
        if self.dst_first_host is None:
            return ns + nd
        return max(ns, self.dst_first_host + nd)

    @property
    def devices_needed(self) -> int:
        """Distinct devices of the two meshes (shared hosts share their first devices)."""
        ns, gs = self.src_mesh
        nd, gd = self.dst_mesh
        first = ns if self.dst_first_host is None else self.dst_first_host
        per_host = [0] * self.hosts_needed
        for h in range(ns):
            per_host[h] = gs
        for h in range(first, first + nd):
            per_host[h] = max(per_host[h], gd)
        return sum(per_host)

    def meshes_on(self, cluster: Cluster,
                  dst_first_host: int | None = None) -> tuple[DeviceMesh, DeviceMesh]:
        """Source and destination meshes placed on ``cluster``'s hosts.

        A mesh of shape (n, g) takes the first g devices of each of n consecutive
        hosts. The source starts on host 0; the destination on ``dst_first_host``, else
        the case's own :attr:`dst_first_host`, else the host after the source's, or the
        last hosts when the cluster is too small for both (then the meshes overlap).
        """
        ns, nd = self.src_mesh[0], self.dst_mesh[0]
        if max(ns, nd) > cluster.num_hosts:
            raise ValueError(f"case {self.name} needs {max(ns, nd)} hosts, the cluster has "
                             f"{cluster.num_hosts}")
        first = self._dst_first(cluster.num_hosts, dst_first_host)
        if first < 0 or first + nd > cluster.num_hosts:
            raise ValueError(f"case {self.name}: destination mesh {self.dst_mesh} from host "
                             f"{first} does not fit {cluster.num_hosts} hosts")

        def place(mesh_shape: tuple[int, ...], first: int) -> DeviceMesh:
            n, g = mesh_shape
            devs: list[int] = []
            for h in range(first, first + n):
                if g > len(cluster.hosts[h]):
                    raise ValueError(f"mesh {mesh_shape} needs {g} devices per host, host "
                                     f"{h} has {len(cluster.hosts[h])}")
                devs.extend(cluster.hosts[h][:g])
            return DeviceMesh(mesh_shape, devices=devs)

        return place(self.src_mesh, 0), place(self.dst_mesh, first)

    def layouts_on(self, cluster: Cluster,
                   dst_first_host: int | None = None) -> tuple[Layout, Layout]:
        """The first tensor's source and destination layouts on ``cluster`` (placed as
        :meth:`meshes_on` says)."""
        src, dst = self.meshes_on(cluster, dst_first_host)
        return Layout(src, self.src_spec), Layout(dst, self.dst_spec)

    def requests_on(self, cluster: Cluster,
                    dst_first_host: int | None = None) -> list[Request]:
        """``(shape, dtype, src_layout, dst_layout, cast)`` of every tensor on
        ``cluster``."""
        src, dst = self.meshes_on(cluster, dst_first_host)
        return [(t.shape, t.dtype, Layout(src, t.src_spec), Layout(dst, t.dst_spec), t.cast)
                for t in self.tensors]

    def cluster(self, devices_per_host: int | None = None, preset: str | None = None,
                **overrides: float) -> Cluster:
        """A regular cluster just large enough for the case (:attr:`hosts_needed`).

        Link figures come from ``preset``, else the case's own :attr:`preset`, else the
        paper's. Hosts have ``devices_per_host`` devices, by default as many as the
        case's own preset's machines (4 for the paper's), or more if a mesh is wider.
        """
        if devices_per_host is None:
            devices_per_host = max(PRESETS[preset_key(self.preset)].devices_per_host,
                                   self.src_mesh[-1], self.dst_mesh[-1])
        return Cluster.regular(self.hosts_needed, devices_per_host,
                               preset=preset_key(preset or self.preset), **overrides)

    def build(self, devices_per_host: int | None = None, preset: str | None = None,
              **overrides: float) -> tuple[Layout, Layout, Cluster]:
        """The first tensor's source and destination layouts and the case's
        :meth:`cluster` (the two meshes on distinct hosts unless the case places its
        destination otherwise)."""
        cluster = self.cluster(devices_per_host, preset, **overrides)
        return (*self.layouts_on(cluster), cluster)

    def build_many(self, devices_per_host: int | None = None, preset: str | None = None,
                   **overrides: float) -> tuple[list[Request], Cluster]:
        """Every tensor's request (see :meth:`requests_on`) and the case's
        :meth:`cluster`: what :func:`reshard.plan_many` takes."""
        cluster = self.cluster(devices_per_host, preset, **overrides)
        return self.requests_on(cluster), cluster

    # ----- text ------------------------------------------------------------------------------
    @property
    def preset_name(self) -> str:
        """The full name of the case's own preset."""
        return preset_key(self.preset)

    def layout_text(self) -> str:
        """``src_spec@mesh->dst_spec@mesh`` (meshes as ``hostsxdevices``; a destination
        that does not start right after the source says ``@h<first host>``)."""
        def mesh(m: tuple[int, ...]) -> str:
            return "x".join(map(str, m))
        where = "" if self.dst_first_host is None else f"@h{self.dst_first_host}"
        src, dst = self.labels or (self.src_spec, self.dst_spec)
        return f"{src}@{mesh(self.src_mesh)}->{dst}@{mesh(self.dst_mesh)}{where}"


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
