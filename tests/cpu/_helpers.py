"""Helpers shared by the real-process tests (and the GPU tier)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Iterable

import numpy as np
from hypothesis import strategies as st

from reshard import Cluster, DeviceMesh, Layout, ShardingSpec

STRATEGIES = ("send_recv", "allgather", "broadcast")
DTYPES = ("int8", "uint16", "int32", "int64", "float32", "float64", "complex64", "bool")

# Eight workers, four hosts of two devices: the paper's (n, 4) meshes at half width.
WORLD = Cluster.regular(4, 2)


@dataclass(frozen=True)
class PaperCase:
    """A case of the paper's n-to-m suite at reduced size (see :func:`paper_cases`)."""

    name: str
    shape: tuple[int, ...]
    src_mesh: tuple[int, int]
    src_spec: str
    dst_mesh: tuple[int, int]
    dst_spec: str
    dst_first_host: int | None = None  # None: the host after the source's

    def narrowed(self, g: int) -> "PaperCase":
        """The case with every mesh (n, x) made (n, g)."""
        return PaperCase(self.name, self.shape, (self.src_mesh[0], g), self.src_spec,
                         (self.dst_mesh[0], g), self.dst_spec, self.dst_first_host)

    def layouts(self, cluster: Cluster = WORLD) -> tuple[Layout, Layout]:
        """Source and destination layouts: a mesh (n, g) takes g devices on each of n
        consecutive hosts; the source from host 0."""
        def place(mesh: tuple[int, int], first: int) -> DeviceMesh:
            n, g = mesh
            devs = [d for h in range(first, first + n) for d in cluster.hosts[h][:g]]
            return DeviceMesh(mesh, devices=devs)

        first = self.src_mesh[0] if self.dst_first_host is None else self.dst_first_host
        return (Layout(place(self.src_mesh, 0), self.src_spec),
                Layout(place(self.dst_mesh, first), self.dst_spec))


def paper_cases() -> tuple[PaperCase, ...]:
    """The paper's cases 1-7 and 9 (int32) on :data:`WORLD`: meshes (n, 4) become
    (n, 2), shapes (1024, 1024, 512) become (16, 16, 8). Source and destination sit
    on distinct hosts, except case 6, whose (2, 2) -> (3, 2) needs five hosts: its
    destination starts on the source's second host (overlapping meshes)."""
    c = (16, 16, 8)
    return (
        PaperCase("1", c, (2, 2), "S0RR", (2, 2), "S0RR"),
        PaperCase("2", c, (2, 2), "RRR", (2, 2), "S0RR"),
        PaperCase("3", c, (2, 2), "RS0R", (2, 2), "S0RR"),
        PaperCase("4", c, (2, 2), "RS01R", (2, 2), "S01RR"),
        PaperCase("5", c, (2, 2), "S1RR", (2, 2), "S0RR"),
        PaperCase("6", (24, 16, 5), (2, 2), "S0RR", (3, 2), "S0RR", dst_first_host=1),
        PaperCase("7", c, (1, 2), "S1RR", (2, 2), "RRR"),
        PaperCase("9", c, (2, 2), "RS0R", (2, 2), "RRS0"),
    )


def sample(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random values of ``dtype`` whose sums stay exact (small integers)."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    vals = rng.integers(-50, 50, size=shape)
    if dt.kind == "c":
        vals = vals + 1j * rng.integers(-50, 50, size=shape)
    return vals.astype(dt)


def addends(rng: np.random.Generator, value: np.ndarray, layout: Layout) -> dict[int, np.ndarray]:
    """Per-device shards of ``value`` on ``layout``; on partial axes, random addends
    that sum (with the dtype's wrap-around) to the value."""
    boxes = layout.boxes(value.shape)
    shards: dict[int, np.ndarray] = {}
    for group in layout.partial_groups():
        sl = tuple(slice(a, b) for a, b in boxes[group[0]])
        rest = [sample(rng, value[sl].shape, value.dtype.name) for _ in group[1:]]
        lead = value[sl].copy()
        for r in rest:
            lead -= r
        shards[group[0]] = lead
        shards.update(zip(group[1:], rest))
    return shards


def check_shards(rt, y, value: np.ndarray) -> None:
    """Every destination shard equals its slice of ``value`` byte for byte (partial
    destinations: partial leaders hold the value, the other addends zeros)."""
    shards = rt.shards(y)
    leaders = y.layout.partial_leaders()
    for d, sl in y.layout.index_map(value.shape).items():
        want = np.ascontiguousarray(value[sl] if d in leaders else np.zeros_like(value[sl]))
        got = shards[d]
        assert got.shape == want.shape and got.dtype == want.dtype, (d, got.shape, want.shape)
        assert got.tobytes() == want.tobytes(), f"device {d} of {y.layout} differs"


# ----- random problems ------------------------------------------------------------------
@st.composite
def meshes(draw, pool: tuple[int, ...]) -> DeviceMesh:
    """A 1-d or 2-d mesh over a prefix of ``pool``."""
    ndim = draw(st.integers(1, 2))
    shape = [draw(st.integers(1, min(4, len(pool))))]
    if ndim == 2:
        shape.append(draw(st.integers(1, max(1, len(pool) // shape[0]))))
    n = math.prod(shape)
    return DeviceMesh(tuple(shape), devices=pool[:n])


@st.composite
def specs(draw, mesh_ndim: int, rank: int, allow_partial: bool) -> ShardingSpec:
    """Each mesh axis splits a random dim (random major/minor order), replicates, or
    (if allowed) is partial."""
    dims: list[list[int]] = [[] for _ in range(rank)]
    partial = []
    for axis in draw(st.permutations(range(mesh_ndim))):
        choice = draw(st.sampled_from(["R", "S", "P"] if allow_partial else ["R", "S"]))
        if choice == "S":
            dims[draw(st.integers(0, rank - 1))].append(axis)
        elif choice == "P":
            partial.append(axis)
    return ShardingSpec(tuple(tuple(d) for d in dims), tuple(partial))


@st.composite
def problems(draw, devices: tuple[int, ...] = WORLD.devices):
    """(shape, dtype, src layout, dst layout): uneven shapes, disjoint or overlapping
    meshes, partial sources and destinations for summable dtypes."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank)))
    dtype = draw(st.sampled_from(DTYPES))
    summable = dtype != "bool"
    order = draw(st.permutations(devices))
    src_mesh = draw(meshes(tuple(order)))
    if draw(st.booleans()):  # overlapping: the destination reuses source devices
        dst_pool = tuple(draw(st.permutations(order)))
    else:
        rest = tuple(d for d in order if d not in src_mesh.devices)
        dst_pool = rest if rest else tuple(order)
    dst_mesh = draw(meshes(dst_pool))
    src = Layout(src_mesh, draw(specs(src_mesh.ndim, rank, summable)))
    dst = Layout(dst_mesh, draw(specs(dst_mesh.ndim, rank, summable)))
    return shape, dtype, src, dst


# ----- processes ------------------------------------------------------------------------
def pid_alive(pid: int) -> bool:
    """True if a process with this id exists (and is not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: Iterable[int], timeout: float = 15.0) -> list[int]:
    """The pids still alive after waiting up to ``timeout`` seconds."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)
